"""Graded through the relay, does check_diloco_outer_step give every right and wrong outer
step the verdict it gets on gloo, its traffic read from the relay's own record?"""

from __future__ import annotations

import diloco_impls
import pytest
from student_code import graded_cell

from course.checks.teaching import CheckFailed
from course.grading import sandbox
from course.grading.rankbox import RankBox
from course.grading.student import StudentCode
from course.lessons.fault_tolerance import check_diloco_outer_step

pytestmark = [
    pytest.mark.ranks,
    pytest.mark.slow,
    pytest.mark.skipif(not sandbox.available(), reason="needs bubblewrap, setpriv and prlimit"),
]

HEADER = "import torch, torch.distributed as dist\n"


def _code(fn) -> StudentCode:
    return graded_cell(fn, "diloco_outer_step", HEADER)


@pytest.fixture(scope="module")
def box():
    with RankBox() as rankbox:
        yield rankbox


@pytest.mark.parametrize("fn", diloco_impls.RIGHT, ids=lambda f: f.__name__)
def test_right_outer_steps_pass_through_the_relay(box, fn):
    assert "passed" in check_diloco_outer_step(_code(fn))


@pytest.mark.parametrize(
    ("fn", "hint"),
    [(f, h) for f, h in diloco_impls.WRONG.items() if f is not diloco_impls.deadlock],
    ids=lambda x: getattr(x, "__name__", ""),
)
def test_wrong_outer_steps_fail_through_the_relay_with_their_hint(box, fn, hint):
    with pytest.raises(CheckFailed) as failed:
        check_diloco_outer_step(_code(fn), world_sizes=(2,))
    assert hint in str(failed.value)


def test_a_deadlocked_outer_step_fails_through_the_relay(box):
    """A rank that skips its all-reduce: on gloo the ranks deadlock; the relay sees the two
    ranks call different collectives and fails the run at once. Both earn nothing."""
    with pytest.raises(CheckFailed) as failed:
        check_diloco_outer_step(_code(diloco_impls.deadlock), world_sizes=(2,))
    assert "failed on 2 ranks" in str(failed.value)
