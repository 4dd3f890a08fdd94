"""Does check_diloco_outer_step pass every right outer step and fail each wrong one, on gloo,
with the hint that names its mistake?"""

from __future__ import annotations

import diloco_impls
import pytest
import torch
from student_code import as_student_code

from course.checks.teaching import CheckFailed
from course.lessons.fault_tolerance import check_diloco_outer_step
from course.lessons.fault_tolerance.outer import SHAPES, Case, oracle

pytestmark = pytest.mark.ranks


@pytest.mark.parametrize("fn", diloco_impls.RIGHT, ids=lambda f: f.__name__)
def test_right_outer_steps_pass(fn):
    """Do the per-tensor, the flat and the mean-of-parameters outer steps all pass?"""
    report = check_diloco_outer_step(as_student_code(fn))
    assert "passed" in report


@pytest.mark.parametrize(
    ("fn", "hint"),
    [
        pytest.param(fn, hint, marks=pytest.mark.deadlocks)
        if fn is diloco_impls.deadlock
        else (fn, hint)
        for fn, hint in diloco_impls.WRONG.items()
    ],
    ids=lambda x: getattr(x, "__name__", ""),
)
def test_wrong_outer_steps_fail_with_their_hint(fn, hint):
    """Does each usual mistake fail, with a message that says which?"""
    with pytest.raises(CheckFailed) as failed:
        check_diloco_outer_step(as_student_code(fn), world_sizes=(2,))
    assert hint in str(failed.value)


def test_the_oracle_is_torchs_nesterov_sgd():
    """Is the check's float64 oracle torch.optim.SGD(nesterov=True) on the mean pseudo-gradient,
    over two steps with the momentum carried?"""
    g = torch.Generator().manual_seed(0)
    start = [torch.randn(s, generator=g, dtype=torch.float64) for s in SHAPES]
    case = Case(0.7, 0.9)
    ours, momentum = [t.clone() for t in start], [torch.zeros_like(t) for t in start]
    theirs = [t.clone().requires_grad_() for t in start]
    opt = torch.optim.SGD(theirs, lr=case.outer_lr, momentum=case.mu, nesterov=True)
    for _ in range(2):
        workers = [[t + 0.1 * torch.randn(t.shape, generator=g, dtype=t.dtype) for t in ours]]
        workers.append([t + 0.1 * torch.randn(t.shape, generator=g, dtype=t.dtype) for t in ours])
        for p, o, w0, w1 in zip(theirs, ours, *workers, strict=True):
            p.grad = ((o - w0) + (o - w1)) / 2
        opt.step()
        ours, momentum = oracle(workers, ours, momentum, case)
        for a, b in zip(ours, theirs, strict=True):
            torch.testing.assert_close(a, b.detach())
