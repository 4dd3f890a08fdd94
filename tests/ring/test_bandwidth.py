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


def stub_all_reduce(tensor: torch.Tensor) -> None:
    """The exercise's stub: its body is only the docstring."""


def halved_all_reduce(tensor: torch.Tensor) -> None:
    """All-reduce, then halve: plausible timings, wrong sums."""
    dist.all_reduce(tensor)
    tensor.div_(2)


def crashing_all_reduce(tensor: torch.Tensor) -> None:
    """Rank 1 raises before it sends anything."""
    if dist.get_rank() == 1:
        raise ValueError("wrong chunk index")
    dist.all_reduce(tensor)


@pytest.mark.parametrize(
    ("fn", "said"),
    [
        (
            stub_all_reduce,
            "rank 0 held 1 (what it handed in: is it still the stub?) where the sum is 3",
        ),
        (halved_all_reduce, "rank 0 held 1.5 where the sum is 3"),
        (crashing_all_reduce, "it failed on 2 ranks: rank 1 raised ValueError: wrong chunk index"),
    ],
)
def test_a_wrong_all_reduce_is_not_timed(fn, said: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Is a stub, a ring with wrong sums or one that fails not timed, with a sentence why,
    rather than reported faster than gloo?"""
    assert compare_busbw(fn, world_size=2, megabytes=(0.25,), iters=2) == []
    out = capsys.readouterr().out
    assert out.startswith("Not timed: ") and said in out
    assert "GB/s" not in out
