"""Grade a student's ``tree_allreduce(tensor)``: right sums, and really recursive doubling.

    from course.checks import check_tree_sums, check_tree_pattern
    print(check_tree_sums(tree_allreduce))        # raises AssertionError that teaches

Graded as the ring is (``course.checks.allreduce``): sums on many tensors and dtypes against
a float64 sum made here, from point-to-point calls only (a collective earns nothing); the
pattern from a recorded run on encoded inputs (under grading the relay's record, on inputs
marked with secret bits), judged by ``course.ring.tree.tree_violations``: the fold of the
ranks above the largest power of two p, log2(p) exchanges of the whole tensor with
rank XOR 2**k, the result sent back, each message holding the ranks its step has summed.
World sizes include ones that are not powers of two; every launch has a deadline.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from course.checks.allreduce import Exercise, Report, check_p2p_allreduce
from course.checks.teaching import teaches
from course.ranks.wording import listed
from course.ring.tree import tree_violations

__all__ = ["TREE", "check_tree_allreduce", "check_tree_pattern", "check_tree_sums"]

SUM_SIZES = (2, 3, 4, 5, 6)
PATTERN_SIZES = (2, 3, 4, 5, 6, 8)


def _too_few(n: int, rank: int, summed: tuple[int, ...]) -> str:
    """What a rank that summed too few ranks missed, in recursive doubling's terms."""
    p = 1 << (n.bit_length() - 1)
    holds = f"rank {rank} holds the sum of ranks {listed(summed)} only"
    if p == n:
        return (
            f"{holds}: after log2({n}) = {n.bit_length() - 1} exchanges with the partners "
            "rank XOR 1, XOR 2, XOR 4, ... every rank holds every rank's tensor"
        )
    return (
        f"{holds}: {n} ranks are not a power of two, so ranks q >= p = {p} first fold their "
        f"tensor into rank q - {p}, the exchanges run among ranks 0..{p - 1}, and each rank "
        f"q < {n - p} then sends the result to q + {p}"
    )


TREE = Exercise(
    name="tree_allreduce",
    algorithm="recursive doubling",
    pattern_noun="recursive doubling",
    violations=tree_violations,
    plan=(
        "Recursive doubling on N ranks, with p the largest power of two <= N: ranks q >= p "
        "first send their whole tensor to q - p (the fold); then at step k = 0, 1, ..., "
        "log2(p) - 1 every rank q < p swaps its whole tensor with rank q XOR 2**k and adds "
        "what it receives; then each rank q < p sends the result to q + p where that exists."
    ),
    deadlock_hint=(
        "Every rank was waiting for a message no rank had sent: a deadlock. At each exchange "
        "step both partners send and receive: post the send with dist.isend, then receive, "
        "then wait for the send (two blocking receives first wait for each other forever). "
        "A folded rank sends first, then waits for the result; its partner receives the fold "
        "before its first exchange."
    ),
    partial=_too_few,
)


@teaches
def check_tree_sums(
    fn: Callable[[torch.Tensor], Any], world_sizes: Sequence[int] = SUM_SIZES
) -> Report:
    """Check that ``fn`` sums in place like ``dist.all_reduce``, point-to-point only
    (communication pattern not judged)."""
    return check_p2p_allreduce(TREE, fn, world_sizes, sums=True, pattern=False)


@teaches
def check_tree_pattern(
    fn: Callable[[torch.Tensor], Any], world_sizes: Sequence[int] = PATTERN_SIZES
) -> Report:
    """Check that ``fn`` communicates as recursive doubling (sums not judged)."""
    return check_p2p_allreduce(TREE, fn, world_sizes, sums=False, pattern=True)


@teaches
def check_tree_allreduce(
    fn: Callable[[torch.Tensor], Any], world_sizes: Sequence[int] = PATTERN_SIZES
) -> Report:
    """Check both: right sums on every rank, and the recursive doubling pattern."""
    return check_p2p_allreduce(TREE, fn, world_sizes, sums=True, pattern=True)
