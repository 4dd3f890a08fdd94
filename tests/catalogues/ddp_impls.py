"""Right and wrong comm hooks and losses for uneven batches, as students write them.

Each is graded on both paths, the notebook's (gloo, ``tests/lessons/``) and the judge's;
the tests send this module to the ranks by value, as a notebook cell would be.
"""

import torch
import torch.distributed as dist


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
