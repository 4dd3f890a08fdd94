"""Run code on N real ``torch.distributed`` ranks (gloo, CPU) from a notebook or a test.

    from course.ranks import run

    def total(x):
        t = torch.tensor([x + dist.get_rank()])
        dist.all_reduce(t)
        return t.item()

    run(total, 4, 10)          # -> [46, 46, 46, 46], one value per rank, in rank order

Inside the function the default gloo process group is initialised. ``run_source`` runs
cell text instead (with ``rank``, ``world_size``, ``torch`` and ``dist`` defined), and
``launch`` returns a :class:`RunResult` (values, per-rank stdout/stderr, failures)
instead of raising. Any failure raises :class:`RankError`, whose ``failures`` say per
rank what happened: ``raised``, ``exited``, ``killed``, ``deadlock``, ``spin``,
``blocked`` (waiting on a rank that failed), ``aborted`` or ``timeout``.

How it works, and the trade-offs:

* Ranks are forked from a forkserver this module owns (not multiprocessing's global
  one), which imported torch once: a warm start costs ~0.1 s, not the ~5 s of
  ``torch.multiprocessing.spawn``. The server is started by fork+exec, so threads in
  the calling kernel do not matter. It exits with the caller and is restarted if it
  dies. The first run in a process pays for importing torch there (~2-3 s).
* Functions travel by value with cloudpickle, so functions defined in a notebook
  work; arguments and return values are pickled bytes (tensors included), so no
  shared-memory file descriptors are passed around.
* Rendezvous is a FileStore in a private temp dir: no port to pick, no collision
  between notebooks. The dir (with each rank's stdout/stderr files) is removed after
  the run.
* Each rank leads its own process group; the caller SIGKILLs those groups when the
  run ends, fails, times out or is interrupted, so children a rank started die too
  (unless they made a new session themselves). A rank whose caller dies kills itself.
* After the first failure the other ranks get ``ABORT_GRACE`` seconds to finish or
  fail on their own, then they are stopped and reported with where they were.
  A rank that was merely slow is reported as aborted, not waited for.
* A rank that has returned or raised stays up, idle, until the run ends: exiting
  early would close gloo connections its peers still read, and a peer blocked on a
  failed rank is then found (by its stack) where it waits. The caller kills them all.
* ``pg_timeout`` (default min(timeout, 10 s)) is gloo's limit for any wait on a peer,
  start-up included: a deadlock fails after it, not after the whole deadline. On a
  heavily loaded machine, raise it if ranks time out while connecting.
"""

from __future__ import annotations

import contextlib
import glob
import io
import os
import pickle
import shutil
import signal
import sys
import tempfile
import threading
import time
import types
from collections import ChainMap
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from multiprocessing import Pipe, forkserver, popen_forkserver, reduction, util
from multiprocessing.connection import Connection, wait
from multiprocessing.context import set_spawning_popen
from multiprocessing.process import BaseProcess
from typing import Any, ClassVar

import cloudpickle
import psutil

__all__ = [
    "RankError",
    "RankFailure",
    "RunResult",
    "launch",
    "max_world_size",
    "run",
    "run_source",
    "shutdown",
    "warm_up",
]

DEFAULT_TIMEOUT = 60.0  # seconds for a whole run, start-up included
MAX_PG_TIMEOUT = 10.0  # gloo gives up on a peer after this long (default pg_timeout)
ABORT_GRACE = 0.5  # seconds the other ranks get after one rank fails
STACK_WAIT = 0.5  # seconds to wait for stuck ranks to report where they are
HARD_MAX_RANKS = 64  # beyond this, N processes on a laptop teach nothing but swapping
RANK_MEMORY = 80 * 2**20  # generous private memory per rank (measured: ~30-40 MB)
RUN_DIR_PREFIX = "course-ranks-"  # + the caller's pid: whose run left it, if one did
CELL_NAME = "<cell>"  # the filename of run_source() code in tracebacks


@dataclass(frozen=True)
class RankFailure:
    """What went wrong on one rank: ``kind``, a one-line ``message``, ``where``, ``traceback``.

    Kinds. Causes: ``raised`` (an exception, or a value that cannot be sent back),
    ``exited`` (sys.exit or os._exit), ``killed`` (a signal: segfault, OOM killer),
    ``spin`` (still running outside any dist call at the deadline). Consequences:
    ``blocked`` (waiting in a dist call on a rank that failed), ``aborted`` (stopped
    after another rank failed), ``deadlock`` (every unfinished rank waiting in a dist
    call, no cause), ``timeout`` (did not finish and did not say where it was).
    """

    rank: int
    kind: str
    message: str
    where: str | None = None
    traceback: str = ""
    exitcode: int | None = None

    def __str__(self) -> str:
        return f"rank {self.rank} {self.message}"


@dataclass
class RunResult:
    """Everything a run left behind: per-rank values, output and failures."""

    world_size: int
    results: list[Any]
    stdout: list[str]
    stderr: list[str]
    failures: dict[int, RankFailure] = field(default_factory=dict)
    elapsed: float = 0.0

    @property
    def ok(self) -> bool:
        """Whether every rank returned normally."""
        return not self.failures

    def check(self) -> list[Any]:
        """The per-rank values, or raise :class:`RankError` if any rank failed."""
        if self.failures:
            raise RankError(self)
        return self.results


class RankError(RuntimeError):
    """One or more ranks failed; ``failures`` maps rank -> :class:`RankFailure`."""

    def __init__(self, result: RunResult) -> None:
        self.result = result
        self.failures = result.failures
        super().__init__(_report(result))

    def __reduce__(self) -> tuple:
        return (RankError, (self.result,))

    def _render_traceback_(self) -> list[str]:
        """Show the ranks' own tracebacks in IPython, not the launcher's frames."""
        return [f"RankError: {self}"]


def run(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    timeout: float = DEFAULT_TIMEOUT,
    pg_timeout: float | None = None,
    **kwargs: Any,
) -> list[Any]:
    """Call ``fn(*args, **kwargs)`` on every rank; return the values in rank order."""
    if not callable(fn):
        raise TypeError(f"run() needs a function to call, got a {type(fn).__name__}")
    return launch(fn, world_size, *args, timeout=timeout, pg_timeout=pg_timeout, **kwargs).check()


def run_source(
    source: str,
    world_size: int,
    *,
    timeout: float = DEFAULT_TIMEOUT,
    pg_timeout: float | None = None,
    variables: Mapping[str, Any] | None = None,
    **more_variables: Any,
) -> list[Any]:
    """Exec cell text on every rank; return each rank's last expression value (or None)."""
    if not isinstance(source, str):
        raise TypeError(f"run_source() needs cell text (a str), got a {type(source).__name__}")
    names = {**(variables or {}), **more_variables}
    return launch(
        source, world_size, timeout=timeout, pg_timeout=pg_timeout, variables=names
    ).check()


def launch(
    target: Callable[..., Any] | str,
    world_size: int,
    *args: Any,
    timeout: float = DEFAULT_TIMEOUT,
    pg_timeout: float | None = None,
    variables: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> RunResult:
    """Run ``fn(*args, **kwargs)``, or cell text with ``variables`` defined; report, never raise."""
    _check_world_size(world_size)
    timeout, pg_timeout = _check_timeouts(timeout, pg_timeout)
    if isinstance(target, str):
        kwargs = {**(variables or {}), **kwargs}  # for cell text, keywords are variables too
    elif variables is not None:
        raise TypeError("variables= is for cell text; pass a function's inputs as arguments")
    payload = _payload(target, args, kwargs)
    return _Run(world_size, payload, timeout, pg_timeout).execute()


def max_world_size() -> int:
    """The most ranks this machine may start: ``HARD_MAX_RANKS``, fewer if memory is short."""
    return max(1, min(HARD_MAX_RANKS, psutil.virtual_memory().available // RANK_MEMORY))


def warm_up() -> None:
    """Start the forkserver now; it imports torch in the background, so the first run is fast."""
    _SERVER.get()


def shutdown() -> None:
    """Stop the launcher's forkserver (the next run starts a fresh, cold one)."""
    _SERVER.stop()


# --- input checks: clear errors before any process starts ---------------------------


def _check_world_size(world_size: Any) -> None:
    """Reject world sizes that are not a whole number of ranks this machine can hold."""
    if isinstance(world_size, bool) or not isinstance(world_size, int):
        raise TypeError(f"world_size must be an int (the number of ranks), got {world_size!r}")
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")
    cap = max_world_size()
    if world_size > cap:
        raise ValueError(
            f"world_size={world_size} is more ranks than this machine should start: each rank "
            f"is a process holding ~{RANK_MEMORY >> 20} MB, and the limit here is {cap} "
            f"(at most {HARD_MAX_RANKS}, fewer when memory is short). Use a smaller world_size."
        )


def _check_timeouts(timeout: Any, pg_timeout: Any) -> tuple[float, float]:
    """Validate the run deadline and default the gloo timeout to min(timeout, 10 s)."""
    for name, value in (("timeout", timeout), ("pg_timeout", pg_timeout)):
        if value is None and name == "pg_timeout":
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1e6:
            raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
    return float(timeout), float(pg_timeout or min(timeout, MAX_PG_TIMEOUT))


def _payload(target: Any, args: tuple, kwargs: dict) -> bytes:
    """Pickle the job by value, naming the argument that cannot be sent if one fails."""
    if isinstance(target, str):
        compile(target, CELL_NAME, "exec")  # a SyntaxError shows here, not on every rank
        job: dict[str, Any] = {"source": target, "variables": kwargs}
        parts = {f"variable {k!r}": v for k, v in kwargs.items()}
    elif callable(target):
        job = {"fn": target, "args": args, "kwargs": kwargs}
        parts = {"the function": target}
        parts |= {f"argument {i + 1}": a for i, a in enumerate(args)}
        parts |= {f"keyword argument {k!r}": v for k, v in kwargs.items()}
    else:
        raise TypeError(f"launch() needs a function or cell text, got a {type(target).__name__}")
    try:
        return _dumps(job)
    except Exception:
        for name, value in parts.items():
            _try_pickle(name, value)
        raise


def _try_pickle(name: str, value: Any) -> None:
    """Raise a TypeError that says which value cannot be sent to the ranks, and why."""
    try:
        _dumps(value)
    except Exception as exc:
        raise TypeError(
            f"{name} (a {type(value).__name__}) cannot be sent to the ranks: {exc}. Pass plain "
            "data (numbers, lists, dicts, tensors) or create the object inside the ranks."
        ) from None


def _dumps(obj: Any) -> bytes:
    """cloudpickle by value, keeping code filenames so rank tracebacks name the user's file."""
    with io.BytesIO() as buf:
        _Pickler(buf).dump(obj)
        return buf.getvalue()


def _code_reduce(code: types.CodeType) -> tuple:
    """cloudpickle's code reducer, minus its renaming of every file to "<dynamic-code>"."""
    constructor, args = cloudpickle.cloudpickle._code_reduce(code)
    return constructor, tuple(code.co_filename if a == "<dynamic-code>" else a for a in args)


class _Pickler(cloudpickle.Pickler):
    """cloudpickle, tuned for ranks that already imported torch (uses cloudpickle internals)."""

    dispatch_table: ClassVar = ChainMap(
        {types.CodeType: _code_reduce}, cloudpickle.Pickler.dispatch_table
    )

    def _dynamic_function_reduce(self, func: types.FunctionType) -> tuple:
        """Do not make ranks import every torch submodule the caller happened to import.

        cloudpickle sends along any imported submodule whose name matches an attribute
        the function uses: after ``torch.testing.assert_close`` (which imports
        ``torch.distributed.tensor``), any function that says ``dist`` and ``.tensor``
        made every rank import sympy, ~1.5 s each. torch loads what it needs itself.
        """
        reduced = super()._dynamic_function_reduce(func)
        with contextlib.suppress(LookupError, TypeError, AttributeError):
            slots = reduced[2][1]
            modules = slots["_cloudpickle_submodules"]
            slots["_cloudpickle_submodules"] = [
                m for m in modules if not m.__name__.startswith("torch.")
            ]
        return reduced


# --- the launcher's own forkserver ------------------------------------------------


class _Server:
    """A private multiprocessing forkserver with torch preloaded, restarted if it dies."""

    # torch._dynamo is what DDP's first forward imports: 1-5 s per rank if every rank pays.
    PRELOAD: ClassVar = ["course._rank_main", "course.ranks", "torch._dynamo"]

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._server: forkserver.ForkServer | None = None

    def get(self) -> forkserver.ForkServer:
        """The running forkserver, starting a fresh one if there is none or it died."""
        with self._lock:
            if self._server is not None and not self._alive(self._server):
                self._discard()
            if self._server is None:
                _sweep_stale_run_dirs()
                self._server = forkserver.ForkServer()
                self._server.set_forkserver_preload(self.PRELOAD)
                self._server.ensure_running()
            return self._server

    def pid(self) -> int | None:
        """The forkserver's pid, if one was started."""
        return self._server._forkserver_pid if self._server else None

    def stop(self) -> None:
        """Ask the forkserver to exit (closing its "alive" pipe) and reap it."""
        with self._lock:
            if self._server is not None:
                pid = self._server._forkserver_pid
                self._discard()
                _reap(pid)

    @staticmethod
    def _alive(server: forkserver.ForkServer) -> bool:
        try:  # multiprocessing internals: stable from Python 3.8 to 3.13
            return os.waitpid(server._forkserver_pid, os.WNOHANG)[0] == 0
        except ChildProcessError:
            return False

    def _discard(self) -> None:
        server, self._server = self._server, None
        if server is not None and server._forkserver_alive_fd is not None:
            os.close(server._forkserver_alive_fd)
        address = server and server._forkserver_address
        if isinstance(address, str) and os.path.exists(address):
            os.unlink(address)


def _reap(pid: int | None, timeout: float = 5.0) -> None:
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
        _signal(os.kill, pid)
        _reap(pid, 1.0)


_SERVER = _Server()


def _sweep_stale_run_dirs() -> None:
    """Remove run directories left by callers that died (SIGKILL, a crash) mid-run."""
    for path in glob.glob(os.path.join(tempfile.gettempdir(), RUN_DIR_PREFIX + "*")):
        pid = os.path.basename(path)[len(RUN_DIR_PREFIX) :].split("-")[0]
        if pid.isdigit() and not psutil.pid_exists(int(pid)):
            shutil.rmtree(path, ignore_errors=True)


class _Popen(popen_forkserver.Popen):
    """Start a process through our forkserver, without re-importing the caller's __main__.

    multiprocessing would send the caller's __main__ module to be re-imported in every
    child (a notebook kernel, a pytest run, a script...): slow, and pointless here.
    """

    def _launch(self, process_obj: BaseProcess) -> None:
        buf = io.BytesIO()
        set_spawning_popen(self)
        try:
            reduction.dump({}, buf)  # no preparation data: ranks set cwd and sys.path
            reduction.dump(process_obj, buf)
        finally:
            set_spawning_popen(None)
        self.sentinel, w = _SERVER.get().connect_to_new_process(self._fds)
        _parent_w = os.dup(w)  # keeps the child's parent_sentinel open while we live
        self.finalizer = util.Finalize(self, util.close_fds, (_parent_w, self.sentinel))
        with open(w, "wb", closefd=True) as f:
            f.write(buf.getbuffer())
        self.pid = forkserver.read_signed(self.sentinel)


class _RankProcess(BaseProcess):
    """One rank; ``run`` imports the rank side lazily so the caller never imports torch."""

    _start_method = "forkserver"

    @staticmethod
    def _Popen(process_obj: BaseProcess) -> _Popen:
        return _Popen(process_obj)

    def run(self) -> None:
        from course._rank_main import rank_main

        rank_main(*self._args)


# --- one run: start, supervise, stop, report ----------------------------------------


@dataclass
class _Rank:
    """The caller's view of one rank while the run is in progress."""

    rank: int
    proc: _RankProcess
    conn: Connection
    outcome: tuple | None = None  # the rank's final message, or how its process ended
    stack: list | None = None  # where it was when stopped
    exit_note: tuple | None = None  # (code, frames) from an os._exit call
    conn_open: bool = True


class _Run:
    """Start the ranks, watch them until done or failed, kill them all, collect results."""

    def __init__(self, world_size: int, payload: bytes, timeout: float, pg_timeout: float) -> None:
        self.world_size, self.payload = world_size, payload
        self.timeout, self.pg_timeout = timeout, pg_timeout
        self.ranks: list[_Rank] = []

    def execute(self) -> RunResult:
        start = time.monotonic()
        self.dir = tempfile.mkdtemp(prefix=f"{RUN_DIR_PREFIX}{os.getpid()}-")
        try:
            for rank in range(self.world_size):
                self.ranks.append(self._start(rank))
            reason = self._supervise(start + self.timeout)
            if reason != "done":
                self._collect_stacks()
            self._kill()
            outputs = [self._read(r.rank) for r in self.ranks]
        finally:
            self._kill()
            shutil.rmtree(self.dir, ignore_errors=True)
        from course._rank_report import build_result

        return build_result(self.ranks, outputs, reason, self.timeout, time.monotonic() - start)

    def _start(self, rank: int) -> _Rank:
        parent, child = Pipe()
        args = (child, rank, self.world_size, self.dir, os.getcwd(), list(sys.path))
        proc = _RankProcess(args=(*args, self.payload, self.pg_timeout), name=f"rank-{rank}")
        proc.daemon = True
        try:
            proc.start()
        finally:
            child.close()
        return _Rank(rank, proc, parent)

    def _supervise(self, deadline: float) -> str:
        """Wait for every rank to report; return "done", "deadline" or "abort"."""
        abort_at = None
        while True:
            live = [r for r in self.ranks if r.outcome is None]
            if not live:
                return "done"
            stop_at = deadline if abort_at is None else min(deadline, abort_at)
            now = time.monotonic()
            if now >= stop_at:
                return "deadline" if stop_at == deadline else "abort"
            # Short slices: a KeyboardInterrupt (Ctrl-C, a Jupyter interrupt) is only
            # raised between Python bytecodes, so never block for long in wait().
            self._poll(live, min(stop_at - now, 0.1))
            if abort_at is None and any(r.outcome and r.outcome[0] != "ok" for r in self.ranks):
                abort_at = time.monotonic() + ABORT_GRACE

    def _poll(self, live: list[_Rank], timeout: float) -> None:
        """Handle whatever the live ranks sent or how they ended, waiting up to timeout."""
        waitables = {r.conn: r for r in live if r.conn_open}
        waitables |= {r.proc.sentinel: r for r in live}
        for ready in wait(list(waitables), timeout):
            rank = waitables[ready]
            if ready is rank.conn:
                self._receive(rank)
            elif rank.outcome is None:
                while rank.conn_open and rank.conn.poll():
                    self._receive(rank)  # its last words may still be in the pipe
                if rank.outcome is None:
                    rank.outcome = ("ended", rank.proc.exitcode)

    def _receive(self, rank: _Rank) -> None:
        try:
            message = pickle.loads(rank.conn.recv_bytes())
        except (EOFError, OSError):
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

    def _kill(self) -> None:
        """SIGKILL every rank's process group, then reap the ranks and close our ends."""
        for rank in self.ranks:
            _signal(os.killpg, rank.proc.pid)
            _signal(os.kill, rank.proc.pid)
        for rank in self.ranks:
            rank.proc.join(2.0)
            rank.conn.close()

    def _read(self, rank: int) -> tuple[str, str]:
        """The rank's captured stdout and stderr."""
        texts = []
        for suffix in ("out", "err"):
            path = os.path.join(self.dir, f"{rank}.{suffix}")
            try:
                with open(path, encoding="utf-8", errors="replace") as f:
                    texts.append(f.read())
            except FileNotFoundError:
                texts.append("")
        return texts[0], texts[1]


def _signal(kill: Callable[[int, int], None], pid: int | None) -> None:
    """Send SIGKILL with ``kill`` (os.kill or os.killpg), ignoring processes already gone."""
    if pid:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            kill(pid, signal.SIGKILL)


def _report(result: RunResult) -> str:
    from course._rank_report import format_report

    return format_report(result)
