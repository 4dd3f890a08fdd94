"""Bus bandwidth of an all-reduce on real ranks: yours, the reference ring, gloo's own.

    from course.ring.bandwidth import compare_busbw
    compare_busbw(ring_allreduce, world_size=2, megabytes=(1, 16))

busbw as nccl-tests reports it (course.ring.cost.busbw): the bytes each rank's link must move
in one ring all-reduce, per second, so a perfect ring scores the link speed whatever N.
The contenders run in one launch, alternating, on the same float32 tensors, each call
started together on every rank; the figure is the median over calls of the slowest rank.
:func:`compare_busbw` times an all-reduce only once its sums are right: a stub is not fast,
and a wrong ring's bandwidth means nothing.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from course.ranks import launch, run
from course.ring.cost import busbw

__all__ = ["BusbwRow", "compare_busbw", "measure_busbw", "sums_error", "timed_calls"]

AllReduce = Callable[[torch.Tensor], object]


@dataclass(frozen=True)
class BusbwRow:
    """One contender at one size: median seconds per call and bus bandwidth in GB/s."""

    name: str
    world_size: int
    megabytes: float
    seconds: float
    gbps: float


def timed_calls(fn: AllReduce, tensor: torch.Tensor, iters: int) -> list[float]:
    """On each rank: one warm-up call of ``fn(tensor)``, then the seconds of ``iters`` calls,
    each started together on every rank (a barrier before it)."""
    fn(tensor)
    times = []
    for _ in range(iters):
        dist.barrier()
        start = time.perf_counter()
        fn(tensor)
        times.append(time.perf_counter() - start)
    return times


def _time_rank(
    contenders: dict[str, AllReduce], megabytes: Sequence[float], iters: int
) -> dict[tuple[str, float], list[float]]:
    """On each rank: :func:`timed_calls` per size and contender, the contenders alternating."""
    times: dict[tuple[str, float], list[float]] = {}
    for mb in megabytes:
        tensor = torch.ones(int(mb * 2**20) // 4)
        for name, fn in contenders.items():
            times[name, mb] = timed_calls(fn, tensor, iters)
    return times


def measure_busbw(
    contenders: dict[str, AllReduce],
    world_size: int,
    megabytes: Sequence[float] = (1, 16),
    iters: int = 5,
    timeout: float = 300.0,
) -> list[BusbwRow]:
    """Time each all-reduce on ``world_size`` fresh ranks at each size."""
    per_rank = run(_time_rank, world_size, contenders, tuple(megabytes), iters, timeout=timeout)
    rows = []
    for mb in megabytes:
        for name in contenders:
            slowest = [max(ts) for ts in zip(*(r[name, mb] for r in per_rank), strict=True)]
            seconds = statistics.median(slowest)
            rows.append(
                BusbwRow(
                    name,
                    world_size,
                    mb,
                    seconds,
                    busbw(int(mb * 2**20) // 4 * 4, world_size, seconds) / 1e9,
                )
            )
    return rows


def sums_error(fn: AllReduce, world_size: int, numel: int, timeout: float = 30.0) -> str | None:
    """Why ``fn`` is not a right all-reduce on ``world_size`` ranks, in one sentence, or None:
    each rank hands in ``rank + 1`` in each of ``numel`` float32 elements and must get back
    1 + 2 + ... + N in every one."""
    result = launch(_sums_rank, world_size, fn, numel, timeout=timeout)
    if not result.ok:
        first = min(result.failures.values(), key=lambda f: (not f.is_cause, f.rank))
        return f"it failed on {world_size} ranks: {first}"
    for rank, got in enumerate(result.results):
        if got is not None:
            want = world_size * (world_size + 1) / 2
            unchanged = " (what it handed in: is it still the stub?)" if got == rank + 1 else ""
            held = f"rank {rank} held {got:g}{unchanged}"
            return f"on {world_size} ranks, {held} where the sum is {want:g}"
    return None


def _sums_rank(fn: AllReduce, numel: int) -> float | None:
    """On each rank: the first wrong element after ``fn`` (None: all right)."""
    rank, n = dist.get_rank(), dist.get_world_size()
    tensor = torch.full((numel,), rank + 1.0)
    fn(tensor)
    wrong = tensor != n * (n + 1) / 2
    return float(tensor[wrong][0]) if wrong.any() else None


def compare_busbw(
    fn: AllReduce, world_size: int = 2, megabytes: Sequence[float] = (1, 16), iters: int = 5
) -> list[BusbwRow]:
    """Print your all-reduce's bus bandwidth beside ``dist.all_reduce``'s, size by size, once
    its sums are right at the largest size (nothing timed and a sentence why, if not)."""
    wrong = sums_error(fn, world_size, int(max(megabytes) * 2**20) // 4)
    if wrong is not None:
        print(f"Not timed: {wrong}. A ring is timed once its sums are right (the checks above).")
        return []
    rows = measure_busbw(
        {"yours": fn, "dist.all_reduce": dist.all_reduce}, world_size, megabytes, iters
    )
    print(f"{world_size} ranks   {'size':>6} {'yours GB/s':>11} {'gloo GB/s':>10} {'ratio':>6}")
    for mb in megabytes:
        yours, gloo = (r for r in rows if r.megabytes == mb)
        ratio = yours.gbps / gloo.gbps
        print(f"{'':9} {mb:>4g}MB {yours.gbps:>11.2f} {gloo.gbps:>10.2f} {ratio:>5.2f}x")
    return rows
