"""One slow rank in synchronous training: what every rank's step costs, and what backups save.

    from course.lessons.synchrony.stragglers import straggler_run, step_seconds, backup_step
    spans = straggler_run(world_size=4, slow_rank=3, slowdown=2.0)
    straggler_run(4, slow_rank=[2, 3])   # several slow ranks, each at ``slowdown``
    step_seconds(spans)                  # per rank: the median step
    backup_step(arrivals(spans)[0], b=1) # a step with one backup worker, from the arrivals

Each rank trains the same small MLP under DDP on its own batch. The compute is emulated:
the model's forward sleeps ``compute_s`` seconds (``slowdown`` times that on the slow rank),
so the timings do not depend on how many cores the machine has or who else uses them; the
real forward and backward of the tiny model take well under a millisecond. Each rank records
when its step started, when its forward ended (its gradient is ready a moment later: the
backward of a tiny model is quick) and when its backward ended: DDP's backward ends only
when the gradients' all-reduce does, so the backward span is the time the rank waits for
the others. Backup workers (Chen et al. 2016, "Revisiting Distributed Synchronous SGD") are
computed from the measured arrivals, not run.

    torchrun --nproc-per-node 4 -m course.lessons.synchrony.stragglers
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Collection, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from course.ranks import run

__all__ = [
    "Slowed",
    "arrivals",
    "backup_step",
    "step_seconds",
    "straggler_rank",
    "straggler_run",
    "waiting_seconds",
]


class Slowed(nn.Module):
    """A module whose forward first sleeps ``delay`` seconds: emulated compute."""

    def __init__(self, inner: nn.Module, delay: float) -> None:
        super().__init__()
        self.inner, self.delay = inner, delay

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.delay)
        return self.inner(x)


def straggler_rank(
    slow_rank: int | Collection[int] = 3,
    slowdown: float = 2.0,
    compute_s: float = 0.03,
    steps: int = 6,
) -> list[dict[str, float]]:
    """On every rank: ``steps`` DDP steps, each ``{"start", "forward_end", "backward_end",
    "end"}`` in seconds of the machine's monotonic clock (one clock for all ranks); the slow
    rank, or each of the slow ranks, computes ``slowdown`` times as long."""
    rank = dist.get_rank()
    slow = {slow_rank} if isinstance(slow_rank, int) else set(slow_rank)
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
    delay = compute_s * (slowdown if rank in slow else 1.0)
    ddp = DDP(Slowed(mlp, delay))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(rank)
    x, y = torch.randn(16, 32, generator=g), torch.randn(16, 1, generator=g)
    ddp(x).sum().backward()  # DDP's first step builds its buckets: not timed
    opt.zero_grad()
    dist.barrier()
    spans = []
    for _ in range(steps):
        start = time.perf_counter()
        loss = nn.functional.mse_loss(ddp(x), y)
        forward_end = time.perf_counter()
        loss.backward()
        backward_end = time.perf_counter()
        opt.step()
        opt.zero_grad()
        spans.append(
            {
                "start": start,
                "forward_end": forward_end,
                "backward_end": backward_end,
                "end": time.perf_counter(),
            }
        )
    return spans


def straggler_run(
    world_size: int = 4,
    slow_rank: int | Collection[int] = 3,
    slowdown: float = 2.0,
    compute_s: float = 0.03,
    steps: int = 6,
) -> list[list[dict[str, float]]]:
    """Per rank, per step, the spans of ``straggler_rank`` on fresh ranks, in seconds from
    the earliest start (the same zero for every rank)."""
    per_rank = run(straggler_rank, world_size, slow_rank, slowdown, compute_s, steps)
    zero = min(s["start"] for spans in per_rank for s in spans)
    return [[{k: v - zero for k, v in s.items()} for s in spans] for spans in per_rank]


def step_seconds(spans: Sequence[Sequence[dict[str, float]]]) -> list[float]:
    """Per rank: the median time from one step's start to its end."""
    return [statistics.median(s["end"] - s["start"] for s in steps) for steps in spans]


def waiting_seconds(spans: Sequence[Sequence[dict[str, float]]]) -> list[float]:
    """Per rank: the median backward span, the time the rank waits in the all-reduce."""
    return [statistics.median(s["backward_end"] - s["forward_end"] for s in ss) for ss in spans]


def arrivals(spans: Sequence[Sequence[dict[str, float]]]) -> list[list[float]]:
    """Per step: when each rank's gradient was ready, in seconds from that step's first start
    (the forward's end: the emulated compute)."""
    by_step = list(zip(*spans, strict=True))
    result = []
    for ranks in by_step:
        first = min(s["start"] for s in ranks)
        result.append([s["forward_end"] - first for s in ranks])
    return result


def backup_step(ready: Sequence[float], b: int, allreduce_s: float = 0.0) -> dict[str, object]:
    """A step with ``b`` backup workers (Chen et al. 2016), played on the times each rank's
    gradient was ready: its seconds, the ranks kept and dropped, and what the sum of the
    kept gradients is divided by; ``allreduce_s`` is the all-reduce after it."""
    n = len(ready)
    if not 0 <= b < n:
        raise ValueError(f"need 0 <= b < {n} backups, got {b}")
    order = sorted(range(n), key=lambda r: ready[r])
    kept = sorted(order[: n - b])
    return {
        "seconds": ready[order[n - b - 1]] + allreduce_s,
        "kept": kept,
        "dropped": sorted(order[n - b :]),
        "divide_by": len(kept),
    }


if __name__ == "__main__":  # torchrun --nproc-per-node 4 -m course.lessons.synchrony.stragglers
    dist.init_process_group("gloo")
    times = straggler_rank()
    print(dist.get_rank(), statistics.median(s["end"] - s["start"] for s in times))
    dist.barrier()  # no rank closes its connections while a peer still uses them
    dist.destroy_process_group()
