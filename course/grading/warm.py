"""A warm grader: nbgrader, the judge and torch imported once per worker, forked per submission.

Each submission still gets an ``nbgrader autograde`` process of its own (a fresh address
space, killed as a whole at its time cap), but forked from a private forkserver that has
already imported what every grading process imports (nbgrader's apps and converters,
SQLAlchemy, the judge, the checks, torch): about 3 s of start-up and 1.5 s of imports that
each submission no longer pays. The forkserver runs no student code; nor does its child,
which is ``nbgrader autograde`` with the judge in place of a kernel.

    code = run_warm(scratch, argv, env, log_path, timeout)
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from course.grading.template import template_env
from course.ranks.forkserver import RankProcess, Server

__all__ = ["PRELOAD", "GraderProcess", "run_warm", "warm_up"]

# What an nbgrader autograde with the judge imports, and generate_feedback (one page made:
# course.grading.warmpage); the forkserver imports it once.
PRELOAD = (
    "nbgrader.apps.nbgraderapp",
    "nbgrader.apps.autogradeapp",
    "nbgrader.converters.autograde",
    "nbgrader.preprocessors",
    "nbconvert.exporters",
    "alembic.command",
    "course.grading.judge",
    "course.checks",
    "course.grading.rankbox",
    "nbgrader.apps.generatefeedbackapp",
    "course.grading.warmpage",
)
PR_SET_PDEATHSIG = 1

_SERVER: Server | None = None
_LOCK = threading.Lock()


def _server() -> Server:
    """This process's warm forkserver (started on first use, restarted if it died)."""
    global _SERVER  # noqa: PLW0603 - one forkserver per grading process, made on first use
    with _LOCK:
        if _SERVER is None:
            _SERVER = Server(preload=PRELOAD)
        return _SERVER


def warm_up() -> None:
    """Start the forkserver's imports now (in the background), and those of the template
    its graders' rank boxes fork from (:mod:`course.grading.template`), before the first
    submission needs them: the coordinator's own work before grading (inspecting, reading)
    then overlaps them."""
    _server().get()
    template_env()


class GraderProcess(RankProcess):
    """One ``nbgrader autograde``, forked from the warm forkserver."""

    def run(self) -> None:
        autograde_main(*self._args)


def autograde_main(
    cwd: str,
    argv: list[str],
    env: dict[str, str],
    log: str,
    around: Callable[[], contextlib.AbstractContextManager] | None = None,
) -> None:
    """The child: its own session, dies with the forkserver, logs to ``log``, runs nbgrader
    (within ``around()``, if given: what it starts ahead of nbgrader, and stops after)."""
    os.setsid()  # its own process group: the time cap kills it as a whole
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115 - the child's own stdout until it exits
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115 - (same)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    sys.argv = ["nbgrader", *argv]
    from nbgrader.apps.nbgraderapp import main

    try:
        with around() if around else contextlib.nullcontext():
            main()
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    except BaseException:  # noqa: BLE001 - reported in the log; the exit code says it failed
        import traceback

        traceback.print_exc()
        code = 1
    else:
        code = 0
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def run_warm(
    cwd: Path,
    argv: list[str],
    env: dict[str, str],
    log: Path,
    timeout: float,
    around: Callable[[], contextlib.AbstractContextManager] | None = None,
) -> int:
    """Run ``nbgrader <argv>`` forked warm in ``cwd``; its exit code.

    ``around`` (picklable) is entered in the child around nbgrader's run. Raises
    TimeoutError when it runs past ``timeout`` seconds (its group is killed first).
    """
    args = (str(cwd), list(argv), dict(env), str(log), around)
    proc = GraderProcess(args=args, name="autograde")
    proc.server = _server()
    proc.start()
    proc.join(timeout)
    if proc.exitcode is None:
        proc.kill_group()  # never by a pid it may no longer hold
        proc.join()
        raise TimeoutError(f"autograde took longer than {timeout:.0f} s and was stopped")
    return proc.exitcode
