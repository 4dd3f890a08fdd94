"""One ``nbgrader autograde`` of a scratch course, in a process that dies with its worker.

    code = autograde_process(scratch, "ring_allreduce", "ada", timeout=600, lease=lease)

The process is nbgrader's own command line, run in the scratch course (its
``nbgrader_config.py`` puts the judge in place of a kernel), its log in ``autograde.log``.
It is forked warm (:mod:`course.grading.warm`: nbgrader, the judge and torch already
imported), gets SIGKILL if the worker that started it dies (a killed Dask worker leaves no
grader behind), and is killed with its process group when the time cap is reached.
"""

from __future__ import annotations

from pathlib import Path

from course.grading.sandbox import UID_ENV
from course.grading.slots import Lease
from course.grading.warm import run_warm
from course.instructor.commands import env

__all__ = ["arguments", "autograde_process"]


def arguments(scratch: Path, assignment: str, student: str) -> list[str]:
    """nbgrader's arguments to autograde one student of the scratch course."""
    return [
        "autograde", assignment, "--student", student, "--force",
        f"--CourseDirectory.root={scratch}",
        f"--CourseDirectory.db_url=sqlite:///{scratch / 'gradebook.db'}",
    ]  # fmt: skip


def autograde_process(
    scratch: Path, assignment: str, student: str, timeout: float, lease: Lease
) -> int:
    """Run nbgrader autograde in ``scratch``, its ranks as ``lease``'s uid; its exit code.

    Raises TimeoutError when it runs past ``timeout`` seconds (it is killed first).
    """
    run_env = {**env(), UID_ENV: str(lease.uid)}  # the uid its sandboxed processes run as
    argv = arguments(scratch, assignment, student)
    return run_warm(scratch, argv, run_env, scratch / "autograde.log", timeout)
