"""The rank side of :mod:`course.ranks`: what each rank process runs.

The launcher's forkserver imports this module once, with torch, so every rank is a
``fork`` of a warm process. Each rank joins the default gloo process group through a
FileStore in the run's private directory (no port to choose), runs its job with
stdout/stderr redirected to files the caller reads afterwards, and sends one message
back: its return value, its exception, or how it exited. A watchdog thread answers
the caller's "where are you?" with the main thread's stack and kills the rank (and
anything it started) when the caller goes away. Not part of the public API.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import faulthandler
import linecache
import os
import signal
import socket
import sys
import threading
import traceback
from datetime import timedelta
from multiprocessing.connection import Connection
from typing import Any

# Before torch and numpy load: one compute thread per rank, so N ranks on a 2-core
# laptop do not thrash, and the forkserver stays single-threaded (OpenBLAS would
# otherwise start a pool on import), which keeps fork() safe.
for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ[_var] = "1"
# All ranks live on this machine: loopback always works, the hostname may not resolve.
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo0" if sys.platform == "darwin" else "lo")

import cloudpickle  # noqa: E402 - after the thread limits above, on purpose
import torch  # noqa: E402 - after the thread limits above, on purpose
import torch.distributed as dist  # noqa: E402 - after the thread limits above, on purpose

from course.ranks import isolation, messages, relay  # noqa: E402 - after the thread limits above
from course.ranks import plain as plain_data  # noqa: E402 - after the thread limits above
from course.ranks.failures import CELL_NAME as CELL  # noqa: E402 - after the thread limits above
from course.ranks.memory import exact_malloc  # noqa: E402 - after the thread limits above

Frames = list[tuple[str, int, str, str]]  # (filename, lineno, function, source line)
_EXIT = os._exit  # the real one: a rank wraps os._exit to report where it was called


def rank_main(
    conn: Connection,
    rank: int,
    world_size: int,
    run_dir: str,
    cwd: str | None,
    sys_path: list[str] | None,
    payload: bytes,
    pg_timeout: float,
    backend: str,
    plain: bool = False,
    link: socket.socket | None = None,
    private: tuple[str, ...] = (),
    before: bytes = b"",
    measured: bool = False,
) -> None:
    """Run one rank's job and report the outcome to the caller; never returns.

    ``cwd`` and ``sys_path`` (the caller's) are taken over unless None; with ``plain`` the
    return value travels as plain data (:mod:`course.ranks.plain`), else with cloudpickle.
    ``before`` (pickled, the launcher's: the checks' refusals) runs before the job is
    unpickled. With ``private`` (graded ranks) the rank first has namespaces and folders of
    its own (:mod:`course.ranks.isolation`); ``measured``: see :func:`_join_relay`.
    """
    if os.getpid() != os.getpgrp():
        os.setpgid(0, 0)  # own process group: the caller kills it and all it started
    _redirect_output(run_dir, rank)  # before isolate: the caller reads these files
    _before_the_job(conn, private, run_dir, before)
    send = _Sender(conn)
    watchdog = threading.Thread(target=_watch, args=(conn, send, threading.get_ident()))
    watchdog.daemon = True
    watchdog.start()
    os._exit = _reporting_exit(send, os._exit)
    try:
        if cwd is not None:
            os.chdir(cwd)
        if sys_path is not None:
            sys.path[:] = sys_path
        torch.set_num_threads(1)
        if plain:  # graded: what the rank frees is seen to go (course.ranks.memory)
            exact_malloc()
        if backend == "relay":  # every message goes through the caller, who records it
            fatal = _failing(send, threading.get_ident())
            device = _join_relay(link, rank, world_size, pg_timeout, fatal, measured)
        else:
            store = dist.FileStore(os.path.join(run_dir, "store"), world_size)
            device = _init_process_group(rank, world_size, store, pg_timeout, backend)
        value = _dump_value(_execute(cloudpickle.loads(payload), rank, world_size, device), plain)
        relay.finished()  # on the relay, its last word after all it sent (on gloo, nothing)
        send(("ok", value))
    except SystemExit as exc:
        send(("sys_exit", _exit_code(exc.code), _frames(exc.__traceback__)))
    except BaseException as exc:  # noqa: BLE001 - every failure, KeyboardInterrupt included, goes to the caller
        send(("raised", _describe(exc)))
    # Having reported, the rank stays up, idle, until the caller ends the whole run.
    # Exiting now would close gloo connections that peers may still be reading (even
    # their start-up handshake), and a peer blocked on a failed rank would fail with
    # "connection closed" instead of being found, by its stack, where it waits.
    _flush()
    threading.Event().wait()


def _before_the_job(
    conn: Connection, private: tuple[str, ...], run_dir: str, before: bytes
) -> None:
    """The launcher's step (``before``: the checks' refusals), on a graded rank (``private``)
    inside namespaces and folders of its own (:mod:`course.ranks.isolation`)."""
    step = cloudpickle.loads(before) if before else _nothing
    if private:
        isolation.isolate(conn, private, run_dir, step)
    else:
        step()


def _join_relay(
    link: socket.socket, rank: int, world_size: int, pg_timeout: float, fatal: Any, measured: bool
) -> torch.device:
    """Join the relay as the default group (the CPU its device); ``measured``: its snapshot
    of every rank now, before the job is unpickled (``relay.BASELINE``), so that what the
    job holds from its first line on counts in what it grew by."""
    relay.join(link, rank, world_size, pg_timeout, fatal)
    if measured:
        relay.snapshot(relay.BASELINE)
    return torch.device("cpu")


def _nothing() -> list[str]:
    """No step before the job: nothing refused, no file to hide."""
    return []


def _init_process_group(
    rank: int, world_size: int, store: dist.Store, pg_timeout: float, backend: str
) -> torch.device:
    """Join the default group; every wait on a peer fails after ``pg_timeout`` seconds.

    With nccl, rank r works on ``cuda:r`` (the launcher checked there is one); gloo is CPU.

    gloo fixes a pair's timeout when it connects (torch's _set_pg_timeout only reaches
    collectives, not send/recv), so start-up and every later wait share this limit.
    """
    timeout = timedelta(seconds=pg_timeout)
    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, rank=rank, world_size=world_size, store=store, timeout=timeout)
    return device


def _execute(job: dict[str, Any], rank: int, world_size: int, device: torch.device) -> Any:
    """Call the job's function, or exec its cell source and return the last expression."""
    if "fn" in job:
        return job["fn"](*job["args"], **job["kwargs"])
    source = job["source"]
    linecache.cache[CELL] = (len(source), None, source.splitlines(True), CELL)
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    namespace |= {"rank": rank, "world_size": world_size, "torch": torch, "dist": dist}
    namespace["device"] = device
    namespace |= job["variables"]
    tree = ast.parse(source, CELL)
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    exec(compile(tree, CELL, "exec", dont_inherit=True), namespace)  # noqa: S102 - runs the cell's own source, on its own rank
    if last is None:
        return None
    return eval(compile(ast.Expression(last.value), CELL, "eval", dont_inherit=True), namespace)  # noqa: S307 - the cell's last expression, like IPython's


def _dump_value(value: Any, plain: bool) -> bytes:
    """Encode a return value, or explain why it cannot travel back to the caller."""
    try:
        return plain_data.dumps(value) if plain else cloudpickle.dumps(value)
    except Exception as exc:  # noqa: BLE001 - any pickling failure becomes this rank's TypeError
        kind = type(value).__name__
        raise TypeError(
            f"the return value (a {kind}) cannot be sent back to the caller: {exc}. "
            "Return plain data instead (numbers, strings, lists, dicts, tensors)."
        ) from None


class _Sender:
    """Send whole messages on the rank's connection from either thread, one at a time."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._lock = threading.Lock()

    def __call__(self, message: tuple) -> None:
        data = messages.encode(message)
        # OSError: the caller is gone, and the watchdog is about to end this rank.
        with self._lock, contextlib.suppress(OSError):
            self._conn.send_bytes(data)


def _watch(conn: Connection, send: _Sender, main_ident: int) -> None:
    """Answer stack requests; when the caller closes the connection, kill this rank."""
    while True:
        try:
            request = conn.recv_bytes()
        except (EOFError, OSError):
            _kill_own_group()
        if request == b"stack":
            _flush()
            frame = sys._current_frames().get(main_ident)  # noqa: SLF001 - the only way to read another thread's stack
            send(("stack", _stack(frame)))


def _failing(send: _Sender, main_ident: int) -> Any:
    """A refused call that torch's C++ waits on (DDP's buckets) fails the rank from here: it
    reports the error where the main thread is, as if raised there, then waits to be ended."""

    def fail(error: BaseException) -> None:
        frame = sys._current_frames().get(main_ident)  # noqa: SLF001 - where the rank waits
        report = _describe(error) | {"frames": _stack(frame)}
        _flush()
        send(("raised", report))

    return fail


def _kill_own_group() -> None:
    """SIGKILL this rank and every process it started (they share its process group); the
    init of its own PID namespace exits, which ends every process in it."""
    if os.getpid() == 1:
        _EXIT(1)
    if os.getpgrp() == os.getpid():
        os.killpg(os.getpid(), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


def _reporting_exit(send: _Sender, real_exit: Any) -> Any:
    """Wrap os._exit so the caller learns where a rank called it before it vanishes."""

    def _exit(code: int) -> None:
        send(("os_exit", code, _stack(sys._getframe(1))))  # noqa: SLF001 - where os._exit was called
        _flush()
        real_exit(code)

    return _exit


def _redirect_output(run_dir: str, rank: int) -> None:
    """Send fds 1 and 2 (so C code and child processes too) to this rank's files."""
    for fd, suffix in ((1, "out"), (2, "err")):
        path = os.path.join(run_dir, f"{rank}.{suffix}")
        file_fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(file_fd, fd)
        os.close(file_fd)
    opts = {"buffering": 1, "encoding": "utf-8", "errors": "backslashreplace", "closefd": False}
    sys.stdout = open(1, "w", **opts)  # noqa: SIM115 - lives as long as the rank
    sys.stderr = open(2, "w", **opts)  # noqa: SIM115 - lives as long as the rank
    faulthandler.enable(sys.stderr)  # a segfault in native code still leaves a Python stack


def _flush() -> None:
    """Flush the rank's Python-level output streams."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()


def _frames(tb: Any) -> Frames:
    """A traceback's frames, outermost first, without this module's own frames."""
    return _strip(traceback.extract_tb(tb))


def _stack(frame: Any) -> Frames:
    """A live stack's frames, outermost first, without the launcher's own frames."""
    return _strip(traceback.extract_stack(frame)) if frame is not None else []


def _strip(summary: traceback.StackSummary) -> Frames:
    """Drop the launcher frames that lead into the user's code."""
    frames = [(f.filename, f.lineno or 0, f.name, f.line or "") for f in summary]
    last_launcher = max((i for i, f in enumerate(frames) if f[0] == __file__), default=-1)
    return frames[last_launcher + 1 :]


def _describe(exc: BaseException) -> dict[str, Any]:
    """The parts of an exception the caller needs to report it."""
    lines = traceback.format_exception_only(type(exc), exc)
    text = "".join(lines).rstrip()
    return {"type": type(exc).__name__, "text": text, "frames": _frames(exc.__traceback__)}


def _exit_code(code: Any) -> int:
    """The process exit status sys.exit(code) stands for."""
    if code is None:
        return 0
    return code if isinstance(code, int) else 1
