"""The trace's ring verdict: does ring_violations accept every ring and name each departure?"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from course.ring.schedule import expected_holds
from course.ring.trace import Message, Trace, decode, encoded_value, ring_trace
from course.ring.verdict import ring_direction, ring_violations


def _mirror(trace: Trace) -> Trace:
    """The same ring run the other way round: rank r plays rank -r."""
    n = trace.world_size

    def flip(mask: int | None) -> int | None:
        return None if mask is None else sum(1 << (-r % n) for r in range(n) if mask >> r & 1)

    messages = tuple(
        dataclasses.replace(m, rank=-m.rank % n, peer=-m.peer % n, holds=flip(m.holds))
        for m in trace.messages
    )
    return dataclasses.replace(trace, messages=messages)


def _replace(trace: Trace, rank: int, op: str, order: int, **changes) -> Trace:
    messages = tuple(
        dataclasses.replace(m, **changes) if (m.rank, m.op, m.order) == (rank, op, order) else m
        for m in trace.messages
    )
    return dataclasses.replace(trace, messages=messages)


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 12), st.integers(0, 60))
def test_reference_trace_is_a_ring(world_size: int, numel: int) -> None:
    """Does the simulator's ring pass, whatever N and numel (uneven, smaller than N, 0)?"""
    assert ring_violations(ring_trace(world_size, numel, 8)) == []


@settings(max_examples=30, deadline=None)
@given(st.integers(3, 9), st.integers(1, 40))
def test_reversed_ring_is_a_ring(world_size: int, numel: int) -> None:
    """Is a ring run the other way round (send to rank - 1) accepted too?"""
    mirrored = _mirror(ring_trace(world_size, numel, 8))
    assert ring_direction(mirrored) == -1
    assert ring_violations(mirrored) == []


def test_skipped_empty_messages_are_accepted() -> None:
    """With fewer elements than ranks, may a ring skip its 0-element sends and receives?"""
    full = ring_trace(5, 3, 8)
    kept = tuple(m for m in full.messages if m.numel)
    renumbered = []
    for rank in range(5):
        for op in ("send", "recv"):
            mine = sorted((m for m in kept if (m.rank, m.op) == (rank, op)), key=lambda m: m.order)
            renumbered += [dataclasses.replace(m, order=k) for k, m in enumerate(mine)]
    assert len(kept) < len(full.messages)
    assert ring_violations(dataclasses.replace(full, messages=tuple(renumbered))) == []


def test_send_to_a_non_neighbour_is_named() -> None:
    """Is a send that skips a neighbour reported with its rank, step and the right peer?"""
    trace = _replace(ring_trace(4, 8, 8), rank=2, op="send", order=3, peer=0)
    texts = [v.text for v in ring_violations(trace)]
    assert "rank 2, step 4: sent to rank 0, expected its ring neighbour rank 3" in texts[0]


def test_wrong_holds_is_named_with_the_expected_count() -> None:
    """Is a reduce-scatter chunk holding too few ranks reported against its step?"""
    trace = _replace(ring_trace(4, 8, 8), rank=1, op="send", order=2, holds=0b0011)
    (v,) = ring_violations(trace)
    assert (v.rank, v.step) == (1, 2)
    assert "holding ranks {0, 1}" in v.text and "should hold 3 ranks" in v.text


def test_unreadable_payload_is_named() -> None:
    """Is a payload that decodes to nothing (scaled, cast) reported?"""
    trace = _replace(ring_trace(3, 6, 8), rank=0, op="send", order=0, holds=None, offset=None)
    assert "not a sum of whole ranks' inputs" in ring_violations(trace)[0].text


def test_missing_step_and_extra_bytes_are_named() -> None:
    """Are a dropped send and the bytes it leaves out both reported?"""
    trace = ring_trace(4, 40, 8)
    dropped = tuple(m for m in trace.messages if (m.rank, m.op, m.order) != (0, "send", 5))
    texts = " ".join(v.text for v in ring_violations(dataclasses.replace(trace, messages=dropped)))
    assert "rank 0 made 5 sends" in texts and "rank 0 sent 400 bytes" in texts


def test_collectives_and_unfinished_ranks_are_named() -> None:
    """Are a data collective and a rank that never returned reported, and a barrier not?"""
    trace = dataclasses.replace(
        ring_trace(3, 6, 8),
        collectives=((0, "barrier"), (1, "all_reduce")),
        unfinished=(2,),
        blocked={2: "blocked in dist.recv at Cell In[3] line 7"},
    )
    texts = [v.text for v in ring_violations(trace)]
    assert texts[0] == "rank 2 never finished: blocked in dist.recv at Cell In[3] line 7"
    assert "rank 1 called the collective dist.all_reduce" in texts[1]
    assert len(texts) == 2


def test_naive_exchange_is_not_a_ring() -> None:
    """Is "everyone sends the whole tensor to everyone" rejected on neighbours and volume?"""
    n, numel = 4, 8
    messages = []
    for r in range(n):
        for k, p in enumerate(q for q in range(n) if q != r):
            messages.append(Message(r, p, "send", k, numel, numel * 8, 0, 1 << r))
            messages.append(Message(p, r, "recv", k, numel, numel * 8, 0, 1 << r))
    texts = " ".join(v.text for v in ring_violations(Trace(n, numel, 8, tuple(messages))))
    assert "expected its ring neighbour" in texts and "made 3 sends" in texts
    assert "sent 192 bytes" in texts


@pytest.mark.parametrize("world_size", [2, 3, 5])
def test_expected_holds_matches_decoded_partial_sums(world_size: int) -> None:
    """Does expected_holds agree with decoding the sum of the ranks it names?"""
    for step in range(2 * (world_size - 1)):
        mask = expected_holds(world_size - 1, step, world_size)
        ranks = [r for r in range(world_size) if mask >> r & 1]
        values = [sum(encoded_value(r, i, world_size) for r in ranks) for i in range(2, 5)]
        assert decode(values, world_size) == (2, mask)


@pytest.mark.parametrize("garbage", [float("nan"), float("inf"), float("-inf")])
def test_a_payload_of_garbage_decodes_to_nothing(garbage: float) -> None:
    """A receive gloo filled with what was not sent (NaN, inf): is it read as no ring's chunk,
    rather than raising inside the recorded dist.recv (a student saw "cannot convert float NaN
    to integer at dist.recv")?"""
    import torch

    from course.ring.encoding import decode_tensor

    assert decode([garbage, 1.0], 3) == (None, None)
    assert decode_tensor(torch.tensor([garbage, 1.0]), 3) == (None, None)
