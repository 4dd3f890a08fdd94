"""A receive from any rank (``dist.recv(t)`` with no ``src``) on the relay, as on gloo."""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist

from course.ranks import launch

pytestmark = [pytest.mark.ranks, pytest.mark.slow]


def first_come(tag: int = 7) -> list[int] | None:
    """Ranks 1.. send to rank 0 after rank-dependent delays (the last rank first); rank 0
    receives from any rank, and says whom it got each message from, and what it held."""
    rank, n = dist.get_rank(), dist.get_world_size()
    if rank:
        time.sleep(0.3 * (n - rank))
        dist.send(torch.full((2,), float(rank)), 0, tag=tag)
        return None
    got = []
    for _ in range(n - 1):
        buf = torch.empty(2)
        src = dist.recv(buf, tag=tag)
        got += [src, int(buf[0])]
    return got


@pytest.mark.parametrize("backend", ["gloo", "relay"])
def test_a_receive_from_any_rank_takes_the_first_to_arrive(backend: str) -> None:
    """Does rank 0 get the messages in the order they were sent, each with its sender, on the
    relay as on gloo, and does the relay record who really sent each?"""
    result = launch(first_come, 4, backend=backend, timeout=30)
    assert result.ok, result.failures
    assert result.results[0] == [3, 3, 2, 2, 1, 1]
    if backend == "relay":
        delivered = [e.src for e in result.relayed if e.kind == "recv"]
        assert delivered == [3, 2, 1]


def other_tag() -> None:
    if dist.get_rank():
        dist.send(torch.ones(1), 0, tag=1)  # never received: rank 0 waits for tag 2
    else:
        dist.recv(torch.empty(1), tag=2)


def test_a_receive_from_any_rank_matches_its_tag_only() -> None:
    """Does a message of another tag stay unmatched, the wait ending on the relay's deadline
    with a message saying it waited for any rank?"""
    result = launch(other_tag, 2, backend="relay", timeout=30, pg_timeout=2)
    assert result.failures[0].kind == "blocked", result.failures
    assert "rank 0 waited for a message from any rank that never came" in (
        result.failures[0].traceback
    )
