"""The synchrony assignment's model solutions, for the tests: they live in tests/, never in the
package students get.

``tree_allreduce`` is recursive doubling (Thakur, Rabenseifner & Gropp, 2005): with p the
largest power of two not above N, ranks p..N-1 first fold their tensor into rank - p; then for
k = 0 .. log2(p) - 1 each rank q < p swaps its whole tensor with q XOR 2**k and adds; then the
folded ranks get the result back. ``hierarchical_allreduce`` is the two-level all-reduce: a
reduce-scatter inside each node, an all-reduce of the shard across nodes, an all-gather inside
the node.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def tree_allreduce(tensor: torch.Tensor) -> None:
    """Sum ``tensor`` in place across all ranks by recursive doubling, point-to-point only."""
    rank, n = dist.get_rank(), dist.get_world_size()
    p = 1 << (n.bit_length() - 1)  # the largest power of two <= n
    incoming = torch.empty_like(tensor)
    if rank >= p:  # fold into rank - p, then wait for the result
        dist.send(tensor, rank - p)
        dist.recv(tensor, rank - p)
        return
    if rank + p < n:
        dist.recv(incoming, rank + p)
        tensor.add_(incoming)
    distance = 1
    while distance < p:
        peer = rank ^ distance
        request = dist.isend(tensor, peer)
        dist.recv(incoming, peer)
        request.wait()
        tensor.add_(incoming)
        distance *= 2
    if rank + p < n:
        dist.send(tensor, rank + p)


_GROUPS: dict[tuple[int, int], tuple] = {}


def _groups(world_size: int, ranks_per_node: int) -> tuple:
    """This rank's (node group, cross-node group); every rank makes every group, in one order."""
    if (world_size, ranks_per_node) not in _GROUPS:
        nodes = world_size // ranks_per_node
        rank = dist.get_rank()
        mine = [None, None]
        for node in range(nodes):
            ranks = list(range(node * ranks_per_node, (node + 1) * ranks_per_node))
            group = dist.new_group(ranks)
            if rank in ranks:
                mine[0] = group
        for local in range(ranks_per_node):
            ranks = [node * ranks_per_node + local for node in range(nodes)]
            group = dist.new_group(ranks)
            if rank in ranks:
                mine[1] = group
        _GROUPS[world_size, ranks_per_node] = tuple(mine)
    return _GROUPS[world_size, ranks_per_node]


def hierarchical_allreduce(tensor: torch.Tensor, ranks_per_node: int) -> None:
    """Sum ``tensor`` in place: reduce-scatter in the node, all-reduce across, all-gather in."""
    node_group, cross_group = _groups(dist.get_world_size(), ranks_per_node)
    flat = tensor.reshape(-1)
    shard_numel = -(-flat.numel() // ranks_per_node)
    padded = torch.zeros(shard_numel * ranks_per_node, dtype=tensor.dtype)
    padded[: flat.numel()] = flat
    shard = torch.empty(shard_numel, dtype=tensor.dtype)
    dist.reduce_scatter_single(shard, padded, group=node_group)
    dist.all_reduce(shard, group=cross_group)
    dist.all_gather_single(padded, shard, group=node_group)
    tensor.copy_(padded[: flat.numel()].view(tensor.shape))


_STEPS = [0]  # this rank's steps so far: each step's messages carry its number as their tag
_SENDING: list = []  # every send's request, kept: on gloo, a dropped request cancels its send


def step_with_backups(grad: torch.Tensor, backups: int) -> list[int]:
    """Average ``grad`` over rank 0 and the first N - 1 - backups others to send theirs."""
    rank, n = dist.get_rank(), dist.get_world_size()
    _STEPS[0] += 1
    tag = _STEPS[0]
    if rank:
        _SENDING.append(dist.isend(grad, 0, tag=tag))
        reply = torch.empty(n + grad.numel(), dtype=torch.float64)
        dist.recv(reply, 0, tag=tag)
        grad.copy_(reply[n:])
        return [r for r in range(n) if reply[r]]
    total, kept = grad.to(torch.float64), [0]
    incoming = torch.empty_like(grad)
    while len(kept) < n - backups:
        kept.append(dist.recv(incoming, tag=tag))  # from any rank: the first to arrive
        total += incoming
    kept.sort()
    grad.copy_(total / len(kept))
    reply = torch.cat([torch.zeros(n, dtype=torch.float64), grad.to(torch.float64)])
    reply[kept] = 1
    _SENDING.extend(dist.isend(reply, r, tag=tag) for r in range(1, n))
    return kept


def step_with_backups_in_two_messages(grad: torch.Tensor, backups: int) -> list[int]:
    """The same step, rank 0 replying with the kept flags and the mean as two tagged
    messages, each sent with dist.isend and kept."""
    rank, n = dist.get_rank(), dist.get_world_size()
    _STEPS[0] += 1
    tag = 2 * _STEPS[0]
    flags = torch.zeros(n, dtype=torch.int64)
    if rank:
        _SENDING.append(dist.isend(grad, 0, tag=tag))
        dist.recv(flags, 0, tag=tag)
        dist.recv(grad, 0, tag=tag + 1)
        return [r for r in range(n) if flags[r]]
    total, kept = grad.to(torch.float64), [0]
    incoming = torch.empty_like(grad)
    while len(kept) < n - backups:
        kept.append(dist.recv(incoming, tag=tag))
        total += incoming
    grad.copy_(total / len(kept))
    flags[kept] = 1
    for r in range(1, n):
        _SENDING.append(dist.isend(flags, r, tag=tag))
        _SENDING.append(dist.isend(grad, r, tag=tag + 1))
    return sorted(kept)
