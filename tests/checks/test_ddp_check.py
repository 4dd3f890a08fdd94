"""The DDP checks: do they pass the reference answers and fail known-wrong ones, saying why?"""

# No "from __future__ import annotations": DDP rejects string annotations on a comm hook.

import pytest
import torch
import torch.distributed as dist

from course.checks import check_reduce_hook, check_weighted_loss

pytestmark = pytest.mark.ranks


def reduce_hook(state, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Reference: divide, all-reduce asynchronously, unwrap the list."""
    buffer = bucket.buffer().div_(dist.get_world_size())
    return dist.all_reduce(buffer, async_op=True).get_future().then(lambda f: f.value()[0])


def sum_hook(state, bucket):
    return dist.all_reduce(bucket.buffer(), async_op=True).get_future().then(lambda f: f.value()[0])


def list_hook(state, bucket):
    return dist.all_reduce(bucket.buffer().div_(dist.get_world_size()), async_op=True).get_future()


def list_divide_hook(state, bucket):
    fut = dist.all_reduce(bucket.buffer(), async_op=True).get_future()
    return fut.then(lambda f: f.value() / dist.get_world_size())


def stub_hook(state, bucket):
    """The released stub: a docstring and nothing else."""


def local_hook(state, bucket):
    done = torch.futures.Future()
    done.set_result(bucket.buffer())
    return done


def renamed_hook(state, b):
    return reduce_hook(state, b)


def crashing_hook(state, bucket):
    if dist.get_rank() == 1:
        raise ValueError("student bug on rank 1")
    return reduce_hook(state, bucket)


def weighted_loss(loss_per_sample: torch.Tensor) -> torch.Tensor:
    """Reference: all-reduce the count, undo DDP's division by world_size."""
    count = torch.tensor([float(loss_per_sample.numel())])
    dist.all_reduce(count)
    return loss_per_sample.sum() * dist.get_world_size() / count.squeeze()


def mean_loss(loss_per_sample):
    return loss_per_sample.mean()


def sum_loss(loss_per_sample):
    return loss_per_sample.sum()


def global_count_only(loss_per_sample):
    count = torch.tensor([float(loss_per_sample.numel())])
    dist.all_reduce(count)
    return loss_per_sample.sum() / count.squeeze()


def vector_loss(loss_per_sample):
    return loss_per_sample


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
