"""A worker's plain result, checked, then written by the coordinator alone: files and grades.

A worker returns plain data (:func:`course.instructor.scratch.grade_task`): the autograded
files as bytes, each grade as (notebook, grade cell, score, needs manual grade), each comment,
the submission's timestamp. :func:`check` refuses anything else before it is used;
:func:`merge` writes the files into ``autograded/<student>/<assignment>/`` (never through a
link, never outside it) and the grades into the one gradebook, in the coordinating process.
"""

from __future__ import annotations

import shutil
import warnings
from datetime import datetime
from pathlib import Path
from typing import Any

from course.instructor.commands import open_gradebook
from course.instructor.intake import write_inert

__all__ = ["BadResultError", "check", "merge"]


class BadResultError(ValueError):
    """A worker's result that is not the plain data a result is made of."""


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def check(result: Any) -> dict[str, Any]:
    """``result`` if it is a graded result of plain data, else :class:`BadResultError` with why."""
    fields = {"autograded": dict, "left_out": list, "grades": list, "comments": list}
    if not isinstance(result, dict) or any(
        not isinstance(result.get(k), t) for k, t in fields.items()
    ):
        raise BadResultError("a result is a dict of autograded, left_out, grades and comments")
    files = result["autograded"].items()
    if not all(isinstance(k, str) and isinstance(v, bytes) for k, v in files):
        raise BadResultError("autograded files are {relative path: bytes}")
    for row in result["grades"]:
        ok = isinstance(row, list | tuple) and len(row) == 4
        if not (ok and all(isinstance(x, str) for x in row[:2]) and isinstance(row[3], bool)):
            raise BadResultError(f"a grade is (notebook, cell, score, manual?): {row!r:.200}")
        if row[2] is not None and not (_number(row[2]) and 0 <= row[2] < 1e6):
            raise BadResultError(f"a score is a number or None: {row[2]!r:.100}")
    for row in result["comments"]:
        ok = isinstance(row, list | tuple) and len(row) == 3
        if not (ok and all(isinstance(x, str) for x in row[:2]) and isinstance(row[2], str | None)):
            raise BadResultError(f"a comment is (notebook, cell, text or None): {row!r:.200}")
    stamp = result.get("timestamp")
    if stamp is not None and not isinstance(stamp, str):
        raise BadResultError("the timestamp is an ISO date or None")
    if not all(isinstance(x, str) for x in result["left_out"]):
        raise BadResultError("left_out lists strings")
    return result


def merge(root: Path, assignment: str, student: str, result: dict) -> tuple[float, float, list]:
    """Write one checked result into ``root``, files then grades: (score, max, left out)."""
    from sqlalchemy.exc import SAWarning

    check(result)
    dest = root / "autograded" / student / assignment
    incoming = dest.with_name(f".{assignment}.incoming")
    shutil.rmtree(incoming, ignore_errors=True)
    write_inert(result["autograded"], incoming)
    shutil.rmtree(dest, ignore_errors=True)
    incoming.rename(dest)
    stamp = datetime.fromisoformat(result["timestamp"]) if result.get("timestamp") else None
    with (
        warnings.catch_warnings(action="ignore", category=SAWarning),  # nbgrader's own noise
        open_gradebook(root / "gradebook.db") as gb,
    ):
        gb.update_or_create_student(student)
        ours = gb.update_or_create_submission(assignment, student, timestamp=stamp)
        for notebook, name, score, manual in result["grades"]:
            mine = gb.find_grade(name, notebook, assignment, student)
            mine.auto_score, mine.needs_manual_grade = score, manual
        for notebook, name, text in result["comments"]:
            gb.find_comment(name, notebook, assignment, student).auto_comment = text
        gb.db.commit()
        return float(ours.score), float(ours.max_score), list(result["left_out"])
