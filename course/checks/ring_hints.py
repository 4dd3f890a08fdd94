"""What a wrong ring's or two-level all-reduce's numbers say plainly: the hint under a sum.

Each hint is read off every rank's result at once, not one rank's: a tensor one rank left
as it was is "unchanged" only if no rank changed its own, and a reduce-scatter without its
all-gather is told by each chunk being fully summed on some rank and partly on the others.
"""

from __future__ import annotations

import itertools
from typing import Any

import torch

from course.checks.ring_cases import Case, compare
from course.ranks.wording import listed

__all__ = ["hierarchy_hints", "ring_hints", "summed_ranks"]

MAX_SEARCHED = 10  # world sizes up to this have every set of ranks tried (2**N sums)


def summed_ranks(value: Any, inputs: list[torch.Tensor]) -> tuple[int, ...] | None:
    """The set of ranks whose inputs add up to ``value`` element by element most closely, if
    it does within float tolerance, or None (or the world is over ``MAX_SEARCHED``)."""
    if not isinstance(value, torch.Tensor) or len(inputs) > MAX_SEARCHED:
        return None
    stacked = torch.stack([t.to(torch.float64).reshape(-1) for t in inputs])
    if value.numel() != stacked.shape[1]:
        return None
    got = value.to(torch.float64).reshape(-1)
    subsets = [
        ranks for size in range(1, len(inputs) + 1)
        for ranks in itertools.combinations(range(len(inputs)), size)
    ]  # fmt: skip
    sums = torch.stack([stacked[list(ranks)].sum(0) for ranks in subsets])
    errors = (sums - got).abs().amax(dim=1)
    best = int(errors.argmin())
    return subsets[best] if torch.allclose(sums[best], got, rtol=1e-4, atol=1e-4) else None


def ring_hints(
    tensors: list[Any],
    inputs: list[torch.Tensor],
    expected: torch.Tensor,
    case: Case,
    rank: int,
    returned: str | None,
    partial: Any = None,
) -> list[str]:
    """Name the likely mistake, only where every rank's numbers say it plainly; ``partial``
    (world size, rank, the ranks it summed) words a result that sums too few ranks, for an
    exercise that has its own reason for that (the tree's fold)."""
    hints = []
    if returned is not None:
        hints.append(
            f"  your function returned a {returned}: it should change `tensor` in place"
            " and return None"
        )
    if not all(isinstance(t, torch.Tensor) and t.shape == expected.shape for t in tensors):
        return hints
    world_size = len(tensors)
    summed = summed_ranks(tensors[rank], inputs) if partial is not None else None
    if summed is not None and len(summed) < world_size:
        hints.append("  " + partial(world_size, rank, summed))
    elif partial is None and _reduce_scatter_only(tensors, inputs, expected, case):
        hints.append(
            "  each chunk holds the full sum on some rank, but no rank holds them all: that is "
            "the reduce-scatter without the all-gather. After its N-1 steps, pass the finished "
            "chunks round the ring N-1 more times, copying each one in (chunk.copy_(received))."
        )
    elif all(torch.equal(t, own) for t, own in zip(tensors, inputs, strict=True)):
        hints.append(
            "  no rank's tensor changed: write the sum into it in place (chunk views, "
            "`chunk.add_(...)`, `chunk.copy_(...)`), do not rebind the name"
        )
    elif torch.allclose(
        tensors[rank].to(torch.float64) * world_size, expected.to(torch.float64), 1e-4, 1e-4
    ):
        hints.append(
            f"  that is the average: all_reduce's SUM does not divide by world_size ({world_size})"
        )
    return hints


def _reduce_scatter_only(
    tensors: list[torch.Tensor], inputs: list[torch.Tensor], expected: torch.Tensor, case: Case
) -> bool:
    """Every chunk (of torch.tensor_split) is fully summed on some rank, and every other chunk
    holds a partial sum that includes the rank's own input: what a reduce-scatter leaves."""
    n = len(tensors)
    split = [torch.tensor_split(t.reshape(-1), n) for t in (*inputs, expected)]
    done = [False] * n
    for rank, tensor in enumerate(tensors):
        for c, chunk in enumerate(torch.tensor_split(tensor.reshape(-1), n)):
            if not chunk.numel() or compare(chunk, split[n][c], case) is None:
                done[c] = True
            elif not _partial_sum(chunk, [s[c] for s in split[:n]], rank, case):
                return False
    return all(done)


def _partial_sum(chunk: torch.Tensor, parts: list[torch.Tensor], rank: int, case: Case) -> bool:
    """``chunk`` is the sum of some ranks' parts, ``rank``'s own among them (N <= 6: 2^N sums)."""
    others = [r for r in range(len(parts)) if r != rank]
    for subset in itertools.chain.from_iterable(
        itertools.combinations(others, k) for k in range(len(others))
    ):
        total = torch.stack([parts[r].to(torch.float64) for r in (rank, *subset)]).sum(0)
        if compare(chunk, total.to(chunk.dtype), case) is None:
            return True
    return False


def hierarchy_hints(
    tensor: Any,
    made: list,
    expected: torch.Tensor,
    ranks_per_node: int,
    returned: str | None,
    rank: int,
) -> list[str]:
    """What a wrong two-level sum most likely got wrong, read from rank ``rank``'s numbers: a
    return value, a remainder left unsummed (no padding), a sum over the wrong ranks (a group
    not of the layout), or a tensor left unchanged."""
    hints = []
    numel, r = expected.numel(), ranks_per_node
    if returned is not None:
        hints.append(
            f"  your function returned a {returned}: it should change `tensor` in place and "
            "return None"
        )
    if not isinstance(tensor, torch.Tensor) or tensor.shape != expected.shape:
        return hints
    head = numel // r * r
    flat, want = tensor.reshape(-1).to(torch.float64), expected.reshape(-1).to(torch.float64)
    own = made[rank].reshape(-1).to(torch.float64)
    summed_head = torch.allclose(flat[:head], want[:head], rtol=1e-4, atol=1e-4)
    if numel % r and summed_head and torch.equal(flat[head:], own[head:]):
        shard = -(-numel // r)
        hints.append(
            f"  numel = {numel} does not split evenly into {r} shards: the last {numel - head} "
            f"element(s) were never summed; pad the flattened tensor to "
            f"{shard * r} (shards of ceil({numel} / {r}) = {shard}) before the reduce-scatter, "
            "and drop the padding after the all-gather"
        )
        return hints
    summed = summed_ranks(tensor, made)
    if summed == (rank,):
        hints.append("  the tensor is unchanged: write the sum into it in place (tensor.copy_)")
    elif summed is not None and len(summed) < len(made):
        node = rank // r
        own = tuple(range(node * r, node * r + r))
        across = listed(range(rank % r, len(made), r))
        why = (
            "its own node's only: the all-reduce across nodes is missing"
            if summed == own
            else f"not the world's: the groups are not the layout's (node {node} is ranks "
            f"{listed(own)}; across nodes, rank {rank}'s group is ranks {across}, the ranks "
            "with its place in their node)"
        )
        hints.append(f"  rank {rank} holds the sum of ranks {listed(summed)}, {why}")
    return hints
