"""The ring's traffic: a ring all-reduce's messages, step for step, and no all-reduce."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.distributed as dist

from course.instructor.reference import ring_allreduce
from course.ring.recorder import Recorder, record
from course.ring.schedule import ring_bytes_per_rank, ring_trace
from course.ring.traffic import ring_traffic

pytestmark = pytest.mark.ranks

SIZES = [(2, 5), (3, 7), (4, 2), (4, 8), (5, 13), (6, 1)]


def _key(m):
    return (m.rank, m.op, m.order)


def _own_payloads(message):
    """A message as ring_traffic sends it: its sender's own input, never a partial sum."""
    sender = message.rank if message.op == "send" else message.peer
    holds = None if message.numel == 0 else 1 << sender
    return dataclasses.replace(message, holds=holds)


@pytest.mark.parametrize(("world_size", "numel"), SIZES)
def test_traffic_is_the_rings_messages(by_value, world_size: int, numel: int) -> None:
    """Recorded, is ring_traffic the simulator's ring, message for message (step, peer, size,
    where in the tensor), each payload its sender's own input?"""
    recorded = record(ring_traffic, world_size, numel)
    expected = [_own_payloads(m) for m in ring_trace(world_size, numel, 8).messages]
    assert sorted(recorded.messages, key=_key) == sorted(expected, key=_key)
    assert (recorded.collectives, recorded.unfinished) == ((), ())


@pytest.mark.parametrize(("world_size", "numel"), SIZES)
def test_reference_sends_the_same_messages(by_value, world_size: int, numel: int) -> None:
    """Does the working ring send exactly what ring_traffic sends, payloads aside?"""
    traffic, working = (
        record(ring_traffic, world_size, numel),
        record(ring_allreduce, world_size, numel),
    )

    def shape(trace):
        return sorted((dataclasses.replace(m, holds=None) for m in trace.messages), key=_key)

    assert shape(traffic) == shape(working)


def traffic_on_a_rank(shape: tuple[int, ...]) -> dict:
    """On each rank: ring_traffic on a tensor of ``shape``; what it sent, and what it left."""
    x = torch.arange(float(torch.Size(shape).numel())).reshape(shape) * (dist.get_rank() + 1)
    before = x.clone()
    with Recorder() as recorder:
        ring_traffic(x.t() if x.dim() == 2 else x)
    sent = sum(m.nbytes for m in recorder.messages if m.op == "send")
    return {"unchanged": torch.equal(x, before), "sent": sent}


@pytest.mark.parametrize("shape", [(10,), (3, 5), ()])
def test_traffic_leaves_the_tensor_and_sends_the_rings_bytes(run_ranks, shape) -> None:
    """Does every rank keep its tensor as it was (no sum: that is the exercise) and send the
    ring's bytes, contiguous or not?"""
    results = run_ranks(traffic_on_a_rank, 3, shape)
    numel = torch.Size(shape).numel()
    assert [r["unchanged"] for r in results] == [True] * 3
    assert [r["sent"] for r in results] == ring_bytes_per_rank(numel, 3, itemsize=4)


def test_one_rank_sends_nothing(run_ranks) -> None:
    """On a single rank there is no ring: nothing sent, nothing changed?"""
    assert run_ranks(traffic_on_a_rank, 1, (4,)) == [{"unchanged": True, "sent": 0}]
