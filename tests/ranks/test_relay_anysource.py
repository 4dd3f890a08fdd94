"""A receive from any rank (``dist.recv(t)`` with no ``src``) on the relay matches its tag only
(tests/ranks/test_relay.py: which message it takes, and whose)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from course.ranks import launch

pytestmark = [pytest.mark.ranks, pytest.mark.slow]


def other_tag() -> None:
    if dist.get_rank():
        dist.send(torch.ones(1), 0, tag=1)  # never received: rank 0 waits for tag 2
    else:
        dist.recv(torch.empty(1), tag=2)


def test_a_receive_from_any_rank_matches_its_tag_only() -> None:
    """Does a message of another tag stay unmatched, both waits ending on the relay's deadline
    (the send too: as on gloo, it waits for its receive), each saying whom it waited for?"""
    result = launch(other_tag, 2, backend="relay", timeout=30, pg_timeout=2)
    assert {r: f.kind for r, f in result.failures.items()} == {0: "deadlock", 1: "deadlock"}
    assert "rank 1 waited for rank 0 to receive its message (tag 1)" in (
        result.failures[1].traceback
    )
    assert "rank 0 waited for a message from any rank that never came" in (
        result.failures[0].traceback
    )
