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
  shared-memory file descriptors are passed around. An argument wrapped in ``PerRank``
  sends rank r its element r only. Under grading (``course.ranks.confined``) ranks fork
  from a confined server and reply in plain data, never unpickled.
* Rendezvous is a FileStore in a private temp dir: no port to pick, no collision
  between notebooks. The dir (with each rank's stdout/stderr files) is removed after
  the run.
* Each rank leads its own process group; the caller SIGKILLs those groups when the
  run ends, fails, times out or is interrupted, so children a rank started die too
  (unless they made a new session themselves). A rank whose caller dies kills itself.
* After the first failure the other ranks get ``grace`` seconds (``ABORT_GRACE``) to finish or
  fail on their own, then they are stopped and reported with where they were.
  A rank that was merely slow is reported as aborted, not waited for.
* A rank that has returned or raised stays up, idle, until the run ends: exiting
  early would close gloo connections its peers still read, and a peer blocked on a
  failed rank is then found (by its stack) where it waits. The caller kills them all.
* ``backend="gloo"`` (the default) runs every rank on the CPU; ``backend="nccl"`` puts rank r
  on ``cuda:r`` and is refused, with the reason, unless there is one CUDA device per rank.
  ``backend="relay"`` (CPU) sends every message and collective through the caller
  (:mod:`course.ranks.relay`), which records each in ``RunResult.relayed``: no rank can reach
  another any other way through torch.distributed, and the record is the caller's own.
* ``pg_timeout`` (default 10 s; for a ``timeout`` under 10 s, ``WALL_FACTOR`` times it, so
  the run's own deadline decides) is gloo's limit for any wait on a peer, start-up
  included: a deadlock fails after it, not after the whole deadline. The run's deadline is
  on :class:`course.ranks.clock.RunClock`: time the ranks waited for a CPU is not charged.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import psutil

from course.ranks.clock import WALL_FACTOR
from course.ranks.confined import PerRank
from course.ranks.failures import CELL_NAME, RankError, RankFailure, RunResult
from course.ranks.faults import Fault
from course.ranks.forkserver import SERVER
from course.ranks.holds import Hold
from course.ranks.objects import Stored
from course.ranks.pickling import dumps
from course.ranks.rescale import Rescale
from course.ranks.supervisor import ABORT_GRACE, Supervisor

__all__ = [
    "PerRank",
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
HARD_MAX_RANKS = 64  # beyond this, N processes on a laptop teach nothing but swapping
RANK_MEMORY = 80 * 2**20  # generous private memory per rank (measured: ~30-40 MB)


def run(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    timeout: float = DEFAULT_TIMEOUT,
    pg_timeout: float | None = None,
    backend: str = "gloo",
    **kwargs: Any,
) -> list[Any]:
    """Call ``fn(*args, **kwargs)`` on every rank; return the values in rank order."""
    if not callable(fn):
        raise TypeError(f"run() needs a function to call, got a {type(fn).__name__}")
    return launch(
        fn, world_size, *args, timeout=timeout, pg_timeout=pg_timeout, backend=backend, **kwargs
    ).check()


def run_source(
    source: str,
    world_size: int,
    *,
    timeout: float = DEFAULT_TIMEOUT,
    pg_timeout: float | None = None,
    backend: str = "gloo",
    variables: Mapping[str, Any] | None = None,
    **more_variables: Any,
) -> list[Any]:
    """Exec cell text on every rank; return each rank's last expression value (or None)."""
    if not isinstance(source, str):
        raise TypeError(f"run_source() needs cell text (a str), got a {type(source).__name__}")
    names = {**(variables or {}), **more_variables}
    return launch(
        source,
        world_size,
        timeout=timeout,
        pg_timeout=pg_timeout,
        backend=backend,
        variables=names,
    ).check()


def launch(
    target: Callable[..., Any] | str,
    world_size: int,
    *args: Any,
    timeout: float = DEFAULT_TIMEOUT,
    pg_timeout: float | None = None,
    backend: str = "gloo",
    variables: Mapping[str, Any] | None = None,
    before: Callable[[], list[str]] | None = None,
    measured: bool = False,
    holds: Sequence[Hold] = (),
    rescale: Rescale | None = None,
    stored: dict[str, Stored] | None = None,
    grace: float = ABORT_GRACE,
    fault: Fault | None = None,
    **kwargs: Any,
) -> RunResult:
    """Run ``fn(*args, **kwargs)``, or cell text with ``variables`` defined; report, never raise.

    ``before`` runs on every rank before its job is unpickled, so before any code the job
    carries (a check's refusals of torch built-ins, ``course.checks.refusals``); on graded
    ranks the files it returns are unreadable for the job. ``measured``: on the relay, every
    rank's memory is read at that point too (a snapshot tagged ``relay.BASELINE``), so that
    what the job's code holds from its first line on counts in what it grew by. ``holds``:
    on the relay, the stragglers it makes (:mod:`course.ranks.holds`), told to no rank;
    ``rescale``: on the relay, the all-gathers it scales (:mod:`course.ranks.rescale`);
    ``stored``: on the relay, the objects its storage starts with (:mod:`course.ranks.objects`;
    the result's ``stored`` is what it holds at the end); ``grace``: the seconds the other
    ranks get after one fails (an experiment on failures gives them gloo's timeout, to see how
    each ends on its own); ``fault``: on the relay, the rank it kills, and when
    (:mod:`course.ranks.faults`), told to no rank. A confined launch whose forkserver was
    stopped or killed while it forked the ranks runs once more, on a fresh forkserver: graded
    ranks, each in a PID namespace of its own, cannot see their forkserver, so that was the
    machine's doing."""
    _check_world_size(world_size)
    _check_backend(backend, world_size)
    timeout, pg_timeout = _check_timeouts(timeout, pg_timeout)
    if isinstance(target, str):
        kwargs = {**(variables or {}), **kwargs}  # for cell text, keywords are variables too
    elif variables is not None:
        raise TypeError("variables= is for cell text; pass a function's inputs as arguments")
    payloads = [_payload(target, *_share(args, kwargs, rank)) for rank in range(world_size)]
    prelude = dumps(before) if before is not None else b""
    options = (timeout, pg_timeout, backend, prelude, measured, tuple(holds), rescale, grace)
    supervisor = Supervisor(world_size, payloads, *options, stored, fault)
    result = supervisor.execute()
    if supervisor.unstarted:
        result = Supervisor(world_size, payloads, *options, stored, fault).execute()
    return result


def max_world_size() -> int:
    """The most ranks this machine may start: ``HARD_MAX_RANKS``, fewer if memory is short."""
    return max(1, min(HARD_MAX_RANKS, psutil.virtual_memory().available // RANK_MEMORY))


def warm_up() -> None:
    """Start the forkserver now; it imports torch in the background, so the first run is fast."""
    SERVER.get()


def shutdown() -> None:
    """Stop the launcher's forkserver (the next run starts a fresh, cold one)."""
    SERVER.stop()


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


def _check_backend(backend: Any, world_size: int) -> None:
    """Accept gloo (CPU, the default), relay (CPU, every message through the caller) or nccl
    with one CUDA device per rank; refuse clearly."""
    if backend in ("gloo", "relay"):
        return
    if backend != "nccl":
        raise ValueError(
            "backend must be 'gloo' (CPU), 'relay' (CPU, every message recorded by the caller) "
            f"or 'nccl' (one GPU per rank), not {backend!r}"
        )
    import torch

    devices = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if devices < world_size:
        raise ValueError(
            f"backend='nccl' puts rank r on cuda:r, so {world_size} ranks need {world_size} CUDA "
            f"devices; this machine has {devices}. Use backend='gloo' (CPU) or fewer ranks."
        )


def _check_timeouts(timeout: Any, pg_timeout: Any) -> tuple[float, float]:
    """Validate the run deadline and default the gloo timeout: 10 s, or for a shorter run
    deadline, that deadline's wall bound (``WALL_FACTOR`` times it)."""
    for name, value in (("timeout", timeout), ("pg_timeout", pg_timeout)):
        if value is None and name == "pg_timeout":
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1e6:
            raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
    if pg_timeout:
        return float(timeout), float(pg_timeout)
    # A deadline within gloo's 10 s is the run's clock's to call (course.ranks.clock: a busy
    # machine does not run it down): gloo's own, in wall time, waits out its wall bound.
    own = min(timeout, MAX_PG_TIMEOUT) if timeout > MAX_PG_TIMEOUT else timeout * WALL_FACTOR
    return float(timeout), float(own)


def _share(args: tuple, kwargs: dict, rank: int) -> tuple[tuple, dict]:
    """One rank's arguments: each :class:`PerRank` one replaced by that rank's element."""

    def mine(value: Any) -> Any:
        return value.for_rank(rank) if isinstance(value, PerRank) else value

    return tuple(map(mine, args)), {k: mine(v) for k, v in kwargs.items()}


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
        return dumps(job)
    except Exception:
        for name, value in parts.items():
            _try_pickle(name, value)
        raise


def _try_pickle(name: str, value: Any) -> None:
    """Raise a TypeError that says which value cannot be sent to the ranks, and why."""
    try:
        dumps(value)
    except Exception as exc:  # noqa: BLE001 - any pickling failure; the next lines name the culprit
        raise TypeError(
            f"{name} (a {type(value).__name__}) cannot be sent to the ranks: {exc}. Pass plain "
            "data (numbers, lists, dicts, tensors) or create the object inside the ranks."
        ) from None
