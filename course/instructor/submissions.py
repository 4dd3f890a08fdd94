"""Sample submissions: TOML specs in ``autograde/submissions/`` assembled onto the release.

Each spec names a student and, per assignment, how to answer the quiz ("key", "wrong", a
letter, blank) and what to put in each solution cell (the source's solution, text, the stub).
The notebook handed in is the committed release notebook with only its solution cells
changed, so samples never go stale (format in autograde/README.md).
"""

from __future__ import annotations

import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import nbformat
from nbformat import NotebookNode

from course.grading.gradebook import open_gradebook
from course.instructor.selfstudy import grade_id, quiz_items

__all__ = ["SPECS", "Submission", "assemble", "load_specs", "submit"]

SPECS = Path(__file__).resolve().parents[2] / "autograde" / "submissions"
_MARKERS = ("BEGIN SOLUTION", "END SOLUTION")


@dataclass(frozen=True)
class Submission:
    """One student's submission of one assignment, as a spec in autograde/submissions/."""

    student: str
    assignment: str
    answers: dict[str, str] = field(default_factory=dict)
    cells: dict[str, str] = field(default_factory=dict)
    expect: dict[str, str | float] = field(default_factory=dict)
    first_name: str = ""
    last_name: str = ""
    timestamp: str | None = None


def load_specs(folder: Path = SPECS) -> list[Submission]:
    """Every submission of every ``<student>.toml`` spec in ``folder``."""
    subs = []
    for path in sorted(Path(folder).glob("*.toml")):
        spec = tomllib.loads(path.read_text())
        who = spec.pop("student", {})
        for assignment, part in spec.items():
            subs.append(
                Submission(
                    student=path.stem,
                    assignment=assignment,
                    answers=_as_table(part.get("answers", "key")),
                    cells=_as_table(part.get("cells", "solution")),
                    expect=dict(part.get("expect", {})),
                    first_name=who.get("first_name", ""),
                    last_name=who.get("last_name", ""),
                    timestamp=part.get("timestamp"),
                )
            )
    return subs


def _as_table(value: str | dict[str, str]) -> dict[str, str]:
    return {"*": value} if isinstance(value, str) else dict(value)


def _pick(table: dict[str, str], name: str, default: str) -> str:
    return table.get(name, table.get("*", default))


def _letter(choice: str, key: str, choices: str) -> str:
    """A spec's answer: a letter, "key" (the right one), "wrong" (another one) or ""."""
    if choice == "key":
        return key
    if choice == "wrong":
        return next(c for c in choices if c != key)
    return choice


def _without_markers(source: str) -> str:
    return "\n".join(x for x in source.split("\n") if not any(m in x for m in _MARKERS))


def assemble(sub: Submission, release_nb: NotebookNode, source_nb: NotebookNode) -> NotebookNode:
    """The student's notebook: the release with the spec's answers and cells filled in."""
    nb = nbformat.from_dict(release_nb)
    items = {q.item_id: q for q in quiz_items(source_nb)}
    solutions = {grade_id(c): c.source for c in source_nb.cells if grade_id(c)}
    known = {"*"}
    for cell in nb.cells:
        gid = grade_id(cell)
        if not cell.metadata.get("nbgrader", {}).get("solution"):
            continue
        item = items.get(gid.removesuffix("_answer")) if gid.endswith("_answer") else None
        if item is not None:
            known.add(item.item_id)
            letter = _letter(_pick(sub.answers, item.item_id, "key"), item.key, item.choices)
            if letter:
                cell.source = _answer_source(cell.source, item.name, letter)
            continue
        known.add(gid)
        text = _pick(sub.cells, gid, "solution")
        if text == "solution":
            cell.source = _without_markers(solutions[gid])
        elif text != "stub":
            cell.source = text.strip("\n")
    unknown = (set(sub.answers) | set(sub.cells)) - known
    if unknown:
        raise ValueError(
            f"{sub.student}.toml, [{sub.assignment}]: no answer or solution cell "
            f"{sorted(unknown)} in the release notebook; fix the spec's names"
        )
    return nb


def _answer_source(stub: str, name: str, letter: str) -> str:
    line = f'{name} = "{letter}"'
    lines = stub.split("\n")
    if "# YOUR CODE HERE" in lines:
        return "\n".join(line if x == "# YOUR CODE HERE" else x for x in lines)
    return stub + "\n" + line


def submit(root: Path, subs: Sequence[Submission]) -> list[Path]:
    """Write each submission to submitted/<student>/<a>/<a>.ipynb with its timestamp.txt."""
    written = []
    for sub in subs:
        a = sub.assignment
        release_nb = nbformat.read(root / "release" / a / f"{a}.ipynb", as_version=4)
        source_nb = nbformat.read(root / "source" / a / f"{a}.ipynb", as_version=4)
        dest = root / "submitted" / sub.student / a
        dest.mkdir(parents=True, exist_ok=True)
        nbformat.write(assemble(sub, release_nb, source_nb), dest / f"{a}.ipynb")
        stamp = sub.timestamp or datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S.%f %Z")
        (dest / "timestamp.txt").write_text(stamp + "\n")
        written.append(dest / f"{a}.ipynb")
    _declare_students(root, subs)
    return written


def _declare_students(root: Path, subs: Sequence[Submission]) -> None:
    with open_gradebook(root / "gradebook.db") as gb:
        for sub in subs:
            gb.update_or_create_student(
                sub.student, first_name=sub.first_name, last_name=sub.last_name
            )
