"""Graded through the relay, does check_fault_tolerant_step give every right and wrong step the
verdict it gets on gloo, with the relay's fault plan killing the rank, told to no rank?"""

from __future__ import annotations

import pytest
import survive_impls
from student_code import graded_cell

from course.checks.teaching import CheckFailed
from course.grading import sandbox
from course.grading.rankbox import RankBox
from course.grading.student import StudentCode
from course.lessons.fault_tolerance import check_fault_tolerant_step

pytestmark = [
    pytest.mark.ranks,
    pytest.mark.slow,
    pytest.mark.skipif(not sandbox.available(), reason="needs bubblewrap, setpriv and prlimit"),
]

HEADER = "import torch, torch.distributed as dist\nimport torch.nn.functional as F\n"


def _code(fn) -> StudentCode:
    return graded_cell(fn, "fault_tolerant_step", HEADER, survive_impls.apply_step)


@pytest.fixture(scope="module")
def box():
    with RankBox() as rankbox:
        yield rankbox


@pytest.mark.parametrize("fn", survive_impls.RIGHT, ids=lambda f: f.__name__)
def test_right_steps_pass_through_the_relay(box, fn):
    assert "passed" in check_fault_tolerant_step(_code(fn))


@pytest.mark.parametrize(
    ("fn", "hint"), list(survive_impls.WRONG.items()), ids=lambda x: getattr(x, "__name__", "")
)
def test_wrong_steps_fail_through_the_relay_with_their_hint(box, fn, hint):
    with pytest.raises(CheckFailed) as failed:
        check_fault_tolerant_step(_code(fn))
    assert hint in str(failed.value)
