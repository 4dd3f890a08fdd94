"""Known-wrong ``step_with_backups`` for testing its check: each a real misconception."""

from __future__ import annotations

import torch
import torch.distributed as dist

_SENDING: list = []


def waits_for_everyone(grad: torch.Tensor, backups: int) -> list[int]:
    """Receives every gradient, in rank order, then drops the last ``backups`` ranks."""
    rank, n = dist.get_rank(), dist.get_world_size()
    if rank:
        dist.send(grad, 0)
        reply = torch.empty(n + grad.numel(), dtype=torch.float64)
        dist.recv(reply, 0)
        grad.copy_(reply[n:])
        return [r for r in range(n) if reply[r]]
    grads = [grad.clone()]
    for r in range(1, n):
        incoming = torch.empty_like(grad)
        dist.recv(incoming, r)
        grads.append(incoming)
    kept = list(range(n - backups))
    grad.copy_(torch.stack([grads[k] for k in kept]).mean(0))
    reply = torch.cat([torch.zeros(n, dtype=torch.float64), grad.double()])
    reply[kept] = 1
    for r in range(1, n):
        dist.send(reply, r)
    return kept


def all_reduce_of_everyone(grad: torch.Tensor, backups: int) -> list[int]:
    """Averages with one all-reduce, which every rank (the straggler too) must join."""
    dist.all_reduce(grad)
    grad /= dist.get_world_size()
    return list(range(dist.get_world_size() - backups))


_STEPS = [0]


def divides_by_everyone(grad: torch.Tensor, backups: int) -> list[int]:
    """Keeps the first N - b, but divides their sum by N."""
    rank, n = dist.get_rank(), dist.get_world_size()
    _STEPS[0] += 1
    tag = _STEPS[0]
    if rank:
        _SENDING.append(dist.isend(grad, 0, tag=tag))
        reply = torch.empty(n + grad.numel(), dtype=torch.float64)
        dist.recv(reply, 0, tag=tag)
        grad.copy_(reply[n:])
        return [r for r in range(n) if reply[r]]
    total, kept = grad.double(), [0]
    incoming = torch.empty_like(grad)
    while len(kept) < n - backups:
        kept.append(dist.recv(incoming, tag=tag))
        total += incoming
    kept.sort()
    grad.copy_(total / n)
    reply = torch.cat([torch.zeros(n, dtype=torch.float64), grad.double()])
    reply[kept] = 1
    _SENDING.extend(dist.isend(reply, r, tag=tag) for r in range(1, n))
    return kept


def each_keeps_its_own(grad: torch.Tensor, backups: int) -> list[int]:
    """Every rank decides for itself: it keeps itself and the lowest others."""
    rank, n = dist.get_rank(), dist.get_world_size()
    return sorted({rank, *range(n - backups - 1)})


def blocks_on_the_straggler(grad: torch.Tensor, backups: int) -> list[int]:
    """Keeps the first N - b, but replies with blocking sends, the straggler's too: on gloo a
    send waits for its receive, so rank 0's step waits for the straggler."""
    rank, n = dist.get_rank(), dist.get_world_size()
    _STEPS[0] += 1
    tag = _STEPS[0]
    reply = torch.empty(n + grad.numel(), dtype=torch.float64)
    if rank:
        _SENDING.append(dist.isend(grad, 0, tag=tag))
        dist.recv(reply, 0, tag=tag)
        grad.copy_(reply[n:])
        return [r for r in range(n) if reply[r]]
    total, kept, incoming = grad.double(), [0], torch.empty_like(grad)
    while len(kept) < n - backups:
        kept.append(dist.recv(incoming, tag=tag))
        total += incoming
    kept.sort()
    grad.copy_(total / len(kept))
    reply[:n], reply[n:] = 0, grad.double()
    reply[kept] = 1
    for r in range(1, n):
        dist.send(reply, r, tag=tag)
    return kept
