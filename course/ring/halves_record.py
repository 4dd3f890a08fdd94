"""Record a reduce-scatter or an all-gather on real ranks, as ``course.ring.recorder`` does a ring.

    from course.ring.halves_record import record_half
    trace = record_half(reduce_scatter, "reduce-scatter", 4, numel=13)

The torch side of ``course.ring.halves``: each rank gets encoded inputs (``encoded_tensor`` for a
reduce-scatter; for an all-gather its shard, chunk ``r``, encoded as fully reduced values and a
zeroed ``out``), runs the function once under the recorder, and the messages come back as a
``course.ring.trace.Trace`` even if the run deadlocks or crashes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from course.ring.encoding import check_encodable, encoded_tensor
from course.ring.halves import Half
from course.ring.logs import log_path, read_trace
from course.ring.recorder import Recorder, scratch_dir
from course.ring.schedule import chunk_bounds
from course.ring.trace import Trace, full_mask

__all__ = ["encoded_args", "record_half"]


def encoded_args(half: Half, rank: int, world_size: int, numel: int) -> tuple[torch.Tensor, ...]:
    """This rank's encoded arguments: ``(tensor,)`` or ``(shard, out)``."""
    if half == "reduce-scatter":
        return (encoded_tensor(rank, numel, world_size),)
    lo, hi = chunk_bounds(numel, world_size)[rank]
    whole = encoded_tensor(0, numel, world_size) * full_mask(world_size)
    return whole[lo:hi].clone(), torch.zeros(numel, dtype=torch.float64)


def _record_rank(fn: Callable[..., Any], half: Half, numel: int, directory: str) -> None:
    rank, world_size = dist.get_rank(), dist.get_world_size()
    args = encoded_args(half, rank, world_size, numel)
    with Recorder(log_path(directory, rank)):
        fn(*args)


def record_half(
    fn: Callable[..., Any], half: Half, world_size: int, numel: int = 13, timeout: float = 20.0
) -> Trace:
    """Run ``fn`` once on ``world_size`` fresh ranks with encoded inputs; what they sent."""
    from course.ranks import launch

    check_encodable(world_size, numel)
    with scratch_dir() as directory:
        result = launch(_record_rank, world_size, fn, half, numel, directory, timeout=timeout)
        return read_trace(directory, world_size, numel, 8, result.failures)
