"""Grade a student's ``reduce_scatter(tensor) -> shard`` and ``all_gather(shard, out)``.

    from course.checks import check_reduce_scatter, check_all_gather, check_halves_pattern
    print(check_reduce_scatter(reduce_scatter))   # raises AssertionError that teaches

The contract is ``course.ring.halves``'s: rank ``r``'s shard is chunk ``r`` of the flattened
tensor (``course.ring.schedule.chunk_bounds``). The functions run on fresh ranks for world sizes
2 to 4, many tensors per launch (sizes divisible by N and not, smaller than N; float32,
float64, int32, int64). Inputs and expected values are made here, in the caller; the ranks
only send back the tensors the student's code produced, and the recorder's messages for the
pattern (``course.ring.halves.half_violations``). Every launch has a deadline.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from course.checks.allreduce import LAUNCH_TIMEOUT, SHOWN, trace_collectives
from course.checks.compare import fresh_seed
from course.checks.ring_cases import (
    Case,
    collectives_called,
    compare,
    inputs,
    refuse_collectives,
    refuse_the_reference,
    relayed_case,
    running_case,
    sum_cases,
)
from course.checks.teaching import failure_message, need_function, teaches
from course.ranks import confined, relay
from course.ranks.wording import count, world_sizes_text
from course.ring.halves import Half, half_violations
from course.ring.halves_record import encoded_args
from course.ring.logs import log_path, open_log, read_trace
from course.ring.recorder import Recorder, scratch_dir
from course.ring.relayed import SecretEncoding
from course.ring.schedule import chunk_bounds
from course.ring.trace import Trace

__all__ = ["check_all_gather", "check_halves_pattern", "check_reduce_scatter"]

WORLD_SIZES = (2, 3, 4)
NAMES = {"reduce-scatter": "reduce_scatter", "all-gather": "all_gather"}
SENTINEL = -7  # what ``out`` holds before all_gather fills it
HALF_DEADLOCK = (
    "Every rank was waiting for a message no rank had sent: a deadlock. At each step every "
    "rank both sends and receives: post the send with dist.isend, then receive, then wait for "
    "the send (or order blocking calls by rank parity)."
)


@teaches
def check_reduce_scatter(fn: Callable, world_sizes: Sequence[int] = WORLD_SIZES) -> str:
    """Every rank ``r`` gets back the sum over ranks of chunk ``r`` (communication not judged)."""
    n = _run_all("reduce-scatter", fn, world_sizes, sums=True)
    return (
        f"reduce_scatter passed: right shards for {n} tensors on {world_sizes_text(world_sizes)}."
    )


@teaches
def check_all_gather(fn: Callable, world_sizes: Sequence[int] = WORLD_SIZES) -> str:
    """Every rank's ``out`` holds every rank's shard in its chunk (communication not judged)."""
    n = _run_all("all-gather", fn, world_sizes, sums=True)
    return f"all_gather passed: {n} tensors filled right on {world_sizes_text(world_sizes)}."


@teaches
def check_halves_pattern(
    reduce_scatter: Callable, all_gather: Callable, world_sizes: Sequence[int] = WORLD_SIZES
) -> str:
    """Both are half a ring: neighbours only, N-1 steps, (N-1)/N of the tensor, no collective."""
    n = _run_all("reduce-scatter", reduce_scatter, world_sizes, sums=False)
    n += _run_all("all-gather", all_gather, world_sizes, sums=False)
    return (
        f"reduce_scatter and all_gather are each half a ring in {n} recorded runs on "
        f"{world_sizes_text(world_sizes)}."
    )


# --- the rank side ---------------------------------------------------------------------


def _run_cases(half: Half, fn: Callable, cases: list[Case], mine: list, directory: str) -> list:
    """On each rank: call ``fn`` once per case (on this rank's own inputs, ``mine``)."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    refuse_the_reference()
    out = []
    with open_log(log_path(directory, rank, "progress")) as progress:
        for i, case in enumerate(cases):
            relay.mark(i)  # under grading: where case i starts, in the relay's record
            progress.write(json.dumps({"case": i}) + "\n")
            if case.recorded and mine[i] is not None:  # graded: the relay records
                got, called = _call(half, fn, *mine[i]), []
            elif case.recorded:
                args = encoded_args(half, rank, world_size, case.shape[0])
                with Recorder(log_path(directory, rank, f"case{i}")):
                    got, called = _call(half, fn, *args), []
            else:
                with Recorder() as seen:  # the result counts only when no collective made it
                    got = _call(half, fn, *mine[i])
                called = collectives_called(seen)
            out.append((got, called))
            progress.write(json.dumps({"done": i}) + "\n")
    return out


def _plain_args(half: Half, rank: int, world_size: int, case: Case, full: Any) -> tuple:
    if half == "reduce-scatter":
        return (full[rank].clone(),)
    lo, hi = chunk_bounds(full.numel(), world_size)[rank]
    return full.reshape(-1)[lo:hi].clone(), torch.full(case.shape, SENTINEL, dtype=case.dtype)


def _call(half: Half, fn: Callable, *args: torch.Tensor) -> Any:
    returned = fn(*args)
    if half == "all-gather":
        return args[1]
    return returned if isinstance(returned, torch.Tensor) else type(returned).__name__


# --- the caller side -------------------------------------------------------------------


def _cases(world_size: int, sums: bool) -> list[Case]:
    if sums:
        return sum_cases(world_size)
    n = world_size
    return [Case((numel,), torch.float64, True) for numel in (3 * n + 1, n - 1 or 1, 4 * n)]


def _run_all(half: Half, fn: Callable, world_sizes: Sequence[int], *, sums: bool) -> int:
    name = NAMES[half]
    need_function(name, fn)
    checked = 0
    relayed = confined.current() is not None  # graded: the relay carries every message
    for world_size in world_sizes:
        cases = _cases(world_size, sums)
        secret = [SecretEncoding.draw(world_size) for _ in cases]
        inputs = [_case_inputs(half, c, world_size, fresh_seed(None)) for c in cases]
        with scratch_dir() as directory:
            graded_args = [
                _secret_args(half, secret[i], c, world_size) if c.recorded and relayed else None
                for i, c in enumerate(cases)
            ]
            result = _launch(half, fn, world_size, cases, inputs, graded_args, directory)
            for i, case in enumerate(cases):
                got = [r[i] for r in result.results]
                trace = (
                    relayed_case(name, result, world_size, case, secret[i], i) if relayed else None
                )
                if case.recorded:
                    trace = trace or read_trace(
                        directory, world_size, case.shape[0], 8, tag=f"case{i}"
                    )
                    _judge_pattern(half, world_size, case, trace)
                else:
                    if trace:
                        refuse_collectives(name, [trace_collectives(trace)])
                    _judge(half, world_size, case, inputs[i], got)
                checked += 1
    return checked


def _secret_args(
    half: Half, secret: SecretEncoding, case: Case, world_size: int
) -> list[tuple[torch.Tensor, ...]]:
    """Each rank's arguments for a recorded case under grading, marked with secret bits:
    ``(tensor,)`` for a reduce-scatter, ``(shard, out)`` for an all-gather."""
    numel = case.shape[0]
    if half == "reduce-scatter":
        return [(secret.tensor(r, numel),) for r in range(world_size)]
    whole = sum(secret.tensor(r, numel) for r in range(world_size))
    bounds = chunk_bounds(numel, world_size)
    return [(whole[lo:hi].clone(), torch.zeros(numel, dtype=torch.float64)) for lo, hi in bounds]


def _case_inputs(half: Half, case: Case, world_size: int, seed: int) -> Any:
    if case.recorded:
        return None
    if half == "reduce-scatter":
        return inputs(case, world_size, seed)
    return inputs(case, 1, seed)[0]  # the gathered tensor; rank r gets its chunk r


def _launch(
    half: Half,
    fn: Callable,
    world_size: int,
    cases: list,
    inputs: list,
    graded_args: list,
    directory: str,
) -> Any:
    from course.ranks import PerRank, launch

    mine = PerRank(  # each rank is sent its own inputs only
        [(graded_args[i][r] if graded_args[i] is not None else None) if c.recorded
         else _plain_args(half, r, world_size, c, inputs[i])
         for i, c in enumerate(cases)]
        for r in range(world_size)
    )  # fmt: skip
    result = launch(
        _run_cases, world_size, half, fn, cases, mine, directory, timeout=LAUNCH_TIMEOUT
    )
    if result.ok:
        return result
    running = [running_case(directory, r, len(cases), result.relayed) for r in range(world_size)]
    index = min((i for i in running if i is not None), default=None)
    during = f" on {cases[index]}" if index is not None else ""
    raise AssertionError(
        failure_message(NAMES[half], world_size, result.failures, during, HALF_DEADLOCK)
    )


def _judge(half: Half, world_size: int, case: Case, inputs: Any, got: list) -> None:
    """Compare each rank's result with the one computed here."""
    name = NAMES[half]
    refuse_collectives(name, [called for _, called in got])
    for rank, (returned, _) in enumerate(got):
        tensor = returned
        if half == "reduce-scatter":
            whole = torch.stack([t.to(torch.float64) for t in inputs]).sum(0).reshape(-1)
            lo, hi = chunk_bounds(whole.numel(), world_size)[rank]
            expected = whole[lo:hi].to(case.dtype)
            if isinstance(returned, torch.Tensor) and returned.numel() == expected.numel():
                tensor = returned.reshape(-1)
        else:
            expected = inputs
        if isinstance(tensor, str):
            problem = f"it returned {tensor}, not the shard (a tensor)"
        elif half == "reduce-scatter" and tensor.numel() != expected.numel():
            problem = (
                f"it returned {count(tensor.numel(), 'element')}; chunk {rank} of "
                f"{case.shape} on {world_size} ranks has {expected.numel()}"
            )
        else:
            problem = compare(tensor, expected, case)
        if problem is None:
            continue
        head = f"{name} gave a wrong result on {world_size} ranks for {case}, rank {rank}:"
        hints = _hints(half, tensor, rank, world_size)
        raise AssertionError("\n".join([head, "  " + problem, *hints]))


def _hints(half: Half, tensor: Any, rank: int, world_size: int) -> list[str]:
    """What to look at when a half's result is wrong."""
    if half == "reduce-scatter":
        return [
            (
                f"  rank {rank}'s shard is chunk {rank} of the flattened tensor, bounds "
                f"course.ring.schedule.chunk_bounds(numel, {world_size})[{rank}], "
                "summed over every rank"
            )
        ]
    if isinstance(tensor, torch.Tensor) and (tensor == SENTINEL).any():
        return [
            (
                "  some of `out` was never written: every chunk c of out.view(-1) must end up "
                "holding rank c's shard, your own chunk included"
            )
        ]
    return []


def _judge_pattern(half: Half, world_size: int, case: Case, trace: Trace) -> None:
    found = half_violations(trace, half)
    if not found:
        return
    name = NAMES[half]
    size = count(case.shape[0], "element")
    lines = [f"{name} is not half a ring on {world_size} ranks ({size}):"]
    lines += [f"  {v}" for v in found[:SHOWN]]
    if len(found) > SHOWN:
        lines.append(f"  ... and {len(found) - SHOWN} more")
    lines.append(
        f"A ring {half} on N ranks sends to one neighbour and receives from the other, N-1 "
        "times, one chunk of about 1/N of the tensor each time: (N-1)/N of it in all."
    )
    raise AssertionError("\n".join(lines))
