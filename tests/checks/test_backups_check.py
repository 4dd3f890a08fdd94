"""The backup workers' grader: the right step passes; each wrong one fails for its reason."""

from __future__ import annotations

import pytest
from backup_impls import WRONG, step_with_backups
from test_ring_check import as_student_code

from course.checks import check_step_with_backups

pytestmark = pytest.mark.ranks


def test_backup_workers_pass() -> None:
    """Does the collecting rank that goes on with the first N - b gradients pass?"""
    passed = check_step_with_backups(as_student_code(step_with_backups))
    assert "4 ranks with 1 backup and 5 ranks with 2 backups" in passed


@pytest.mark.parametrize("name", sorted(WRONG))
def test_wrong_step_fails_with_the_reason(name: str) -> None:
    """Does each wrong step (waiting for all, waiting then dropping, summing, disagreeing)
    fail with a message naming the mistake?"""
    fn, words = WRONG[name]
    with pytest.raises(AssertionError) as failure:
        check_step_with_backups(as_student_code(fn), cases=((4, 1),))
    message = str(failure.value)
    assert all(w in message for w in words), message


@pytest.mark.parametrize("bad", [(), ((4, 0),), ((4, 3),), ((4.0, 1),)])
def test_cases_the_check_cannot_run_are_refused(bad: tuple) -> None:
    with pytest.raises(ValueError, match="cases must be"):
        check_step_with_backups(as_student_code(step_with_backups), cases=bad)
