"""The relay's snapshots: every rank stopped at once, its memory read from outside it."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from course.ranks import launch, relay
from course.ranks.link import Work
from course.ranks.memory import process_memory

pytestmark = [pytest.mark.ranks, pytest.mark.slow]

MIB = 2**20


def grows_on_rank_one() -> int:
    """Rank 1 fills 64 MiB between the snapshots and keeps it; rank 0 makes nothing."""
    relay.snapshot(0)
    kept = torch.ones(16 * MIB) if dist.get_rank() == 1 else torch.empty(0)
    relay.snapshot(1)
    return kept.numel()


def test_a_snapshot_reads_each_ranks_memory_from_outside() -> None:
    """Does the relay record, at each snapshot, what each rank's process holds, so that the
    64 MiB rank 1 filled shows on rank 1 alone?"""
    result = launch(grows_on_rank_one, 2, backend="relay", timeout=60)
    assert result.ok, result.failures
    snaps = [e for e in result.relayed if e.kind == "snapshot"]
    assert [e.tag for e in snaps] == [0, 1]
    before, after = snaps
    grew = [b - a for a, b in zip(before.memory, after.memory, strict=True)]
    assert grew[1] >= 63 * MIB, grew
    assert abs(grew[0]) < 8 * MIB, grew
    assert min(before.memory) > 50 * MIB  # a Python process with torch, not an empty count
    assert before.box == after.box == -1  # no sandbox, so no cgroup to read
    assert after.held == 0


def leaves_a_message() -> None:
    """Rank 0 sends 1 MiB that rank 1 only receives after the second snapshot."""
    t = torch.ones(MIB // 4)
    relay.snapshot(0)
    if dist.get_rank() == 0:
        sent = dist.isend(t, 1)
    relay.snapshot(1)
    if dist.get_rank() == 0:
        sent.wait()
    else:
        dist.recv(t, 0)


def test_a_snapshot_counts_what_the_relay_holds_for_a_receiver() -> None:
    """Does a snapshot say how many bytes were sent and not yet received (memory parked in
    the relay, away from the rank)?"""
    result = launch(leaves_a_message, 2, backend="relay", timeout=60)
    assert result.ok, result.failures
    before, after = (e for e in result.relayed if e.kind == "snapshot")
    assert (before.held, after.held) == (0, MIB)


def uneven_snapshots() -> str:
    """Rank 0 snapshots with tag 0, rank 1 with tag 1; then rank 0 alone, as a forged frame."""
    out = []
    try:
        relay.snapshot(dist.get_rank())
    except RuntimeError as err:
        out.append(str(err))
    if dist.get_rank() == 0:
        link = relay._LINK  # noqa: SLF001 - the rank's own link, as hostile code would find it
        header = {"kind": "snapshot", "group": [0], "tag": 2, "dtype": "float32", "shape": [0]}
        try:
            Work(link.request(header, b"", lambda _h, _p: None), link).wait()  # a forged call
        except RuntimeError as err:
            out.append(str(err))
    return " | ".join(out)


def test_a_snapshot_needs_every_rank_with_one_tag() -> None:
    """Are snapshots with different tags, and one of a single rank, refused with the reason,
    and none recorded?"""
    result = launch(uneven_snapshots, 2, backend="relay", timeout=60)
    assert result.ok, result.failures
    told = "a snapshot is taken by every rank at once, with one tag"
    assert result.results[0].count(told) == 2, result.results
    assert result.results[1].count(told) == 1, result.results
    assert not [e for e in result.relayed if e.kind == "snapshot"]


def test_a_snapshot_is_a_no_op_on_gloo() -> None:
    """In a notebook (gloo) a snapshot does nothing and nothing is recorded."""
    result = launch(grows_on_rank_one, 2, timeout=60)
    assert result.ok, result.failures
    assert result.relayed == ()


def test_a_process_that_is_gone_reads_as_unknown() -> None:
    """Is the memory of a pid with no process -1, not 0 (which would pass as "held none")?"""
    assert process_memory(2**22 + 1) == -1
