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

__all__ = ["hierarchy_hints", "ring_hints"]


def ring_hints(
    tensors: list[Any],
    inputs: list[torch.Tensor],
    expected: torch.Tensor,
    case: Case,
    rank: int,
    returned: str | None,
) -> list[str]:
    """Name the likely mistake, only where every rank's numbers say it plainly."""
    hints = []
    if returned is not None:
        hints.append(
            f"  your function returned a {returned}: it should change `tensor` in place"
            " and return None"
        )
    if not all(isinstance(t, torch.Tensor) and t.shape == expected.shape for t in tensors):
        return hints
    world_size = len(tensors)
    if _reduce_scatter_only(tensors, inputs, expected, case):
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
) -> list[str]:
    """What a wrong two-level sum most likely got wrong: a return value, a size the node
    does not divide (no padding), or a tensor left unchanged."""
    hints = []
    numel = expected.numel()
    if returned is not None:
        hints.append(
            f"  your function returned a {returned}: it should change `tensor` in place and "
            "return None"
        )
    if numel % ranks_per_node:
        shard = -(-numel // ranks_per_node)
        hints.append(
            f"  numel = {numel} does not split evenly into {ranks_per_node} shards: if yours "
            f"hold "
            f"{numel} // {ranks_per_node} each, the rest is never summed; pad the "
            f"flattened tensor to {shard * ranks_per_node} (shards of ceil({numel} / "
            f"{ranks_per_node}) = {shard}) before the reduce-scatter, and drop the padding after "
            "the all-gather"
        )
    unchanged = isinstance(tensor, torch.Tensor) and tensor.shape == expected.shape
    if not numel % ranks_per_node and unchanged and any(torch.equal(tensor, own) for own in made):
        hints.append("  the tensor is unchanged: write the sum into it in place (tensor.copy_)")
    return hints
