"""What the picture says about a run that is not a ring: one line per mistake, and blocked
receives drawn as such."""

from __future__ import annotations

import dataclasses

import pytest

from course.pictures.deviations import deviations, pending_receives
from course.pictures.figures import WAITING, RingView
from course.pictures.style import counter, sizes
from course.ring.schedule import ring_trace
from course.ring.trace import Message, Trace


def _recv_first(n: int) -> Trace:
    """Every rank posted a receive from its left neighbour first; nobody ever sent."""
    posted = tuple(Message(r, (r - 1) % n, "recv", 0, 3, 12, None, None) for r in range(n))
    blocked = {r: f"waiting in dist.recv from rank {(r - 1) % n} (line 5)" for r in range(n)}
    return Trace(n, 3 * n + 1, 4, posted, (), tuple(range(n)), blocked)


@pytest.mark.parametrize("n", [4, 16, 32])
def test_a_deadlock_is_one_line_and_dashed_arrows(n: int) -> None:
    """On N ranks all stuck in their first receive, is there one deviation line with a
    count, no "made 1 receives", and one dashed arrow per blocked receive?"""
    trace = _recv_first(n)
    found = deviations(trace)
    assert len(found) == 1
    assert found[0].line.startswith("rank 0 never finished: waiting in dist.recv from rank")
    assert f"(the same on {n - 1} more ranks: 1-{n - 1})" in found[0].line
    assert len(pending_receives(trace)) == n
    view = RingView(trace, "your ring_allreduce")
    last = view.frame(view.last)
    assert len(last.data[WAITING]["x"]) == 3 * n  # start, end, gap per arrow
    assert "never completed" in last.data[WAITING]["hovertext"][0]


def test_a_finished_run_has_no_blocked_arrows() -> None:
    """Does the reference ring draw no dashed arrow at any step?"""
    view = RingView(ring_trace(4, 13))
    assert not pending_receives(view.trace)
    assert all(not view.frame(k).data[WAITING]["x"] for k in range(view.last + 1))


def test_deviations_on_different_steps_stay_apart() -> None:
    """Are two different mistakes kept as two lines (collapsing joins only repeats)?"""
    ref = ring_trace(4, 13)
    bad = dataclasses.replace(
        ref,
        messages=tuple(
            dataclasses.replace(m, peer=(m.rank + 2) % 4)
            if (m.op, m.order) == ("send", 1) and m.rank in (0, 1)
            else m
            for m in ref.messages
        ),
    )
    lines = [d.line for d in deviations(bad)]
    assert any("rank 0, step 2: sent to rank 2" in x and "1 more rank: 1" in x for x in lines)


def test_one_step_numbering() -> None:
    """Does the counter number steps from 1, the step whose arrows the frame draws?"""
    assert counter(0, 4).startswith("step 0 / 6 - start")
    assert counter(1, 4) == "step 1 / 6 - reduce-scatter"
    assert counter(4, 4) == "step 4 / 6 - all-gather"
    hover = RingView(ring_trace(4, 13)).frame(1).data[1]["hovertext"][0]
    assert hover.startswith("step 1: rank")


def test_sizes_shrink_with_the_world_size() -> None:
    """Are nodes smaller and chunk labels dropped as N grows to 32?"""
    assert sizes(4).node > sizes(16).node > sizes(32).node
    assert sizes(16).labels and not sizes(32).labels
