"""The set-up files: pyproject.toml, environment.yml, the Makefile and CI agree."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

ROOT = Path(__file__).resolve().parents[1]
CONDA_NAMES = {"torch": "pytorch"}  # PyPI name -> conda-forge name, where they differ


def _pyproject_requirements() -> dict[str, Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = (Requirement(r) for r in project["dependencies"])
    return {CONDA_NAMES.get(r.name.lower(), r.name.lower()): r for r in reqs}


def _conda_specs() -> dict[str, str]:
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    specs = {}
    for dep in env["dependencies"]:
        # conda's packages, and pip's (a package conda-forge lacks) but the project itself
        pip = dep.get("pip", []) if isinstance(dep, dict) else []
        for entry in [dep] if isinstance(dep, str) else [p for p in pip if p[0] != "-"]:
            requirement = entry.split("#")[0].strip()
            name, spec = re.fullmatch(r"([A-Za-z0-9_.-]+)(.*)", requirement).groups()
            specs[name.lower()] = spec.replace("==", "=", 1) if spec.startswith("==") else spec
    return specs


def _as_pip_spec(conda_spec: str) -> str:
    """conda's ``=2.13.0=cpu*`` (version, then build) is pip's ``==2.13.0``."""
    if conda_spec.startswith("="):
        return "==" + conda_spec.lstrip("=").split("=")[0]
    return conda_spec


def test_every_pyproject_dependency_is_in_environment_yml_with_the_same_bounds() -> None:
    """Does the conda/Binder environment ask for what pyproject.toml asks for?"""
    conda = _conda_specs()
    for name, req in _pyproject_requirements().items():
        assert name in conda, f"{name} is in pyproject.toml but not in environment.yml"
        assert SpecifierSet(_as_pip_spec(conda[name])) == req.specifier, (
            f"{name}: pyproject says {req.specifier!s}, environment.yml says {conda[name]}"
        )


def test_environment_yml_has_nothing_pyproject_lacks() -> None:
    """Is every conda package (beyond python and pip) declared in pyproject.toml too?"""
    extra = set(_conda_specs()) - set(_pyproject_requirements()) - {"python", "pip"}
    assert not extra, f"in environment.yml only: {sorted(extra)}"


def test_torch_is_pinned_to_a_cpu_build_everywhere() -> None:
    """Is torch pinned exactly, so set-up never pulls a multi-GB CUDA build?"""
    assert str(_pyproject_requirements()["pytorch"].specifier) == "==2.13.0"
    assert _conda_specs()["pytorch"].endswith("=cpu*")


def test_ci_runs_the_readme_test_command() -> None:
    """Does CI run `make test`, the command the README gives, and nothing weaker?"""
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"^make test$", ci, re.MULTILINE)
    assert "make test" in (ROOT / "README.md").read_text()


def test_run_time_output_is_git_ignored() -> None:
    """Are nbgrader's run-time folders and the gradebook kept out of git?"""
    ignored = (ROOT / ".gitignore").read_text().split()
    for path in ["/submitted/", "/autograded/", "/feedback/", "/gradebook.db"]:
        assert path in ignored
