"""Tests for course.ring.schedule: chunk bounds, the step functions, the trace and the
large-N simulator, against closed forms and against course.ring.trace's own reading of a trace."""

from __future__ import annotations

from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from course.ring.schedule import (
    chunk_bounds,
    num_steps,
    phase,
    recv_chunk,
    recv_peer,
    ring_bytes_formula,
    ring_bytes_per_rank,
    send_chunk,
    send_peer,
    simulate,
)
from course.ring.trace import (
    bytes_sent,
    chunk_states,
    decode,
    encoded_value,
    full_mask,
    ring_trace,
    steps,
)

world_sizes = st.integers(min_value=1, max_value=64)
small_world_sizes = st.integers(min_value=1, max_value=12)
lengths = st.one_of(st.integers(0, 3), st.integers(0, 200))


def masks_after_steps(world_size: int, numel: int) -> list[list[list[int]]]:
    """The simulator's masks at every step, as ``chunk_states`` lays them out."""
    return [state.masks() for state in simulate(world_size, numel)]


def nonempty(states: list[list[list[int]]], bounds: list[tuple[int, int]]):
    """Drop empty chunks: a trace cannot say anything about a chunk with no elements."""
    keep = [c for c, (lo, hi) in enumerate(bounds) if hi > lo]
    return [[[row[c] for c in keep] for row in state] for state in states]


@given(world_sizes, lengths)
def test_chunks_tile_the_tensor(world_size: int, numel: int) -> None:
    """Do the chunks cover [0, numel) in order, without gaps, sizes differing by at most one?"""
    bounds = chunk_bounds(numel, world_size)
    assert len(bounds) == world_size
    assert bounds[0][0] == 0 and bounds[-1][1] == numel
    assert all(a[1] == b[0] for a, b in pairwise(bounds))
    sizes = [hi - lo for lo, hi in bounds]
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)


@given(world_sizes)
def test_every_step_is_a_ring_permutation(world_size: int) -> None:
    """Does every rank send once and receive once per step, to and from its ring neighbours,
    receiving exactly the chunk its predecessor sends?"""
    n = world_size
    assert num_steps(n) == 2 * (n - 1)
    for s in range(num_steps(n)):
        receivers = sorted(send_peer(r, n) for r in range(n))
        assert receivers == list(range(n))
        for r in range(n):
            assert recv_peer(send_peer(r, n), n) == r
            assert recv_chunk(send_peer(r, n), s, n) == send_chunk(r, s, n)
        expected = "reduce-scatter" if s < n - 1 else "all-gather"
        assert phase(s, n) == expected


@given(small_world_sizes, lengths)
@settings(max_examples=60, deadline=None)
def test_reduce_scatter_leaves_one_full_chunk_per_rank(world_size: int, numel: int) -> None:
    """After N-1 steps, does each rank hold exactly one fully reduced chunk, (r + 1) % N, all
    different, and at the end every chunk on every rank?"""
    n = world_size
    states = [s.snapshot() for s in simulate(n, max(numel, n))]
    assert len(states) == num_steps(n) + 1
    middle = states[n - 1]
    full = [middle.full_chunks(r) for r in range(n)]
    assert full == [[(r + 1) % n] for r in range(n)]
    assert states[-1].all_full()
    assert not states[0].all_full() or n == 1


@given(small_world_sizes, lengths)
@settings(max_examples=60, deadline=None)
def test_simulator_agrees_with_the_trace_of_the_ring(world_size: int, numel: int) -> None:
    """Does the simulator hold, at every step, what chunk_states reads off ring_trace?"""
    bounds = chunk_bounds(numel, world_size)
    trace = ring_trace(world_size, numel)
    assert nonempty(masks_after_steps(world_size, numel), bounds) == nonempty(
        chunk_states(trace), bounds
    )


@given(small_world_sizes, lengths, st.sampled_from([1, 2, 4, 8]))
@settings(max_examples=60, deadline=None)
def test_bytes_sent_agree_everywhere(world_size: int, numel: int, itemsize: int) -> None:
    """Do the simulator, the trace and ring_bytes_per_rank count the same bytes per rank at
    every step, within two elements of 2(N-1)/N times the size at the end?"""
    trace = ring_trace(world_size, numel, itemsize)
    for state in simulate(world_size, numel, itemsize):
        assert state.bytes_sent.tolist() == bytes_sent(trace, upto_step=state.step)
    exact = ring_bytes_per_rank(numel, world_size, itemsize)
    assert exact == bytes_sent(trace)
    formula = ring_bytes_formula(numel * itemsize, world_size)
    assert all(abs(b - formula) <= 2 * itemsize for b in exact)


@given(small_world_sizes, lengths)
@settings(max_examples=40, deadline=None)
def test_ring_trace_payloads_are_what_encoded_inputs_would_carry(
    world_size: int, numel: int
) -> None:
    """Does every message's (offset, holds) equal decode() of the payload the reference ring
    would really send, computed here by playing the ring on encoded integers?"""
    n = world_size
    bounds = chunk_bounds(numel, n)
    data = [[encoded_value(r, i, n) for i in range(numel)] for r in range(n)]
    trace = ring_trace(n, numel)
    assert steps(trace) == num_steps(n)
    for s in range(num_steps(n)):
        payloads = [data[r][slice(*bounds[send_chunk(r, s, n)])] for r in range(n)]
        for m in trace.messages:
            if m.order != s:
                continue
            sender = m.rank if m.op == "send" else m.peer
            payload = payloads[sender]
            assert (m.numel, m.nbytes) == (len(payload), 4 * len(payload))
            assert (m.offset, m.holds) == decode([float(v) for v in payload], n)
        for r in range(n):
            lo, hi = bounds[recv_chunk(r, s, n)]
            incoming = payloads[(r - 1) % n]
            add = phase(s, n) == "reduce-scatter"
            data[r][lo:hi] = (
                [a + b for a, b in zip(data[r][lo:hi], incoming, strict=True)] if add else incoming
            )
    total = [sum(data[r][i] for r in range(n)) for i in range(numel)]
    expected = [full_mask(n) * (1 + i * 2**n) for i in range(numel)]
    assert all(row == expected for row in data) and total == [n * v for v in expected]


def test_one_rank_has_no_steps() -> None:
    """Does a single rank run no steps, send nothing, and start (and end) fully reduced?"""
    assert num_steps(1) == 0
    states = list(simulate(1, 5))
    assert len(states) == 1 and states[0].all_full() and states[0].bytes_sent.tolist() == [0]
    assert ring_trace(1, 5).messages == () and ring_bytes_per_rank(5, 1) == [0]


def test_holds_is_an_arc_ending_at_the_rank() -> None:
    """Mid reduce-scatter, does chunk (r - s) on rank r hold the s + 1 ranks r-s .. r?"""
    n, s = 6, 3
    state = next(st for st in simulate(n, 60) if st.step == s)
    for r in range(n):
        assert state.holds(r, (r - s) % n) == frozenset((r - j) % n for j in range(s + 1))
        assert state.phase == "reduce-scatter"


def test_yielded_state_is_read_only_and_snapshot_keeps_it() -> None:
    """Can a consumer not corrupt the simulation, and does snapshot() freeze a step?"""
    it = simulate(4, 8)
    first = next(it)
    kept = first.snapshot()
    with pytest.raises(ValueError, match="read-only"):
        first.counts[0, 0] = 7
    for _ in it:
        pass
    assert first.all_full() and not kept.all_full() and kept.step == 0


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: phase(2, 2), r"steps 0\.\.1"),
        (lambda: send_chunk(0, 0, 1), "no steps"),
        (lambda: send_chunk(3, 0, 3), r"rank must be in 0\.\.2"),
        (lambda: chunk_bounds(4, 0), "world_size >= 1"),
    ],
)
def test_bad_arguments_say_what_is_wrong(call, match: str) -> None:
    """Do out-of-range steps, ranks and world sizes raise a ValueError that names the range?"""
    with pytest.raises(ValueError, match=match):
        call()
