"""Right and wrong samplers, accumulation steps and loops for uneven data, as students write them.

Each is graded on both paths, the notebook's (gloo, ``tests/lessons/``) and the judge's;
the tests send this module to the ranks by value, as a notebook cell would be.
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.join import Join


def sampler_indices(
    dataset_len, num_replicas, rank, shuffle=True, seed=0, epoch=0, drop_last=False
):
    """Reference: DistributedSampler's rule, written out."""
    if shuffle:
        g = torch.Generator()
        g.manual_seed(seed + epoch)
        indices = torch.randperm(dataset_len, generator=g).tolist()
    else:
        indices = list(range(dataset_len))
    if drop_last and dataset_len % num_replicas:
        per_rank = math.ceil((dataset_len - num_replicas) / num_replicas)
    else:
        per_rank = math.ceil(dataset_len / num_replicas)
    total = per_rank * num_replicas
    while len(indices) < total:
        indices += indices[: total - len(indices)]
    return indices[:total][rank:total:num_replicas]


def contiguous_sampler(
    dataset_len, num_replicas, rank, shuffle=True, seed=0, epoch=0, drop_last=False
):
    """Wrong: each rank takes a contiguous block, and nobody pads."""
    per = math.ceil(dataset_len / num_replicas)
    return list(range(dataset_len))[rank * per : (rank + 1) * per]


def strided_sampler(
    dataset_len, num_replicas, rank, shuffle=True, seed=0, epoch=0, drop_last=False
):
    """Wrong: round robin, but no padding (ranks get different lengths)."""
    return list(range(dataset_len))[rank::num_replicas]


def unseeded_sampler(
    dataset_len, num_replicas, rank, shuffle=True, seed=0, epoch=0, drop_last=False
):
    """Wrong: ignores the epoch when shuffling."""
    return sampler_indices(dataset_len, num_replicas, rank, shuffle, seed, 0, drop_last)


def accumulation_step(ddp, optimizer, micro_batches):
    """Reference: no_sync for all but the last micro-batch, loss / K, one step."""
    k = len(micro_batches)
    for i, (x, y) in enumerate(micro_batches):
        with ddp.no_sync() if i < k - 1 else contextlib.nullcontext():
            (nn.functional.mse_loss(ddp(x), y) / k).backward()
    optimizer.step()
    optimizer.zero_grad()


def sync_every_time(ddp, optimizer, micro_batches):
    """Right values, but DDP all-reduces after every micro-batch."""
    for x, y in micro_batches:
        (nn.functional.mse_loss(ddp(x), y) / len(micro_batches)).backward()
    optimizer.step()


def no_division(ddp, optimizer, micro_batches):
    """Wrong: the K micro-batch gradients add up."""
    k = len(micro_batches)
    for i, (x, y) in enumerate(micro_batches):
        with ddp.no_sync() if i < k - 1 else contextlib.nullcontext():
            nn.functional.mse_loss(ddp(x), y).backward()
    optimizer.step()


def never_syncs(ddp, optimizer, micro_batches):
    """Wrong: every backward under no_sync."""
    with ddp.no_sync():
        for x, y in micro_batches:
            (nn.functional.mse_loss(ddp(x), y) / len(micro_batches)).backward()
    optimizer.step()


def stub_step(ddp, optimizer, micro_batches):
    """The released stub: a docstring and nothing else."""


def stub_loop(ddp, optimizer, batches):
    """The released stub."""


def train_uneven(ddp, optimizer, batches):
    """Reference: agree each step whether anyone has data; a rank that ran out adds zeros."""
    step = 0
    while True:
        anyone = torch.tensor(float(step < len(batches)))
        dist.all_reduce(anyone)
        if anyone.item() == 0:
            return
        x, y = batches[min(step, len(batches) - 1)]
        optimizer.zero_grad()
        (nn.functional.mse_loss(ddp(x), y) * float(step < len(batches))).backward()
        optimizer.step()
        step += 1


def train_with_join(ddp, optimizer, batches):
    """Finishes with Join's weights, but the exercise asks for the loop without Join."""
    with Join([ddp]):
        for x, y in batches:
            optimizer.zero_grad()
            nn.functional.mse_loss(ddp(x), y).backward()
            optimizer.step()


def train_plain(ddp, optimizer, batches):
    """Wrong: no agreement, so the rank with more batches waits in vain."""
    for x, y in batches:
        optimizer.zero_grad()
        nn.functional.mse_loss(ddp(x), y).backward()
        optimizer.step()


def train_no_step_when_done(ddp, optimizer, batches):
    """Wrong: agrees and adds zeros, but a rank that ran out no longer steps its optimizer."""
    step = 0
    while True:
        anyone = torch.tensor(float(step < len(batches)))
        dist.all_reduce(anyone)
        if anyone.item() == 0:
            return
        x, y = batches[min(step, len(batches) - 1)]
        optimizer.zero_grad()
        (nn.functional.mse_loss(ddp(x), y) * float(step < len(batches))).backward()
        if step < len(batches):
            optimizer.step()
        step += 1


def train_to_the_shortest(ddp, optimizer, batches):
    """Wrong: agrees on the smallest number of batches, so everyone stops with the first out."""
    steps = torch.tensor(len(batches))
    dist.all_reduce(steps, op=dist.ReduceOp.MIN)
    for x, y in batches[: int(steps)]:
        optimizer.zero_grad()
        nn.functional.mse_loss(ddp(x), y).backward()
        optimizer.step()
