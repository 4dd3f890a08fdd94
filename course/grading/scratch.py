"""One submission autograded in a private scratch course: plain data in, plain data out.

A worker (a thread of the local pool, or a Dask worker on another machine: the same code)
gets a task of plain data from the coordinator (:mod:`course.grading.classrun`): the
submission's files as read inert, the instructor's ``source/<assignment>/``, the course's
``nbgrader_config.py`` and a gradebook holding the assignment's cells and no student's work.
:func:`grade_task` lays them out as a scratch course, runs real ``nbgrader autograde`` there
with the judge, as a uid leased for this submission alone (:mod:`course.grading.slots`),
and returns plain data: the autograded files, the grades and comments nbgrader recorded,
the log's tail. It never touches the class's gradebook: the coordinator alone writes that.

``nbgrader autograde`` itself runs no student code (that runs only in sandboxed processes as
the leased uid, ``$COURSE_SANDBOX_UID``), so when it exits non-zero, or writes no autograded
folder, the fault is the machine's: it is retried once, and a second failure is reported
with the log's tail, never as a score of 0.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import shutil
import socket
import sqlite3
import tempfile
import time
from pathlib import Path
from typing import Any

from course.grading.autograder import autograde_process
from course.grading.gradebook import env
from course.grading.intake import OUTPUT, Rejected, read_inert, write_inert
from course.grading.slots import Lease, kill_uid, lease_uid
from course.grading.warm import run_warm

__all__ = [
    "ATTEMPTS",
    "GradingMachineError",
    "course_task",
    "grade_task",
    "trimmed_gradebook",
]

ATTEMPTS = 2  # a machine-side failure is retried once
LOG_TAIL = 1500  # characters of nbgrader's log a failure carries
FEEDBACK_TIMEOUT = 120.0  # seconds for one student's feedback page

# What nbgrader says when the notebook's own structure is broken (cells renamed, retyped or
# their metadata edited): the submission's fault, not the machine's.
NBGRADER_REFUSALS = (
    "the nbgrader metadata may be corrupted",
    "Notebook failed to validate",
    "Inconsistent checksums",
    "Notebook JSON is invalid",
)
NOT_GRADABLE = (
    "only cells of the released notebook, with their metadata as released, can be graded; "
    "ask for a resubmission made from a fresh copy of the release"
)
# Every student's work in a gradebook, children first: a worker gets the assignment's cells only.
STUDENT_TABLES = ("grade", "comment", "submitted_notebook", "submitted_assignment", "student")


class GradingMachineError(RuntimeError):
    """``nbgrader autograde`` failed on every attempt: the machine's fault, not the work's."""


def trimmed_gradebook(gradebook: Path) -> bytes:
    """The bytes of a copy of ``gradebook`` without any student's work (what workers get)."""
    with tempfile.TemporaryDirectory(prefix="classrun-gradebook-") as tmp:
        copy = Path(tmp) / "gradebook.db"
        shutil.copyfile(gradebook, copy)
        with contextlib.closing(sqlite3.connect(copy)) as con:
            with con:
                for table in STUDENT_TABLES:
                    con.execute(f"DELETE FROM {table}")  # noqa: S608 - the names above
            con.execute("VACUUM")
        return copy.read_bytes()


@functools.cache
def course_version() -> str:
    """A hash of the ``course`` package's code: the checks a worker would grade with."""
    package = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        h.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def course_task(root: Path, assignment: str, gradebook: bytes) -> dict[str, Any]:
    """What every submission of ``assignment`` shares: its source, the config, the gradebook,
    and the version of the course's code it must be graded with."""
    source, _ = read_inert(root, ("source", assignment), OUTPUT, strict=False)
    config = (root / "nbgrader_config.py").read_text()
    return {"assignment": assignment, "source": source, "config": config,
            "gradebook": gradebook, "version": course_version()}  # fmt: skip


def grade_task(course: dict[str, Any], task: dict[str, Any]) -> dict[str, Any]:
    """Autograde one submission (``task``: student, digest, submission files, timeout)."""
    started = time.monotonic()
    result: dict[str, Any] = {"student": task["student"], "digest": task["digest"]}
    result.update(status="failed", error="", worker=f"{socket.gethostname()}:{os.getpid()}")
    try:
        _same_version(course)
        with lease_uid() as lease:  # every process of the uid is killed when it is given back
            result.update(_grade(course, task, lease), status="graded")
    except Rejected as why:  # nbgrader refused the notebook's own structure
        result.update(status="rejected", error=str(why))
    except Exception as err:  # noqa: BLE001 - any failure is the machine's; the run goes on
        result["error"] = f"{type(err).__name__}: {err}"
    result["seconds"] = time.monotonic() - started
    return result


def _same_version(course: dict[str, Any]) -> None:
    """Refuse to grade with checks other than the coordinator's (a worker left on an old commit)."""
    if course.get("version", course_version()) != course_version():
        raise GradingMachineError(
            f"this worker has another version of the course's code ({course_version()}, "
            f"not {course['version']}): install the coordinator's commit on every worker"
        )


def _grade(course: dict[str, Any], task: dict[str, Any], lease: Lease) -> dict[str, Any]:
    """Lay out the scratch course, run nbgrader (retried once), read back what it made."""
    assignment, student = course["assignment"], task["student"]
    scratch = Path(tempfile.mkdtemp(prefix=f"classrun-{student}-"))
    try:
        write_inert(task["submission"], scratch / "submitted" / student / assignment)
        write_inert(course["source"], scratch / "source" / assignment)
        (scratch / "nbgrader_config.py").write_text(course["config"])
        failures = _attempts(scratch, course, student, task["timeout"], lease)
        if failures:
            tail = (scratch / "autograde.log").read_text(errors="replace")[-LOG_TAIL:]
            raise GradingMachineError(
                f"the grading machine failed, not the submission ({'; '.join(failures)}); "
                f"the end of its log:\n{tail}"
            )
        names = (student, assignment)
        files, left_out = read_inert(scratch / "autograded", names, OUTPUT, strict=False)
        return {"autograded": files, "left_out": left_out, "feedback": _feedback(scratch, names),
                **_recorded(scratch, names)}  # fmt: skip
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _attempts(
    scratch: Path, course: dict[str, Any], student: str, timeout: float, lease: Lease
) -> list[str]:
    """Up to ``ATTEMPTS`` runs of nbgrader, each from a fresh gradebook; [] once one worked.

    ``timeout`` caps each attempt; a submission that reaches it is stopped, not retried.
    """
    assignment, failures = course["assignment"], []
    for attempt in range(1, ATTEMPTS + 1):
        shutil.rmtree(scratch / "autograded", ignore_errors=True)
        (scratch / "gradebook.db").write_bytes(course["gradebook"])  # fresh: no half-written try
        code = autograde_process(scratch, assignment, student, timeout, lease)
        if code == 0 and (scratch / "autograded" / student / assignment).is_dir():
            return []
        log = (scratch / "autograde.log").read_text(errors="replace")
        reason = _not_gradable(log)
        if reason:  # the course's own reading of the notebook refused it, and says why
            raise Rejected(f"nbgrader cannot grade this notebook: {reason}")
        refusal = _refusal(log)
        if refusal:  # the notebook itself: another attempt would be refused the same way
            raise Rejected(f"nbgrader cannot grade this notebook ({refusal}): {NOT_GRADABLE}")
        what = f"exited with {code}" if code else f"wrote no autograded/{student}/{assignment}"
        failures.append(f"attempt {attempt}: nbgrader autograde {what}")
        kill_uid(lease.uid)  # the next attempt starts with nothing of this one running
    return failures


def _feedback(scratch: Path, names: tuple[str, str]) -> dict[str, bytes]:
    """The student's feedback page, made here by ``nbgrader generate_feedback`` ({} if it
    failed: the coordinator then makes it as before)."""
    student, assignment = names
    argv = ["generate_feedback", assignment, "--student", student, "--force",
            f"--CourseDirectory.root={scratch}",
            f"--CourseDirectory.db_url=sqlite:///{scratch / 'gradebook.db'}"]  # fmt: skip
    log = scratch / "feedback.log"
    try:
        code = run_warm(scratch, argv, env(), log, FEEDBACK_TIMEOUT)
        pages, _ = read_inert(scratch / "feedback", names, OUTPUT, strict=False)
    except (OSError, TimeoutError, Rejected):
        return {}
    return pages if code == 0 else {}


def _not_gradable(log: str) -> str | None:
    """The reason :class:`course.grading.cells.NotGradable` gave, as nbgrader logged it."""
    marker = "NotGradable: "
    line = next((ln for ln in log.splitlines() if marker in ln), None)
    return line.split(marker, 1)[1].strip()[:500] if line else None


def _refusal(log: str) -> str | None:
    return next((r for r in NBGRADER_REFUSALS if r in log), None)


def _recorded(scratch: Path, names: tuple[str, str]) -> dict[str, Any]:
    """What nbgrader recorded in the scratch gradebook, as plain lists (grades, comments)."""
    from course.grading.gradebook import nbgrader_quiet, open_gradebook

    student, assignment = names
    with (
        nbgrader_quiet(),
        open_gradebook(scratch / "gradebook.db") as gb,
    ):
        theirs = gb.find_submission(assignment, student)
        grades = [
            [nb.name, g.name, g.auto_score, bool(g.needs_manual_grade)]
            for nb in theirs.notebooks
            for g in nb.grades
        ]
        notebooks = theirs.notebooks
        comments = [[nb.name, c.name, c.auto_comment] for nb in notebooks for c in nb.comments]
        stamp = theirs.timestamp.isoformat() if theirs.timestamp else None
    return {"grades": grades, "comments": comments, "timestamp": stamp}
