"""Where a submission's code runs during grading: ranks forked from a confined forkserver.

    with RankBox() as box:          # every course.ranks launch in here runs confined
        check_ring_sums(StudentCode(cells, "ring_allreduce"))

The forkserver runs inside :func:`course.grading.sandbox.confine` (no network, a read-only
view of Python and the ``course`` package with the instructor's modules and their bytecode
left out, none of the course's sources, gradebook or submissions), as the uid in
``COURSE_SANDBOX_UID`` (one per submission graded at a time, so the process limit, counted
per uid, is its own), with a size-capped scratch folder as the only place it may write. It
is forked there from this grading process's template, torch already imported
(:mod:`course.grading.template`), or, where that cannot be, started there fresh. It and its
ranks have a PID namespace of their own (no other process is in their view: not the
grader's, not another submission's); the launcher translates the pids the forkserver
reports into its own, so it stops them as usual, and what they send back is plain data
(:mod:`course.ranks.confined`).

The scratch folder is root's (``0711``): the ranks write their own working folder in it,
``work/``, and the run folders the launcher makes in ``runs/`` (root's too), so no folder in
which the grader, as root, creates or chowns anything can be written by the sandbox uid (a
rank cannot swap a run folder for a link between its creation and its chown). Every process
of the box is in its cgroups (:mod:`course.grading.cgroups`: memory, processes and CPU share
for the submission as a whole), all killed when the box ends.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import psutil

from course.grading.cgroups import Cgroups
from course.grading.sandbox import Limits, confine, give_to_sandbox, sandbox_uid
from course.grading.slots import owned_by
from course.grading.template import BoxServer
from course.ranks.confined import confined_launches

__all__ = ["HIDDEN", "RankBox", "discard_early", "start_early", "sweep_stale_scratch"]

COURSE = Path(__file__).resolve().parents[1]
# The instructor's modules (the reference ring, the quiz bank) and their bytecode: the
# student install has none, and on graded ranks the folder is empty.
HIDDEN = (COURSE / "instructor",)
LIMITS = Limits(file_size=64 * 2**20, tmp_size=64 * 2**20)
SCRATCH_SIZE = "256m"  # the scratch folder's size cap, when it can be a tmpfs (as root)


class RankBox:
    """A confined forkserver and its scratch folder, for the duration of a ``with``."""

    def __init__(
        self, uid: int | None = None, ddp: bool = True, preload: tuple[str, ...] = ()
    ) -> None:
        """``uid``: default ``COURSE_SANDBOX_UID``, which is then this submission's alone;
        ``ddp``: the checks train with DDP (a forkserver started fresh then imports
        ``torch._dynamo``; the template has);
        ``preload``: more modules the forkserver imports once, so that no rank forked from it
        imports them again (the instructor's setup imports, the built-ins the checks refuse)."""
        self.uid = sandbox_uid() if uid is None else uid
        self.ddp = ddp
        self.preload = tuple(preload)
        self.exclusive = uid is None and "COURSE_SANDBOX_UID" in os.environ
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> Self:
        early = next((box for box in _EARLY if box.options() == self.options()), None)
        if early is not None:  # started by start_early: take over its server and its cleanup
            _EARLY.remove(early)
            self._stack, self.server = early._stack, early.server  # noqa: SLF001 - the same class's
            self._runs, self.cgroups = early._runs, early.cgroups  # noqa: SLF001 - the same class's
        else:
            self._start()
        launches = confined_launches(
            self.server, self._runs, self._share, self._cleanup, self.cgroups.memory_used
        )
        self._stack.enter_context(launches)
        return self

    def options(self) -> tuple:
        """What makes two boxes' forkservers the same: uid, DDP or not, preload."""
        return (self.uid, self.ddp, self.preload, self.exclusive)

    def _start(self) -> None:
        """Make the scratch folder and the wrapper, and start the forkserver's imports."""
        sweep_stale_scratch()
        private = Path(tempfile.mkdtemp(prefix=PREFIX))  # the wrapper lives here
        (private / OWNER).write_text(str(os.getpid()))
        self._stack.callback(shutil.rmtree, private, ignore_errors=True)
        scratch = private / "scratch"
        scratch.mkdir()
        if _mount_tmpfs(scratch):
            self._stack.callback(_unmount, scratch)
        work, runs = scratch / "work", scratch / "runs"
        work.mkdir()
        runs.mkdir()
        self._share(str(work))
        # The confined uid may pass through these, not list or change what is in them.
        for folder in (private, scratch, runs):
            os.chmod(folder, 0o711)  # noqa: S103 - execute-only for others, on purpose
        # Killed as a whole when the box ends (course.grading.cgroups), whatever hid in it.
        self.cgroups = self._stack.enter_context(Cgroups())
        join = "".join(f"echo $$ > {shlex.quote(f)} || exit 70\n" for f in self.cgroups.procs)
        hide = [str(p) for p in HIDDEN]
        wrappers = {}  # the cold forkserver's Python, and the stub a warm one enters
        for name, cmd in (
            ("python", [sys.executable]),
            ("stub", [shutil.which("sleep") or "sleep", "infinity"]),
        ):
            argv = confine(
                cmd, rw=[str(scratch)], cwd=str(work), limits=LIMITS, uid=self.uid, hide=hide
            )
            wrappers[name] = private / name
            wrappers[name].write_text(f'#!/bin/sh\n{join}exec {shlex.join(argv)} "$@"\n')
            wrappers[name].chmod(0o700)
        preload = ("course.ranks.nodump", "course.checks", "course.grading.student", *self.preload)
        entry = {"procs": self.cgroups.procs, "cwd": str(work), "uid": self.uid, "limits": LIMITS}
        self.server = BoxServer(
            str(wrappers["python"]), str(wrappers["stub"]), entry, preload, self.ddp
        )
        self._stack.callback(self.server.stop)
        self._stack.callback(self._kill_server)  # first: stop() then only reaps
        self._runs = str(runs)
        self.server.get()  # its imports run from now on, while the caller goes on

    def __exit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stack.close()

    def _share(self, path: str) -> None:
        """Hand a folder to the confined uid (when we are root; else it is ours already)."""
        give_to_sandbox(path, self.uid)

    def _kill_server(self) -> None:
        """SIGKILL what bwrap runs (the forkserver): nothing in it is kept, and the orderly
        exit of an interpreter that imported torch costs a second of every submission. bwrap
        then exits on its own, and the server's stop() reaps it."""
        bwrap = self.server.pid()
        with contextlib.suppress(psutil.Error, ValueError):
            for proc in psutil.Process(bwrap).children(recursive=True) if bwrap else ():
                with contextlib.suppress(psutil.Error):
                    proc.kill()

    def _cleanup(self) -> None:
        """After a launch, kill every process of our uid but the forkserver (its ranks, and
        anything they started in a session of its own): only when the uid is ours alone."""
        if not self.exclusive or os.geteuid() != 0:
            return
        keep = (self.server.server_pid(), self.server.stub_pid())
        for proc in self._owned():
            with contextlib.suppress(psutil.Error):
                if proc.pid not in keep:
                    proc.kill()

    def _owned(self) -> list[psutil.Process]:
        """The live processes of the box's uid: those of its cgroups, where it has any (every
        process the box starts is in them, and cannot leave), not every process on the
        machine looked at (3 ms after each launch, on a busy one)."""
        return owned_by(self.uid, self.cgroups.pids() if self.cgroups.dirs else None)


_EARLY: list[RankBox] = []  # started ahead by start_early, not yet taken over


def start_early(**options: Any) -> None:
    """Start the forkserver of ``RankBox(**options)`` now, in the background: the next
    ``with RankBox(**options)`` of this process takes it over, its imports done or under way
    (a grader starts it before nbgrader's own start-up, which the imports then overlap)."""
    box = RankBox(**options)
    box._start()  # noqa: SLF001 - the same class's
    _EARLY.append(box)


def discard_early() -> None:
    """Stop every forkserver started early that no box took over."""
    while _EARLY:
        _EARLY.pop()._stack.close()  # noqa: SLF001 - the same class's


PREFIX, OWNER = "course-grader-", "owner"
UNOWNED_AGE = 600.0  # seconds: a folder with no owner file yet older than this was left behind


def sweep_stale_scratch(tmp: str | None = None) -> list[Path]:
    """Unmount and remove the scratch of every box whose process is gone (root only).

    A box unmounts its tmpfs when it ends; a grader killed outright (SIGKILL at nbgrader's
    cap, a machine fault) cannot, and its mount would stay until reboot. Each box's folder
    names the pid that made it; the next box started on the machine sweeps those whose pid
    is dead. Returns the folders removed."""
    if os.geteuid() != 0:
        return []
    gone = []
    for private in Path(tmp or tempfile.gettempdir()).glob(f"{PREFIX}*"):
        if not private.is_dir() or private.is_symlink() or _alive(private):
            continue
        scratch = private / "scratch"
        if scratch.is_mount():
            _unmount(scratch)
        shutil.rmtree(private, ignore_errors=True)
        gone.append(private)
    return gone


def _alive(private: Path) -> bool:
    """Is the process that made ``private`` still running (or too young to tell)?"""
    try:
        return psutil.pid_exists(int((private / OWNER).read_text()))
    except FileNotFoundError:
        try:
            return time.time() - private.stat().st_mtime < UNOWNED_AGE
        except OSError:
            return True
    except (OSError, ValueError):
        return True


def _unmount(path: Path) -> None:
    """Detach the tmpfs at ``path`` (lazily: a process still inside it keeps it until it ends)."""
    subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)


def _mount_tmpfs(path: Path) -> bool:
    """Make ``path`` a size-capped tmpfs (root only); False where that is not allowed."""
    if os.geteuid() != 0 or not shutil.which("mount"):
        return False
    cmd = ["mount", "-t", "tmpfs", "-o", f"size={SCRATCH_SIZE},mode=0711", "tmpfs", str(path)]
    return subprocess.run(cmd, capture_output=True, check=False).returncode == 0
