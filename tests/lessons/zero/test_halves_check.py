"""The zero assignment's checks: do they pass the model solution and fail known-wrong code,
saying why?"""

from __future__ import annotations

import inspect
import sys

import halves_impls
import pytest
import torch
import torch.distributed as dist

from course.lessons.zero import (
    check_all_gather,
    check_halves_pattern,
    check_reduce_scatter,
    check_zero_matches_ddp,
    check_zero_memory,
)

pytestmark = pytest.mark.ranks


def _as_student_code() -> dict:
    """The module pasted into a notebook cell: the same code, none of it importable."""
    namespace = {"__name__": "__main__"}
    source = inspect.getsource(sys.modules[halves_impls.__name__])
    exec(compile(source, "<cell>", "exec"), namespace)  # noqa: S102 - as a notebook cell would
    return namespace


CELL = _as_student_code()


def test_model_solution_passes_every_check() -> None:
    """Do the model reduce_scatter, all_gather and ZeroOptimizer pass the hidden checks?"""
    rs, ag = CELL["reduce_scatter"], CELL["all_gather"]
    assert "right shards" in check_reduce_scatter(rs)
    assert "filled right" in check_all_gather(ag)
    assert "half a ring" in check_halves_pattern(rs, ag)
    assert "matches DDP" in check_zero_matches_ddp(CELL["ZeroOptimizer"], seed=3)
    assert "1/4" in check_zero_memory(CELL["ZeroOptimizer"])


@pytest.mark.parametrize(
    ("check", "name", "words"),
    [
        ("rs", "rs_wrong_chunk", ["chunk 0", "chunk_bounds"]),
        ("pattern_rs", "rs_collective", ["dist.all_reduce", "point-to-point"]),
        ("pattern_ag", "ag_naive", ["neighbour"]),
        ("ag", "ag_forgets_own", ["never written", "your own chunk"]),
        pytest.param("rs", "rs_deadlock", ["deadlock", "dist.isend"], marks=pytest.mark.deadlocks),
    ],
)
def test_wrong_halves_fail_with_the_reason(check: str, name: str, words: list[str]) -> None:
    """Does each wrong half fail its check with a message naming the mistake?"""
    fn = CELL[name]
    calls = {
        "rs": lambda: check_reduce_scatter(fn, world_sizes=(3,)),
        "ag": lambda: check_all_gather(fn, world_sizes=(2, 3)),
        "pattern_rs": lambda: check_halves_pattern(fn, CELL["all_gather"], world_sizes=(3,)),
        "pattern_ag": lambda: check_halves_pattern(CELL["reduce_scatter"], fn, world_sizes=(3,)),
    }
    with pytest.raises(AssertionError) as failure:
        calls[check]()
    message = str(failure.value)
    assert all(w in message for w in words), message
    assert "_run_cases" not in message and "recorder.py" not in message


@pytest.mark.parametrize(
    ("name", "check", "words"),
    [
        ("FullStateZero", check_zero_memory, ["optimizer state", "only this rank's shard"]),
        ("Zero1", check_zero_memory, ["gradient", ".grad to None"]),
        ("SummingZero", check_zero_matches_ddp, ["differ", "divide by world_size"]),
    ],
)
def test_wrong_zero_fails_with_the_reason(name: str, check, words: list[str]) -> None:
    """A full-state, a ZeRO-1 and a summing optimizer: each fails the right check, saying why."""
    with pytest.raises(AssertionError) as failure:
        check(CELL[name])
    message = str(failure.value)
    assert all(w in message for w in words), message


def test_full_state_zero_still_trains_like_ddp() -> None:
    """The full-state optimizer loses the memory points only: it does train like DDP."""
    check_zero_matches_ddp(CELL["FullStateZero"], world_sizes=(2,), seed=1)


def test_animate_half_shows_your_run_and_its_deviations() -> None:
    """Recorded on real ranks: is the model half clean, and a naive all-gather flagged?"""
    from course.pictures.widgets import animate_half

    assert animate_half(CELL["reduce_scatter"], "reduce-scatter", 4).view.deviations == []
    assert animate_half(CELL["all_gather"], "all-gather", 3).view.deviations == []
    naive = animate_half(CELL["ag_naive"], "all-gather", 3)
    assert any("neighbour" in v.text for v in naive.view.deviations)


def test_error_feedback_hook_check() -> None:
    """Does the error-feedback hook pass, and plain fp16 compression fail, saying what to keep?"""
    from course.lessons.zero import check_error_feedback_hook

    assert "within 5%" in check_error_feedback_hook(CELL["ef_fp16_hook"])
    with pytest.raises(AssertionError) as failure:
        check_error_feedback_hook(CELL["fp16_no_feedback"])
    assert "keep the error" in str(failure.value)


def fp32_hook(state, bucket):  # no annotations: DDP compares them as objects
    """No compression at all: trains exactly like fp32, at twice float16's bytes."""
    averaged = bucket.buffer().div_(dist.get_world_size())
    return dist.all_reduce(averaged, async_op=True).get_future().then(lambda f: f.value()[0])


def test_an_uncompressed_hook_fails_on_its_bytes() -> None:
    """Does a hook that all-reduces the float32 gradient, which trains as fp32 does, fail on
    the bytes it sent (4 an element a step, where float16 sends 2)?"""
    from course.lessons.zero import check_error_feedback_hook

    with pytest.raises(AssertionError, match=r"4\.0 bytes a gradient element a step"):
        check_error_feedback_hook(fp32_hook)


def test_the_measured_steps_are_judged_by_the_share_of_parameters_far_off() -> None:
    """A right ZeroOptimizer's slice is far off DDP + Adam's in a few parameters only (where a
    gradient is near Adam's eps): 0.05% of them off by half the largest passes; 1% off by
    twice the tolerance fails, and so does a NaN, saying how many were off."""
    from course.lessons.zero.check import MEMORY_ATOL, MEMORY_SHARE, _compare_slice

    oracle = torch.linspace(-1, 1, 40_000)
    mine = oracle.tensor_split(2)[1].clone()
    mine[: int(mine.numel() * MEMORY_SHARE / 2)] += 0.5
    _compare_slice(oracle, mine, 2, 1)
    mine = oracle.tensor_split(2)[1].clone()
    mine[: mine.numel() // 100] += 2 * MEMORY_ATOL
    with pytest.raises(AssertionError, match=r"1\.0% of rank 1 of 2's parameters differ"):
        _compare_slice(oracle, mine, 2, 1)
    mine = oracle.tensor_split(2)[1].clone()
    mine[: mine.numel() // 100] = float("nan")
    with pytest.raises(AssertionError, match="differ from DDP"):
        _compare_slice(oracle, mine, 2, 1)
