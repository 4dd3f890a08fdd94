"""Bus bandwidth on real ranks: timed the way nccl-tests reports it."""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist

from course.ring.bandwidth import compare_busbw, measure_busbw
from course.ring.cost import busbw

pytestmark = pytest.mark.ranks


def slow_all_reduce(tensor: torch.Tensor) -> None:
    """dist.all_reduce that takes at least 50 ms."""
    time.sleep(0.05)
    dist.all_reduce(tensor)


def test_rows_follow_the_busbw_formula_and_see_a_slow_contender() -> None:
    """Is a contender that sleeps 50 ms timed at 50 ms or more, with busbw from the formula?"""
    rows = measure_busbw({"slow": slow_all_reduce, "gloo": dist.all_reduce}, 2, (0.25,), iters=3)
    slow, gloo = rows
    assert (slow.name, gloo.name) == ("slow", "gloo")
    assert slow.seconds >= 0.05 > gloo.seconds
    assert slow.gbps == pytest.approx(busbw(0.25 * 2**20, 2, slow.seconds) / 1e9)


def test_compare_prints_yours_beside_gloo(capsys: pytest.CaptureFixture[str]) -> None:
    """Does the notebook's comparison print one line per size with both figures?"""
    rows = compare_busbw(dist.all_reduce, world_size=2, megabytes=(0.25, 0.5), iters=2)
    out = capsys.readouterr().out
    assert "yours GB/s" in out and "0.25MB" in out and "0.5MB" in out
    assert [r.name for r in rows] == ["yours", "dist.all_reduce"] * 2
