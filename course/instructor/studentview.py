"""What students get, as a folder of its own: for a student repository, Binder, or handing out.

    python -m course.instructor.studentview DEST --repo OWNER/NAME   # make student-view DEST=...

``DEST`` gets the release notebooks, the student install of the ``course`` package (without
what :data:`LEFT_OUT` names), ``pyproject.toml`` and ``environment.yml``, a ``postBuild`` that
Binder runs to build the learners' notebooks in ``work/``, and a student README whose Binder
badge opens the first notebook in JupyterLab. It never gets ``source/``, a key in the clear,
or an explanation: with ``--selfstudy`` (the default) the quiz items' check cells are carried
*sealed* in ``selfstudy.json`` (``course.instructor.selfstudy``: honour-based, as the README
says); ``--no-selfstudy`` leaves them out, for graded work.
"""

from __future__ import annotations

import argparse
import json
import shutil
from collections.abc import Sequence
from pathlib import Path

import nbformat

from course.instructor.selfstudy import quiz_items, seal
from course.instructor.workcopies import COURSE_ORDER

__all__ = ["LEFT_OUT", "export", "student_files"]

REPO = Path(__file__).resolve().parents[2]

# What the student install of the package leaves out, in one place: the instructor's tools
# (authoring, release, grading, its sandbox and this export) and the reference ring, a
# working solution (the notebooks measure the ring's traffic with course.ring.traffic).
LEFT_OUT = (
    "course/grading/__init__.py",
    "course/instructor/authoring.py",
    "course/grading/autograder.py",
    "course/grading/classrun.py",
    "course/instructor/commands.py",
    "course/grading/copies.py",
    "course/grading/executors.py",
    "course/instructor/grades.py",
    "course/instructor/hub.py",
    "course/instructor/hubconfig.py",
    "course/grading/intake.py",
    "course/grading/judge.py",
    "course/instructor/pipeline.py",
    "course/grading/quiz.py",
    "course/grading/rankbox.py",
    "course/instructor/reference.py",
    "course/grading/results.py",
    "course/grading/sandbox.py",
    "course/grading/scratch.py",
    "course/grading/slots.py",
    "course/grading/student.py",
    "course/instructor/studentview.py",
    "course/instructor/submissions.py",
    "course/grading/warm.py",
)
TOP_LEVEL = ("pyproject.toml", "environment.yml")
BADGE = "https://mybinder.org/badge_logo.svg"


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
    """Assignment -> grade_id -> the sealed self-study source of each quiz item's check cell."""
    out: dict[str, dict[str, str]] = {}
    for path in sorted(source.glob("*/*.ipynb")):
        if path.stem != path.parent.name:
            continue
        cells = {}
        for q in quiz_items(nbformat.read(path, as_version=4)):
            cells[f"{q.item_id}_check"] = (
                "from course.instructor.selfstudy import feedback\n\n"
                "# Commit to an answer above, then run this cell: it says right or wrong and why.\n"
                f'feedback("{q.name}", {q.name}, choices="{q.choices}", '
                f'sealed="{seal(q.key, q.explanation)}")'
            )
        out[path.stem] = cells
    return out


def export(dest: Path, repo_slug: str, selfstudy: bool = True, repo: Path = REPO) -> list[Path]:
    """Write the student view into ``dest`` (which must not exist); return the files written."""
    dest = Path(dest)
    if dest.exists():
        raise FileExistsError(f"{dest} exists: give a new folder, the export never overwrites")
    for rel in student_files(repo):
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(repo / rel, dest / rel)
    ignore = shutil.ignore_patterns(".ipynb_checkpoints")
    shutil.copytree(repo / "release", dest / "release", ignore=ignore)
    for name in TOP_LEVEL:
        shutil.copy2(repo / name, dest / name)
    assignments = sorted(p.parent.name for p in (dest / "release").glob("*/*.ipynb"))
    first = next((a for a in COURSE_ORDER if a in assignments), assignments[0])
    build = "python -m course.instructor.workcopies work"
    if selfstudy:
        (dest / "selfstudy.json").write_text(json.dumps(seals(repo / "source"), indent=1))
        build += " --seals selfstudy.json"
    post = dest / "postBuild"
    post.write_text(_POSTBUILD.format(build=build))
    post.chmod(0o755)
    (dest / ".gitignore").write_text("work/\n__pycache__/\n*.egg-info/\n.ipynb_checkpoints/\n")
    readme = _README.format(badge=BADGE, url=binder_url(repo_slug, first), first=first, build=build)
    (dest / "README.md").write_text(readme)
    return sorted(p for p in dest.rglob("*") if p.is_file())


_POSTBUILD = """#!/bin/bash
# Binder runs this once, after installing environment.yml (which installs this package):
# it builds the learners' notebooks in work/ from release/ (and selfstudy.json, if present).
set -euo pipefail
{build}
"""

_README = """# Synchronous data-parallel training, measured

[![Binder]({badge})]({url})

Ring all-reduce, what PyTorch DDP does to your gradients, and gradient bucketing: every quiz
item stands next to a cell that measures the answer on real `torch.distributed` ranks (gloo,
on CPU), and you write your own ring all-reduce, comm hook and bucketing.

**On Binder**: press the badge; JupyterLab opens `work/{first}/{first}.ipynb`. The
notebooks in `work/` are yours: save your answers there.

**On your machine** (Python 3.11):

```sh
python -m venv .venv     # the CPU build of torch: the default one brings GBs of CUDA
.venv/bin/pip install --extra-index-url https://download.pytorch.org/whl/cpu -e .
.venv/bin/{build}
.venv/bin/jupyter lab work      # open {first}/{first}.ipynb first
```

`release/` holds the notebooks as handed out; `work/` your copies (never overwritten: run the
second command again after an update to get new notebooks without losing your answers).
"""


def main(argv: Sequence[str] | None = None) -> int:
    """Export the student view and say where its Binder badge points."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dest", type=Path)
    parser.add_argument("--repo", default="OWNER/NAME", help="the student repo on GitHub")
    parser.add_argument("--no-selfstudy", dest="selfstudy", action="store_false")
    args = parser.parse_args(argv)
    files = export(args.dest, args.repo, args.selfstudy)
    print(f"wrote {len(files)} files to {args.dest}; push it as github.com/{args.repo}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
