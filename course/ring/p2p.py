"""Who waits for whom: blocking point-to-point on gloo, three ways round a ring.

Each function runs on every rank (``course.ranks.launch(send_first, 3, 1)``) and passes a
tensor of ``numel`` ones to the right-hand neighbour while receiving from the left. They
differ only in the order of the calls; the ring lesson measures which orders move at all
(https://pytorch.org/docs/stable/distributed.html#point-to-point-communication).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

__all__ = ["isend_then_recv", "parity_ordered", "send_first"]


def _neighbours() -> tuple[int, int]:
    """This rank's right- and left-hand neighbours."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    return (rank + 1) % world_size, (rank - 1) % world_size


def send_first(numel: int = 1) -> str:
    """Every rank: blocking ``send`` to the right, then ``recv`` from the left."""
    right, left = _neighbours()
    out, into = torch.ones(numel), torch.empty(numel)
    dist.send(out, right)
    dist.recv(into, left)
    return "finished"


def parity_ordered(numel: int = 1) -> str:
    """Even ranks send first, odd ranks receive first (for an odd N, rank N-1 pairs up late)."""
    right, left = _neighbours()
    out, into = torch.ones(numel), torch.empty(numel)
    if dist.get_rank() % 2 == 0:
        dist.send(out, right)
        dist.recv(into, left)
    else:
        dist.recv(into, left)
        dist.send(out, right)
    return "finished"


def isend_then_recv(numel: int = 1) -> str:
    """Every rank: post the send with ``isend``, ``recv``, then wait for the send."""
    right, left = _neighbours()
    out, into = torch.ones(numel), torch.empty(numel)
    request = dist.isend(out, right)
    dist.recv(into, left)
    request.wait()
    return "finished"
