"""The tree grader: recursive doubling passes, and each wrong tree fails for its reason."""

from __future__ import annotations

from dataclasses import replace

import pytest
import synchrony_impls
from student_code import as_student_code
from wrong_synchrony import TREES

from course.lessons.synchrony import check_tree_allreduce, check_tree_pattern, check_tree_sums
from course.ring.tree import tree_trace, tree_violations

pytestmark = pytest.mark.ranks

tree_allreduce = as_student_code(synchrony_impls.tree_allreduce)
CHECKS = {"sums": check_tree_sums, "pattern": check_tree_pattern}
# The narrowest world sizes that show each mistake: a fold needs N > p.
SLOW = {"tree_deadlock", "tree_blocking_sends"}  # run into the launch deadline
SIZES = {"off_by_one_fold": (5, 6), "no_unfold": (5,), "tree_deadlock": (2,)}
SIZES |= {"tree_blocking_sends": (2,), "powers_of_two_only": (3,)}


def test_recursive_doubling_passes() -> None:
    """Does the model tree pass both halves, on powers of two and not, and say so?"""
    report = check_tree_allreduce(tree_allreduce)
    assert report.world_sizes == (2, 3, 4, 5, 6, 8)
    assert report.sums_checked > 0 and report.patterns_checked == 18
    assert "recursive doubling in 18 recorded runs" in str(report)


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(n, marks=[pytest.mark.slow, pytest.mark.deadlocks]) if n in SLOW else n
        for n in sorted(TREES)
    ],
)
def test_wrong_tree_fails_with_the_reason(name: str) -> None:
    """Does each wrong tree fail its check with a message naming the mistake?"""
    fn, check, words = TREES[name]
    with pytest.raises(AssertionError) as failure:
        CHECKS[check](as_student_code(fn), world_sizes=SIZES.get(name, (4,)))
    message = str(failure.value)
    assert all(w in message for w in words), message
    assert "_run_cases" not in message and "recorder.py" not in message


@pytest.mark.parametrize("name", ["ring_as_tree", "wrong_partner_order", "sends_halves"])
def test_right_sums_in_the_wrong_pattern_earn_the_sums(name: str) -> None:
    """Does a tree with the right sums but the wrong pattern (a ring among them) pass the
    sums check: partial credit, as the ring's?"""
    assert check_tree_sums(as_student_code(TREES[name][0]), world_sizes=(3, 4)).sums_checked


def test_a_ring_passes_as_a_ring_and_not_as_a_tree() -> None:
    """Is the pattern verdict the tree's own: the ring fails it on every world size?"""
    ring = as_student_code(TREES["ring_as_tree"][0])
    for n in (3, 8):
        with pytest.raises(AssertionError, match="is not recursive doubling"):
            check_tree_pattern(ring, world_sizes=(n,))


@pytest.mark.parametrize("n", range(2, 10))
def test_the_schedule_is_its_own_verdicts_pattern(n: int) -> None:
    """Does the simulated recursive doubling pass the verdict on every N, and does swapping
    two exchange partners, or halving one message, fail it?"""
    trace = tree_trace(n, 7)
    assert tree_violations(trace) == []
    sends = [m for m in trace.messages if m.op == "send" and m.rank == 0]
    wrong_peer = replace(sends[0], peer=0)  # rank 0 never sends to itself
    halved = replace(sends[0], numel=3, nbytes=24)
    for bad in (wrong_peer, halved):
        mutated = replace(
            trace, messages=tuple(bad if m is sends[0] else m for m in trace.messages)
        )
        assert tree_violations(mutated), bad
