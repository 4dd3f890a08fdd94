"""One submission autograded in a private scratch course, then merged into the real one.

The scratch course holds a copy of the gradebook, a link to the instructor's ``source/`` and a
no-follow copy of the one submission (:func:`course.instructor.intake.copy_inert`): nbgrader
never sees the student's own folder. ``nbgrader autograde`` itself runs no student code (that
runs only in sandboxed processes as the worker slot's uid, ``$COURSE_SANDBOX_UID``), so when it
exits non-zero, or writes no autograded folder, the fault is the machine's: it is retried
once, and a second failure is reported with the log's tail, never as a score of 0.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

from course.instructor.commands import env, open_gradebook
from course.instructor.intake import OUTPUT, Rejected, copy_inert
from course.instructor.sandbox import UID_ENV
from course.instructor.slots import kill_uid

__all__ = ["ATTEMPTS", "GradingMachineError", "autograde_one", "merge"]

ATTEMPTS = 2  # a machine-side failure is retried once


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


def _refusal(log: str) -> str | None:
    return next((r for r in NBGRADER_REFUSALS if r in log), None)


class GradingMachineError(RuntimeError):
    """``nbgrader autograde`` failed on every attempt: the machine's fault, not the work's."""


def autograde_one(
    root: Path, gradebook: Path, assignment: str, student: str, timeout: float, uid: int
) -> Path:
    """Autograde one submission in a scratch course as ``uid``; return it (caller removes it).

    ``timeout`` caps each attempt; a submission that reaches it is stopped, not retried.
    """
    scratch = Path(tempfile.mkdtemp(prefix=f"classrun-{student}-"))
    try:
        names = (student, assignment)
        copy_inert(root / "submitted", names, scratch / "submitted" / student / assignment)
        os.symlink(root / "source", scratch / "source")  # the instructor's, never the student's
        failures = _attempts(root, scratch, gradebook, assignment, student, timeout, uid)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    if failures:
        tail = (scratch / "autograde.log").read_text(errors="replace")[-1500:]
        shutil.rmtree(scratch, ignore_errors=True)
        raise GradingMachineError(
            f"the grading machine failed, not the submission ({'; '.join(failures)}); "
            f"the end of its log:\n{tail}"
        )
    return scratch


def _attempts(
    root: Path,
    scratch: Path,
    gradebook: Path,
    assignment: str,
    student: str,
    timeout: float,
    uid: int,
) -> list[str]:
    """Up to ``ATTEMPTS`` runs of nbgrader, each from a fresh gradebook; [] once one worked."""
    failures = []
    for attempt in range(1, ATTEMPTS + 1):
        shutil.rmtree(scratch / "autograded", ignore_errors=True)
        shutil.copyfile(gradebook, scratch / "gradebook.db")  # fresh: no half-written try
        code = _run(root, scratch, assignment, student, timeout, uid)
        if code == 0 and (scratch / "autograded" / student / assignment).is_dir():
            return []
        refusal = _refusal((scratch / "autograde.log").read_text(errors="replace"))
        if refusal:  # the notebook itself: another attempt would be refused the same way
            raise Rejected(f"nbgrader cannot grade this notebook ({refusal}): {NOT_GRADABLE}")
        what = f"exited with {code}" if code else f"wrote no autograded/{student}/{assignment}"
        failures.append(f"attempt {attempt}: nbgrader autograde {what}")
        kill_uid(uid)  # the next attempt starts with nothing of this one running
    return failures


def _run(root: Path, scratch: Path, assignment: str, student: str, timeout: float, uid: int) -> int:
    """One ``nbgrader autograde`` of the scratch course, its log in autograde.log; exit code."""
    cmd = [sys.executable, "-m", "nbgrader", "autograde", assignment, "--student", student]
    cmd += [f"--CourseDirectory.root={scratch}", "--force"]
    cmd += [f"--CourseDirectory.db_url=sqlite:///{scratch / 'gradebook.db'}"]
    with open(scratch / "autograde.log", "w") as log:
        run_env = {**env(), UID_ENV: str(uid)}  # the uid its sandboxed processes run as
        proc = subprocess.Popen(cmd, cwd=root, stdout=log, stderr=subprocess.STDOUT,
                                env=run_env, start_new_session=True)  # fmt: skip
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # nbgrader (no kernel); the uid's go later
            proc.wait()
            raise TimeoutError(
                f"autograde took longer than {timeout:.0f} s and was stopped"
            ) from None


def merge(root: Path, scratch: Path, assignment: str, student: str) -> tuple[float, float, list]:
    """Copy one submission's results back (no-follow) and its grades into the gradebook.

    Returns its score, the maximum, and what was left out of ``autograded/`` because it
    was not a plain file (say, a symlink the graded code made in its folder).
    """
    from sqlalchemy.exc import SAWarning

    dest = root / "autograded" / student / assignment
    incoming = dest.with_name(f".{assignment}.incoming")
    shutil.rmtree(incoming, ignore_errors=True)
    names = (student, assignment)
    left_out = copy_inert(scratch / "autograded", names, incoming, OUTPUT, strict=False)
    shutil.rmtree(dest, ignore_errors=True)
    incoming.rename(dest)
    with (
        warnings.catch_warnings(action="ignore", category=SAWarning),  # nbgrader's own noise
        open_gradebook(scratch / "gradebook.db") as src,
        open_gradebook(root / "gradebook.db") as gb,
    ):
        theirs = src.find_submission(assignment, student)
        gb.update_or_create_student(student)
        ours = gb.update_or_create_submission(assignment, student, timestamp=theirs.timestamp)
        for nb in theirs.notebooks:
            for grade in nb.grades:
                mine = gb.find_grade(grade.name, nb.name, assignment, student)
                mine.auto_score = grade.auto_score
                mine.needs_manual_grade = grade.needs_manual_grade
            for comment in nb.comments:
                note = gb.find_comment(comment.name, nb.name, assignment, student)
                note.auto_comment = comment.auto_comment
        gb.db.commit()
        return float(ours.score), float(ours.max_score), left_out
