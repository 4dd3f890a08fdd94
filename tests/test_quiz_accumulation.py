"""Do the measurements support each keyed answer of the accumulation quiz, and no other?

Keys are read from the source notebook's hidden checks; every test runs the experiment and
decides, for each option, whether the measurement supports it.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from quiz import keys, supported

from course.experiments import accumulation, sampler
from course.ranks import launch

pytestmark = pytest.mark.ranks

KEYS = keys("accumulation")


def counts_and_scales() -> dict[str, dict]:
    """On each rank, in one launch: the accumulation runs with and without no_sync."""
    return {
        "plain": accumulation.accumulation_counts(use_no_sync=False),
        "no_sync": accumulation.accumulation_counts(use_no_sync=True),
    }


def _times(r: dict, factor: float) -> bool:
    """Whether this run's .grad is ``factor`` times the large-batch gradient."""
    got, want = torch.tensor(r["grad"]), torch.tensor(r["large_batch_grad"])
    return torch.allclose(got, factor * want, rtol=1e-4, atol=1e-6)


def test_accumulation_1_no_sync_count(run_ranks) -> None:
    """With no_sync on 3 of 4 micro-batches, does DDP all-reduce once, in the last backward?"""
    counts = run_ranks(counts_and_scales, 2)[0]
    plain, no_sync = counts["plain"], counts["no_sync"]
    same = torch.allclose(torch.tensor(plain["grad"]), torch.tensor(no_sync["grad"]), atol=1e-6)
    options = {
        "a": no_sync["allreduces_per_backward"] == [1, 1, 1, 1],
        "b": no_sync["allreduces_per_backward"] == [1, 1, 1, 0],
        "c": no_sync["allreduces_per_backward"] == [0, 0, 0, 1]
        and plain["allreduces_per_backward"] == [1, 1, 1, 1]
        and same,
        "d": sum(no_sync["allreduces_per_backward"]) == 0,
    }
    assert supported(options) == KEYS["accumulation_1"]


def test_accumulation_2_undivided_loss_scale(run_ranks) -> None:
    """Without dividing by K = 4, is the accumulated .grad 4 times the large-batch gradient?"""
    counts = run_ranks(counts_and_scales, 2)[0]
    r = counts["no_sync"]
    options = {"a": _times(r, 1.0), "b": _times(r, 4.0), "c": _times(r, 8.0), "d": _times(r, 0.25)}
    assert supported(options) == KEYS["accumulation_2"]


def test_accumulation_3_sampler_padding() -> None:
    """10 samples over 4 ranks: 3 each, with samples 0 and 1 read twice?"""
    split = sampler.sampler_split(10, 4)
    assert split == [[0, 4, 8], [1, 5, 9], [2, 6, 0], [3, 7, 1]]
    flat = [i for s in split for i in s]
    options = {
        "a": [len(s) for s in split] == [3, 3, 2, 2] and sorted(flat) == list(range(10)),
        "b": [len(s) for s in split] == [3] * 4
        and sorted(i for i in set(flat) if flat.count(i) == 2) == [0, 1],
        "c": [len(s) for s in split] == [2] * 4,
        "d": False,  # sampler_split returned: no error
    }
    assert supported(options) == KEYS["accumulation_3"]
    assert sampler.sampler_split(10, 4, drop_last=True) == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert sampler.sampler_split(3, 4) == [[0], [1], [2], [0]]


def test_accumulation_4_set_epoch() -> None:
    """Without set_epoch, does rank 0 read the same (shuffled) order in every epoch?"""
    orders = sampler.epoch_orders(10, 2, 3, set_epoch=False)
    reshuffled = sampler.epoch_orders(10, 2, 3, set_epoch=True)
    assert len({tuple(o) for o in reshuffled}) == 3
    same = len({tuple(o) for o in orders}) == 1
    options = {
        "a": not same,
        "b": same and orders[0] != sorted(orders[0]),
        "c": same and orders[0] == sorted(orders[0]),
        "d": not same,
    }
    assert supported(options) == KEYS["accumulation_4"]


def test_accumulation_5_uneven_without_join(no_leftovers) -> None:
    """Rank 0 with 3 batches, rank 1 with 2 and then idle: does rank 0 time out in backward,
    rank 1 finish?"""
    result = launch(accumulation.uneven_loop, 2, (3, 2), False, timeout=30, pg_timeout=5)
    rank1 = result.results[1]
    failure = result.failures.get(0)
    waited = (
        failure is not None
        and "gloo gave up" in failure.message
        and "backward()" in failure.message  # where it waited: DDP's all-reduce in backward
        and result.elapsed >= 5
    )
    options = {
        "a": result.ok,
        "b": 1 in result.failures,
        "c": waited and 1 not in result.failures and len(rank1) == 2,
        "d": rank1 is not None and len(rank1) == 3,
    }
    assert supported(options) == KEYS["accumulation_5"]


def test_accumulation_5_the_ending_depends_on_what_the_short_rank_does(no_leftovers) -> None:
    """Do the other endings the explanation gives hold: an exiting rank ends its peer's wait
    before the timeout, a rank in dist.barrier() waits out the timeout too?"""
    exits = launch(accumulation.uneven_loop, 2, (3, 2), False, "exit", timeout=30, pg_timeout=5)
    assert exits.elapsed < 5 and exits.failures[1].kind == "exited" and 0 in exits.failures
    barrier = launch(
        accumulation.uneven_loop, 2, (3, 2), False, "barrier", timeout=30, pg_timeout=5
    )
    assert barrier.elapsed >= 5
    assert all("gloo gave up" in f.message for f in barrier.failures.values())
    assert "dist.barrier" in barrier.failures[1].message


def test_accumulation_6_join_divides_by_initial_world_size(run_ranks) -> None:
    """With Join, is rank 0's third .grad its local [3, 3] divided by 2?"""
    r0, r1 = run_ranks(accumulation.uneven_loop, 2, (3, 2), True)
    assert len(r0) == 3 and len(r1) == 2 and r0[2]["local"] == [3.0, 3.0]
    grad = r0[2]["grad"]
    options = {
        "a": grad == [3.0, 3.0],
        "b": grad == [1.5, 1.5] and r0[0]["grad"] == r1[0]["grad"] == [6.0, 6.0],
        "c": grad == [0.0, 0.0],
        "d": grad == [7.5, 7.5],
    }
    assert supported(options) == KEYS["accumulation_6"]


def unused_runs() -> dict[str, list]:
    return {
        "default": accumulation.unused_parameter_steps(False),
        "find": accumulation.unused_parameter_steps(True),
    }


def test_accumulation_7_unused_parameter(run_ranks) -> None:
    """find_unused_parameters=False: is step 1 unsynced and silent, step 2 an error?"""
    r0, r1 = run_ranks(unused_runs, 2)
    first0, first1 = r0["default"][0], r1["default"][0]
    unsynced = first0.get("grad") == [1.0, 1.0] and first1.get("grad") == [2.0, 2.0]
    second_fails = all("finished reduction" in r["default"][1].get("error", "") for r in (r0, r1))
    found = all(s.get("grad") == [1.5, 1.5] for r in (r0, r1) for s in r["find"])
    options = {
        "a": "error" in first0,
        "b": "error" not in r0["default"][1] and not unsynced,
        "c": unsynced and second_fails and found,
        "d": "error" not in r0["default"][1] and first0.get("grad") == [1.5, 1.5],
    }
    assert supported(options) == KEYS["accumulation_7"]


def sizes_differ() -> None:
    t = torch.ones(3 if dist.get_rank() == 0 else 5)
    dist.all_reduce(t)


def test_accumulation_8_swapped_collectives(run_ranks) -> None:
    """Same-shaped all-reduces in swapped order: silently wrong sums, no error, no hang?"""
    r0, r1 = run_ranks(accumulation.swapped_all_reduce, 2)
    options = {
        "a": r0["loss_sum"] == r1["loss_sum"] == 3.0 and r0["count"] == 300.0,
        "b": False,  # run_ranks returned: nothing hung
        "c": False,  # and nothing raised
        "d": (r0["loss_sum"], r0["count"]) == (201.0, 102.0)
        and (r1["loss_sum"], r1["count"]) == (102.0, 201.0),
    }
    assert supported(options) == KEYS["accumulation_8"]


def test_accumulation_8_other_mismatches_crash_or_hang(by_value, no_leftovers) -> None:
    """Do the comparisons the explanation cites hold: different sizes crash a rank?"""
    result = launch(sizes_differ, 2, timeout=30, pg_timeout=5)
    assert not result.ok and any(f.kind == "killed" for f in result.failures.values())


def _masks_on_other_data(n: int = 12) -> list[float]:
    """A dropout mask drawn from seed 0 after DDP, applied to this rank's own data."""
    torch.manual_seed(0)
    from torch import nn

    layer = nn.Dropout(0.5)
    layer(torch.randn(n) + dist.get_rank())  # each rank's data differs
    torch.manual_seed(0)
    return (layer(torch.full((n,), 10.0 * (dist.get_rank() + 1))) != 0).float().tolist()


def test_accumulation_9_dropout_masks(run_ranks) -> None:
    """Seeded alike and under DDP, do the ranks draw the same dropout mask, whatever their data
    (and different ones per rank)?"""
    same = run_ranks(accumulation.dropout_masks, 2, False)
    per_rank = run_ranks(accumulation.dropout_masks, 2, True)
    on_data = run_ranks(_masks_on_other_data, 2)
    assert per_rank[0] != per_rank[1]
    options = {
        "a": same[0] != same[1],
        "b": same[0] == same[1] and 0.0 in same[0] and 2.0 in same[0],
        "c": same[0] != same[1] or same == per_rank,  # as if DDP had seeded with the rank
        "d": on_data[0] != on_data[1],
    }
    assert supported(options) == KEYS["accumulation_9"]


def test_accumulation_10_clipping_needs_no_all_reduce(run_ranks) -> None:
    """After DDP's backward, does every rank clip by the large-batch norm, with no collective?"""
    r0, r1 = run_ranks(accumulation.clipped_norms, 2)
    large = r0["large_batch_norm"]
    options = {
        "a": r0["norm"] == pytest.approx(r0["local_norm"]) and r0["norm"] != r1["norm"],
        "b": r0["norm"] == r1["norm"] == pytest.approx(large, rel=1e-5)
        and r0["local_norm"] != pytest.approx(large, rel=1e-2)
        and r0["collectives"] == r1["collectives"] == []
        and r0["clipped"] == r1["clipped"],
        "c": bool(r0["collectives"]),
        "d": r0["norm"] == pytest.approx(2 * large, rel=1e-3),  # the norm of the sum over 2 ranks
    }
    assert supported(options) == KEYS["accumulation_10"]


def test_accumulation_11_batchnorm_buffers(run_ranks) -> None:
    """broadcast_buffers: is rank 1's running mean rank 0's, updated with its own batch?"""
    r0, r1 = run_ranks(accumulation.batchnorm_buffers, 2, True)
    own = run_ranks(accumulation.batchnorm_buffers, 2, False)
    sync_bn = run_ranks(accumulation.sync_batchnorm_on_cpu, 2)[0]  # as the explanation says
    assert "expected input tensor to be on GPU or XPU or privateuseone" in sync_bn["forward"]
    assert "SyncBatchNorm layers only work with GPU modules" in sync_bn["DDP"]
    assert r0[1] == pytest.approx(0.285)
    options = {
        "a": r1[1] == pytest.approx(r0[1]),
        "b": r1[1] == pytest.approx(own[1][1]),
        "c": r1[1] == pytest.approx(0.9 * r0[0] + 0.1 * 11.5)
        and own[1][1] == pytest.approx(2.185, rel=1e-5),
        "d": r1[1] == pytest.approx((own[0][1] + own[1][1]) / 2),
    }
    assert supported(options) == KEYS["accumulation_11"]
