"""What the picture says about a run that is not a ring: one line per mistake, and blocked
receives drawn as such."""

from __future__ import annotations

import dataclasses

import pytest

from course.pictures.base import ARROWS, BAD_ARROWS, BYTES
from course.pictures.deviations import deviations, pending_receives, pending_sends
from course.pictures.figures import WAITING, RingView
from course.pictures.style import counter, sizes
from course.ring.trace import Message, Trace, ring_trace


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
    more = f"{n - 1} more ranks: 1-{n - 1}"
    assert f"(likewise on {more}, with their own numbers)" in found[0].line  # their own peers
    assert len(pending_receives(trace)) == n
    view = RingView(trace, "your ring_allreduce")
    last = view.frame(view.last)
    assert len(last.data[WAITING]["x"]) == 3 * n  # start, end, gap per arrow
    assert "never completed" in last.data[WAITING]["hovertext"][0]


def test_the_same_is_said_only_of_the_same_text() -> None:
    """Is a deviation "the same" on other ranks only when their texts differ by the rank
    alone, and "likewise, with their own numbers" when bytes differ?"""
    same = dataclasses.replace(_recv_first(4), blocked=dict.fromkeys(range(4), "in dist.recv"))
    assert "(the same on 3 more ranks: 1-3)" in deviations(same)[0].line
    ref = ring_trace(3, 10)  # uneven chunks: 4, 3 and 3 elements
    doubled = tuple(
        dataclasses.replace(m, nbytes=2 * m.nbytes) if m.op == "send" else m for m in ref.messages
    )
    (line,) = [d.line for d in deviations(dataclasses.replace(ref, messages=doubled))]
    assert "sent" in line and "bytes" in line and "the same" not in line
    assert "likewise on 2 more ranks: 1-2, with their own numbers" in line


def test_a_send_that_never_completed_is_dashed_and_not_counted() -> None:
    """On 3 ranks all stuck in a blocking send to the right peer with the right chunk, is
    each send drawn dashed (not red, not "departs from the ring") and counted in no bytes?"""
    sends = tuple(Message(r, (r + 1) % 3, "send", 0, 4, 32, 4 * r, 1 << r) for r in range(3))
    blocked = dict.fromkeys(range(3), "deadlocked in dist.send at Cell In[6] line 5")
    view = RingView(Trace(3, 12, 8, sends, (), (0, 1, 2), blocked), "yours")
    assert len(pending_sends(view.trace)) == 3
    last = view.frame(view.last)
    assert not last.data[BAD_ARROWS]["x"] and not last.data[ARROWS]["x"]
    assert (
        len(last.data[WAITING]["x"]) == 9
        and "a send to rank 1" in last.data[WAITING]["hovertext"][0]
    )
    assert view.sent(view.last) == [0, 0, 0] and list(last.data[BYTES]["y"]) == [0, 0, 0]


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
