"""The accumulation checks: do they pass the references and fail known-wrong ones, saying why?"""

from __future__ import annotations

import contextlib
import math
import time

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.join import Join

from course.checks import (
    check_accumulation_syncs,
    check_accumulation_values,
    check_sampler_indices,
    check_train_uneven,
)
from course.checks.uneven import UNEVEN_PG_TIMEOUT

pytestmark = pytest.mark.ranks


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


def test_reference_sampler_passes(no_leftovers) -> None:
    """Does the reference sampler match DistributedSampler in order and shuffled?"""
    assert "matches" in check_sampler_indices(sampler_indices, "in order")
    assert "matches" in check_sampler_indices(sampler_indices, "shuffled")


@pytest.mark.parametrize(
    ("fn", "part", "says"),
    [
        (contiguous_sampler, "in order", "positions r, r + num_replicas"),
        (strided_sampler, "in order", "pad the index list"),
        (unseeded_sampler, "shuffled", "seed + epoch"),
    ],
)
def test_wrong_samplers_fail_with_a_teaching_message(no_leftovers, fn, part, says) -> None:
    """Does each known-wrong sampler fail, naming the call and what to fix?"""
    with pytest.raises(AssertionError) as failure:
        check_sampler_indices(fn, part)
    assert says in str(failure.value) and "DistributedSampler gives" in str(failure.value)


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


def test_the_stubs_are_not_checked_yet(no_leftovers) -> None:
    """Do the released stubs get a one-line note saying they are not implemented, not a
    diagnosis, and start no rank?"""
    for check in (check_accumulation_values, check_accumulation_syncs):
        note = check(stub_step, world_sizes=(2,), seed=1)
        assert note.startswith("Not checked yet: stub_step is not implemented yet")
    note = check_train_uneven(stub_loop, world_sizes=(2,), seed=1)
    assert note.startswith("Not checked yet: stub_loop is not implemented yet")


def test_reference_accumulation_passes(by_value, no_leftovers) -> None:
    """Does the reference step give the large-batch step with one sync, on 2 and 3 ranks?"""
    assert "large-batch" in check_accumulation_values(accumulation_step, world_sizes=(2, 3))
    assert "once per step" in check_accumulation_syncs(accumulation_step, world_sizes=(2,))


@pytest.mark.parametrize(
    ("fn", "check", "says"),
    [
        (no_division, check_accumulation_values, "K = 4 times too large"),
        (sync_every_time, check_accumulation_syncs, "4 times in one step"),
        (never_syncs, check_accumulation_syncs, "never all-reduced"),
    ],
)
def test_wrong_accumulation_fails_with_a_teaching_message(by_value, no_leftovers, fn, check, says):
    """Does each known-wrong step fail its check, naming its mistake?"""
    with pytest.raises(AssertionError) as failure:
        check(fn, world_sizes=(2,), seed=5)
    assert says in str(failure.value)


def test_syncing_every_time_still_earns_the_values(by_value, no_leftovers) -> None:
    """Partial credit: is a step that syncs every micro-batch right on values?"""
    assert "large-batch" in check_accumulation_values(sync_every_time, world_sizes=(2,), seed=5)


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


def test_reference_uneven_loop_passes(by_value, no_leftovers) -> None:
    """Does the loop that agrees each step finish on 2 and 3 ranks with Join's weights?"""
    assert "without Join" in check_train_uneven(train_uneven, world_sizes=(2, 3))


def test_a_join_loop_is_refused(by_value, no_leftovers) -> None:
    """Does a loop that uses Join (right weights) fail, saying the exercise is without Join?"""
    with pytest.raises(AssertionError) as failure:
        check_train_uneven(train_with_join, world_sizes=(2,), seed=3)
    message = str(failure.value)
    assert "without Join: agree each step" in message and "accumulation_6" in message


def test_a_plain_loop_fails_after_the_gloo_timeout(by_value, no_leftovers) -> None:
    """Does the plain loop fail within about pg_timeout, saying that a rank waited and why?"""
    start = time.monotonic()
    with pytest.raises(AssertionError) as failure:
        check_train_uneven(train_plain, world_sizes=(2,), seed=2)
    assert time.monotonic() - start < UNEVEN_PG_TIMEOUT + 15
    message = str(failure.value)
    assert "did not finish" in message and "rank 0 (5 batches): waited" in message
    assert "Agree each step" in message and "Join([ddp])" not in message


@pytest.mark.parametrize(
    ("fn", "says"),
    [
        (train_no_step_when_done, "must still step its optimizer"),
        (train_to_the_shortest, "stopped when the first rank ran out of data"),
    ],
)
def test_a_loop_with_other_weights_fails_saying_why(by_value, no_leftovers, fn, says) -> None:
    """Does a loop that finishes with other weights than Join's fail, naming its mistake?"""
    with pytest.raises(AssertionError, match=says):
        check_train_uneven(fn, world_sizes=(2,), seed=4)
