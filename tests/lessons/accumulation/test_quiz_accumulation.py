"""Do the measurements support each keyed answer of the accumulation quiz, and no other?

Keys are read from the source notebook's hidden checks; every test runs the experiment and
decides, for each option, whether the measurement supports it.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from quiz import keys, supported

from course.lessons.accumulation import experiment as accumulation
from course.lessons.accumulation import sampler
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


def test_accumulation_1_synced_first(run_ranks) -> None:
    """The one synced backward first, no_sync on the 3 after it: does .grad hold micro-batch 1
    averaged plus the rank's own last 3, different on the two ranks?"""
    r0, r1 = run_ranks(accumulation.accumulation_counts, 2, True, 4, 0, "mean", True)
    right = run_ranks(counts_and_scales, 2)[0]
    assert right["no_sync"]["allreduces_per_backward"] == [0, 0, 0, 1]
    assert r0["allreduces_per_backward"] == r1["allreduces_per_backward"] == [1, 0, 0, 0]
    g0, g1 = torch.tensor(r0["grad"]), torch.tensor(r1["grad"])
    local0, local1 = torch.tensor(r0["local_grads"]), torch.tensor(r1["local_grads"])
    first = (local0[0] + local1[0]) / 2
    options = {
        "a": torch.allclose(g0, g1) and torch.allclose(g0, torch.tensor(right["no_sync"]["grad"])),
        "b": torch.allclose(g0, first, atol=1e-6),
        "c": torch.allclose(g0, first + local0[1:].sum(0), atol=1e-6)
        and torch.allclose(g1, first + local1[1:].sum(0), atol=1e-6)
        and not torch.allclose(g0, g1, atol=1e-3),
        "d": False,  # run_ranks returned: nothing raised
    }
    assert supported(options) == KEYS["accumulation_1"]


def test_accumulation_2_summed_loss_scale(run_ranks) -> None:
    """K = 4 micro-batches of 2 samples, summed loss, 2 ranks: is .grad 8 times the large-batch
    gradient (and the cell's mean-loss run K = 3 times it)?"""
    summed = run_ranks(accumulation.accumulation_counts, 2, True, 4, 0, "sum")[0]
    assert _times(run_ranks(accumulation.accumulation_counts, 2, True, 3)[0], 3.0)
    options = {
        "a": _times(summed, 8.0),
        "b": _times(summed, 4.0),
        "c": _times(summed, 1.0),
        "d": _times(summed, 16.0),
    }
    assert supported(options) == KEYS["accumulation_2"]


def test_accumulation_3_shuffled_padding() -> None:
    """1000 samples, 64 ranks, shuffled with set_epoch: are the samples read twice the first 24
    of each epoch's order, a new set each epoch?"""
    repeated, starts = [], []
    for epoch in (0, 1):
        split = sampler.seeded_split(1000, [0] * 64, epoch)
        assert [len(s) for s in split] == [16] * 64
        order = [split[p % 64][p // 64] for p in range(1024)]  # the order the ranks deal from
        assert order[1000:] == order[:24] and sorted(set(order)) == list(range(1000))
        flat = [i for s in split for i in s]
        repeated.append({i for i in flat if flat.count(i) == 2})
        starts.append(set(order[:24]))
        if epoch == 0:
            dropped = sampler.seeded_split(1000, [0] * 64, 0, drop_last=True)
            assert [len(s) for s in dropped] == [15] * 64
            assert {i for s in dropped for i in s} == set(order[:960])  # the last 40 dropped
    options = {
        "a": repeated[0] == repeated[1] == set(range(24)),
        "b": repeated[0] == set(),
        "c": repeated == starts and repeated[0] != repeated[1] and len(repeated[0]) == 24,
        "d": repeated[0] == repeated[1] == set(range(960, 1000)),
    }
    assert supported(options) == KEYS["accumulation_3"]
    assert sampler.sampler_split(10, 4) == [[0, 4, 8], [1, 5, 9], [2, 6, 0], [3, 7, 1]]


def test_accumulation_4_seed_per_rank() -> None:
    """Seed r on rank r (12 samples, 3 ranks): do the shares overlap, some samples read twice
    and some never, where a shared seed gives disjoint ones?"""
    split = sampler.seeded_split(12, [0, 1, 2])
    assert split == [[8, 9, 2, 1], [4, 11, 3, 10], [3, 5, 8, 11]]
    assert sorted(i for s in sampler.seeded_split(12, [0, 0, 0]) for i in s) == list(range(12))
    flat = [i for s in split for i in s]
    twice = sorted({i for i in flat if flat.count(i) > 1})
    never = sorted(set(range(12)) - set(flat))
    assert (twice, never) == ([3, 8, 11], [0, 6, 7])
    options = {
        "a": sorted(flat) == list(range(12)),
        "b": [len(s) for s in split] == [4] * 3 and bool(twice) and bool(never),
        "c": all(sorted(s) == sorted(split[0]) for s in split),
        "d": False,  # seeded_split returned: no error
    }
    assert supported(options) == KEYS["accumulation_4"]


def test_accumulation_5_zeros_complete_the_missing_all_reduce(no_leftovers) -> None:
    """Rank 1, out of batches, all-reduces a zero tensor of the bucket's size: does rank 0's
    third backward complete with half its local gradient, and both ranks finish?"""
    result = launch(accumulation.uneven_loop, 2, (3, 2), False, "zeros", timeout=30, pg_timeout=5)
    r0 = result.results[0]
    options = {
        "a": 0 in result.failures and "gloo gave up" in result.failures[0].message,
        "b": 0 in result.failures and 1 in result.failures,
        "c": result.ok and r0[2]["grad"] == [3.0, 3.0],
        "d": result.ok and r0[2]["local"] == [3.0, 3.0] and r0[2]["grad"] == [1.5, 1.5],
    }
    assert supported(options) == KEYS["accumulation_5"]


def test_accumulation_5_without_the_call_rank_0_waits_out_the_timeout(no_leftovers) -> None:
    """As the explanation says of the plain loop: does rank 0 wait in backward until gloo gives
    up after the 5 s timeout, while rank 1 finished?"""
    result = launch(accumulation.uneven_loop, 2, (3, 2), False, timeout=30, pg_timeout=5)
    failure = result.failures.get(0)
    assert failure is not None and "gloo gave up" in failure.message
    assert "backward()" in failure.message and result.elapsed >= 5
    assert 1 not in result.failures and len(result.results[1]) == 2


def unused_runs() -> dict[str, list]:
    return {
        "default": accumulation.unused_parameter_steps(False),
        "find": accumulation.unused_parameter_steps(True),
    }


def join_runs() -> dict[str, list[dict]]:
    """On each rank, in one launch: rank 0 with 1 batch, rank 1 with 3, SGD lr 0.2 inside Join,
    with Join's default division by the initial world size and without it."""
    return {
        "initial": accumulation.uneven_loop((1, 3), True, "return", 0.2),
        "training": accumulation.uneven_loop((1, 3), True, "return", 0.2, False),
    }


def test_accumulation_6_weights_after_join(run_ranks) -> None:
    """Rank 0 with 1 batch, rank 1 with 3, SGD lr 0.2 inside Join: does rank 0 leave the block
    with the last joiner's weights, whose lone steps divided by the initial world size?"""
    r0, r1 = run_ranks(join_runs, 2)
    assert [s["grad"] for s in r1["initial"][:-1]] == [[6.0, 6.0], [6.0, 6.0], [6.5, 6.5]]
    assert [s["grad"] for s in r1["training"][:-1]] == [[6.0, 6.0], [12.0, 12.0], [13.0, 13.0]]
    inside = r0["initial"][0]["weight"]  # rank 0's own step, inside the block
    assert len(r0["initial"]) == 2 and inside == pytest.approx([-1.2, -1.2])
    longest = r1["initial"][-2]["weight"]  # rank 1's weights after its last step
    three = run_ranks(accumulation.uneven_loop, 3, (3, 2, 1), True, "return", 0.1)  # the cell's
    assert three[0][2]["grad"] == pytest.approx([1.0, 1.0])
    assert all(r[-1]["weight"] == three[0][-1]["weight"] for r in three)  # rank 0 = last joiner
    average = [(a + b) / 2 for a, b in zip(inside, longest, strict=True)]
    by_training = r1["training"][-1]["weight"]  # divide_by_initial_world_size=False
    assert average == pytest.approx([-2.45, -2.45]) and by_training == pytest.approx([-6.2, -6.2])
    final = r0["initial"][-1]["weight"]
    options = {
        "a": final == pytest.approx(average),
        "b": final == pytest.approx(inside),
        "c": final == pytest.approx(by_training),
        "d": final == pytest.approx(longest) and final == pytest.approx([-3.7, -3.7]),
    }
    assert supported(options) == KEYS["accumulation_6"]


def test_accumulation_7_head_used_on_one_rank(run_ranks) -> None:
    """find_unused_parameters=True, rank 0 runs head a on [1, 1], rank 1 head b on [3, 3]: does
    every rank hold both heads' gradients averaged with zeros?"""
    g0, g1 = (  # head a is the module's "used", head b its "unused"
        {"a": g["used"], "b": g["unused"]} for g in run_ranks(accumulation.branch_grads, 2, True)
    )
    r0, r1 = run_ranks(unused_runs, 2)  # the cell's: an unused head, with and without find
    assert all(s["unused_grad"] is None for r in (r0, r1) for s in r["find"])
    assert r0["default"][0]["grad"] == [1.0, 1.0] and r1["default"][0]["grad"] == [2.0, 2.0]
    assert all("finished reduction" in r["default"][1].get("error", "") for r in (r0, r1))
    assert g1 == g0
    options = {
        "a": g0 == {"a": [1.0, 1.0], "b": None},
        "b": g0 == {"a": [1.0, 1.0], "b": [3.0, 3.0]},
        "c": g0 == {"a": [0.5, 0.5], "b": None},
        "d": g0 == {"a": [0.5, 0.5], "b": [1.5, 1.5]},
    }
    assert supported(options) == KEYS["accumulation_7"]


def sizes_differ() -> None:
    t = torch.ones(3 if dist.get_rank() == 0 else 5)
    dist.all_reduce(t)


def test_accumulation_8_collectives_pair_by_order(run_ranks) -> None:
    """3 ranks, rank 2 reducing count before loss: do ranks 0 and 1 print 67 / 131 and rank 2
    131 / 67, with no error and no hang?"""
    means = run_ranks(accumulation.swapped_all_reduce, 3, 1.0, 64.0, (2,), False)
    two = run_ranks(accumulation.swapped_all_reduce, 2, 5.0, 1000.0)  # the cell's run, finished
    assert [(r["loss_sum"], r["count"]) for r in two] == [(2005.0, 1006.0), (1006.0, 2005.0)]
    assert [(r["loss_sum"], r["count"]) for r in means] == [(67.0, 131.0)] * 2 + [(131.0, 67.0)]
    mean, rank2 = (round(r["loss_sum"] / r["count"], 3) for r in (means[0], means[2]))
    assert rank2 == 1.955
    options = {
        "a": mean == round(6 / 192, 3),  # paired by tensor: the true mean
        "b": mean == round(129 / 69, 3),  # own loss plus the other ranks' counts
        "c": mean == 0.511,
        "d": mean == rank2,
    }
    assert supported(options) == KEYS["accumulation_8"]


def test_accumulation_8_other_mismatches_crash_or_hang(by_value, no_leftovers) -> None:
    """Do the comparisons the explanation cites hold: different sizes crash a rank?"""
    result = launch(sizes_differ, 2, timeout=30, pg_timeout=5)
    assert not result.ok and any(f.kind == "killed" for f in result.failures.values())


def _seeded_replicas(n: int = 12) -> dict[str, list[float]]:
    """Seeded with its rank, a rank builds nn.Linear(n, n), wraps it in DDP and draws a dropout
    mask: its weights (first row) and the mask."""
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(dist.get_rank())
    model = nn.Linear(n, n)
    before = model.weight[0].detach().clone()
    DDP(model)
    mask = nn.functional.dropout(torch.ones(n), 0.5).tolist()
    return {"before": before.tolist(), "weight": model.weight[0].detach().tolist(), "mask": mask}


def test_accumulation_9_seed_per_rank_under_ddp(run_ranks) -> None:
    """Seeded with their rank and wrapped in DDP: equal weights, different dropout masks (and
    equal masks when seeded alike, the cell's case)?"""
    per_rank = run_ranks(_seeded_replicas, 3)
    alike = run_ranks(accumulation.dropout_masks, 3, False)
    assert alike[0] == alike[1] == alike[2]
    assert per_rank[1]["before"] != per_rank[0]["before"]  # the seeds did differ
    weights = all(r["weight"] == per_rank[0]["weight"] for r in per_rank)
    masks = any(r["mask"] != per_rank[0]["mask"] for r in per_rank)
    options = {
        "a": not weights and masks,
        "b": weights and not masks,
        "c": weights and masks,
        "d": not weights and not masks,
    }
    assert supported(options) == KEYS["accumulation_9"]


def _clip_factor(r: dict, factor: float) -> bool:
    """Whether the clip multiplied this run's .grad by ``factor``, element by element."""
    before, after = torch.tensor(r["unclipped_grad"]), torch.tensor(r["grad"])
    return torch.allclose(after, factor * before, rtol=1e-4, atol=1e-6)


def test_accumulation_10_clip_after_accumulation(run_ranks) -> None:
    """K = 3 micro-batches of 4 samples, summed losses, max_norm 6 times the large-batch norm:
    does the clip halve .grad on both ranks? (And, as the cell shows, does the clip after a
    plain DDP backward see the large-batch norm on every rank, with no collective?)"""
    r0, r1 = run_ranks(accumulation.accumulation_counts, 2, True, 3, 0, "sum", False, 6.0, 4)
    plain = run_ranks(accumulation.clipped_norms, 2)
    assert all(r["collectives"] == [] for r in plain)
    assert all(r["norm"] == pytest.approx(r["large_batch_norm"], rel=1e-5) for r in plain)
    assert r0["allreduces_per_backward"] == [0, 0, 1]
    assert r0["norm"] == pytest.approx(12 * r0["large_batch_norm"], rel=1e-4)
    unclipped = {**r0, "grad": r0["unclipped_grad"]}
    assert _times(unclipped, 12.0) and _times(r0, 6.0)  # as the explanation says
    same = r0["grad"] == r1["grad"] and r0["norm"] == r1["norm"]
    options = {
        "a": same and _clip_factor(r0, 0.5),
        "b": same and _clip_factor(r0, 1.0),
        "c": same and _clip_factor(r0, 0.25),
        "d": not same,
    }
    assert supported(options) == KEYS["accumulation_10"]


def buffer_runs() -> dict[str, list[float]]:
    """On each rank, in one launch: the running mean after every forward, with K = 2
    micro-batches per step (three steps), with one forward per step (six steps), and without
    broadcast_buffers."""
    return {
        "accumulated": accumulation.batchnorm_buffers(True, 3, 10.0, 2),
        "every_forward": accumulation.batchnorm_buffers(True, 6, 10.0),
        "own": accumulation.batchnorm_buffers(False, 3, 10.0, 2),
    }


def test_accumulation_11_batchnorm_buffers(run_ranks) -> None:
    """4 ranks, batch means 10 r + 1.5, broadcast_buffers, K = 2 micro-batches (the first under
    no_sync): after 3 steps, has rank 3 started each step from rank 0's value and then updated
    twice with its own batch, the second forward broadcasting nothing?"""
    r = run_ranks(buffer_runs, 4)
    two = run_ranks(accumulation.batchnorm_buffers, 2, True, 2, 20.0)  # the cell's run
    assert two[1] == pytest.approx([2.15, 2.285])
    sync_bn = run_ranks(accumulation.sync_batchnorm_on_cpu, 2)[0]  # as the explanation says
    assert "expected input tensor to be on GPU or XPU or privateuseone" in sync_bn["forward"]
    assert "SyncBatchNorm layers only work with GPU modules" in sync_bn["DDP"]
    zero, three = r[0]["accumulated"], r[3]["accumulated"]
    assert zero == pytest.approx([0.15, 0.285, 0.4065, 0.51585, 0.614265, 0.702839], rel=1e-5)
    assert three == pytest.approx([3.15, 5.985, 3.4065, 6.21585, 3.614265, 6.402839], rel=1e-5)
    per_step = all(  # each step's first forward from rank 0's value, the second from its own
        three[2 * s] == pytest.approx(0.9 * zero[2 * s - 1] + 3.15)
        and three[2 * s + 1] == pytest.approx(0.9 * three[2 * s] + 3.15)
        for s in (1, 2)
    )
    every_forward, own = r[3]["every_forward"][-1], r[3]["own"][-1]
    assert every_forward == pytest.approx(3.7028, rel=1e-4)
    assert own == pytest.approx(14.7596, rel=1e-4)
    rank3 = three[-1]
    options = {
        "a": rank3 == pytest.approx(every_forward),
        "b": per_step and rank3 == pytest.approx(6.4028, rel=1e-4),
        "c": rank3 == pytest.approx(own),
        "d": rank3 == pytest.approx(zero[-1]),
    }
    assert supported(options) == KEYS["accumulation_11"]
