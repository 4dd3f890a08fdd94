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
- each rank's reads: no more than the bytes of the saved objects its range overlaps (each
  read whole is allowed; the whole checkpoint fails); ranged ``get``\\ s read exactly the
  range;
- nothing travels between ranks in either call, the storage included: a save writes its own
  rank's objects only and reads none, a load reads and writes nothing else (so no rank can
  leave another a message in a key or an object).
Under grading the storage is the relay's (:mod:`course.ranks.objects`): the objects, the
bytes each rank read and the calls between ranks are the caller's own record over the whole
run (no mark a rank sends itself moves a call out of it), none a rank's report; in a
notebook, the files and each rank's own counts.
``torch.distributed.checkpoint``'s save and load, and the planner functions that work out
overlapping chunks, are refused on graded ranks.
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
    tuple(
        f"torch.distributed.checkpoint.state_dict_saver:{f}"
        for f in ("save", "save_state_dict", "_save_state_dict", "async_save")
    )
    + tuple(
        f"torch.distributed.checkpoint.state_dict_loader:{f}"
        for f in ("load", "load_state_dict", "_load_state_dict", "_load_state_dict_from_keys")
    )
    + tuple(
        f"torch.distributed.checkpoint.planner_helpers:{f}"
        for f in ("create_read_items_for_chunk_list", "_create_read_items")
    )
    + tuple(
        f"torch.distributed.checkpoint.resharding:{f}"
        for f in (
            "_check_shard_metadata_pair_overlap",
            "_shards_get_overlap_region_wrt_saved_tensor",
        )
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


def _on_rank(fn: Callable, args: tuple, storage: Storage) -> tuple[Any, list[str], list]:
    """Run the student's call; what it returned, the calls between ranks the recorder saw and
    this rank's puts and gets (the notebook's path reads these two; grading, the relay's)."""
    with Recorder() as seen:
        out = fn(*args, storage)
    calls = [c.name for c in seen.collectives] + [m.op for m in seen.messages if m.op == "send"]
    dist.barrier()  # no rank leaves while another still reads
    return out, calls, storage.log


def _load(fn: Callable, numel: int, storage: Storage) -> tuple[Any, list[str], list]:
    out, calls, log = _on_rank(fn, (list(NAMES), numel), storage)
    if isinstance(out, dict):  # tensors as plain data; the caller checks what came
        out = {k: v.detach().clone() if isinstance(v, torch.Tensor) else repr(v)[:80]
               for k, v in out.items() if isinstance(k, str)}  # fmt: skip
    else:
        out = f"a {type(out).__name__}"
    return out, calls, log


def _save(fn: Callable, shards: dict, numel: int, storage: Storage) -> tuple[Any, list[str], list]:
    _, calls, log = _on_rank(fn, (shards, numel), storage)
    return None, calls, log


# --- the caller side -------------------------------------------------------------------


Access = tuple[str, str, int]  # ("put" or "get", key, bytes)


def _launch(job: Callable, n: int, doing: str, *args: Any, stored: Any = None) -> Any:
    from course.ranks import launch

    extra = {"stored": stored} if confined.current() is not None else {}
    result = launch(job, n, *args, timeout=LAUNCH_TIMEOUT, before=refusing(DCP), **extra)
    name = SAVE if job is _save else LOAD
    if not result.ok:
        raise AssertionError(failure_message(name, n, result.failures, doing))
    for rank, reply in enumerate(result.results):
        if not (isinstance(reply, list | tuple) and len(reply) == 3):
            raise AssertionError(
                f"{name} on {n} ranks: rank {rank}'s reply is not what the check's code on the "
                "rank returns: the check's code was changed there, and the call earns nothing"
            )
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
    for rank, accesses in enumerate(_accesses(result, n)):
        lo, hi = bounds[rank]
        mine = {f"{name}/{lo}-{hi}" for name in NAMES}
        for op, key, _nbytes in accesses:
            if op == "get" or key not in mine:
                what = f"read {key!r}" if op == "get" else f"wrote {key!r}"
                raise AssertionError(
                    f"{head} rank {rank} {what}: in a save each rank writes its own shards "
                    f"only (here {', '.join(sorted(mine))}) and reads nothing, so that no "
                    f"rank passes another anything through the storage. {KEYS}"
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
    for rank, accesses in enumerate(_accesses(result, m)):
        wrote = [key for op, key, _ in accesses if op == "put"]
        if wrote:
            raise AssertionError(
                f"{head} rank {rank} wrote {wrote[0]!r} to the storage: a load only reads "
                "(the objects the save left), so that no rank passes another anything "
                "through the storage."
            )
        _judge_reads(head, rank, sum(b for op, _, b in accesses if op == "get"), saved_on, m)
    for rank, (out, _calls, _log) in enumerate(result.results):
        _judge_values(head, rank, out, states, saved_on, m)


def _between(result: Any) -> list[str]:
    """The calls that moved data between ranks (a barrier moves none), over the whole run:
    under grading, the relay's record, which no mark a rank sends can cut."""
    if confined.current() is None:
        kinds = [str(c) for _out, calls, _log in result.results for c in calls]
    else:
        named = {**TORCH_NAMES, "send": "send"}
        kinds = [named.get(e.kind, "") for e in result.relayed]
    return [k for k in kinds if k and k != "barrier"]


def _accesses(result: Any, n: int) -> list[list[Access]]:
    """Each rank's puts and gets, in order: under grading, every one the relay answered."""
    out: list[list[Access]] = [[] for _ in range(n)]
    if confined.current() is None:
        for rank, (_out, _calls, log) in enumerate(result.results):
            out[rank] = [(str(op), str(key), int(b)) for op, key, b in log]
        return out
    for e in result.relayed:
        if e.kind in ("put", "get"):
            out[e.src].append((e.kind, e.op, e.nbytes[0]))
    return out


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
    where = f"elements {lo}:{hi} (chunk_bounds(numel, {m})[{rank}])"
    problem = out if isinstance(out, str) else "" if isinstance(out, dict) else "something else"
    if problem:
        raise AssertionError(
            f"{head} rank {rank} returned {problem}: return a dict of every tensor's name to "
            f"this rank's range of it, here {where}."
        )
    for name in NAMES:
        got, want = out.get(name), now[name][lo:hi]
        said = "" if isinstance(got, torch.Tensor) else "nothing" if got is None else "no tensor"
        if said:
            raise AssertionError(
                f"{head} rank {rank} returned {said} for {name!r}: return a dict of every "
                f"tensor's name to this rank's range of it, here {where}."
            )
        if got.dtype == torch.float32 and got.shape == want.shape and torch.equal(got, want):
            continue
        raise AssertionError(
            f"{head} rank {rank}'s {name} is wrong: it should be {where}, "
            f"{count(hi - lo, 'element')} of the checkpoint, and "
            f"{_what_instead(got, saved[name], now[name], rank, saved_on, (lo, hi))}."
        )


def _what_instead(
    got: torch.Tensor, saved: torch.Tensor, now: torch.Tensor, rank: int, saved_on: int,
    bounds: tuple[int, int],
) -> str:  # fmt: skip
    """What a wrong range is instead, where it is a usual mistake."""
    lo, hi = bounds
    if got.dtype != torch.float32 or got.dim() != 1:
        dtype = str(got.dtype).removeprefix("torch.")
        return (
            f"it is a {dtype} tensor of shape {tuple(got.shape)}: return the saved float32 "
            "elements as a 1-D tensor"
        )
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
