"""The ring's halves as data: does the simulated reduce-scatter / all-gather obey the contract?"""

from __future__ import annotations

import dataclasses

import pytest

from course.ring.halves import HALVES, half_bytes_formula, half_states, half_trace, half_violations
from course.ring.schedule import chunk_bounds
from course.ring.trace import bytes_sent, full_mask, steps

SIZES = [(n, numel) for n in (2, 3, 4, 5, 8) for numel in (1, n - 1, n, 3 * n + 1, 4 * n)]


@pytest.mark.parametrize("half", HALVES)
@pytest.mark.parametrize(("world_size", "numel"), SIZES)
def test_simulated_half_is_clean(half, world_size, numel) -> None:
    """Does the simulator's half pass its own check, in N-1 steps, within the byte formula?"""
    trace = half_trace(half, world_size, numel, itemsize=8)
    assert half_violations(trace, half) == []
    assert steps(trace) == world_size - 1
    for sent in bytes_sent(trace):
        assert abs(sent - half_bytes_formula(trace.nbytes, world_size)) <= 8 * (world_size - 1)


@pytest.mark.parametrize(("world_size", "numel"), SIZES)
def test_reduce_scatter_ends_with_shard_r_on_rank_r(world_size, numel) -> None:
    """After N-1 steps, is chunk r (a non-empty one) fully reduced on rank r, and only there?"""
    final = half_states(half_trace("reduce-scatter", world_size, numel), "reduce-scatter")[-1]
    full = full_mask(world_size)
    for r, (lo, hi) in enumerate(chunk_bounds(numel, world_size)):
        if hi > lo:
            assert [final[q][r] == full for q in range(world_size)] == [
                q == r for q in range(world_size)
            ]


@pytest.mark.parametrize(("world_size", "numel"), SIZES)
def test_all_gather_ends_with_every_shard_everywhere(world_size, numel) -> None:
    """After N-1 steps of all-gather, does every rank hold every non-empty chunk whole?"""
    final = half_states(half_trace("all-gather", world_size, numel), "all-gather")[-1]
    full = full_mask(world_size)
    bounds = chunk_bounds(numel, world_size)
    assert all(
        final[q][c] == full
        for q in range(world_size)
        for c, (lo, hi) in enumerate(bounds)
        if hi > lo
    )


def test_violations_name_the_mistake() -> None:
    """Would an extra message, a wrong peer or a collective be reported?"""
    trace = half_trace("reduce-scatter", 4, 17)
    first = trace.messages[0]
    wrong_peer = dataclasses.replace(
        trace, messages=(dataclasses.replace(first, peer=2), *trace.messages[1:])
    )
    assert any("neighbour" in v.text for v in half_violations(wrong_peer, "reduce-scatter"))
    extra = dataclasses.replace(
        trace, messages=(*trace.messages, dataclasses.replace(first, order=3))
    )
    assert any("makes N-1 = 3" in v.text for v in half_violations(extra, "reduce-scatter"))
    called = dataclasses.replace(trace, collectives=((0, "all_reduce"),))
    assert any("point-to-point" in v.text for v in half_violations(called, "reduce-scatter"))
    whole = half_trace("reduce-scatter", 4, 17)
    assert half_violations(whole, "all-gather"), "a reduce-scatter is not an all-gather"
