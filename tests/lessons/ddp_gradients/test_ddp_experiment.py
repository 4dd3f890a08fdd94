"""The DDP experiments: do they measure what DDP does, against plain all-reduce and one process?"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from course.lessons.ddp_gradients import experiment as ddp

pytestmark = pytest.mark.ranks


def test_seed_step_grad_is_the_all_reduced_sum_over_world_size(run_ranks) -> None:
    """Does .grad after the seed's DDP step hold dist.all_reduce(SUM) / world_size on every rank?"""
    results = run_ranks(ddp.seed_step, 2)
    for r in results:
        assert r["local"] == [r["rank"] + 1.0] * 2
        assert r["all_reduce_sum"] == [3.0, 3.0]
        assert r["grad"] == [s / 2 for s in r["all_reduce_sum"]]
        assert r["backend"] == "gloo" and r["torch"] == torch.__version__


def hook_runs(lr: float) -> dict[str, list[float]]:
    """On each rank, in one launch (DDP's first construction per rank is slow): the runs."""
    n = dist.get_world_size()
    return {
        "grad_sum": ddp.seed_step(ddp.sum_hook)["grad"],
        "sum_of_locals": ddp.seed_step(ddp.sum_hook)["all_reduce_sum"],
        "grad_default": ddp.seed_step()["grad"],
        "default": ddp.train(lr),
        "rescaled": ddp.train(lr / n, ddp.sum_hook),
    }


def test_sum_hook_grad_and_training_runs(run_ranks) -> None:
    """On 4 ranks: is SUM-hook .grad 4x the default, default DDP the one-process curve, and
    the SUM hook at lr/4 the default curve?"""
    results = run_ranks(hook_runs, 4, 0.2)
    for r in results:
        assert r["grad_sum"] == r["sum_of_locals"] == [4 * g for g in r["grad_default"]]
    r = results[0]
    assert r["default"] == pytest.approx(ddp.train_single(0.2), rel=1e-4)
    assert r["rescaled"] == pytest.approx(r["default"], rel=1e-4)
    assert r["default"][-1] < r["default"][0] / 100


def test_uneven_step_gives_the_flat_average_of_local_means(run_ranks) -> None:
    """With local batches of 1 and 3, is .grad the flat average of local means, not the pooled?"""
    for r in run_ranks(ddp.uneven_step, 2, (1, 3)):
        flat = [(a + b) / 2 for a, b in zip(*r["local_means"], strict=True)]
        assert r["grad"] == pytest.approx(flat, rel=1e-5)
        assert r["grad"] != pytest.approx(r["pooled_mean"], rel=1e-2)
        # the pooled mean weights each rank by its share of the samples
        weighted = [(a + 3 * b) / 4 for a, b in zip(*r["local_means"], strict=True)]
        assert r["pooled_mean"] == pytest.approx(weighted, rel=1e-5)


def test_ddp_construction_copies_rank_zero_parameters(run_ranks) -> None:
    """After DDP(m), does every rank hold rank 0's initial weights?"""
    results = run_ranks(ddp.construction_step, 3)
    assert len({tuple(r["before"]) for r in results}) == 3
    assert all(r["after"] == results[0]["before"] for r in results)


def test_loss_figure_has_one_trace_per_run() -> None:
    """Does the loss figure draw each run as one line on a log axis?"""
    fig = ddp.loss_figure({"a": [1.0, 0.5], "b": [1.0, 2.0]})
    assert [t.name for t in fig.data] == ["a", "b"] and fig.layout.yaxis.type == "log"
    assert fig.data[0].line.dash != fig.data[1].line.dash  # curves that coincide stay visible
