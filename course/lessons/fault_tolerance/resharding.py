"""Grade a student's ``save_sharded(shards, numel, storage)`` and
``load_resharded(names, numel, storage)``: a sharded optimizer state saved on N ranks and
loaded on M, each rank reading only what it needs.

    from course.lessons.fault_tolerance import check_resharding
    print(check_resharding(save_sharded, load_resharded))   # raises AssertionError that teaches

The state is ZeRO's: a few flat float32 tensors of ``numel`` elements (the Adam state of a
flattened model), rank r of N holding elements ``chunk_bounds(numel, N)[r]`` of each.
``save_sharded`` writes this rank's shard of each tensor as one object of the storage
(:class:`~course.lessons.fault_tolerance.storage.Storage`), named ``"<name>/<lo>-<hi>"`` by
the global elements it holds, as ``torch.distributed.checkpoint``'s index names each
chunk by its offsets. ``load_resharded``, on M ranks, returns this rank's range on M,
``chunk_bounds(numel, M)[rank]`` of each tensor, from the objects that overlap it.

Each case saves on ``SAVED_ON`` ranks and loads on each of ``LOADED_ON`` (fewer, then more).
The verdict is computed in the caller:
- the storage after the save holds each rank's shard under its key, and nothing else;
- before each load the caller writes new values under the same keys, so what a load returns
  comes from the storage as it is then (a state a rank kept elsewhere is stale), and must
  equal the new values' range, bit for bit;
- each rank's reads: no more than the bytes of the objects its range overlaps (reading the
  whole checkpoint, or more of it than the range needs, fails); ranged ``get``\\ s read
  exactly the range;
- nothing travels between ranks in either call (each rank writes and reads its own).
Under grading the storage is the relay's (:mod:`course.ranks.objects`): the objects, the
bytes each rank read and the calls between ranks are the caller's own record over the whole
run (no mark a rank sends itself moves a call out of it), none a rank's report; in a
notebook, the files and each rank's own counts.
``torch.distributed.checkpoint``'s save and load are refused on graded ranks.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from course.checks.compare import fresh_seed
from course.checks.refusals import Refusal, refusing
from course.checks.teaching import failure_message, need_function, teaches
from course.lessons.fault_tolerance.storage import Storage, read_objects, write_objects
from course.ranks import confined
from course.ranks.objects import Stored
from course.ranks.wording import count
from course.ring.recorder import Recorder
from course.ring.relayed import NAMES as TORCH_NAMES
from course.ring.schedule import chunk_bounds

__all__ = ["NAMES", "check_resharding", "expected_objects", "overlapping"]

SAVE, LOAD = "save_sharded", "load_resharded"
NAMES = ("param", "exp_avg", "exp_avg_sq")  # one flattened model's Adam state
NUMEL = 29  # chunk_bounds gives uneven shards on 2, 3 and 4 ranks
SAVED_ON = 3
LOADED_ON = (2, 4)  # fewer ranks, then more
LAUNCH_TIMEOUT = 30.0
DCP = Refusal(
    (
        "torch.distributed.checkpoint.state_dict_saver:save",
        "torch.distributed.checkpoint.state_dict_loader:load",
    ),
    "this is torch.distributed.checkpoint: the exercise is to write the sharded save and the "
    "resharding load yourself, with the storage's put, get and list",
)
KEYS = (
    'Each rank writes its shard of each tensor as one object, storage.put(f"{name}/{lo}-{hi}", '
    "shard), where (lo, hi) = chunk_bounds(numel, world_size)[rank] are the global elements "
    "it holds."
)


def expected_objects(whole: dict[str, torch.Tensor], n: int) -> dict[str, Stored]:
    """What a save of ``whole`` on ``n`` ranks leaves in the storage: one object per tensor
    and rank (an empty shard's may be left out)."""
    out = {}
    for name, t in whole.items():
        for lo, hi in chunk_bounds(t.numel(), n):
            out[f"{name}/{lo}-{hi}"] = Stored("float32", t[lo:hi].numpy().tobytes())
    return out


def overlapping(numel: int, saved_on: int, loaded_on: int, rank: int) -> list[tuple[int, int]]:
    """The saved shards (their global bounds) that rank ``rank`` of ``loaded_on`` needs."""
    lo, hi = chunk_bounds(numel, loaded_on)[rank]
    return [(a, b) for a, b in chunk_bounds(numel, saved_on) if a < hi and lo < b and a < b]


@teaches
def check_resharding(
    save_sharded: Callable[..., Any],
    load_resharded: Callable[..., Any],
    saved_on: int = SAVED_ON,
    loaded_on: Sequence[int] = LOADED_ON,
) -> str:
    """Save a sharded state on ``saved_on`` ranks, load it on each of ``loaded_on``."""
    need_function(SAVE, save_sharded)
    need_function(LOAD, load_resharded)
    sizes = (saved_on, *loaded_on)
    if any(type(n) is not int or n < 2 for n in sizes):
        raise ValueError(f"saved_on and loaded_on must be integers of at least 2, got {sizes}")
    seed = fresh_seed(None)
    g = torch.Generator().manual_seed(seed)
    saved = {name: torch.randn(NUMEL, generator=g) for name in NAMES}
    with tempfile.TemporaryDirectory(prefix="ckpt-") as path:
        storage = Storage(path)
        _check_save(save_sharded, saved, saved_on, storage)
        for m in loaded_on:
            now = {name: torch.randn(NUMEL, generator=g) for name in NAMES}
            _check_load(load_resharded, (saved, now), saved_on, m, storage)
    loads = " and on ".join(str(m) for m in loaded_on)
    return (
        f"{SAVE} and {LOAD} passed: {len(NAMES)} tensors of {NUMEL} elements saved on "
        f"{saved_on} ranks and loaded on {loads}, every rank's range exact, each rank reading "
        "no more than the objects its range overlaps, and nothing sent between ranks."
    )


# --- the rank side ---------------------------------------------------------------------


def _on_rank(fn: Callable, args: tuple, storage: Storage) -> tuple[Any, list[str], int]:
    """Run the student's call; what it returned, the calls between ranks the recorder saw and
    the bytes this rank read (the notebook's path reads these two)."""
    with Recorder() as seen:
        out = fn(*args, storage)
    calls = [c.name for c in seen.collectives] + [m.op for m in seen.messages if m.op == "send"]
    dist.barrier()  # no rank leaves while another still reads
    return out, calls, storage.got


def _returned(out: Any) -> dict[str, torch.Tensor] | str:
    """A load's result as plain tensors, or what it was instead."""
    if not isinstance(out, dict):
        return f"a {type(out).__name__}"
    plain = {}
    for name in NAMES:
        t = out.get(name)
        if not isinstance(t, torch.Tensor):
            return f"a dict whose {name!r} is {'missing' if t is None else type(t).__name__}"
        plain[name] = t.detach().reshape(-1).clone()
    return plain


def _load(fn: Callable, numel: int, storage: Storage) -> tuple[Any, list[str], int]:
    out, calls, got = _on_rank(fn, (list(NAMES), numel), storage)
    return _returned(out), calls, got


def _save(fn: Callable, shards: dict, numel: int, storage: Storage) -> tuple[Any, list[str], int]:
    _, calls, got = _on_rank(fn, (shards, numel), storage)
    return None, calls, got


# --- the caller side -------------------------------------------------------------------


def _launch(job: Callable, n: int, doing: str, *args: Any, stored: Any = None) -> Any:
    from course.ranks import launch

    extra = {"stored": stored} if confined.current() is not None else {}
    result = launch(job, n, *args, timeout=LAUNCH_TIMEOUT, before=refusing(DCP), **extra)
    if not result.ok:
        name = SAVE if job is _save else LOAD
        raise AssertionError(failure_message(name, n, result.failures, doing))
    return result


def _check_save(fn: Callable, saved: dict, n: int, storage: Storage) -> None:
    from course.ranks import PerRank

    bounds = chunk_bounds(NUMEL, n)
    shards = PerRank([{k: t[lo:hi].clone() for k, t in saved.items()} for lo, hi in bounds])
    doing = f" (saving {len(NAMES)} tensors of {NUMEL} elements)"
    result = _launch(_save, n, doing, fn, shards, NUMEL, storage)
    head = f"{SAVE} on {n} ranks:"
    _judge_calls(head, _between(result), "a save")
    held = result.stored if confined.current() is not None else read_objects(storage.path)
    want = expected_objects(saved, n)
    missing = [k for k in want if k not in held and want[k].data]
    extra = sorted(k for k in held if k not in want)
    if missing or extra:
        said = count(len(held), "object") + (f", named like {extra[0]!r}" if extra else "")
        raise AssertionError(
            f"{head} the storage holds {said}, and a save on {n} ranks leaves "
            f"{count(len(want), 'object')}: {', '.join(sorted(want)[:4])}, ... "
            + (f"({missing[0]!r} is missing). " if missing else "")
            + KEYS
        )
    for key, stored in want.items():
        got = held.get(key)
        if got is None:
            continue
        if got.dtype != "float32" or got.data != stored.data:
            rank = [f"{lo}-{hi}" for lo, hi in bounds].index(key.split("/")[1])
            raise AssertionError(
                f"{head} object {key!r} does not hold rank {rank}'s shard of {key.split('/')[0]} "
                f"as it was handed to save_sharded (float32, "
                f"{count(len(stored.data) // 4, 'element')}). {KEYS}"
            )


def _check_load(fn: Callable, states: tuple, saved_on: int, m: int, storage: Storage) -> None:
    _saved, now = states
    objects = expected_objects(now, saved_on)
    relayed = confined.current() is not None
    if not relayed:
        write_objects(storage.path, objects)
    doing = f" (loading a state saved on {saved_on} ranks)"
    result = _launch(_load, m, doing, fn, NUMEL, storage, stored=objects if relayed else None)
    head = f"{LOAD} on {m} ranks, from a save on {saved_on}:"
    _judge_calls(head, _between(result), "a load")
    read = _bytes_read(result, m)
    for rank, (out, _calls, _got) in enumerate(result.results):
        _judge_values(head, rank, out, states, saved_on, m)
        _judge_reads(head, rank, read[rank], saved_on, m)


def _between(result: Any) -> list[str]:
    """The calls that moved data between ranks (a barrier moves none), over the whole run:
    under grading, the relay's record, which no mark a rank sends can cut."""
    if confined.current() is None:
        kinds = [name for _out, calls, _got in result.results for name in calls]
    else:
        named = {**TORCH_NAMES, "send": "send"}
        kinds = [named.get(e.kind, "") for e in result.relayed]
    return [k for k in kinds if k and k != "barrier"]


def _bytes_read(result: Any, n: int) -> list[int]:
    """Bytes each rank read from the storage: under grading, every get the relay answered."""
    if confined.current() is None:
        return [got for _out, _calls, got in result.results]
    read = [0] * n
    for e in result.relayed:
        if e.kind == "get":
            read[e.src] += e.nbytes[0]
    return read


def _judge_calls(head: str, calls: list[str], what: str) -> None:
    if calls:
        kinds = ", ".join(sorted(set(calls)))
        raise AssertionError(
            f"{head} it called {kinds}: in {what} nothing travels between ranks. Each rank "
            "writes its own shard, and each reads from the storage the elements of its own "
            "range (the objects that overlap it, found with storage.list())."
        )


def _judge_values(head: str, rank: int, out: Any, states: tuple, saved_on: int, m: int) -> None:
    saved, now = states
    lo, hi = chunk_bounds(NUMEL, m)[rank]
    problem = out if isinstance(out, str) else ""  # what _returned found instead of a dict
    if problem:
        raise AssertionError(
            f"{head} rank {rank} returned {problem}: return a dict of every tensor's name to this "
            f"rank's range of it, here elements {lo}:{hi} (chunk_bounds(numel, {m})[{rank}])."
        )
    for name in NAMES:
        got, want = out[name], now[name][lo:hi]
        if got.dtype == torch.float32 and torch.equal(got, want):
            continue
        raise AssertionError(
            f"{head} rank {rank}'s {name} is wrong: it should be elements {lo}:{hi} of the "
            f"checkpoint (chunk_bounds(numel, {m})[{rank}], {count(hi - lo, 'element')}), "
            f"and {_what_instead(got, saved[name], now[name], rank, saved_on, (lo, hi))}."
        )


def _what_instead(
    got: torch.Tensor, saved: torch.Tensor, now: torch.Tensor, rank: int, saved_on: int,
    bounds: tuple[int, int],
) -> str:  # fmt: skip
    """What a wrong range is instead, where it is a usual mistake."""
    lo, hi = bounds
    if got.dtype != torch.float32:
        return f"it is {str(got.dtype).removeprefix('torch.')}, not the saved float32"
    if got.numel() == hi - lo and torch.equal(got, saved[lo:hi]):
        return (
            "it holds the values as they were saved, not as the storage holds them now: this "
            "check writes new values under the same keys before each load, so a state kept "
            "anywhere but the storage is stale. Read it with storage.get"
        )
    if rank < saved_on:
        a, b = chunk_bounds(now.numel(), saved_on)[rank]
        if got.numel() == b - a and torch.equal(got, now[a:b]):
            return (
                f"it holds elements {a}:{b}, rank {rank}'s shard as saved on {saved_on} ranks: "
                "on a new number of ranks each rank's range changes, and it is pieced together "
                "from every saved object that overlaps it"
            )
    if got.numel() == now.numel() and torch.equal(got, now):
        return "it holds the whole tensor: return only this rank's range"
    if got.numel() != hi - lo:
        return f"it holds {count(got.numel(), 'element')}"
    wrong = (got != now[lo:hi]).nonzero().flatten().tolist()
    return (
        f"{count(len(wrong), 'element')} differ, the first at index {wrong[0]} of the range "
        f"(global element {lo + wrong[0]}): check where each overlapping object's piece starts "
        "and ends"
    )


def _judge_reads(head: str, rank: int, read: int, saved_on: int, m: int) -> None:
    lo, hi = chunk_bounds(NUMEL, m)[rank]
    pieces = overlapping(NUMEL, saved_on, m, rank)
    allowed = sum(b - a for a, b in pieces) * 4 * len(NAMES)
    if read <= allowed:
        return
    whole = NUMEL * 4 * len(NAMES)
    needed = (hi - lo) * 4 * len(NAMES)
    raise AssertionError(
        f"{head} rank {rank} read {count(read, 'byte')} from the storage; its range (elements "
        f"{lo}:{hi} of each tensor, {count(needed, 'byte')}) overlaps "
        f"{count(len(pieces), 'saved shard')} of each tensor, {count(allowed, 'byte')} in all, "
        f"and the whole checkpoint is {count(whole, 'byte')}. Read only the objects that "
        "overlap this rank's range, better only the elements it needs: "
        "storage.get(key, start, stop) reads elements start:stop of one object."
    )
