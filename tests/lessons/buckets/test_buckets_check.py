"""The buckets checks: do they pass the reference answers and fail known-wrong ones, saying why?"""

from __future__ import annotations

import pytest
from buckets_impls import (
    AllAtTheEnd,
    Blocking,
    InFinish,
    NoReset,
    OverlappingDDP,
    Stub,
    bucketed_allreduce,
    forward_order,
    no_copy_back,
    no_division,
    per_parameter,
    replaces_list_items,
    stub,
)

from course.lessons.buckets import check_bucketed_allreduce, check_overlapping_ddp
from course.lessons.buckets.check import HIDDEN_CASES

pytestmark = pytest.mark.ranks


def test_reference_bucketed_allreduce_passes_visible_and_hidden_cases(by_value, no_leftovers):
    """Does the reference pass on 2 and 3 ranks, including the hidden cases?"""
    assert "right" in check_bucketed_allreduce(bucketed_allreduce, world_sizes=(2, 3))
    assert "right" in check_bucketed_allreduce(bucketed_allreduce, (3,), cases=HIDDEN_CASES)


@pytest.mark.parametrize(
    ("fn", "says"),
    [
        (per_parameter, "one all-reduce per gradient"),
        (forward_order, "from the LAST to the first"),
        (no_division, "divide by world_size"),
        (no_copy_back, "copy each bucket's all-reduced values back"),
        (replaces_list_items, "replaced grads[0]"),
    ],
)
def test_wrong_bucketed_allreduce_fails_saying_why(by_value, no_leftovers, fn, says) -> None:
    """Does each known-wrong bucketing fail with a message naming its mistake?"""
    with pytest.raises(AssertionError) as failure:
        check_bucketed_allreduce(fn, world_sizes=(2,), seed=5)
    assert says in str(failure.value)


def test_the_stubs_are_not_checked_yet() -> None:
    """Do the released stubs get a one-line note instead of a diagnosis or a failure?"""
    note = check_bucketed_allreduce(stub, world_sizes=(2,))
    assert note.startswith("Not checked yet: stub is not implemented yet")
    note = check_overlapping_ddp(Stub, world_sizes=(2,))
    assert note.startswith("Not checked yet: Stub.__init__, Stub.finish are not implemented yet")


def test_reference_overlapping_ddp_passes(by_value, no_leftovers) -> None:
    """Does the reference wrapper pass on 2 and 3 ranks, at two caps?"""
    assert "overlapping" in check_overlapping_ddp(OverlappingDDP, world_sizes=(2, 3))
    assert "overlapping" in check_overlapping_ddp(OverlappingDDP, (2,), bucket_cap_mb=0.02)


@pytest.mark.parametrize(
    ("cls", "says"),
    [
        (Blocking, "async_op=True"),
        (AllAtTheEnd, "started only after"),
        (InFinish, "started only after"),
        (NoReset, "step 2"),
    ],
)
def test_wrong_overlapping_ddp_fails_saying_why(by_value, no_leftovers, cls, says) -> None:
    """Does each known-wrong wrapper fail with a message naming its mistake?"""
    with pytest.raises(AssertionError) as failure:
        check_overlapping_ddp(cls, world_sizes=(2,), seed=7)
    assert says in str(failure.value)
