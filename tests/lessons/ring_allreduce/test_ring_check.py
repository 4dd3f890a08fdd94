"""The ring grader: does it pass every correct ring and fail each wrong one for the right reason?"""

from __future__ import annotations

import pytest
import torch
from student_code import as_student_code
from wrong_rings import CORRECT, WRONG, WRONG_PATTERN

from course.instructor import reference as ring
from course.lessons.ring_allreduce import check_ring_allreduce, check_ring_pattern, check_ring_sums

pytestmark = pytest.mark.ranks


ring_allreduce = as_student_code(ring.ring_allreduce)

CHECKS = {"sums": check_ring_sums, "pattern": check_ring_pattern}
SLOW = {"deadlock", "spins"}  # these run into the launch deadline


def test_reference_passes() -> None:
    """Does the reference, written in a cell, pass the full check and report what it covered?"""
    report = check_ring_allreduce(ring_allreduce)
    assert report.world_sizes == (2, 3, 4, 5, 6)
    assert report.sums_checked > 0 and report.patterns_checked > 0
    assert "world sizes 2, 3, 4, 5 and 6" in str(report)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CORRECT))
def test_correct_styles_pass(name: str) -> None:
    """Do correct rings in other styles (blocking, batched, reversed, copies) pass?"""
    check_ring_allreduce(CORRECT[name])


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(n, marks=[pytest.mark.slow, pytest.mark.deadlocks]) if n in SLOW else n
        for n in sorted(WRONG)
    ],
)
def test_wrong_ring_fails_with_the_reason(name: str) -> None:
    """Does each wrong implementation fail its check, with a message naming the mistake?"""
    fn, check, words = WRONG[name]
    with pytest.raises(AssertionError) as failure:
        CHECKS[check](fn)
    message = str(failure.value)
    assert all(w in message for w in words), message
    assert "_run_cases" not in message and "recorder.py" not in message  # no course internals


def test_each_hint_fires_only_where_its_diagnosis_is_true() -> None:
    """Is a reduce-scatter without all-gather told so, and not that its tensor is unchanged
    (rank 0's one element of a (1,) tensor on 2 ranks is), nor that it averages?"""
    with pytest.raises(AssertionError) as failure:
        check_ring_sums(WRONG["reduce_scatter_only"][0], world_sizes=(2, 3))
    message = str(failure.value)
    assert "reduce-scatter without the all-gather" in message
    assert "changed" not in message and "average" not in message
    with pytest.raises(AssertionError) as failure:
        check_ring_sums(WRONG["off_by_one_chunk"][0], world_sizes=(3,))
    assert "all-gather" not in str(failure.value) and "changed" not in str(failure.value)


@pytest.mark.parametrize("name", WRONG_PATTERN)
def test_pattern_check_alone_catches(name: str) -> None:
    """Does the pattern verdict alone reject code that is not a ring?"""
    with pytest.raises(AssertionError, match="is not a ring all-reduce"):
        check_ring_pattern(WRONG[name][0])


@pytest.mark.parametrize("name", ["naive_exchange", "whole_tensor_ring"])
def test_right_but_naive_earns_the_sums(name: str) -> None:
    """Does a right-but-not-a-ring solution pass the sums check (partial credit)? (A
    collective does not: the exercise is point-to-point, see library_collective.)"""
    assert check_ring_sums(WRONG[name][0]).sums_checked > 0


def calls_the_reference(tensor: torch.Tensor) -> None:
    import course.instructor.reference

    course.instructor.reference.ring_allreduce(tensor)


def test_calling_the_course_reference_earns_nothing() -> None:
    """Can a student pass by calling the course's own reference ring?"""
    for check in (check_ring_sums, check_ring_pattern):
        with pytest.raises(AssertionError, match="write the ring yourself"):
            check(calls_the_reference, world_sizes=(2,))


def test_a_subset_of_world_sizes_is_checked_and_reported() -> None:
    """Do visible tests on fewer world sizes check and report just those?"""
    report = check_ring_sums(ring_allreduce, world_sizes=(3,))
    assert report.world_sizes == (3,)
    assert "world size 3" in str(report)


@pytest.mark.parametrize("bad", [(), (1,), (2.0,), ("3",)])
def test_bad_world_sizes_are_refused(bad: tuple) -> None:
    """Is a world size list the check cannot run refused with a clear error?"""
    with pytest.raises(ValueError, match="world_sizes must be"):
        check_ring_sums(ring_allreduce, world_sizes=bad)
