"""Students' work copies: the notebooks they open and fill in, never the committed release.

    python -m course.instructor.workcopies work               # from release/ (make lab)
    python -m course.instructor.workcopies work --from selfstudy   # from a self-study build
    python -m course.instructor.workcopies work --seals selfstudy.json  # self-study, from release/

Each ``<from>/<a>/<a>.ipynb`` is copied to ``<dest>/<a>/<a>.ipynb`` unless that copy already
exists: answers a student saved are never overwritten, and a notebook added to the course
later is copied in on the next run. ``work/`` is git-ignored, so ``release/`` stays exactly
what nbgrader generated. With ``--seals`` (written by ``course.instructor.studentview``) the
copies are self-study notebooks: each quiz item's check cell becomes the sealed
``feedback(...)`` call of ``course.instructor.selfstudy``, so a learner without ``source/``
(on Binder, say) gets instant feedback.
"""

from __future__ import annotations

import argparse
import json
import shutil
from collections.abc import Sequence
from pathlib import Path

import nbformat

__all__ = ["make_work_copies", "with_seals"]

# The order the course is taken in; an assignment not listed comes after, by name.
COURSE_ORDER = (
    "ring_allreduce",
    "ddp_gradients",
    "buckets",
    "accumulation",
    "zero",
    "fsdp",
    "synchrony",
    "fault_tolerance",
)


def course_order(path: Path) -> tuple[int, str]:
    """Sort key of ``<a>/<a>.ipynb``: the course's order first, then the name."""
    name = path.stem
    rank = COURSE_ORDER.index(name) if name in COURSE_ORDER else len(COURSE_ORDER)
    return rank, name


def with_seals(nb: nbformat.NotebookNode, seals: dict[str, str]) -> nbformat.NotebookNode:
    """A release notebook as a self-study one: each check cell named in ``seals`` (grade_id ->
    cell source) replaced; nothing is graded, so nbgrader's metadata goes, locks stay."""
    for cell in nb.cells:
        meta = cell.metadata.pop("nbgrader", {})
        if meta.get("grade_id") in seals:
            cell.source = seals[meta["grade_id"]]
        if meta.get("locked") and not meta.get("solution"):
            cell.metadata.update(editable=False, deletable=False)
    return nb


def make_work_copies(
    dest: Path, origin: Path, seals: dict[str, dict[str, str]] | None = None
) -> tuple[list[Path], list[Path]]:
    """Copy every ``origin/<a>/<a>.ipynb`` missing from ``dest``; return (copied, kept).
    ``seals`` (assignment -> grade_id -> source) makes them self-study notebooks."""
    copied, kept = [], []
    for src in sorted(Path(origin).glob("*/*.ipynb")):
        if src.stem != src.parent.name:
            continue
        target = Path(dest) / src.parent.name / src.name
        if target.exists():
            kept.append(target)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        if seals is None:
            shutil.copyfile(src, target)
        else:
            nb = with_seals(nbformat.read(src, as_version=4), seals.get(src.stem, {}))
            nbformat.write(nb, target)
        copied.append(target)
    return copied, kept


def main(argv: Sequence[str] | None = None) -> int:
    """Make the work copies and say which notebook to open first."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dest", nargs="?", default="work", type=Path)
    parser.add_argument("--from", dest="origin", default="release", type=Path)
    parser.add_argument("--seals", type=Path, help="a studentview seals file: self-study copies")
    args = parser.parse_args(argv)
    origin = args.origin if args.origin.is_absolute() else Path.cwd() / args.origin
    seals = json.loads(args.seals.read_text()) if args.seals else None
    copied, kept = make_work_copies(args.dest, origin, seals)
    if not copied and not kept:
        print(f"no notebooks in {origin}: nothing to copy")
        return 1
    for path in copied:
        print(f"new work copy: {path}")
    if kept:
        print(f"kept {len(kept)} work copies with your answers in {args.dest}/")
    first = min(copied + kept, key=course_order)
    print(f"open {first.relative_to(args.dest)} in JupyterLab (under {args.dest}/)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
