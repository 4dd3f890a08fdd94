"""Who waits for whom: blocking point-to-point on gloo, three ways round a ring.

Each function runs on every rank (``course.ranks.launch(send_first, 3, 1)``) and passes a
tensor of ``numel`` ones to the right-hand neighbour while receiving from the left. They
differ only in the order of the calls (:func:`blocking_step` takes any choice of the ranks
that receive first); the ring lesson measures which orders move at all
(https://pytorch.org/docs/stable/distributed.html#point-to-point-communication).
"""

from __future__ import annotations

from collections.abc import Collection

import torch
import torch.distributed as dist

__all__ = ["blocking_step", "isend_then_recv", "parity_ordered", "send_first"]


def _neighbours() -> tuple[int, int]:
    """This rank's right- and left-hand neighbours."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    return (rank + 1) % world_size, (rank - 1) % world_size


def blocking_step(numel: int = 1, receivers: Collection[int] = ()) -> str:
    """Every rank: blocking calls, ``recv`` from the left then ``send`` to the right on the
    ranks in ``receivers``, the other order on every other rank
    (``course.ranks.launch(blocking_step, 5, 1, {0, 2}, timeout=8)``)."""
    right, left = _neighbours()
    out, into = torch.ones(numel), torch.empty(numel)
    if dist.get_rank() in receivers:
        dist.recv(into, left)
        dist.send(out, right)
    else:
        dist.send(out, right)
        dist.recv(into, left)
    return "finished"


def send_first(numel: int = 1) -> str:
    """Every rank: blocking ``send`` to the right, then ``recv`` from the left."""
    return blocking_step(numel)


def parity_ordered(numel: int = 1) -> str:
    """Even ranks send first, odd ranks receive first (for an odd N, rank N-1 pairs up late)."""
    return blocking_step(numel, range(1, dist.get_world_size(), 2))


def isend_then_recv(numel: int = 1) -> str:
    """Every rank: post the send with ``isend``, ``recv``, then wait for the send."""
    right, left = _neighbours()
    out, into = torch.ones(numel), torch.empty(numel)
    request = dist.isend(out, right)
    dist.recv(into, left)
    request.wait()
    return "finished"
