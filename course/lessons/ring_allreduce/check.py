"""Grade a student's ``ring_allreduce(tensor)``: right sums, and really a ring.

    from course.checks import check_ring_allreduce
    print(check_ring_allreduce(ring_allreduce))     # raises AssertionError that teaches

The student's function runs on fresh ranks (``course.ranks``) for world sizes 2 to 6, on
many tensors per launch (sizes divisible by N and not, smaller than N, a single element;
float32, float64, int32, int64; 1-D to 3-D shapes). The verdict is computed here, in the
caller, from the tensors the ranks send back, against a float64 sum of the inputs made here:
nothing the student's code or kernel state can change. The ring pattern is judged from a
recorded run on encoded inputs (``course.ring.verdict.ring_violations``): under grading, from
the relay's own record of every message, on inputs whose encoding no rank knows
(``course.ring.relayed``); in a notebook, from the recorder on the ranks (``course.ring.recorder``).
The grading path is ``course.checks.allreduce``'s, shared with the other point-to-point
all-reduces.
``check_ring_sums`` and ``check_ring_pattern`` are the two halves, for partial credit.
Every launch has a deadline, so a deadlock or an endless loop fails within seconds.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from course.checks.allreduce import Exercise, Report, check_p2p_allreduce
from course.checks.teaching import teaches
from course.ring.verdict import ring_violations

__all__ = ["RING", "RingReport", "check_ring_allreduce", "check_ring_pattern", "check_ring_sums"]

WORLD_SIZES = (2, 3, 4, 5, 6)
RING_DEADLOCK = (
    "Every rank was waiting for a message no rank had sent: a deadlock. Make sure each send "
    "has a matching receive on the neighbour, and that not every rank blocks in a receive (or "
    "a blocking send) first: post the send with dist.isend and the receive with dist.irecv, "
    "then wait on both (or order blocking calls by rank parity)."
)
RING = Exercise(
    name="ring_allreduce",
    algorithm="a ring all-reduce",
    pattern_noun="a ring pattern",
    violations=ring_violations,
    plan=(
        "A ring on N ranks sends to one neighbour and receives from the other, 2(N-1) times "
        "(N-1 reduce-scatter steps, then N-1 all-gather steps), one chunk of about "
        "1/N of the tensor each time: the plan in the exercise's introduction."
    ),
    deadlock_hint=RING_DEADLOCK,
)
RingReport = Report  # what a passing ring check covered


@teaches
def check_ring_sums(
    fn: Callable[[torch.Tensor], Any], world_sizes: Sequence[int] = WORLD_SIZES
) -> RingReport:
    """Check that ``fn`` sums in place like ``dist.all_reduce`` (communication not judged)."""
    return check_p2p_allreduce(RING, fn, world_sizes, sums=True, pattern=False)


@teaches
def check_ring_pattern(
    fn: Callable[[torch.Tensor], Any], world_sizes: Sequence[int] = WORLD_SIZES
) -> RingReport:
    """Check that ``fn`` communicates as a ring all-reduce (sums not judged)."""
    return check_p2p_allreduce(RING, fn, world_sizes, sums=False, pattern=True)


@teaches
def check_ring_allreduce(
    fn: Callable[[torch.Tensor], Any], world_sizes: Sequence[int] = WORLD_SIZES
) -> RingReport:
    """Check both: right sums on every rank, and a real ring pattern."""
    return check_p2p_allreduce(RING, fn, world_sizes, sums=True, pattern=True)
