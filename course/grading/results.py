"""A worker's plain result, checked, then written by the coordinator alone: files and grades.

A worker returns plain data (:func:`course.grading.scratch.grade_task`): the autograded
files as bytes, each grade as (notebook, grade cell, score, needs manual grade), each comment,
the submission's timestamp. :func:`check` refuses anything else before it is used;
:func:`merge` writes the files into ``autograded/<student>/<assignment>/`` (never through a
link, never outside it) and the grades into the one gradebook, in the coordinating process.
"""

from __future__ import annotations

import shutil
import threading
from datetime import datetime
from pathlib import Path
from typing import Any

from course.grading.gradebook import nbgrader_quiet, open_gradebook
from course.grading.intake import write_inert

__all__ = ["WRITING", "BadResultError", "check", "merge"]

# The coordinator's threads (one per assignment graded at once) take turns writing the course.
WRITING = threading.RLock()


class BadResultError(ValueError):
    """A worker's result that is not the plain data a result is made of."""


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _files(value: Any) -> bool:
    """{relative path: bytes}."""
    return isinstance(value, dict) and all(
        isinstance(k, str) and isinstance(v, bytes) for k, v in value.items()
    )


def _check_rows(result: dict) -> None:
    """Grades are (notebook, cell, score, manual?); comments (notebook, cell, text)."""
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


def check(result: Any) -> dict[str, Any]:
    """``result`` if it is a graded result of plain data, else :class:`BadResultError` with why."""
    fields = {"autograded": dict, "left_out": list, "grades": list, "comments": list}
    if not isinstance(result, dict) or any(
        not isinstance(result.get(k), t) for k, t in fields.items()
    ):
        raise BadResultError("a result is a dict of autograded, left_out, grades and comments")
    if not _files(result["autograded"]) or not _files(result.get("feedback", {})):
        raise BadResultError("autograded files and feedback pages are {relative path: bytes}")
    _check_rows(result)
    stamp = result.get("timestamp")
    if stamp is not None and not isinstance(stamp, str):
        raise BadResultError("the timestamp is an ISO date or None")
    if not all(isinstance(x, str) for x in result["left_out"]):
        raise BadResultError("left_out lists strings")
    return result


def merge(root: Path, assignment: str, student: str, result: dict) -> tuple[float, float, list]:
    """Write one checked result into ``root``, files then grades: (score, max, left out)."""
    check(result)
    with WRITING:
        return _merge(root, assignment, student, result)


def _replace(dest: Path, files: dict[str, bytes]) -> None:
    """``dest`` becomes a folder of exactly ``files`` (written aside, then renamed in)."""
    incoming = dest.with_name(f".{dest.name}.incoming")
    shutil.rmtree(incoming, ignore_errors=True)
    write_inert(files, incoming)
    shutil.rmtree(dest, ignore_errors=True)
    incoming.rename(dest)


def _merge(root: Path, assignment: str, student: str, result: dict) -> tuple[float, float, list]:
    _replace(root / "autograded" / student / assignment, result["autograded"])
    feedback = root / "feedback" / student / assignment
    if result.get("feedback"):
        feedback.parent.mkdir(parents=True, exist_ok=True)
        _replace(feedback, result["feedback"])
    else:  # made later by the pipeline's generate_feedback; never a stale page meanwhile
        shutil.rmtree(feedback, ignore_errors=True)
    stamp = datetime.fromisoformat(result["timestamp"]) if result.get("timestamp") else None
    with (
        nbgrader_quiet(),
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
