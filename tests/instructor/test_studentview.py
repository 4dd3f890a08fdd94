"""The student view: everything a student needs, nothing an instructor keeps, and it runs."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

import nbformat
import pytest

from course.grading.copies import course_solutions, near_copies, shared_rules
from course.instructor.forkedkernels import PROVISIONER
from course.instructor.selfstudy import quiz_items
from course.instructor.studentview import LEFT_OUT, export
from course.instructor.workcopies import COURSE_ORDER

REPO = Path(__file__).resolve().parents[2]
KEY_ARGUMENT = re.compile(r"""\bkey\s*=\s*["'][a-z]["']""")


@pytest.fixture(scope="module")
def view(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The default view: the graded one."""
    dest = tmp_path_factory.mktemp("studentview") / "dp-course"
    export(dest, "someone/dp-course")
    return dest


@pytest.fixture(scope="module")
def selfstudy_view(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dest = tmp_path_factory.mktemp("selfstudy-view") / "dp-course"
    export(dest, "someone/dp-course", selfstudy=True)
    return dest


def _explanation_sentences() -> list[str]:
    sentences = []
    for path in sorted((REPO / "source").glob("*/*.ipynb")):
        for item in quiz_items(nbformat.read(path, as_version=4)):
            flat = " ".join(item.explanation.split())
            sentences += [s for s in re.split(r"(?<=[.:;!?])\s+", flat) if len(s) >= 30]
    return sentences


@pytest.mark.parametrize("kind", ["view", "selfstudy_view"])
def test_the_view_has_what_students_need_and_no_source_or_keys(kind: str, request) -> None:
    """Release notebooks, the package without the instructor's tools, the environment, a
    postBuild and a README with a Binder badge; no source/, no key, no explanation?"""
    view = request.getfixturevalue(kind)
    assert sorted(p.name for p in (view / "release").iterdir()) == sorted(
        p.name for p in (REPO / "release").iterdir()
    )
    assert (view / "environment.yml").exists() and (view / "pyproject.toml").exists()
    assert not (view / "source").exists() and not (view / "autograde").exists()
    assert all(not (view / rel).exists() for rel in LEFT_OUT)
    assert (view / "course" / "checks" / "teaching.py").exists()
    assert os.access(view / "postBuild", os.X_OK)
    readme = (view / "README.md").read_text()
    assert (
        "(https://mybinder.org/v2/gh/someone/dp-course/HEAD"
        "?urlpath=lab/tree/work/ring_allreduce/ring_allreduce.ipynb)" in readme
    )
    text = {p: p.read_text(errors="replace") for p in view.rglob("*") if p.is_file()}
    assert not [p for p, t in text.items() if KEY_ARGUMENT.search(t)]
    flat = {p: " ".join(t.split()) for p, t in text.items()}
    leaks = [s for s in _explanation_sentences() if any(s in t for t in flat.values())]
    assert not leaks, leaks[:3]


def test_the_default_view_is_the_graded_one_with_no_key_at_all(view: Path) -> None:
    """Does the default view carry no seals, build plain work copies, and say it is for
    graded work?"""
    assert not (view / "selfstudy.json").exists()
    assert "--seals" not in (view / "postBuild").read_text()
    readme = (view / "README.md").read_text()
    assert "for graded work" in readme and "self-study" not in readme


def test_the_selfstudy_view_carries_sealed_keys_and_the_hidden_exercise_checks(
    selfstudy_view: Path,
) -> None:
    """Are its quiz checks sealed and its exercise checks the grader's own (hidden part
    included), for every assignment, and does its README forbid graded work?"""
    seals = json.loads((selfstudy_view / "selfstudy.json").read_text())
    assert set(seals) == {p.name for p in (REPO / "release").iterdir()}
    ring = seals["ring_allreduce"]
    assert 'sealed="sealed-v1:' in ring["ring_1_check"]
    assert "print(check_ring_sums(ring_allreduce))" in ring["ring_allreduce_sums"]
    assert not any("HIDDEN TESTS" in text for cells in seals.values() for text in cells.values())
    assert "--seals selfstudy.json" in (selfstudy_view / "postBuild").read_text()
    assert "do not use this copy for graded work" in (selfstudy_view / "README.md").read_text()


def test_the_view_describes_only_what_it_ships(view: Path) -> None:
    """Do its README, pyproject and environment name the five notebooks and the course's
    packages, and none of the instructor's tests, tools or settings?"""
    readme = (view / "README.md").read_text()
    for path in sorted((REPO / "release").glob("*/*.ipynb")):
        title = nbformat.read(path, as_version=4).cells[0].source.splitlines()[0].lstrip("# ")
        assert f"`{path.stem}`: {title}" in readme
    assert f"{len(COURSE_ORDER)} notebooks" in readme and "--no-index --find-links wheels" in readme
    student = tomllib.loads((view / "pyproject.toml").read_text())
    course = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert student["project"]["dependencies"] == course["project"]["dependencies"]
    assert "optional-dependencies" not in student["project"]
    assert set(student.get("tool", {})) == {"setuptools"}
    environment = (view / "environment.yml").read_text()
    assert "tests/" not in environment and "pytorch=2.13.0=cpu*" in environment
    assert "python -m course.instructor.studentlab" in (view / "postBuild").read_text()


def test_the_view_holds_no_working_solution(view: Path) -> None:
    """Does no module a student gets define a copy of an exercise's solution (the source
    notebooks' solution cells, or the instructor's reference ring), and does no function of it
    hold one of their rules, renamed or with lines added?"""
    solutions = [(REPO / "course" / "instructor" / "reference.py").read_text()]
    for path in sorted((REPO / "source").glob("*/*.ipynb")):
        solutions += course_solutions(path)
    shipped = {p: p.read_text() for p in sorted((view / "course").rglob("*.py"))}
    assert len(shipped) > 40 and len(solutions) > 10
    copies = {str(p.relative_to(view)): near_copies([t], solutions) for p, t in shipped.items()}
    assert {p: names for p, names in copies.items() if names} == {}
    modules = {str(p.relative_to(view)): t for p, t in shipped.items()}
    assert shared_rules(modules, solutions) == []


def _fresh_venv(tmp_path: Path) -> Path:
    """A new venv whose only course is the view's; torch and the rest come from this venv."""
    fresh = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", fresh], check=True)
    purelib = sysconfig.get_paths(vars={"base": str(fresh), "platbase": str(fresh)})["purelib"]
    here = sysconfig.get_paths()["purelib"]  # this venv's packages, but not its editable course
    Path(purelib).mkdir(parents=True, exist_ok=True)
    (Path(purelib) / "dependencies.pth").write_text(here + "\n")
    return fresh


TRIED = ("setup", "meet_ranks_run", "ring_1_answer", "ring_1_check", "ring_1_measure_widget")
TRIED += ("ring_allreduce", "try_it")


@pytest.mark.slow
@pytest.mark.ranks
def test_the_view_installs_in_a_fresh_venv_and_its_notebook_runs(
    selfstudy_view: Path, tmp_path
) -> None:
    """Installed from the view alone, does postBuild turn nbgrader's instructor views off in
    that environment only, build self-study work copies, and does the ring notebook run:
    ranks, the widget, sealed feedback, the stub's note, in a kernel forked as the student's
    lab forks it?"""
    view = selfstudy_view
    fresh = _fresh_venv(tmp_path)
    python = fresh / "bin" / "python"
    env = {**os.environ, "PATH": f"{fresh / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    subprocess.run(
        [python, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", view],
        check=True, env=env, cwd=tmp_path,
    )  # fmt: skip
    where = subprocess.run(
        [python, "-c", "import course; print(course.__file__)"],
        check=True, env=env, cwd=tmp_path, capture_output=True, text=True,
    ).stdout  # fmt: skip
    assert where.startswith(str(fresh)), where
    subprocess.run(["bash", "postBuild"], check=True, env=env, cwd=view)
    server = json.loads((fresh / "etc" / "jupyter" / "jupyter_server_config.json").read_text())
    assert (
        server["ServerApp"]["jpserver_extensions"]["nbgrader.server_extensions.formgrader"] is False
    )
    assert server["KernelProvisionerFactory"]["default_provisioner_name"] == PROVISIONER
    page = json.loads((fresh / "etc" / "jupyter" / "labconfig" / "page_config.json").read_text())
    assert page["disabledExtensions"]["@jupyter/nbgrader:create-assignment"] is True
    ours = Path(sys.prefix) / "etc" / "jupyter" / "jupyter_server_config.json"
    assert not ours.exists() or "formgrader" not in ours.read_text()  # this venv untouched
    notebook = view / "work" / "ring_allreduce" / "ring_allreduce.ipynb"
    nb = nbformat.read(notebook, as_version=4)
    release = nbformat.read(view / "release" / "ring_allreduce" / "ring_allreduce.ipynb", 4)
    ids = [c.metadata.get("nbgrader", {}).get("grade_id") for c in release.cells]
    nb.cells = [c for c, gid in zip(nb.cells, ids, strict=True) if gid in TRIED]
    assert len(nb.cells) == len(TRIED)
    nb.cells.append(
        nbformat.v4.new_code_cell("import os; print(open(f'/proc/{os.getppid()}/cmdline').read())")
    )
    trimmed = tmp_path / "trimmed.ipynb"
    nbformat.write(nb, trimmed)
    runner = (
        "import sys, nbformat\n"
        "from jupyter_client.provisioning import KernelProvisionerFactory\n"
        "from nbclient import NotebookClient\n"
        f"KernelProvisionerFactory.instance().default_provisioner_name = '{PROVISIONER}'\n"
        "nb = nbformat.read(sys.argv[1], as_version=4)\n"
        "NotebookClient(nb, timeout=120, kernel_name='python3', allow_errors=True).execute()\n"
        "nbformat.write(nb, sys.argv[1])\n"
    )
    subprocess.run([python, "-c", runner, trimmed], check=True, env=env, cwd=view, timeout=300)
    outputs = [o for c in nbformat.read(trimmed, as_version=4).cells for o in c.outputs]
    errors = [o for o in outputs if o.output_type == "error"]
    assert not errors, [f"{o.ename}: {o.evalue}" for o in errors]
    text = "\n".join(o.get("text", "") for o in outputs)
    assert "holds 10.0" in text  # four real ranks summed
    assert "No feedback yet" in text  # the sealed self-study check of ring_1
    assert "ring_allreduce is not implemented yet" in text  # the stub says so
    assert "course.instructor.zygote" in text  # forked as the lab forks it: its entry point
