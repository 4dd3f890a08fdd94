"""Grades out of the real nbgrader gradebook, as a table, checked against the samples' hopes."""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from course.grading.gradebook import open_gradebook
from course.instructor.submissions import Submission

__all__ = [
    "GradeRow",
    "check_expectations",
    "format_grades",
    "grade_rows",
    "near_copies",
]


@dataclass(frozen=True)
class GradeRow:
    """One grade cell of one student's submission, as the gradebook holds it."""

    student: str
    assignment: str
    grade_id: str
    score: float
    max_score: float


def grade_rows(root: Path) -> list[GradeRow]:
    """Every grade of every submission in the course's gradebook."""
    rows = []
    with open_gradebook(root / "gradebook.db") as gb:
        for assignment in gb.assignments:
            for sub in assignment.submissions:
                for nb in sub.notebooks:
                    for g in nb.grades:
                        score = g.score if g.score is not None else float("nan")
                        rows.append(
                            GradeRow(sub.student.id, assignment.name, g.name, score, g.max_score)
                        )
    return sorted(rows, key=lambda r: (r.assignment, r.student))


def near_copies(root: Path) -> dict[tuple[str, str], list[str]]:
    """(student, assignment) -> the functions the judge found to be near copies of the course's
    solutions (``course.grading.copies``), from the autograded notebooks' metadata."""
    found = {}
    for path in sorted(Path(root).glob("autograded/*/*/*.ipynb")):
        try:
            meta = json.loads(path.read_text()).get("metadata", {})
        except (OSError, ValueError):
            continue
        names = meta.get("course", {}).get("near_copies") or []
        if names:
            found[path.parent.parent.name, path.parent.name] = [str(n) for n in names]
    return found


def format_grades(
    rows: Sequence[GradeRow], copies: dict[tuple[str, str], list[str]] | None = None
) -> str:
    """A table per assignment: one line per grade cell, one column per student, totals; then
    the near copies of the course's solutions, for the instructor to look at."""
    out = []
    for assignment in sorted({r.assignment for r in rows}):
        mine = [r for r in rows if r.assignment == assignment]
        students = sorted({r.student for r in mine})
        cells = list(dict.fromkeys(r.grade_id for r in mine))
        score = {(r.grade_id, r.student): r.score for r in mine}
        top = {r.grade_id: r.max_score for r in mine}
        width = max(len(c) for c in [*cells, "total"]) + 8
        out.append(f"{assignment:<{width}}" + "".join(f"{s:>9}" for s in students))
        for c in cells:
            label = f"  {c} ({top[c]:g})"
            out.append(
                f"{label:<{width}}" + "".join(f"{score.get((c, s), 0):>9g}" for s in students)
            )
        label = f"  total ({sum(top.values()):g})"
        totals = [sum(score.get((c, s), 0) for c in cells) for s in students]
        out.append(f"{label:<{width}}" + "".join(f"{t:>9g}" for t in totals))
        for (student, a), names in sorted((copies or {}).items()):
            if a == assignment:
                what = ", ".join(names)
                out.append(f"  flagged: {student}'s {what}: a near copy of the course's solution")
    return "\n".join(out)


def check_expectations(rows: Sequence[GradeRow], subs: Sequence[Submission]) -> list[str]:
    """Where a grade differs from its spec's ``expect`` table (first matching pattern wins)."""
    problems = []
    graded = {(r.student, r.assignment) for r in rows}
    problems += [
        f"{sub.student}/{sub.assignment}: no grades in the gradebook"
        for sub in subs
        if (sub.student, sub.assignment) not in graded
    ]
    for r in rows:
        sub = next(
            (s for s in subs if (s.student, s.assignment) == (r.student, r.assignment)), None
        )
        if sub is None or not sub.expect:
            continue
        pattern = next((p for p in sub.expect if fnmatch.fnmatchcase(r.grade_id, p)), None)
        if pattern is None:
            problems.append(f"{r.student}/{r.assignment}/{r.grade_id}: no expectation matches it")
            continue
        want = sub.expect[pattern]
        want = r.max_score if want == "full" else float(want)
        if r.score != want:
            problems.append(
                f"{r.student}/{r.assignment}/{r.grade_id}: {r.score:g} points, expected {want:g}"
            )
    return problems
