"""A box's forkserver forked from a warm template, not started cold: torch imported once.

A rank box (:mod:`course.grading.rankbox`) started cold runs a fresh interpreter inside
bubblewrap that imports torch and the course's rank side before it forks a rank: about
2.5 CPU-s of every submission. Here one *template* per grading process has imported them
once: a private forkserver (:class:`course.ranks.forkserver.Server`), as root, unconfined,
started with the sandbox's clean environment (:func:`course.grading.sandbox.sandbox_env`),
that runs no student code and reads nothing of a course (no gradebook, notebook or
instructor module). For each box:

1. bubblewrap starts as for a cold box (the same view, namespaces, limits and uid, the same
   cgroups), around a stub (``sleep``) that only holds the namespaces open;
2. the template forks an *entry* process that joins the box's cgroups, then the stub's
   namespaces (network, IPC, UTS, cgroup, PID, mounts) and its root, as ``nsenter`` does, and
   forks the box's forkserver, which is thus in the box's PID namespace; the entry exits, and
   the namespace's init (bubblewrap's) becomes the forkserver's parent, as the stub's;
3. the forkserver starts a session of its own, takes the box's resource limits, drops to the
   box's uid (no groups, no new privileges, not dumpable), keeps the grader's stdout and
   stderr and no other descriptor it inherited, then imports what the box preloads and
   serves forks (its environment is the template's: the sandbox's, as a cold one's).

Its ranks are confined as a cold box's are; only their memory starts as the template's,
which holds what a cold forkserver's would. Joining namespaces needs root: elsewhere, or
when the template cannot serve, the box starts cold.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import shlex
import shutil
import sys
import threading
import time
from multiprocessing import reduction, util
from pathlib import Path
from typing import Any

import psutil

from course.grading.sandbox import Limits, sandbox_env
from course.ranks.clock import Deadline
from course.ranks.forkserver import (
    START_WAIT,
    PrivateForkServer,
    RankProcess,
    RankStartError,
    Server,
)
from course.ranks.processes import child_pids, kill, ns_member, sandbox_members, wait_within

__all__ = ["ENV", "PRELOAD", "BoxServer", "template", "template_env"]

ENV = "COURSE_BOX_TEMPLATE"  # "ADDRESS PID": the grading process's template, for its graders
# What every box's forkserver imports (course.grading.rankbox), imported once here.
PRELOAD = (*Server.PRELOAD, "course.checks", "course.grading.student", "course.grading.template")
# The namespaces bubblewrap gives a box, joined in this order (the mounts last: after them
# /proc is the box's).
NAMESPACES = ("ipc", "uts", "net", "cgroup", "pid", "mnt")
PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS = 4, 38

_LOCK = threading.Lock()
_TEMPLATE: Server | None = None


def template() -> Server | None:
    """This process's template: the one its grading process handed down (``$COURSE_BOX_TEMPLATE``),
    else its own, started on first use. None where boxes start cold (not root)."""
    global _TEMPLATE  # noqa: PLW0603 - one template per grading process, made on first use
    if os.geteuid() != 0 or not shutil.which("sleep"):
        return None
    with _LOCK:
        if _TEMPLATE is None:
            handed = os.environ.get(ENV, "").split()
            if len(handed) == 2 and handed[1].isdigit():
                _TEMPLATE = _Attached(handed[0], int(handed[1]))
            else:
                _TEMPLATE = Server(_clean_python(), preload=PRELOAD)
        return _TEMPLATE


def template_env() -> dict[str, str]:
    """Start this process's template (its imports run from now on) and return what hands it
    to the graders this process starts (empty where boxes start cold)."""
    server = template()
    if server is None:
        return {}
    address = server.get()._forkserver_address  # noqa: SLF001 - multiprocessing internals, see course.ranks.forkserver
    return {ENV: f"{address} {server.pid()}"}


def _clean_python() -> str:
    """A wrapper that runs this Python in ``/`` with the sandbox's environment and nothing of
    ours: a process's first environment stays readable in its memory (``/proc/self/environ``),
    and every box's forkserver inherits the template's memory. Not in the grader's folder (a
    course root, whose names Python would list and import from first)."""
    path = Path(util.get_temp_dir()) / "template-python"  # private, removed at exit
    env = " ".join(shlex.quote(f"{k}={v}") for k, v in sandbox_env(None).items())
    python = shlex.quote(sys.executable)
    path.write_text(f'#!/bin/sh\ncd / || exit 70\nexec env -i {env} {python} "$@"\n')
    path.chmod(0o700)
    return str(path)


class _Attached(Server):
    """The template of the grading process that started this one: used, never started."""

    def __init__(self, address: str, pid: int) -> None:
        super().__init__()
        self._attached = PrivateForkServer(confined=True)  # its children get no pipe of ours
        self._attached._forkserver_address, self._attached._forkserver_pid = address, pid  # noqa: SLF001 - multiprocessing internals, see course.ranks.forkserver
        self._server = self._attached

    def get(self) -> PrivateForkServer:
        """The template as handed down (one that died since makes the box start cold)."""
        return self._attached


class BoxServer(Server):
    """A box's forkserver, forked from the template into the namespaces of a stub that
    ``stub`` (bubblewrap's wrapper, made as the cold one) starts; cold through ``executable``
    when the template cannot serve."""

    def __init__(
        self, executable: str, stub: str, entry: dict, preload: tuple[str, ...], ddp: bool
    ) -> None:
        """``entry``: the cgroups' ``procs`` files, the ``cwd``, ``uid`` and ``limits``;
        ``ddp``: its checks may train with DDP (a cold start then imports ``torch._dynamo``,
        whose import is seconds that only DDP's first forward needs)."""
        super().__init__(executable, preload=preload, own_pids=True)
        self._preload = [m for m in self._preload if ddp or m != "torch._dynamo"]
        self._stub, self._entry = stub, entry
        self._entered: psutil.Process | None = None  # the forkserver, when forked warm
        self._stub_proc: psutil.Process | None = None

    def _start(self, server: PrivateForkServer) -> None:
        self._entered = None
        warm = template()
        if warm is not None:
            with contextlib.suppress(RankStartError, OSError, EOFError, ValueError, psutil.Error):
                self._entered = self._fork(server, warm)
                return
        super()._start(server)

    def _fork(self, server: PrivateForkServer, warm: Server) -> psutil.Process:
        """Start the stub, have the template fork the forkserver into its namespaces, and
        set ``server`` up as multiprocessing's own start would; the forkserver."""
        import socket
        from multiprocessing import connection

        address = connection.arbitrary_address("AF_UNIX")
        outer, stub = _start_stub(self._stub)
        self._stub_proc = stub
        alive_r, alive_w = os.pipe()
        report_r, report_w = os.pipe()
        pinned: list[int] = []
        try:
            pinned = _pin(stub)
            with socket.socket(socket.AF_UNIX) as listener:
                listener.bind(address)
                os.chmod(address, 0o600)
                listener.listen()
                fds = tuple(map(_Fd, (listener.fileno(), alive_r, report_w, 1, 2)))
                args = (self._entry, self._preload, [_Fd(fd) for fd in pinned], fds)
                entry = _Entry(args=args, name="box-entry")
                entry.server = warm
                entry.start()
                os.close(report_w)
                report_w = -1
                inner = _report(report_r, entry.pid)
            server._forkserver_address, server._forkserver_pid = address, outer  # noqa: SLF001 - multiprocessing internals, see course.ranks.forkserver
            server._forkserver_alive_fd, alive_w = alive_w, -1  # noqa: SLF001 - multiprocessing internals, see course.ranks.forkserver
            return inner
        finally:
            _close([fd for fd in (alive_r, alive_w, report_r, report_w, *pinned) if fd >= 0])
            if alive_w >= 0:  # not started: the stub and its namespace go
                kill(os.kill, outer)
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(outer, 0)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(address)

    def server_pid(self) -> int | None:
        """This process's pid of the forkserver (None: gone, or not there yet)."""
        if self._entered is None:
            return super().server_pid()
        return self._entered.pid if _running(self._entered) else None

    def stub_pid(self) -> int | None:
        """This process's pid of the stub a warm forkserver entered (None: a cold one)."""
        return self._stub_proc.pid if self._entered is not None and self._stub_proc else None

    def host_pid(self, pid: int) -> int:
        """This process's pid of the forkserver's child ``pid`` (as the forkserver reported
        it): a warm one's children are its own, not under bubblewrap's init."""
        if self._entered is None:
            return super().host_pid(pid)
        try:
            children = child_pids(self._entered.pid, recursive=True)
        except OSError as err:
            raise RankStartError("the forkserver's sandbox is gone") from err
        return ns_member(children, self._entered.pid, pid)

    def _alive(self, server: PrivateForkServer) -> bool:  # type: ignore[override]
        return super()._alive(server) and (self._entered is None or _running(self._entered))

    def _discard(self) -> None:
        """Forget the server. A warm one's namespace goes with bubblewrap's init (then its
        bubblewrap exits, as a cold one's does when its forkserver ends)."""
        pid, entered = self.pid(), self._entered
        super()._discard()
        if entered is not None and pid is not None:
            with contextlib.suppress(psutil.Error):
                for init in psutil.Process(pid).children():
                    init.kill()


def _running(proc: psutil.Process) -> bool:
    with contextlib.suppress(psutil.Error):
        return proc.status() != psutil.STATUS_ZOMBIE
    return False


def _start_stub(wrapper: str) -> tuple[int, psutil.Process]:
    """Start bubblewrap around the stub; its pid, and the stub once it runs (the box's view,
    limits and uid are then in place)."""
    outer = util.spawnv_passfds(os.fsencode(wrapper), [wrapper], [])
    sleep = os.path.realpath(shutil.which("sleep") or "sleep")
    deadline = Deadline(START_WAIT, lambda: (outer,))
    while not deadline.past():
        with contextlib.suppress(psutil.Error, RankStartError):
            for pid in sandbox_members(outer)[1]:
                proc = psutil.Process(pid)
                if proc.exe() == sleep:
                    return outer, proc
        if os.waitpid(outer, os.WNOHANG)[0]:
            raise RankStartError("the box's bubblewrap exited before its stub ran")
        time.sleep(0.005)
    kill(os.kill, outer)
    os.waitpid(outer, 0)
    raise RankStartError(f"the box's stub did not start in {START_WAIT:.0f} s")


def _report(report: int, entry: int | None) -> psutil.Process:
    """Read the forkserver's pid (from the entry) and its "ready" (from the forkserver), in
    either order (the forkserver may run before its parent), within a deadline charged to
    the two (what they waited for a CPU is not charged)."""
    got = b""

    def pid() -> int | None:
        return next((int(word) for word in got.split() if word.isdigit()), None)

    deadline = Deadline(START_WAIT, lambda: (entry, pid()))
    while pid() is None or b"ready" not in got.split():
        wait_within(report, deadline, "the box's forkserver did not start")
        more = os.read(report, 256)
        if not more or (got + more).startswith(b"error"):
            said = (got + more).decode(errors="replace")
            raise RankStartError(f"the box's forkserver stopped before it was ready: {said}")
        got += more
    return psutil.Process(pid())


class _Entry(RankProcess):
    """Forked by the template: joins a box and forks its forkserver there."""

    def run(self) -> None:
        entry, preload, pinned, fds = self._args
        listener, alive_r, report, out, err = fds
        try:
            _enter(entry, pinned)
        except OSError as err_:
            os.write(report, f"error {err_}".encode())
            os._exit(1)
        pid = os.fork()
        if pid:  # the forkserver's parent until it ends: it is then reaped, never orphaned
            with contextlib.suppress(BrokenPipeError):  # the grader gave up: it starts cold
                os.write(report, f" {pid} ".encode())
            for fd in (listener, alive_r, report, out, err):
                os.close(fd)
            os._exit(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) & 0xFF)
        _serve(entry, preload, listener, alive_r, report, out, err)


def _enter(entry: dict, pinned: list[int]) -> None:
    """Join the box's cgroups, then the namespaces and root of ``pinned`` (descriptors of
    the stub's, opened while it was known to be the stub): what the forkserver forked next
    is in."""
    for procs in entry["procs"]:  # first: the box's cgroups are not in its view
        Path(procs).write_text(str(os.getpid()))
    *spaces, root = pinned
    libc = ctypes.CDLL(None, use_errno=True)
    for ns, fd in zip(NAMESPACES, spaces, strict=True):
        if os.fstat(fd).st_ino == os.stat(f"/proc/self/ns/{ns}").st_ino:
            raise OSError(f"the box's {ns} namespace is this process's own")
        if libc.setns(fd, 0) != 0:
            raise OSError(ctypes.get_errno(), f"setns {ns}")
    os.fchdir(root)
    os.chroot(".")
    os.chdir(entry["cwd"])
    _close(pinned)


def _pin(stub: psutil.Process) -> list[int]:
    """Descriptors of the stub's namespaces and root (NAMESPACES, then the root), opened
    while it is still the stub (not a process that took its pid since)."""
    paths = [*(f"/proc/{stub.pid}/ns/{ns}" for ns in NAMESPACES), f"/proc/{stub.pid}/root"]
    fds: list[int] = []
    try:
        fds.extend(os.open(path, os.O_RDONLY | os.O_CLOEXEC) for path in paths)
    except OSError:
        _close(fds)
        raise
    if not stub.is_running():  # psutil: the same pid and start time
        _close(fds)
        raise RankStartError("the box's stub ended before it was entered")
    return fds


def _close(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)


def _serve(entry: dict, preload: list[str], listener: int, alive_r: int, report: int,
           out: int, err: int) -> None:  # fmt: skip
    """The box's forkserver, in its PID namespace: confine itself as bubblewrap, prlimit
    and setpriv would the command they run, then serve."""
    from multiprocessing import forkserver

    os.setsid()
    null = os.open(os.devnull, os.O_RDONLY)
    for fd, std in ((null, 0), (out, 1), (err, 2)):
        os.dup2(fd, std)
    keep = {0, 1, 2, listener, alive_r, report}
    for fd in map(int, os.listdir("/proc/self/fd")):
        if fd not in keep:
            with contextlib.suppress(OSError):
                os.close(fd)
    limits: Limits = entry["limits"]
    for kind, value in (
        (resource.RLIMIT_AS, limits.address_space), (resource.RLIMIT_NPROC, limits.processes),
        (resource.RLIMIT_NOFILE, limits.open_files), (resource.RLIMIT_FSIZE, limits.file_size),
        (resource.RLIMIT_CORE, 0),
    ):  # fmt: skip
        resource.setrlimit(kind, (value, value))
    uid = entry["uid"]
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) or libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0):
        raise OSError(ctypes.get_errno(), "prctl")
    _forget_the_template()
    try:
        os.write(report, b" ready ")
    except BrokenPipeError:  # the grader gave up waiting (it starts a box cold): no one to serve
        os._exit(1)
    os.close(report)
    forkserver.main(listener, alive_r, preload)


def _forget_the_template() -> None:
    """Note the box's folder where the interpreter noted the template's, as a cold
    forkserver notes its own: bubblewrap's --chdir names it, multiprocessing started in it,
    and Python listed it (the template's listing of its own goes)."""
    from multiprocessing import process

    sys.path_importer_cache.pop(process.ORIGINAL_DIR, None)
    os.environ["PWD"] = process.ORIGINAL_DIR = os.getcwd()


class _Fd:
    """A descriptor handed to a process the template forks (multiprocessing's DupFd)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self) -> tuple:
        return _detach, (reduction.DupFd(self.fd),)


def _detach(dup: Any) -> int:
    return dup.detach()
