"""The ring's traffic on real ranks: every message a ring all-reduce sends, and no arithmetic.

    with Recorder() as recorder:      # on every rank (``%%ranks 8`` in a notebook)
        ring_traffic(tensor)          # tensor unchanged; recorder.messages: the ring's sends

What the notebooks measure the ring's steps and bytes with. It plays ``course.ring.schedule``
step by step between real processes: at each step one ``isend`` of the chunk the schedule
names, to the right-hand neighbour, and one ``irecv`` of the left-hand neighbour's chunk, of its
real size, into a scratch buffer. It adds nothing and copies nothing back, so it is not an
all-reduce: summing is the exercise. Recorded, its messages are a ring all-reduce's, step,
peer and size (``tests/ring/test_traffic.py`` holds it to the simulator's ``ring_trace``, and
the recorded reference ring to the same trace).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from course.ring.schedule import chunk_bounds, plan

__all__ = ["ring_traffic"]


def ring_traffic(tensor: torch.Tensor) -> None:
    """Send and receive, step by step, what a ring all-reduce of ``tensor`` would, over every
    rank of the default group; ``tensor`` is left as it was."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    flat = tensor.detach().reshape(-1)
    bounds = chunk_bounds(flat.numel(), world_size)
    landing = torch.empty(max(hi - lo for lo, hi in bounds), dtype=flat.dtype)
    for step in plan(rank, world_size):
        out_lo, out_hi = bounds[step.send_chunk]
        in_lo, in_hi = bounds[step.recv_chunk]
        sent = dist.isend(flat[out_lo:out_hi].contiguous(), step.send_to)
        dist.irecv(landing[: in_hi - in_lo], step.recv_from).wait()
        sent.wait()
