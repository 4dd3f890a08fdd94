"""The stragglers the relay makes: when a held rank is let through, and what the record says."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator

import psutil
import pytest
import torch
import torch.distributed as dist

from course.ranks import launch
from course.ranks.holds import QUIET, Hold, Holds

pytestmark = [pytest.mark.ranks]


@pytest.fixture
def busy_and_asleep() -> Iterator[tuple[int, int]]:
    """Two processes: one running (a CPU loop), one asleep."""
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    asleep = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        deadline = time.monotonic() + 10
        while psutil.Process(asleep.pid).status() != psutil.STATUS_SLEEPING:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        yield busy.pid, asleep.pid
    finally:
        for proc in (busy, asleep):
            proc.kill()
            proc.wait()


def _held(world_size: int = 3) -> Holds:
    holds = Holds([Hold(after=0, rank=2)], world_size, timeout=30.0)
    holds.barrier_done(0.0)
    return holds


def test_a_straggler_goes_once_every_other_rank_has_ended_its_step() -> None:
    """Is the held rank let through the moment every other rank reached the next barrier,
    and not before?"""
    holds = _held()
    assert holds.holding(2)
    assert holds.due(at_barrier={0}, waiting={0}, pids=(), now=1.0) == []
    assert holds.due(at_barrier={0, 1}, waiting={0, 1}, pids=(), now=1.0) == [Hold(0, 2)]
    assert not holds.holding(2)


def test_a_rank_that_runs_keeps_the_straggler_held(busy_and_asleep: tuple[int, int]) -> None:
    """With one rank blocked and the other running (or waiting for a CPU, which the kernel
    also counts as running), does the straggler stay held however long, and go only once
    both are asleep for QUIET seconds?"""
    busy, asleep = busy_and_asleep
    holds = _held()
    for now in (1.0, 2.0, 10.0):
        assert holds.due(set(), {0, 1}, (asleep, busy, 0), now) == []
    assert holds.due(set(), {0, 1}, (asleep, asleep, 0), 11.0) == []
    assert holds.due(set(), {0, 1}, (asleep, asleep, 0), 11.0 + QUIET) == [Hold(0, 2)]


def test_a_hold_ends_on_its_deadline() -> None:
    """Does a rank that never blocks nor ends its step still let the straggler go, on the
    hold's deadline?"""
    holds = _held()
    assert holds.due(set(), set(), (), 29.0) == []
    assert holds.due(set(), set(), (), 31.0) == [Hold(0, 2)]


def waits_for_rank_one() -> float:
    """Rank 0 waits for rank 1's message; rank 2 ends its step at once."""
    dist.barrier()
    t = torch.zeros(1)
    if dist.get_rank() == 1:
        dist.send(torch.ones(1), 0)
    elif dist.get_rank() == 0:
        dist.recv(t, 1)
    dist.barrier()
    return t.item()


def test_the_record_says_who_ended_after_the_release() -> None:
    """On the relay, with rank 1 held after the first barrier, is rank 0 (which waits for it)
    the one rank whose arrival at the next barrier follows the release, and rank 2 not?"""
    result = launch(waits_for_rank_one, 3, backend="relay", timeout=30, holds=[Hold(0, 1)])
    assert result.ok, result.failures
    (release,) = [e for e in result.relayed if e.kind == "release"]
    closing = [e for e in result.relayed if e.kind == "barrier"][1]
    after = [r for r, t in zip(closing.group, closing.arrived, strict=True) if t > release.time]
    assert sorted(after) == [0, 1]


def test_only_the_relay_makes_stragglers() -> None:
    """Are holds refused on gloo, where no one could make them?"""
    with pytest.raises(ValueError, match="only the relay makes stragglers"):
        launch(waits_for_rank_one, 3, timeout=30, holds=[Hold(0, 1)])
