"""The launcher's own forkserver: ranks are forked from a warm process that imported torch.

Private API, on purpose and in one place. ``multiprocessing``'s public forkserver is one
global server per interpreter, preloads only at its first start, and re-imports the caller's
``__main__`` (a notebook kernel, a pytest run) in every child. A private server needs
``forkserver.ForkServer``'s attributes (``_forkserver_pid``, ``_forkserver_alive_fd``,
``_forkserver_address``) and a ``popen_forkserver.Popen`` whose ``_launch`` sends no
preparation data: stable from Python 3.8 to 3.13 (this project runs 3.11).

A server started through another executable (a sandbox wrapper, for grading) is started
once through it and never again behind its back: multiprocessing's own ``ensure_running``
would restart a dead server, and this process's resource tracker, with the plain
interpreter, unconfined. Its children get ``/dev/null`` where multiprocessing hands them
the resource tracker's pipe, so no confined process can write to a tracker outside the
sandbox (a ``REGISTER`` line there makes it unlink a file of the writer's choosing).

Every wait on a server has a deadline (``START_WAIT``): a server that was stopped (SIGSTOP)
or a child that reads nothing makes the launch raise :class:`RankStartError`, never hang,
on their clock (:class:`course.ranks.clock.Deadline`: time they waited for a CPU is free).
A server whose processes have a PID namespace of their own (``own_pids``) reports its
children's pids in that namespace: they are translated to this process's pids (the
kernel's ``NSpid``), so the launcher signals and measures the right processes.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from multiprocessing import forkserver, popen_forkserver, reduction, resource_tracker, spawn, util
from multiprocessing.connection import wait
from multiprocessing.context import set_spawning_popen
from multiprocessing.process import BaseProcess
from typing import ClassVar

from course.ranks.clock import Deadline
from course.ranks.processes import (
    RUN_DIR_PREFIX,
    SERVER_GONE,
    NamespacePid,
    RankStartError,
    host_pid,
    kill,
    pin,
    reap,
    signal_pinned,
    still_held,
    sweep_stale_run_dirs,
    wait_within,
    write_within,
)

__all__ = [
    "IDLE_SHUTDOWN", "RUN_DIR_PREFIX", "SERVER", "SERVER_GONE", "START_WAIT",
    "PrivateForkServer", "RankProcess", "RankStartError", "Server", "kill",
    "sweep_stale_run_dirs",
]  # fmt: skip

# Seconds a server may take to fork a rank (a cold one imports torch first), and a rank to
# take its job: a server stopped by code it ran fails the launch after this, not never.
START_WAIT = 60.0
# In a PID namespace of its own, bubblewrap is pid 1 and the command it runs (the server) 2.
SERVER_NS_PID = 2


class Server:
    """A private multiprocessing forkserver with torch preloaded, restarted if it dies."""

    # torch._dynamo is what DDP's first forward imports: 1-5 s per rank if every rank pays.
    PRELOAD: ClassVar = ["course.ranks.worker", "course.ranks.launcher", "torch._dynamo"]

    def __init__(
        self,
        executable: str | None = None,
        preload: tuple[str, ...] = (),
        idle_shutdown: float | None = None,
        own_pids: bool = False,
    ) -> None:
        """``executable`` runs the server's Python (a wrapper that confines it, say); with
        ``idle_shutdown`` the server stops once no run has used it for that many seconds;
        ``own_pids``: the executable gives the server a PID namespace (bubblewrap's)."""
        self._lock = threading.Lock()
        self._server: forkserver.ForkServer | None = None
        self._executable, self._preload = executable, [*self.PRELOAD, *preload]
        self._idle_shutdown, self._users, self._used = idle_shutdown, 0, time.monotonic()
        self._reaper: threading.Thread | None = None
        self._own_pids = own_pids
        self._inner = NamespacePid(SERVER_NS_PID)  # the server's Python, found once for each

    def get(self) -> forkserver.ForkServer:
        """The running forkserver, starting a fresh one if there is none or it died."""
        with self._lock:
            if self._server is not None and not self._alive(self._server):
                self._discard()
            if self._server is None:
                sweep_stale_run_dirs()
                self._server = PrivateForkServer(confined=self._executable is not None)
                self._server.set_forkserver_preload(self._preload)
                self._start(self._server)
            self._used = time.monotonic()
            self._watch_idle()
            return self._server

    @contextlib.contextmanager
    def in_use(self) -> Iterator[None]:
        """Keep the server from stopping for idleness while a run uses it."""
        with self._lock:
            self._users += 1
        try:
            yield
        finally:
            with self._lock:
                self._users, self._used = self._users - 1, time.monotonic()

    def _watch_idle(self) -> None:
        """Start the thread that stops an idle server, if it has one and it is not running."""
        if self._idle_shutdown is None or (self._reaper and self._reaper.is_alive()):
            return
        self._reaper = threading.Thread(target=self._stop_when_idle, name="forkserver-idle")
        self._reaper.daemon = True
        self._reaper.start()

    def _stop_when_idle(self) -> None:
        """Stop the server once it has been idle for ``idle_shutdown`` s; then end the thread."""
        idle = float(self._idle_shutdown or 0)
        while True:
            time.sleep(min(idle / 4, 5.0))
            with self._lock:
                if self._server is None:
                    return
                if self._users or time.monotonic() - self._used < idle:
                    continue
                pid = self._server._forkserver_pid  # noqa: SLF001 - multiprocessing internals, see the module docstring
                self._discard()
            reap(pid)
            return

    def _start(self, server: PrivateForkServer) -> None:
        """Start ``server``, through our executable if we have one (multiprocessing's hook)."""
        if self._executable is None:
            server.start()
            return
        # This process's own tracker, never through the wrapper: a confined one would be
        # killed with the submission's processes, then restarted unconfined by the stdlib.
        resource_tracker.ensure_running()
        usual = spawn.get_executable()
        spawn.set_executable(self._executable)
        try:
            server.start()
        finally:
            spawn.set_executable(usual)

    def pid(self) -> int | None:
        """The forkserver's pid, if one was started."""
        return self._server._forkserver_pid if self._server else None  # noqa: SLF001 - multiprocessing internals, see the module docstring

    def host_pid(self, pid: int) -> int:
        """This process's pid of the server's child ``pid`` (as the server reported it)."""
        if not self._own_pids:
            return pid
        outer = self.pid()
        if outer is None:
            raise RankStartError("the forkserver was stopped")
        return host_pid(outer, pid)

    def server_pid(self) -> int | None:
        """This process's pid of the server's Python itself (None: gone, or not there yet)."""
        outer = self.pid()
        return self._inner(outer) if self._own_pids and outer is not None else outer

    def kill(self) -> None:
        """Stop a server that stopped answering: SIGKILL (its namespace dies with it)."""
        with self._lock:
            if self._server is not None:
                pid = self._server._forkserver_pid  # noqa: SLF001 - multiprocessing internals, see the module docstring
                self._discard()
                kill(os.kill, pid)
                reap(pid, 1.0)

    def stop(self) -> None:
        """Ask the forkserver to exit (closing its "alive" pipe) and reap it."""
        with self._lock:
            if self._server is not None:
                pid = self._server._forkserver_pid  # noqa: SLF001 - multiprocessing internals, see the module docstring
                self._discard()
                reap(pid)

    @staticmethod
    def _alive(server: forkserver.ForkServer) -> bool:
        try:  # multiprocessing internals: stable from Python 3.8 to 3.13
            return os.waitpid(server._forkserver_pid, os.WNOHANG)[0] == 0  # noqa: SLF001 - multiprocessing internals, see the module docstring
        except ChildProcessError:
            return False

    def _discard(self) -> None:
        server, self._server = self._server, None
        if server is not None and server._forkserver_alive_fd is not None:  # noqa: SLF001 - multiprocessing internals, see the module docstring
            os.close(server._forkserver_alive_fd)  # noqa: SLF001 - multiprocessing internals, see the module docstring
        address = server and server._forkserver_address  # noqa: SLF001 - multiprocessing internals, see the module docstring
        if isinstance(address, str) and os.path.exists(address):
            os.unlink(address)


class PrivateForkServer(forkserver.ForkServer):
    """multiprocessing's ForkServer, started only by :meth:`start`: a server that died is
    replaced by :class:`Server` (through its executable), never by the stdlib's restart."""

    def __init__(self, confined: bool) -> None:
        super().__init__()
        self._confined = confined

    def start(self) -> None:
        """Start the server process (once)."""
        super().ensure_running()

    def ensure_running(self) -> None:
        """Called by every ``connect_to_new_process``: never starts anything."""
        if self._forkserver_pid is None:
            raise ConnectionError("the forkserver was stopped")

    def connect_to_new_process(self, fds: list[int]) -> tuple[int, int]:
        """Ask the server for a child; a confined one's children get neither the tracker's
        pipe nor the server's own alive pipe (whose write end, shared by every rank, is a
        channel between them, and one byte written to it stops the server)."""
        if not self._confined:
            return super().connect_to_new_process(fds)
        self.ensure_running()
        if len(fds) + 4 >= forkserver.MAXFDS_TO_SEND:
            raise ValueError("too many fds")
        with socket.socket(socket.AF_UNIX) as client:
            client.connect(self._forkserver_address)
            parent_r, child_w = os.pipe()
            child_r, parent_w = os.pipe()
            no_tracker = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
            no_alive = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
            try:
                allfds = [child_r, child_w, no_alive, no_tracker, *fds]
                reduction.sendfds(client, allfds)
            except BaseException:
                os.close(parent_r)
                os.close(parent_w)
                raise
            finally:
                for fd in (child_r, child_w, no_alive, no_tracker):
                    os.close(fd)
            return parent_r, parent_w


# A kernel keeps its forkserver (torch imported: about 220 MB) only while it runs ranks: five
# notebooks left open on Binder (2 GB in all) then hold none. A run after that starts a cold
# one (about 2 s); the magic warms it as soon as a cell runs, so that is rarely felt.
IDLE_SHUTDOWN = 60.0
SERVER = Server(idle_shutdown=IDLE_SHUTDOWN)


class _Popen(popen_forkserver.Popen):
    """Start a process through our forkserver, without re-importing the caller's __main__.

    multiprocessing would send the caller's __main__ module to be re-imported in every
    child (a notebook kernel, a pytest run, a script...): slow, and pointless here. The
    process is held by a pidfd (:func:`course.ranks.processes.pin`): every signal goes
    through it, and once the forkserver is gone (it reports no exit code then, where
    multiprocessing would make one up: 255) the pidfd says when the process ends.
    """

    pidfd: int | None = None

    def _launch(self, process_obj: BaseProcess) -> None:
        buf = io.BytesIO()
        set_spawning_popen(self)
        try:
            reduction.dump({}, buf)  # no preparation data: ranks set cwd and sys.path
            reduction.dump(process_obj, buf)
        finally:
            set_spawning_popen(None)
        server = getattr(process_obj, "server", None) or SERVER
        self.sentinel, w = server.get().connect_to_new_process(self._fds)
        _parent_w = os.dup(w)  # keeps the child's parent_sentinel open while we live
        held = [_parent_w, self.sentinel]  # closed when this object goes (the pidfd joins)
        self.finalizer = util.Finalize(self, util.close_fds, held)
        try:  # the server sends the pid as soon as it forked: before the child reads its job
            forking = Deadline(START_WAIT, lambda: (server.pid(), server.server_pid()))
            wait_within(self.sentinel, forking, "the forkserver started no rank")
            self.pid = pid = server.host_pid(forkserver.read_signed(self.sentinel))
            self.pidfd = pin(pid, server.server_pid())
            held += [] if self.pidfd is None else [self.pidfd]
            write_within(w, buf.getbuffer(), Deadline(START_WAIT, lambda: (pid,)))
        finally:
            os.close(w)

    def poll(self, flag: int = os.WNOHANG) -> int | None:
        """The exit code the forkserver reported, or ``SERVER_GONE`` for a process that ended
        after its forkserver (which took its exit status with it)."""
        if self.returncode is None:
            if not wait([self.sentinel], 0 if flag == os.WNOHANG else None):
                return None
            if self.sentinel == self.pidfd:  # the process itself ended
                self.returncode = SERVER_GONE
                return self.returncode
            try:
                self.returncode = forkserver.read_signed(self.sentinel)
            except (OSError, EOFError):  # the forkserver is gone, with no word of this process
                if self.pidfd is None:
                    self.returncode = SERVER_GONE
                    return self.returncode
                self.sentinel = self.pidfd  # from now on, wait for the process itself
                return self.poll(flag)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int | None:
        """The exit code, waiting up to ``timeout`` seconds (None: for ever) on whatever says
        the process ended: the forkserver's report, or the pidfd once the forkserver is gone."""
        end = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            if not wait([self.sentinel], None if end is None else max(0, end - time.monotonic())):
                return None
            self.poll()
        return self.returncode

    def _send_signal(self, sig: int) -> None:
        if self.returncode is None:
            signal_pinned(self.pidfd, self.pid, sig)

    def kill_group(self) -> None:
        """SIGKILL the process and the process group it leads, only while they are still its:
        not once it was reaped, when its pid, free, may be another process's."""
        if self.returncode is None and still_held(self.pidfd):
            kill(os.killpg, self.pid)
            signal_pinned(self.pidfd, self.pid, signal.SIGKILL)


class RankProcess(BaseProcess):
    """One rank; ``run`` imports the rank side lazily so the caller never imports torch."""

    _start_method = "forkserver"

    @staticmethod
    def _Popen(process_obj: BaseProcess) -> _Popen:  # noqa: N802 - multiprocessing's own hook name
        return _Popen(process_obj)

    server: Server | None = None  # which forkserver forks it (None: the launcher's own)

    def __getstate__(self) -> dict:
        """What the forkserver's child receives: everything but the server."""
        return {k: v for k, v in vars(self).items() if k != "server"}

    @property
    def ends(self) -> int:
        """What is readable once the process ended: its forkserver's report, or, once that is
        gone, the process itself (its pidfd)."""
        return self._popen.sentinel

    def kill_group(self) -> None:
        """SIGKILL the process and its process group, never a process that took its pid."""
        if self._popen is not None:
            self._popen.kill_group()

    def run(self) -> None:
        from course.ranks.worker import rank_main

        rank_main(*self._args)
