"""One ``nbgrader autograde`` of a scratch course, in a process that dies with its worker.

    code = autograde_process(scratch, "ring_allreduce", "ada", timeout=600, lease=lease)

The process is nbgrader's own command line, run in the scratch course (its
``nbgrader_config.py`` puts the judge in place of a kernel), its log in ``autograde.log``.
It is forked warm (:mod:`course.grading.warm`: nbgrader, the judge and torch already
imported), starts the submission's confined forkserver before nbgrader's own start-up (forked
from this process's template, :mod:`course.grading.template`; the judge takes it over), gets
SIGKILL if the worker that started it dies (a killed Dask worker leaves no grader behind),
and is killed with its process group when the time cap is reached.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from pathlib import Path

from course.grading.gradebook import env
from course.grading.sandbox import UID_ENV
from course.grading.slots import Lease
from course.grading.template import template_env
from course.grading.warm import run_warm

__all__ = ["arguments", "autograde_process"]


def arguments(scratch: Path, assignment: str, student: str) -> list[str]:
    """nbgrader's arguments to autograde one student of the scratch course."""
    return [
        "autograde", assignment, "--student", student, "--force",
        f"--CourseDirectory.root={scratch}",
        f"--CourseDirectory.db_url=sqlite:///{scratch / 'gradebook.db'}",
    ]  # fmt: skip


@contextlib.contextmanager
def _rank_box(db_url: str, assignment: str, student: str, root: str) -> Iterator[None]:
    """In the grading child: the judge's forkserver, started ahead (the coordinator that
    imports this module never imports the judge, nor torch)."""
    from course.grading.early import rank_box_started

    with rank_box_started(db_url, assignment, student, root):
        yield


def autograde_process(
    scratch: Path, assignment: str, student: str, timeout: float, lease: Lease
) -> int:
    """Run nbgrader autograde in ``scratch``, its ranks as ``lease``'s uid; its exit code.

    Raises TimeoutError when it runs past ``timeout`` seconds (it is killed first).
    """
    # The uid its sandboxed processes run as, and the template its box's forkserver forks from.
    run_env = {**env(), UID_ENV: str(lease.uid), **template_env()}
    argv = arguments(scratch, assignment, student)
    # The confined forkserver starts while nbgrader starts up.
    db_url = f"sqlite:///{scratch / 'gradebook.db'}"
    box = functools.partial(_rank_box, db_url, assignment, student, str(scratch))
    return run_warm(scratch, argv, run_env, scratch / "autograde.log", timeout, around=box)
