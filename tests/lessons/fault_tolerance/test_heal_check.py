"""check_heal on the notebook's path (gloo, the ranks' recorders): every right heal passes,
every wrong one fails with the hint it needs, and the relay's grading path
(tests/grading/test_relayed_heal.py) gives each the same verdict."""

from __future__ import annotations

import itertools

import heal_impls
import pytest
import torch

from course.checks.teaching import CheckFailed
from course.lessons.fault_tolerance import check_heal, try_heal
from course.lessons.fault_tolerance.heal import CASES, states

pytestmark = [pytest.mark.ranks]


@pytest.mark.parametrize("fn", heal_impls.RIGHT, ids=lambda f: f.__name__)
def test_right_heals_pass_on_gloo(fn):
    assert "passed" in check_heal(fn)


@pytest.mark.parametrize(
    ("fn", "hint"), list(heal_impls.WRONG.items()), ids=lambda x: getattr(x, "__name__", "")
)
def test_wrong_heals_fail_on_gloo_with_their_hint(fn, hint):
    with pytest.raises(CheckFailed) as failed:
        check_heal(fn)
    assert hint in str(failed.value)


def test_the_states_are_one_trajectory():
    """Each step moves the parameters, and the same seed gives the same run."""
    run = states(3, seed=5)
    assert len(run) == 4
    assert all(not torch.equal(a, b) for a, b in itertools.pairwise(run))
    assert all(torch.equal(a, b) for a, b in zip(run, states(3, seed=5), strict=True))


def test_no_fixed_rank_is_a_right_source_in_every_case():
    """Every rank of 4 is behind in some case; in some case the first rank past step 0 is
    behind; and the visible cases alone (3 ranks) leave no rank of 3 a right source."""
    cases = [steps for per_size in CASES.values() for steps in per_size]
    for rank in range(4):
        assert any(rank < len(s) and s[rank] < max(s) for s in cases), rank
    for rank in range(3):
        assert any(s[rank] < max(s) for s in CASES[3]), rank
    assert any(next(x for x in s if x > 0) < max(s) for s in cases)
    assert all(0 in s and s.count(max(s)) < len(s) for s in cases)


def test_the_try_table_shows_each_rank_before_and_after():
    table = try_heal(heal_impls.heal).splitlines()
    assert table[0].startswith("3 ranks (rank 0 with a fresh model")
    rows = [line.split() for line in table[2:]]
    assert [row[:3] for row in rows] == [["0", "0", "3"], ["1", "3", "3"], ["2", "3", "3"]]
    assert rows[0][-2:] == rows[1][-2:] != rows[0][3:5]


def test_only_the_planned_world_sizes_are_checked():
    with pytest.raises(ValueError, match="world_sizes must be among"):
        check_heal(heal_impls.heal, world_sizes=(5,))
