"""Student-style ``tree_allreduce`` and ``hierarchical_allreduce`` implementations that are wrong.

Each is written as a student would in a notebook cell (plain ``torch.distributed``). ``TREES``
and ``HIERARCHIES`` map a name to ``(fn, check, words)``: ``check`` is the narrowest check
that must fail ("sums" or "pattern") and ``words`` what its message must say. A wrong
pattern with right sums is listed under "pattern" and must pass the sums check.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def _doubling(tensor, distances=None, fold_shift=0, halves=False, unfold=True):
    """Recursive doubling with knobs for the mistakes below; the defaults make it right."""
    rank, n = dist.get_rank(), dist.get_world_size()
    p = 1 << (n.bit_length() - 1)
    incoming = torch.empty_like(tensor)
    if rank >= p:
        dist.send(tensor, rank - p + fold_shift)
        if unfold:
            dist.recv(tensor, rank - p + fold_shift)
        return
    folded = [q for q in range(p, n) if q - p + fold_shift == rank]
    for q in folded:
        dist.recv(incoming, q)
        tensor.add_(incoming)
    for distance in distances(p) if distances else [1 << k for k in range(p.bit_length() - 1)]:
        peer = rank ^ distance
        if halves:  # half the tensor each way, then the other half back: not a doubling step
            flat, buf = tensor.view(-1), incoming.view(-1)
            mid = flat.numel() // 2
            for lo, hi in ((0, mid), (mid, flat.numel())):
                request = dist.isend(flat[lo:hi].clone(), peer)
                dist.recv(buf[lo:hi], peer)
                request.wait()
        else:
            request = dist.isend(tensor.clone(), peer)
            dist.recv(incoming, peer)
            request.wait()
        tensor.add_(incoming)
    if unfold:
        for q in folded:
            dist.send(tensor, q)


def ring_as_tree(tensor):
    """A right ring all-reduce, handed in as the tree: 2(N-1) steps of 1/N chunks."""
    n, r = dist.get_world_size(), dist.get_rank()
    chunks = list(tensor.view(-1).tensor_split(n))
    for phase in (0, 1):
        for s in range(n - 1):
            out, into = chunks[(r - s + phase) % n], chunks[(r - s - 1 + phase) % n]
            buf = torch.empty_like(into)
            sent = dist.isend(out.clone(), (r + 1) % n)
            dist.irecv(buf, (r - 1) % n).wait()
            sent.wait()
            into.add_(buf) if phase == 0 else into.copy_(buf)


def wrong_partner_order(tensor):
    """The exchanges in reverse order (distance p/2 first): right sums, not the schedule."""
    _doubling(tensor, distances=lambda p: [1 << k for k in reversed(range(p.bit_length() - 1))])


def sends_halves(tensor):
    """Each exchange in two messages of half the tensor."""
    _doubling(tensor, halves=True)


def off_by_one_fold(tensor):
    """Rank q >= p folds into q - p + 1 instead of q - p: right sums, the wrong partner."""
    _doubling(tensor, fold_shift=1)


def no_unfold(tensor):
    """The folded ranks are never sent the result: they keep their own tensor."""
    _doubling(tensor, unfold=False)


def tree_deadlock(tensor):
    """Both partners of an exchange receive first, with blocking calls."""
    rank, n = dist.get_rank(), dist.get_world_size()
    incoming = torch.empty_like(tensor)
    peer = rank ^ 1
    if peer < n:
        dist.recv(incoming, peer)
        dist.send(tensor, peer)
        tensor.add_(incoming)


def tree_blocking_sends(tensor):
    """Both partners of an exchange send first, with blocking calls: on gloo a send waits for
    its receive, so both wait forever."""
    rank, n = dist.get_rank(), dist.get_world_size()
    incoming = torch.empty_like(tensor)
    peer = rank ^ 1
    if peer < n:
        dist.send(tensor, peer)
        dist.recv(incoming, peer)
        tensor.add_(incoming)


def powers_of_two_only(tensor):
    """Recursive doubling with no fold: right on 2, 4, 8 ranks; on 3, rank 2 is left out."""
    rank, n = dist.get_rank(), dist.get_world_size()
    incoming = torch.empty_like(tensor)
    distance = 1
    while distance < n:
        peer = rank ^ distance
        if peer < n:
            sent = dist.isend(tensor.clone(), peer)
            dist.recv(incoming, peer)
            sent.wait()
            tensor.add_(incoming)
        distance *= 2


def tree_library(tensor):
    """The library's own all-reduce."""
    dist.all_reduce(tensor)


TREES = {
    "ring_as_tree": (ring_as_tree, "pattern", ["made 6 sends", "makes 2", "whole tensor"]),
    "wrong_partner_order": (
        wrong_partner_order,
        "pattern",
        ["rank 0, step 1: sent to rank 2, expected rank 1", "XOR"],
    ),
    "sends_halves": (sends_halves, "pattern", ["elements to rank", "the whole tensor"]),
    "off_by_one_fold": (
        off_by_one_fold,
        "pattern",
        ["rank 4, the fold: sent to rank 1, expected rank 0"],
    ),
    "no_unfold": (no_unfold, "sums", ["wrong result", "rank 4"]),
    "tree_deadlock": (tree_deadlock, "sums", ["deadlock", "dist.isend"]),
    "tree_blocking_sends": (tree_blocking_sends, "sums", ["deadlock", "dist.isend"]),
    "tree_library": (tree_library, "sums", ["dist.all_reduce", "a collective"]),
    "powers_of_two_only": (
        powers_of_two_only,
        "sums",
        ["not a power of two", "fold", "holds the sum of ranks"],
    ),
}


# --- hierarchies ---------------------------------------------------------------------------


def _groups(ranks_per_node):
    """This rank's (node group, cross-node group), made afresh on every call."""
    n, rank = dist.get_world_size(), dist.get_rank()
    nodes = n // ranks_per_node
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
    return mine


def uncached_groups(tensor, ranks_per_node):
    """Right: the groups made on every call, not cached."""
    node_group, cross_group = _groups(ranks_per_node)
    flat = tensor.reshape(-1)
    shard = -(-flat.numel() // ranks_per_node)
    padded = torch.zeros(shard * ranks_per_node, dtype=tensor.dtype)
    padded[: flat.numel()] = flat
    mine = torch.empty(shard, dtype=tensor.dtype)
    dist.reduce_scatter_single(mine, padded, group=node_group)
    dist.all_reduce(mine, group=cross_group)
    dist.all_gather_single(padded, mine, group=node_group)
    tensor.copy_(padded[: flat.numel()].view(tensor.shape))


def groups_of_its_own(tensor, ranks_per_node):
    """The two levels, but each rank makes only the groups it is in: torch requires every
    rank to make every group, in the same order (on gloo the groups meet under one name)."""
    n, rank = dist.get_world_size(), dist.get_rank()
    node = rank // ranks_per_node
    node_group = dist.new_group(list(range(node * ranks_per_node, (node + 1) * ranks_per_node)))
    cross_group = dist.new_group(list(range(rank % ranks_per_node, n, ranks_per_node)))
    dist.all_reduce(tensor, group=node_group)
    dist.all_reduce(tensor, group=cross_group)


def leader_based(tensor, ranks_per_node):
    """Right sums: each node reduces to its first rank, the leaders all-reduce the whole
    tensor, and each leader broadcasts to its node. Not the two-level scheme: the leaders
    carry the whole tensor across nodes, the others nothing."""
    node_group, cross_group = _groups(ranks_per_node)
    rank = dist.get_rank()
    leader = rank - rank % ranks_per_node
    dist.reduce(tensor, leader, group=node_group)
    if rank == leader:
        dist.all_reduce(tensor, group=cross_group)
    dist.broadcast(tensor, leader, group=node_group)


def own_node_only(tensor, ranks_per_node):
    """The reduce-scatter and the all-gather inside the node, and no all-reduce across."""
    node_group, _cross_group = _groups(ranks_per_node)
    flat = tensor.reshape(-1)
    shard = -(-flat.numel() // ranks_per_node)
    padded = torch.zeros(shard * ranks_per_node, dtype=tensor.dtype)
    padded[: flat.numel()] = flat
    mine = torch.empty(shard, dtype=tensor.dtype)
    dist.reduce_scatter_single(mine, padded, group=node_group)
    dist.all_gather_single(padded, mine, group=node_group)
    tensor.copy_(padded[: flat.numel()].view(tensor.shape))


def flat_world(tensor, ranks_per_node):
    """One all-reduce over the whole world: no hierarchy at all."""
    dist.all_reduce(tensor)


def whole_across(tensor, ranks_per_node):
    """The whole tensor all-reduced inside the node, then the whole tensor across nodes."""
    node_group, cross_group = _groups(ranks_per_node)
    dist.all_reduce(tensor, group=node_group)  # every rank of a node: the node's sum
    dist.all_reduce(tensor, group=cross_group)  # summed over nodes: right, but S per rank


def dropped_remainder(tensor, ranks_per_node):
    """Shards of numel // R elements: the last numel % R elements are never summed."""
    node_group, cross_group = _groups(ranks_per_node)
    flat = tensor.view(-1)
    shard = flat.numel() // ranks_per_node
    mine = torch.empty(shard, dtype=tensor.dtype)
    dist.reduce_scatter_single(mine, flat[: shard * ranks_per_node].clone(), group=node_group)
    dist.all_reduce(mine, group=cross_group)
    out = torch.empty(shard * ranks_per_node, dtype=tensor.dtype)
    dist.all_gather_single(out, mine, group=node_group)
    flat[: shard * ranks_per_node] = out


HIERARCHIES = {
    "groups_of_its_own": (groups_of_its_own, "sums", ["dist.new_group", "same order"]),
    "leader_based": (leader_based, "pattern", ["carried", "its shard"]),
    "own_node_only": (own_node_only, "sums", ["its own node's only", "across nodes is missing"]),
    "flat_world": (flat_world, "sums", ["over the whole world", "earns none"]),
    "flat_world_pattern": (flat_world, "pattern", ["ran over the whole world"]),
    "whole_across": (whole_across, "pattern", ["per rank; across nodes each rank", "its shard"]),
    "dropped_remainder": (
        dropped_remainder,
        "sums",
        ["wrong result", "does not split evenly", "pad"],
    ),
}
