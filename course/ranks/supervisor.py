"""One run of ranks: start them, watch them until done or failed, kill them all, collect.

The caller's side of the launcher (``course.ranks.launcher`` checks the inputs and builds
the job; ``course.ranks.worker`` is the rank's side). Ranks report on a pipe; after the first
failure the others get ``ABORT_GRACE`` seconds, then every still-running rank is asked where
it is (its stack) and every rank's process group is SIGKILLed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import time
from dataclasses import dataclass
from multiprocessing import Pipe
from multiprocessing.connection import Connection, wait

from course.ranks import confined, messages
from course.ranks.clock import Deadline, RunClock
from course.ranks.failures import RankFailure, RanksInterrupted, RunResult
from course.ranks.faults import Fault
from course.ranks.forkserver import RUN_DIR_PREFIX, SERVER, RankProcess, RankStartError
from course.ranks.holds import Hold
from course.ranks.isolation import SANDBOX_SHARED, map_ids
from course.ranks.objects import Stored
from course.ranks.processes import child_pids
from course.ranks.report import build_result
from course.ranks.rescale import Rescale
from course.ranks.router import Relay

__all__ = ["ABORT_GRACE", "STACK_WAIT", "Supervisor"]

ABORT_GRACE = 0.5  # seconds the other ranks get after one rank fails
STACK_WAIT = 0.5  # seconds to wait for stuck ranks to report where they are
MESSAGE_WAIT = 5.0  # seconds for the rest of a message once its first byte has come
MAP_WAIT = 10.0  # seconds for a graded rank to ask for its ids, then to fork: on its own clock


@dataclass
class _Rank:
    """The caller's view of one rank while the run is in progress."""

    rank: int
    proc: RankProcess
    conn: Connection
    pid: int  # the process that runs the job: ``proc``, or its child in a PID namespace of its own
    outcome: tuple | None = None  # the rank's final message, or how its process ended
    stack: list | None = None  # where it was when stopped
    exit_note: tuple | None = None  # (code, frames) from an os._exit call
    conn_open: bool = True


def _give_ids(pid: int, conn: Connection) -> int:
    """A graded rank's first word: it took namespaces of its own and asks for its ids to be
    mapped there (done from here: :mod:`course.ranks.isolation`), or it runs shared. Its
    second: it forked the process that runs its job, pid 1 of a PID namespace of its own,
    found here as its only child, or it runs the job itself. The pid of the job's process.

    Each word has ``MAP_WAIT`` seconds of the rank's own time (:class:`Deadline`): a rank
    kept from a CPU by a busy machine is waited for, not left without its ids."""
    try:
        if _said(conn, pid) and conn.recv_bytes(16) == b"map":
            conn.send_bytes(b"mapped" if map_ids(pid) else b"unmapped")
            if _said(conn, pid) and conn.recv_bytes(16) == b"forked":
                return _only_child(pid) or pid
    except (EOFError, OSError):  # it died first: the supervision says how
        pass
    return pid


def _said(conn: Connection, pid: int) -> bool:
    """Has rank ``pid`` sent something (or closed its end) within ``MAP_WAIT`` of its time?"""
    deadline = Deadline(MAP_WAIT, lambda: (pid,))
    while not conn.poll(deadline.left()):
        if deadline.past():
            return False
    return True


def _only_child(pid: int) -> int | None:
    """The one child of process ``pid``, as the kernel lists it (None: none, or several)."""
    try:
        children = child_pids(pid)
    except OSError:
        return None
    return children[0] if len(children) == 1 else None


class Supervisor:
    """Start the ranks, watch them until done or failed, kill them all, collect results."""

    def __init__(
        self,
        world_size: int,
        payloads: list[bytes],
        timeout: float,
        pg_timeout: float,
        backend: str,
        before: bytes = b"",
        measured: bool = False,
        holds: tuple[Hold, ...] = (),
        rescale: Rescale | None = None,
        grace: float = ABORT_GRACE,
        stored: dict[str, Stored] | None = None,
        fault: Fault | None = None,
    ) -> None:
        self.world_size, self.payloads, self.before = world_size, payloads, before
        self.measured, self.grace = measured, grace
        self.timeout, self.pg_timeout, self.backend = timeout, pg_timeout, backend
        self.ranks: list[_Rank] = []
        self.unstarted = False  # confined, and its forkserver failed to start its ranks
        self.box = confined.current()
        if self.box and backend == "gloo":
            backend = "relay"  # graded ranks reach each other only through the caller
        if holds and backend != "relay":
            raise ValueError("only the relay makes stragglers (holds=): run with backend='relay'")
        if rescale and backend != "relay":
            raise ValueError("only the relay scales all-gathers (rescale=): use backend='relay'")
        if stored is not None and backend != "relay":
            raise ValueError("only the relay keeps a storage (stored=): use backend='relay'")
        if fault is not None and backend != "relay":
            raise ValueError("only the relay injects faults (fault=): use backend='relay'")
        self.relay = (
            Relay(world_size, pg_timeout, keep=bool(self.box), holds=holds, rescale=rescale,
                  stored=stored, fault=fault)
            if backend == "relay"
            else None
        )  # fmt: skip
        self.backend = backend

    def execute(self) -> RunResult:
        server = self.box.server if self.box else SERVER
        start = time.monotonic()
        with server.in_use():
            try:
                return self._execute()
            except KeyboardInterrupt:  # every rank is already stopped: say so in one line
                raise RanksInterrupted(self.world_size, time.monotonic() - start) from None

    def _execute(self) -> RunResult:
        start = time.monotonic()
        self.dir = confined.rank_dir(f"{RUN_DIR_PREFIX}{os.getpid()}-")
        relay = self.relay or contextlib.nullcontext()
        try:
            relay.__enter__()
            try:
                for rank in range(self.world_size):  # all forked, then each given its ids:
                    self.ranks.append(self._start(rank))  # one isolates while the next forks
                for r in self.ranks if self.box else ():
                    r.pid = _give_ids(r.proc.pid, r.conn)
            except (RankStartError, EOFError, ConnectionError) as err:
                if not self.box:
                    raise
                self.box.server.kill()  # stopped or killed: the next launch gets a fresh one
                self.unstarted = True
                return self._unstarted(err, time.monotonic() - start)
            if self.relay:
                self.relay.close_ends()  # the ranks hold them now
                memory = self.box.memory if self.box else None
                self.relay.probe.name([r.pid for r in self.ranks], memory)
                self.relay.stop_rank = self._stop
            clock = RunClock([r.pid for r in self.ranks], relayed=self.relay is not None)
            reason = self._supervise(clock)
            if reason != "done":
                self._collect_stacks()
            self._kill()
            outputs = [self._read(r.rank) for r in self.ranks]
        finally:
            self._kill()
            relay.__exit__(None, None, None)
            if self.box:
                self.box.cleanup()  # what the ranks started in a new session, too
            shutil.rmtree(self.dir, ignore_errors=True)
        elapsed = time.monotonic() - start
        result = build_result(
            self.ranks, outputs, reason, self.timeout, elapsed, self.box is not None
        )
        result.relayed = tuple(self.relay.events) if self.relay else ()
        result.stored = dict(self.relay.objects.held) if self.relay else {}
        return result

    def _unstarted(self, err: BaseException, elapsed: float) -> RunResult:
        """The result of a confined launch whose ranks could not all be started (the launcher
        tries once more, on a fresh forkserver, and reports this only if that fails too)."""
        message = (
            f"the ranks could not be started ({type(err).__name__}: {err}), on two forkservers "
            "in turn: each was stopped or killed, by the machine or by code this submission "
            "ran before"
        )
        n = self.world_size
        failures = {r: RankFailure(r, "raised", message) for r in range(n)}
        return RunResult(n, [None] * n, [""] * n, [""] * n, failures, elapsed)

    def _start(self, rank: int) -> _Rank:
        parent, child = Pipe()
        # A confined rank keeps its own cwd and sys.path: the caller's are not in its sandbox.
        here = (None, None) if self.box else (os.getcwd(), list(sys.path))
        args = (child, rank, self.world_size, self.dir, *here)
        link = self.relay.ends[rank] if self.relay else None
        job = (self.payloads[rank], self.pg_timeout, self.backend, self.box is not None, link)
        private = (os.path.dirname(self.box.run_root), *SANDBOX_SHARED) if self.box else ()
        job = (*job, private, self.before, self.measured)  # private: what ranks could share
        proc = RankProcess(args=(*args, *job), name=f"rank-{rank}")
        proc.server = self.box.server if self.box else None
        proc.daemon = True
        try:
            proc.start()
        finally:
            child.close()
        return _Rank(rank, proc, parent, proc.pid)  # a graded one's job pid comes with its ids

    def _supervise(self, clock: RunClock) -> str:
        """Wait for every rank to report; return "done", "deadline" or "abort".

        The deadline is on ``clock``: time the ranks waited for a CPU is not charged.
        """
        abort_at = None
        while True:
            live = [r for r in self.ranks if r.outcome is None]
            if not live:
                return "done"
            if clock.past(self.timeout):
                return "deadline"
            now = time.monotonic()
            if abort_at is not None and now >= abort_at:
                return "abort"
            # Short slices: a KeyboardInterrupt (Ctrl-C, a Jupyter interrupt) is only
            # raised between Python bytecodes, so never block for long in wait().
            self._poll(live, 0.1 if abort_at is None else min(abort_at - now, 0.1))
            if abort_at is None and any(r.outcome and r.outcome[0] != "ok" for r in self.ranks):
                abort_at = time.monotonic() + self.grace

    def _poll(self, live: list[_Rank], timeout: float) -> None:
        """Handle whatever the live ranks sent or how they ended, waiting up to timeout."""
        waitables = {r.conn: r for r in live if r.conn_open}
        waitables |= {r.proc.ends: r for r in live}
        for ready in wait(list(waitables), timeout):
            rank = waitables[ready]
            if ready is rank.conn:
                self._receive(rank)
            elif rank.outcome is None:
                while rank.conn_open and rank.conn.poll():
                    self._receive(rank)  # its last words may still be in the pipe
                code = rank.proc.exitcode  # None: its forkserver ended, and it runs on
                if rank.outcome is None and code is not None:
                    rank.outcome = ("ended", code)

    def _receive(self, rank: _Rank) -> None:
        try:
            message = messages.decode(messages.receive(rank.conn, MESSAGE_WAIT))
        except messages.TooLongError as err:  # its report, unread: the rank fails, saying why
            rank.conn_open = False
            if rank.outcome is None:
                rank.outcome = messages.malformed(str(err))
            return
        except (EOFError, OSError):  # TimeoutError included: a rank that stopped halfway
            rank.conn_open = False
            return
        if message[0] == "stack":
            rank.stack = message[1]
        elif message[0] == "os_exit":
            rank.exit_note = message[1:]
        elif rank.outcome is None:
            rank.outcome = message

    def _collect_stacks(self) -> None:
        """Ask every still-running rank where it is, and wait briefly for the answers."""
        live = [r for r in self.ranks if r.outcome is None and r.conn_open]
        for rank in live:
            try:
                rank.conn.send_bytes(b"stack")
            except OSError:
                rank.conn_open = False
        end = time.monotonic() + STACK_WAIT
        while time.monotonic() < end:
            waiting = [r for r in live if r.stack is None and r.outcome is None and r.conn_open]
            if not waiting:
                return
            self._poll(waiting, end - time.monotonic())

    def _stop(self, rank: int) -> None:
        """SIGKILL rank ``rank``'s process group (at the run's end, or the relay's fault plan);
        once the rank was reaped, nothing (its pid may be another process's by then)."""
        self.ranks[rank].proc.kill_group()

    def _kill(self) -> None:
        """SIGKILL every rank's process group, then reap the ranks and close our ends."""
        for rank in self.ranks:
            self._stop(rank.rank)
        for rank in self.ranks:
            rank.proc.join(2.0)
            rank.conn.close()

    def _read(self, rank: int) -> tuple[str, str]:
        """The rank's captured stdout and stderr."""
        texts = []
        for suffix in ("out", "err"):
            try:
                texts.append(confined.read_rank_file(os.path.join(self.dir, f"{rank}.{suffix}")))
            except FileNotFoundError:
                texts.append("")
        return texts[0], texts[1]
