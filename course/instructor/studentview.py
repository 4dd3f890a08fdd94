"""What students get, as a folder of its own: for a student repository, Binder, or handing out.

    python -m course.instructor.studentview DEST --repo OWNER/NAME   # make student-view DEST=...
    python -m course.instructor.studentview DEST --selfstudy         # make student-view SELFSTUDY=1

``DEST`` gets the release notebooks, the student install of the ``course`` package (without
what :data:`LEFT_OUT` names), a ``pyproject.toml`` and an ``environment.yml`` of its own (the
course's packages, none of its tests or tools), a ``postBuild`` that Binder runs to turn off
nbgrader's instructor views and build the notebooks in ``work/``, and a README whose Binder
badge opens the first notebook in JupyterLab. It never gets ``source/``, a key in the clear
or an explanation. By default it is the graded view: no key at all. With ``--selfstudy`` the
quiz items' check cells travel *sealed* in ``selfstudy.json`` (``course.instructor.selfstudy``:
honour-based, and its README says it must not be used for graded work), with the exercises'
hidden checks, so that self-study copies check as much as the grader does.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tomllib
from collections.abc import Sequence
from pathlib import Path

import nbformat

from course.instructor.selfstudy import grade_id, quiz_items, seal, strip_hidden_markers
from course.instructor.studentlab import CULL_IDLE
from course.instructor.workcopies import COURSE_ORDER

__all__ = ["LEFT_OUT", "export", "student_files"]

REPO = Path(__file__).resolve().parents[2]

# What the student install of the package leaves out, in one place: the instructor's tools
# (authoring, the quiz bank's figures, release, grading, its sandbox and this export) and the
# reference ring, a working solution (the notebooks measure gloo's own ring on the wire).
LEFT_OUT = (
    "course/grading/__init__.py",
    "course/grading/autograder.py",
    "course/grading/classrun.py",
    "course/grading/copies.py",
    "course/grading/executors.py",
    "course/grading/intake.py",
    "course/grading/judge.py",
    "course/grading/quiz.py",
    "course/grading/rankbox.py",
    "course/grading/results.py",
    "course/grading/sandbox.py",
    "course/grading/scratch.py",
    "course/grading/slots.py",
    "course/grading/student.py",
    "course/grading/warm.py",
    "course/instructor/authoring.py",
    "course/instructor/bank.py",
    "course/instructor/commands.py",
    "course/instructor/cues.py",
    "course/instructor/grades.py",
    "course/instructor/hub.py",
    "course/instructor/hubconfig.py",
    "course/instructor/lab.py",
    "course/instructor/pipeline.py",
    "course/instructor/reference.py",
    "course/instructor/studentview.py",
    "course/instructor/submissions.py",
)
BADGE = "https://mybinder.org/badge_logo.svg"
CPU_TORCH = "https://download.pytorch.org/whl/cpu"


def student_files(repo: Path = REPO) -> list[Path]:
    """The package's files a student gets, relative to ``repo``."""
    files = sorted(p.relative_to(repo) for p in (repo / "course").rglob("*.py"))
    return [f for f in files if f.as_posix() not in LEFT_OUT and "__pycache__" not in f.parts]


def binder_url(repo_slug: str, first: str) -> str:
    """A mybinder.org link that opens ``work/<first>/<first>.ipynb`` in JupyterLab."""
    return (
        f"https://mybinder.org/v2/gh/{repo_slug}/HEAD?urlpath=lab/tree/work/{first}/{first}.ipynb"
    )


def seals(source: Path) -> dict[str, dict[str, str]]:
    """Assignment -> grade_id -> the self-study source of each grade cell: a quiz item's check
    sealed, an exercise's check with its hidden part (no key there: it runs the same checks)."""
    out: dict[str, dict[str, str]] = {}
    for path in sorted(source.glob("*/*.ipynb")):
        if path.stem != path.parent.name:
            continue
        nb = nbformat.read(path, as_version=4)
        cells = {
            grade_id(c): strip_hidden_markers(c.source)
            for c in nb.cells
            if c.cell_type == "code" and c.metadata.get("nbgrader", {}).get("grade")
        }
        for q in quiz_items(nb):
            cells[f"{q.item_id}_check"] = (
                "from course.instructor.selfstudy import feedback\n\n"
                "# Commit to an answer above, then run this cell: it says right or wrong and why.\n"
                f'feedback("{q.name}", {q.name}, choices="{q.choices}", '
                f'sealed="{seal(q.key, q.explanation)}")'
            )
        out[path.stem] = cells
    return out


def topics(release: Path) -> list[tuple[str, str]]:
    """(assignment, its notebook's title) in the course's order: what the view ships."""
    found = []
    for path in sorted(release.glob("*/*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        title = next((c.source for c in nb.cells if c.cell_type == "markdown"), "").splitlines()
        found.append((path.stem, (title or [path.stem])[0].lstrip("# ").strip()))
    order = {a: i for i, a in enumerate(COURSE_ORDER)}
    return sorted(found, key=lambda t: (order.get(t[0], len(order)), t[0]))


def pyproject(repo: Path) -> str:
    """The student install's pyproject.toml: the course's packages, no tests, no tools."""
    project = tomllib.loads((repo / "pyproject.toml").read_text())["project"]
    deps = "".join(f'    "{d}",\n' for d in project["dependencies"])
    return _PYPROJECT.format(
        version=project["version"],
        python=project["requires-python"],
        license=project["license"],
        deps=deps,
    )


def environment(repo: Path) -> str:
    """The course's environment.yml, its opening comment for the student view."""
    lines = (repo / "environment.yml").read_text().splitlines()
    while lines and lines[0].startswith("#"):
        lines.pop(0)
    return "\n".join([_ENV_HEAD, *lines]) + "\n"


def export(dest: Path, repo_slug: str, selfstudy: bool = False, repo: Path = REPO) -> list[Path]:
    """Write the student view into ``dest`` (which must not exist); return the files written.
    ``selfstudy`` adds the sealed keys: never for graded work."""
    dest = Path(dest)
    if dest.exists():
        raise FileExistsError(f"{dest} exists: give a new folder, the export never overwrites")
    for rel in student_files(repo):
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(repo / rel, dest / rel)
    ignore = shutil.ignore_patterns(".ipynb_checkpoints")
    shutil.copytree(repo / "release", dest / "release", ignore=ignore)
    (dest / "pyproject.toml").write_text(pyproject(repo))
    (dest / "environment.yml").write_text(environment(repo))
    shipped = topics(dest / "release")
    first = shipped[0][0]
    build = "python -m course.instructor.workcopies work"
    if selfstudy:
        (dest / "selfstudy.json").write_text(json.dumps(seals(repo / "source"), indent=1))
        build += " --seals selfstudy.json"
    post = dest / "postBuild"
    post.write_text(_POSTBUILD.format(build=build))
    post.chmod(0o755)
    (dest / ".gitignore").write_text("work/\n__pycache__/\n*.egg-info/\n.ipynb_checkpoints/\n")
    listing = "".join(f"{i}. `{a}`: {title}\n" for i, (a, title) in enumerate(shipped, 1))
    readme = _README.format(
        badge=BADGE,
        url=binder_url(repo_slug, first),
        first=first,
        build=build,
        count=len(shipped),
        topics=listing,
        kind=_SELFSTUDY if selfstudy else _GRADED,
        cpu=CPU_TORCH,
        cull=CULL_IDLE // 60,
    )
    (dest / "README.md").write_text(readme)
    return sorted(p for p in dest.rglob("*") if p.is_file())


_POSTBUILD = """#!/bin/bash
# Binder runs this once, after installing environment.yml (which installs this package):
# it turns off nbgrader's instructor views and builds the notebooks in work/ from release/
# (and selfstudy.json, if present).
set -euo pipefail
python -m course.instructor.studentlab
{build}
"""

_PYPROJECT = """[build-system]
requires = ["setuptools>=69"]
build-backend = "setuptools.build_meta"

[project]
name = "course"
version = "{version}"
description = "Synchronous data-parallel training, measured: the notebooks' package, for students"
readme = "README.md"
requires-python = "{python}"
license = "{license}"
dependencies = [
{deps}]

# Kernels forked from a zygote that imported the course (course/instructor/forkedkernels.py)
[project.entry-points."jupyter_client.kernel_provisioners"]
course-forked = "course.instructor.forkedkernels:ForkedProvisioner"

[tool.setuptools.packages.find]
include = ["course*"]
"""

_ENV_HEAD = "# conda / Binder environment of this course: the same packages as pyproject.toml."

_GRADED = """These are the notebooks as handed out for graded work: they hold no answers and no
keys. Each check cell says whether an item is answered; answers are marked when graded."""

_SELFSTUDY = """This copy is for **self-study**: each quiz item gives instant feedback and its
explanation once you commit to an answer, and each exercise runs every check the grader
runs. The keys travel sealed in `selfstudy.json`, which keeps them from being read at a
glance but does not keep them secret: **do not use this copy for graded work**; graded work
is done in the graded view, which carries no key at all."""

_README = """# Synchronous data-parallel training, measured

[![Binder]({badge})]({url})

{count} notebooks on how data-parallel training keeps its ranks in step. Every quiz item
stands next to a cell that measures the answer on real `torch.distributed` ranks (gloo, on
CPU), and you write the algorithms yourself:

{topics}
{kind}

**On Binder**: press the badge; JupyterLab opens `work/{first}/{first}.ipynb`. The
notebooks in `work/` are yours: save your answers there. Binder gives all you open 2 GB, and
the whole course open and run holds about 1.2 GB of it; a kernel idle for {cull} minutes is
shut down all the same: its outputs stay, and running the notebook again goes on.

**On your machine** (Python 3.11):

```sh
python -m venv .venv     # the CPU build of torch: the default one brings GBs of CUDA
.venv/bin/pip install --extra-index-url {cpu} -e .
.venv/bin/python -m course.instructor.studentlab     # nbgrader's instructor views off
.venv/bin/{build}
.venv/bin/jupyter lab --LabApp.default_url=/lab/tree/work/{first}/{first}.ipynb
```

**Without a network** pip can reach neither index. On a machine that has one, download
everything into a folder, copy it next to this one, and install from it:

```sh
pip download --dest wheels --extra-index-url {cpu} . setuptools   # online
.venv/bin/pip install --no-index --find-links wheels -e .             # offline
```

`release/` holds the notebooks as handed out; `work/` your copies (never overwritten: run the
`workcopies` command again after an update to get new notebooks without losing your answers).
"""


def main(argv: Sequence[str] | None = None) -> int:
    """Export the student view and say where its Binder badge points."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dest", type=Path)
    parser.add_argument("--repo", default="OWNER/NAME", help="the student repo on GitHub")
    parser.add_argument(
        "--selfstudy", action="store_true", help="add sealed keys: self-study, never graded work"
    )
    args = parser.parse_args(argv)
    files = export(args.dest, args.repo, args.selfstudy)
    kind = "self-study view (sealed keys: not for graded work)" if args.selfstudy else "graded view"
    print(
        f"wrote the {kind}, {len(files)} files, to {args.dest}; push it as github.com/{args.repo}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
