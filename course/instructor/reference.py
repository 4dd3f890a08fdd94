"""The course's reference ring all-reduce on real ``torch.distributed`` ranks, point-to-point only.

A working solution of the ring exercise, so it is the instructor's: the student install leaves
it out (``course.instructor.studentview.LEFT_OUT``), graded ranks see it blank
(``course.grading.rankbox.HIDDEN``), and the notebooks measure the ring's traffic with
``course.ring.traffic`` instead. The tests decide the ring quiz's keys with it, check the
checks against it, and ``benchmarks/ring.py`` times it against gloo.

It plays ``course.ring.schedule`` step by step (reduce-scatter, then all-gather; Patarasuk & Yuan
2009), so a recorded run of it and the simulator's ``ring_trace`` agree by construction:
one ``isend`` and one ``irecv`` per step, posted together so sending and receiving overlap.
Reduce-scatter receives into one buffer kept between calls and adds in place into the chunk
view; all-gather receives straight into the chunk view, so no step copies a chunk. Keeping
the buffer matters: fresh pages cost a fault each, and with a new buffer per call the ring
reached 0.58x of gloo's bus bandwidth at 64 MB on 2 ranks, against about 1x now.

Try it on four ranks (in a notebook: ``%load_ext course``, then ``%%ranks 4``)::

    t = torch.full((10,), float(rank)); ring_allreduce(t)   # every rank: 0+1+2+3 = 6
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from course.ring.schedule import chunk_bounds, num_steps, phase, recv_chunk, send_chunk

__all__ = ["ring_allreduce"]


def ring_allreduce(tensor: torch.Tensor) -> None:
    """Sum ``tensor`` in place across every rank of the default group, like
    ``dist.all_reduce(tensor)`` (https://pytorch.org/docs/stable/distributed.html), but
    built from ``isend``/``irecv`` round a ring."""
    world_size, rank = dist.get_world_size(), dist.get_rank()
    if world_size == 1:
        return
    flat = tensor.view(-1) if tensor.is_contiguous() else tensor.contiguous().view(-1)
    _ring(flat, rank, world_size)
    if flat.data_ptr() != tensor.data_ptr():
        tensor.copy_(flat.view(tensor.shape))


def _ring(flat: torch.Tensor, rank: int, world_size: int) -> None:
    """The ``2(N-1)`` steps on a flat contiguous tensor."""
    chunks = [flat[lo:hi] for lo, hi in chunk_bounds(flat.numel(), world_size)]
    scratch = _scratch(max(c.numel() for c in chunks), flat.dtype)
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    for step in range(num_steps(world_size)):
        out = chunks[send_chunk(rank, step, world_size)]
        into = chunks[recv_chunk(rank, step, world_size)]
        adding = phase(step, world_size) == "reduce-scatter"
        landing = scratch[: into.numel()] if adding else into
        sent = dist.isend(out, right)
        dist.irecv(landing, left).wait()
        if adding:
            torch.add(into, landing, out=into)
        sent.wait()


_SCRATCH: dict[torch.dtype, torch.Tensor] = {}


def _scratch(numel: int, dtype: torch.dtype) -> torch.Tensor:
    """A receive buffer kept between calls: fresh pages would cost a page fault each."""
    buffer = _SCRATCH.get(dtype)
    if buffer is None or buffer.numel() < numel:
        buffer = _SCRATCH[dtype] = torch.empty(numel, dtype=dtype)
    return buffer[:numel]
