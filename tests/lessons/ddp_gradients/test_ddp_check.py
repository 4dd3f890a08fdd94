"""The DDP checks: do they pass the reference answers and fail known-wrong ones, saying why?"""

# No "from __future__ import annotations": DDP rejects string annotations on a comm hook.

import pytest
from ddp_impls import (
    crashing_hook,
    global_count_only,
    list_divide_hook,
    list_hook,
    local_hook,
    mean_loss,
    reduce_hook,
    renamed_hook,
    stub_hook,
    sum_hook,
    sum_loss,
    vector_loss,
    weighted_loss,
)

from course.lessons.ddp_gradients import check_reduce_hook, check_weighted_loss

pytestmark = pytest.mark.ranks


def test_reference_hook_passes(by_value, no_leftovers) -> None:
    """Does the reference hook match DDP's default on 2 and 3 ranks?"""
    assert "matches" in check_reduce_hook(reduce_hook, world_sizes=(2, 3))


def test_the_stub_hook_is_not_checked_yet() -> None:
    """Does the released stub get a one-line note instead of a diagnosis or a failure?"""
    note = check_reduce_hook(stub_hook, world_sizes=(2,))
    assert note.startswith("Not checked yet: stub_hook is not implemented yet")


@pytest.mark.parametrize(
    ("hook", "says"),
    [
        (sum_hook, "world_size (2) times too large"),
        (list_hook, "list of tensors"),
        (list_divide_hook, "take fut.value()[0] before dividing"),
        (local_hook, "own local gradient, not synced"),
        (crashing_hook, "student bug on rank 1"),
    ],
)
def test_wrong_hooks_fail_with_a_teaching_message(by_value, no_leftovers, hook, says) -> None:
    """Does each known-wrong hook fail, with a message naming its mistake?"""
    with pytest.raises(AssertionError, match=None) as failure:
        check_reduce_hook(hook, world_sizes=(2,), seed=1)
    assert says in str(failure.value)


def test_hook_signature_is_checked_before_any_rank_starts() -> None:
    """Is a hook whose second parameter is not named `bucket` rejected, saying DDP needs it?"""
    with pytest.raises(AssertionError, match="looks the second one up by its name"):
        check_reduce_hook(renamed_hook)


def test_reference_loss_passes(by_value, no_leftovers) -> None:
    """Does the reference weighted_loss give the pooled mean on 2 and 3 ranks?"""
    assert "pooled" in check_weighted_loss(weighted_loss, world_sizes=(2, 3))


@pytest.mark.parametrize(
    ("loss", "says"),
    [
        (mean_loss, "flat average of the ranks' local means"),
        (sum_loss, "the batch ratio"),
        (global_count_only, "world_size (2) times too small"),
        (vector_loss, "return one number"),
    ],
)
def test_wrong_losses_fail_with_a_teaching_message(by_value, no_leftovers, loss, says) -> None:
    """Does each known-wrong loss fail, with a message naming its mistake?"""
    with pytest.raises(AssertionError) as failure:
        check_weighted_loss(loss, world_sizes=(2,), seed=3)
    assert says in str(failure.value)
