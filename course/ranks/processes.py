"""Processes the launcher starts and stops: pids across a PID namespace, bounded waits.

The plain-OS side of :mod:`course.ranks.forkserver` (which holds the private multiprocessing
API): a confined forkserver's ranks live in a PID namespace of their own, so their pids are
translated to the caller's (:func:`host_pid`); every write to and wait on a process is
bounded (:func:`write_within`, on the reading process's clock; :func:`reap`); :func:`kill`
ignores what is already gone; run folders that callers which died left behind are swept
(:func:`sweep_stale_run_dirs`).

A rank is not the launcher's child but its forkserver's, which reaps it: once it has, the
rank's pid is free, and the kernel gives it to the next process to start when the pids
come round again (``/proc/sys/kernel/pid_max``, 32768 on a 2-core machine: seconds apart on
one busy with forks). A signal sent by that pid could then reach any process on the
machine, and a grader runs as root. So a rank is held by a pidfd, opened as it starts
(:func:`pin`: and checked to be its forkserver's child), and signalled through it
(:func:`signal_pinned`): a process that took the pid since is never reached.
"""

from __future__ import annotations

import contextlib
import glob
import os
import select
import shutil
import signal
import tempfile
import time
from collections.abc import Callable

import psutil

from course.ranks.clock import Deadline

__all__ = [
    "RUN_DIR_PREFIX", "SERVER_GONE", "NamespacePid", "RankStartError", "child_pids",
    "host_pid", "kill", "ns_member", "pin", "reap", "sandbox_members", "signal_pinned",
    "still_held", "sweep_stale_run_dirs", "wait_within", "write_within",
]  # fmt: skip

RUN_DIR_PREFIX = "course-ranks-"  # + the caller's pid: whose run left it, if one did
# The exit code of a process that ended after its forkserver: not a status (those are -64 to
# 255), since the forkserver, which reaped it, took that with it.
SERVER_GONE = 256


class RankStartError(OSError):
    """A rank could not be started: its server stopped answering, or is gone."""


def child_pids(pid: int, recursive: bool = False) -> list[int]:
    """The pids of process ``pid``'s children (``recursive``: and theirs, and so on), as the
    kernel lists each thread's (``/proc/PID/task/TID/children``): a few files, where psutil's
    ``children()`` reads the status of every process on the machine, about 3 ms a call on a
    busy one, twice for each rank a grader starts. Raises ProcessLookupError if ``pid`` is
    gone; a child that ends meanwhile is left out."""
    if not _LISTS_CHILDREN:  # a kernel that lists none
        try:
            return [p.pid for p in psutil.Process(pid).children(recursive=recursive)]
        except psutil.NoSuchProcess as err:
            raise ProcessLookupError(f"no process {pid}") from err
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError as err:
            if parent == pid:
                raise ProcessLookupError(f"no process {pid}") from err
            continue  # a child that ended
        for task in tasks:
            with contextlib.suppress(OSError), open(f"/proc/{parent}/task/{task}/children") as f:
                kids = [int(p) for p in f.read().split()]
                found += kids
                todo += kids if recursive else []
    return found


_LISTS_CHILDREN = os.path.exists(f"/proc/self/task/{os.getpid()}/children")  # CONFIG_PROC_CHILDREN


def sandbox_members(outer: int) -> tuple[int, list[int]]:
    """Bubblewrap ``outer``'s init (its child, pid 1 of the sandbox's PID namespace) and
    the pids of every process under it. Raises RankStartError when there is none."""
    try:
        init = child_pids(outer)[0]
        return init, child_pids(init, recursive=True)
    except (IndexError, OSError) as err:
        raise RankStartError("the forkserver's sandbox is gone") from err


def host_pid(outer: int, ns_pid: int) -> int:
    """The pid of process ``ns_pid`` of the PID namespace whose init is ``outer``'s child."""
    init, inside = sandbox_members(outer)
    return ns_member(inside, init, ns_pid)


def ns_member(pids: list[int], anchor: int, ns_pid: int) -> int:
    """The one of ``pids`` that is process ``ns_pid`` of process ``anchor``'s PID namespace
    (as ``readlink /proc/PID/ns/pid`` names it)."""
    try:
        namespace = os.readlink(f"/proc/{anchor}/ns/pid")
    except OSError as err:
        raise RankStartError("the forkserver's sandbox is gone") from err
    for pid in pids:
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/{pid}/ns/pid") == namespace:
                with open(f"/proc/{pid}/status") as f:
                    nspid = next(line for line in f if line.startswith("NSpid:")).split()
                if int(nspid[-1]) == ns_pid:
                    return pid
    raise RankStartError(f"no process {ns_pid} in the forkserver's sandbox")


class NamespacePid:
    """:func:`host_pid` of one process of a namespace, found once for each ``outer`` (a
    server's Python, the same as long as it lives; None until it is there)."""

    def __init__(self, ns_pid: int) -> None:
        self.ns_pid, self.found = ns_pid, (0, 0)

    def __call__(self, outer: int) -> int | None:
        if self.found[0] != outer:
            with contextlib.suppress(RankStartError):
                self.found = (outer, host_pid(outer, self.ns_pid))
        return self.found[1] if self.found[0] == outer else None


def wait_within(fd: int, deadline: Deadline, what: str) -> None:
    """Wait until ``fd`` can be read (or is closed), or raise RankStartError (``what``, not
    done in time) once ``deadline`` (charged to the process that writes it) is past."""
    while not select.select([fd], [], [], deadline.left())[0]:
        if deadline.past():
            raise RankStartError(f"{what} in {deadline.seconds:.0f} s")


def write_within(fd: int, data: memoryview, deadline: Deadline) -> None:
    """Write all of ``data`` to the pipe ``fd``, or raise RankStartError once ``deadline``
    (charged to the process that reads it) is past."""
    os.set_blocking(fd, False)
    while data:
        try:
            data = data[os.write(fd, data) :]
        except BlockingIOError:
            if not select.select([], [fd], [], deadline.left())[1] and deadline.past():
                raise RankStartError(f"a rank took no job in {deadline.seconds:.0f} s") from None


def reap(pid: int | None, timeout: float = 5.0) -> None:
    """Wait (bounded) for a child process to exit, then SIGKILL it."""
    end = time.monotonic() + timeout
    while pid is not None and time.monotonic() < end:
        try:
            if os.waitpid(pid, os.WNOHANG)[0]:
                return
        except ChildProcessError:
            return
        time.sleep(0.01)
    if pid is not None:
        kill(os.kill, pid)
        reap(pid, 1.0)


def kill(kill: Callable[[int, int], None], pid: int | None) -> None:
    """Send SIGKILL with ``kill`` (os.kill or os.killpg), ignoring processes already gone."""
    if pid:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            kill(pid, signal.SIGKILL)


def pin(pid: int, parent: int | None) -> int | None:
    """A pidfd of process ``pid``, a child of ``parent`` (None: not checked); None where the
    kernel has no pidfds (then signals go by pid). Raises RankStartError when ``pid`` is no
    longer ``parent``'s child: it ended as it started, and its pid may be another's already."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError as err:
        raise RankStartError(f"process {pid} ended as soon as it started") from err
    except (AttributeError, OSError):  # not Linux, or a kernel before 5.3
        return None
    if parent is not None and _parent(pid) != parent:
        os.close(fd)
        raise RankStartError(f"process {pid} ended as soon as it started")
    return fd


def _parent(pid: int) -> int | None:
    """The pid of process ``pid``'s parent (None if it is gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def still_held(pidfd: int | None) -> bool:
    """Is the process ``pidfd`` pins not yet reaped (running, or a zombie), so that its pid,
    and the process group it leads, are still its own? True where there is no pidfd."""
    if pidfd is None:
        return True
    try:
        signal.pidfd_send_signal(pidfd, 0)
    except ProcessLookupError:
        return False
    return True


def signal_pinned(pidfd: int | None, pid: int, sig: int) -> None:
    """Send ``sig`` to the process ``pidfd`` pins (by ``pid`` where there is no pidfd),
    ignoring one already gone."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if pidfd is None:
            os.kill(pid, sig)
        else:
            signal.pidfd_send_signal(pidfd, sig)


def sweep_stale_run_dirs() -> None:
    """Remove run directories left by callers that died (SIGKILL, a crash) mid-run."""
    for path in glob.glob(os.path.join(tempfile.gettempdir(), RUN_DIR_PREFIX + "*")):
        pid = os.path.basename(path)[len(RUN_DIR_PREFIX) :].split("-")[0]
        if pid.isdigit() and not psutil.pid_exists(int(pid)):
            shutil.rmtree(path, ignore_errors=True)
