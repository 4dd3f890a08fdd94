"""Student-style ``step_with_backups(grad, backups)``: a right one, and wrong ones.

Rank 0 collects: every other rank sends it its gradient; rank 0 receives from whichever
rank comes first (``dist.recv`` without a source) until it has N - b (its own among them),
sends the decision and the average to every rank, and leaves the late gradients unread.
``WRONG`` maps a name to ``(fn, words)``: what the
failure message must say.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

_RUNNING: list = []  # sends and late receives that finish after the step returns


def _collect(grad, need, wait_for_all=False):
    """On rank 0: the ranks in order of arrival (rank 0 first), and their gradients, from
    receives that take whichever message comes first (dist.recv without a source)."""
    n = dist.get_world_size()
    arrived, bufs = [0], {0: grad.clone()}
    while len(arrived) < (n if wait_for_all else need):
        buf = torch.empty_like(grad)
        src = dist.recv(buf)
        arrived.append(src)
        bufs[src] = buf
    return arrived, bufs


def _tell(kept, grad):
    """On rank 0: send every rank the kept mask and the average, without waiting."""
    n = dist.get_world_size()
    mask = torch.zeros(n, dtype=torch.int64)
    mask[kept] = 1
    for r in range(1, n):
        _RUNNING.append(dist.isend(mask, r))
        _RUNNING.append(dist.isend(grad.clone(), r))


def _hear(grad):
    """On the other ranks: hand in the gradient, then hear the decision and the average."""
    n = dist.get_world_size()
    _RUNNING.append(dist.isend(grad.clone(), 0))
    mask = torch.empty(n, dtype=torch.int64)
    dist.recv(mask, 0)
    dist.recv(grad, 0)
    return [r for r in range(n) if mask[r]]


def step_with_backups(grad, backups):
    """Average the first N - b gradients to reach rank 0; return the kept ranks, sorted."""
    need = dist.get_world_size() - backups
    if dist.get_rank() != 0:
        return _hear(grad)
    arrived, bufs = _collect(grad, need)
    kept = sorted(arrived[:need])
    grad.copy_(sum(bufs[r] for r in kept) / need)
    _tell(kept, grad)
    return kept


def waits_for_all(grad, backups):
    """Plain synchronous SGD: every rank's gradient, averaged."""
    dist.all_reduce(grad)
    grad /= dist.get_world_size()
    return list(range(dist.get_world_size()))


def waits_then_drops(grad, backups):
    """The right ranks and average, but only after every gradient, the late ones too, is in."""
    need = dist.get_world_size() - backups
    if dist.get_rank() != 0:
        return _hear(grad)
    arrived, bufs = _collect(grad, need, wait_for_all=True)
    kept = sorted(arrived[:need])
    grad.copy_(sum(bufs[r] for r in kept) / need)
    _tell(kept, grad)
    return kept


def sums_not_averages(grad, backups):
    """The right ranks, summed: no division by N - b."""
    need = dist.get_world_size() - backups
    if dist.get_rank() != 0:
        return _hear(grad)
    arrived, bufs = _collect(grad, need)
    kept = sorted(arrived[:need])
    grad.copy_(sum(bufs[r] for r in kept))
    _tell(kept, grad)
    return kept


def others_forget_rank_0(grad, backups):
    """Right on rank 0; the other ranks read the decision without rank 0's own place."""
    kept = step_with_backups(grad, backups)
    return kept if dist.get_rank() == 0 else [r for r in kept if r != 0]


WRONG = {
    "waits_for_all": (waits_for_all, ["kept 4 ranks", "N - b = 3"]),
    "waits_then_drops": (
        waits_then_drops,
        ["after the first straggler handed in its gradient", "waited for the"],
    ),
    "sums_not_averages": (sums_not_averages, ["sum over the kept ranks"]),
    "others_forget_rank_0": (others_forget_rank_0, ["disagree", "let one rank decide"]),
}
