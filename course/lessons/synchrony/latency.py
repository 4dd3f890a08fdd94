"""What one message and one all-reduce cost on this machine: latency, bandwidth, the fit.

    from course.lessons.synchrony.latency import pingpong, allreduce_times, bandwidth_by_world_size
    times = pingpong()                      # {bytes: one-way seconds}, on 2 ranks
    alpha, beta = fit_alpha_beta(list(times), list(times.values()))

Each launcher starts fresh gloo ranks (``course.ranks.run``) and returns plain data; the
rank-side functions (``*_rank``) also run under ``torchrun``::

    torchrun --nproc-per-node 2 -m course.lessons.synchrony.latency

A ping-pong is the classic way to time one message (the OSU and Intel MPI benchmarks): rank 0
sends, rank 1 sends it back, half the round trip is one one-way message, with nothing else on
the wire. Every size is sent once before it is timed. On one machine the "network" is the
loopback interface: alpha is the kernel's and gloo's software path (tens of microseconds),
1/beta a memory copy through TCP buffers (a few GB/s); between machines both are the NIC's.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch
import torch.distributed as dist

from course.ranks import run
from course.ring.bandwidth import AllReduce, timed_calls
from course.ring.cost import algbw, busbw, fit_alpha_beta

__all__ = [
    "SIZES",
    "allreduce_rank",
    "allreduce_times",
    "bandwidth_by_world_size",
    "fit_alpha_beta",
    "pingpong",
    "pingpong_rank",
    "time_allreduce",
]

SIZES = tuple(2**e for e in range(10, 27, 2))  # 1 KiB, 4 KiB .. 64 MiB


def pingpong_rank(sizes: Sequence[int] = SIZES, repeats: int = 11) -> dict[int, float]:
    """On ranks 0 and 1 (others wait): the one-way time of a ``size``-byte message.

    Round trips follow one another with no barrier between (each waits for the last), after
    one warm-up round trip per size; rank 0's clock times them. Messages under 1 MB make
    more round trips than ``repeats`` (at most 200). The fastest round trip is kept, as
    ``timeit`` does: on a shared machine every slower one was held up by something else
    (another process on the core), not by the network.
    """
    rank = dist.get_rank()
    times: dict[int, float] = {}
    for size in sizes:
        buffer = torch.zeros(max(size // 4, 1))
        dist.barrier()
        rounds = []
        for _ in range(_rounds(size, repeats) + 1):
            start = time.perf_counter()
            if rank == 0:
                dist.send(buffer, 1)
                dist.recv(buffer, 1)
            elif rank == 1:
                dist.recv(buffer, 0)
                dist.send(buffer, 0)
            rounds.append(time.perf_counter() - start)
        times[size] = min(rounds[1:]) / 2
    return times


def _rounds(size: int, repeats: int) -> int:
    """Round trips for one size: ``repeats``, more for small messages (up to 200), which
    take microseconds each and are the ones a busy machine most often holds up."""
    return max(repeats, min(200, repeats * (2**20 // max(size, 1))))


def pingpong(sizes: Sequence[int] = SIZES, repeats: int = 11) -> dict[int, float]:
    """One-way seconds of a gloo message per size in bytes, by ping-pong on 2 fresh ranks."""
    return run(pingpong_rank, 2, tuple(sizes), repeats)[0]


def allreduce_rank(
    fn: AllReduce, numels: Sequence[int], repeats: int = 5
) -> dict[int, list[float]]:
    """On every rank: the seconds of each of ``repeats`` calls ``fn(tensor)`` per ``numel``.

    Every call is started together (a barrier before it) after one warm-up call.
    """
    return {numel: timed_calls(fn, torch.ones(numel), repeats) for numel in numels}


def time_allreduce(
    fn: AllReduce, numels: Sequence[int], repeats: int = 5, world_size: int = 4
) -> dict[int, float]:
    """Seconds of one all-reduce ``fn(tensor)`` of float32 tensors of each ``numel``, on fresh
    ranks: per call the slowest rank (the collective ends when its last rank does), then the
    fastest call, as for ``pingpong``."""
    per_rank = run(allreduce_rank, world_size, fn, tuple(numels), repeats)
    return {
        numel: min(max(ts) for ts in zip(*(r[numel] for r in per_rank), strict=True))
        for numel in numels
    }


def _all_reduce(tensor: torch.Tensor) -> None:
    dist.all_reduce(tensor)


def allreduce_times(
    numels: Sequence[int], repeats: int = 5, world_size: int = 4
) -> dict[int, float]:
    """Seconds of gloo's own ``dist.all_reduce`` per ``numel`` on ``world_size`` ranks."""
    return time_allreduce(_all_reduce, numels, repeats, world_size)


def bandwidth_by_world_size(
    numel: int = 2**22, world_sizes: Sequence[int] = (2, 3, 4), repeats: int = 5
) -> dict[int, dict[str, float]]:
    """Per world size: seconds, algbw = S/t and busbw (bytes/s, as nccl-tests defines them,
    doc/PERFORMANCE.md; ``course.ring.cost.busbw``) of one ``dist.all_reduce`` of ``numel``
    float32 numbers."""
    size = numel * 4
    rows = {}
    for n in world_sizes:
        seconds = allreduce_times([numel], repeats, n)[numel]
        rows[n] = {
            "seconds": seconds,
            "algbw": algbw(size, seconds),
            "busbw": busbw(size, n, seconds),
        }
    return rows


if __name__ == "__main__":  # torchrun --nproc-per-node 2 -m course.lessons.synchrony.latency
    dist.init_process_group("gloo")
    measured = pingpong_rank()
    if dist.get_rank() == 0:
        alpha, beta = fit_alpha_beta(list(measured), list(measured.values()))
        print(f"alpha = {alpha * 1e6:.1f} us, 1/beta = {1 / beta / 1e9:.2f} GB/s")
    dist.barrier()  # no rank closes its connections while a peer still uses them
    dist.destroy_process_group()
