"""A student's own FSDP step, recorded for the widget: is every call of a right fully_shard
matched to its unit, and does a stub, a failing run or a bad world size get one line?"""

from __future__ import annotations

import cloudpickle
import fsdp_impls
import pytest
import wrong_fsdp

from course.lessons.fsdp.record import animate_fully_shard
from course.lessons.fsdp.widget import FsdpWidget

pytestmark = pytest.mark.ranks


def stub(module, *, param_dtype=None, reduce_dtype=None):
    """Shard ``module``'s managed parameters over the default group; gather them per use."""


def test_a_right_step_is_played_with_every_call_on_its_unit() -> None:
    """On 3 ranks: 4 units (3 blocks and the root), each gathered twice and reduced once,
    nothing left over?"""
    cloudpickle.register_pickle_by_value(fsdp_impls)
    try:
        shown = animate_fully_shard(fsdp_impls.fully_shard, world_size=3)
    finally:
        cloudpickle.unregister_pickle_by_value(fsdp_impls)
    assert isinstance(shown, FsdpWidget)
    schedule = shown.view.schedule
    assert list(schedule.notes) == []
    for unit in range(4):
        assert schedule.gathers(unit) == 2
    assert sum(e.kind == "reduce-scatter" for e in schedule.events) == 4


def test_a_stub_a_hang_and_a_bad_world_size_get_one_line() -> None:
    """Is nothing run for the stub or 9 ranks, and is a deadlock told as a run that did not
    finish?"""
    assert "Nothing to animate yet" in animate_fully_shard(stub).value
    assert "2 to 8 ranks" in animate_fully_shard(stub, world_size=9).value
    shown = animate_fully_shard(wrong_fsdp.student_fn("deadlock"), 2, timeout=5)
    assert "did not finish a step on 2 ranks" in shown.value
