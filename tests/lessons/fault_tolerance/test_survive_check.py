"""check_fault_tolerant_step on the notebook's path (gloo, the rank's harness ending its
process): every right step passes, every wrong one fails with the hint it needs, and the
relay's grading path (tests/grading/test_relayed_survive.py) gives each the same verdict."""

from __future__ import annotations

import pytest
import survive_impls
import torch

from course.checks.teaching import CheckFailed
from course.lessons.fault_tolerance import check_fault_tolerant_step
from course.lessons.fault_tolerance.survive import STEPS, oracle
from course.ranks.faults import Fault

pytestmark = [pytest.mark.ranks]


@pytest.mark.parametrize("fn", survive_impls.RIGHT, ids=lambda f: f.__name__)
def test_right_steps_pass_on_gloo(fn):
    assert "passed" in check_fault_tolerant_step(fn)


@pytest.mark.parametrize(
    ("fn", "hint"), list(survive_impls.WRONG.items()), ids=lambda x: getattr(x, "__name__", "")
)
def test_wrong_steps_fail_on_gloo_with_their_hint(fn, hint):
    with pytest.raises(CheckFailed) as failed:
        check_fault_tolerant_step(fn)
    assert hint in str(failed.value)


def test_the_oracle_averages_over_the_ranks_of_each_step():
    """Before the failure over all three ranks' gradients, from it on over the two left."""
    g = torch.Generator().manual_seed(0)
    batches = [[(torch.randn(4, 8, generator=g), torch.randn(4, 8, generator=g))
                for _ in range(STEPS)] for _ in range(3)]  # fmt: skip
    start = torch.zeros(128)
    start[::3] = 0.1
    everyone = oracle(start, batches, Fault(rank=1, step=STEPS))
    lost = oracle(start, batches, Fault(rank=1, step=1))
    assert torch.equal(everyone[0], lost[0])
    assert not torch.allclose(everyone[1], lost[1])
    kept = [batches[0], batches[2]]
    assert torch.allclose(lost[1], oracle(lost[0], [b[1:] + b[:1] for b in kept], Fault(9, 9))[0])


def test_only_the_planned_world_sizes_are_checked():
    with pytest.raises(ValueError, match="world_sizes must be among"):
        check_fault_tolerant_step(survive_impls.fault_tolerant_step, world_sizes=(5,))
