"""The FSDP checks: the model solution passes each, each known-wrong one fails for its reason."""

from __future__ import annotations

import fsdp_impls
import pytest
import torch
from student_code import as_student_code
from wrong_fsdp import KEPT_FOR_BACKWARD, LOST_BY_KEEPING, WRONG, student_fn

from course.checks.compare import MODEL_SEED, rank_generators
from course.lessons.fsdp import (
    check_fsdp_memory,
    check_fsdp_mixed_precision,
    check_fsdp_traffic,
    check_fully_shard,
    memory,
)
from course.lessons.fsdp.check import backward_rescale, backward_values, judge_use, value_problem
from course.lessons.fsdp.model import make_batches, oracle, tiny_lm, unit_flats, units
from course.lessons.fsdp.replies import valid_reply
from course.lessons.fsdp.traffic import expected_step, traffic_problem

pytestmark = pytest.mark.ranks

fully_shard = as_student_code(fsdp_impls.fully_shard)
QUICK = {"timeout": 10.0}
CHECKS = {
    "values": lambda fn: check_fully_shard(fn, world_sizes=(2,), repeats=1, **QUICK),
    "any": lambda fn: check_fully_shard(fn, world_sizes=(2,), repeats=1, **QUICK),
    "traffic": lambda fn: check_fsdp_traffic(fn, world_sizes=(2,), **QUICK),
    "memory": lambda fn: check_fsdp_memory(fn, **QUICK),
    "mixed": lambda fn: check_fsdp_mixed_precision(fn, world_sizes=(2,), **QUICK),
    "mixed on 3": lambda fn: check_fsdp_mixed_precision(fn, world_sizes=(3,), **QUICK),
}


def test_the_model_solution_passes_every_check() -> None:
    """Does the model solution pass the values on 3 ranks, and each other check?"""
    assert "largest difference" in check_fully_shard(fully_shard, world_sizes=(3,), repeats=1)
    assert "what its all-gathers bring" in check_fsdp_traffic(fully_shard, world_sizes=(3,))
    assert "counted on the ranks" in check_fsdp_memory(fully_shard)
    assert "bf16 all-gathers" in check_fsdp_mixed_precision(fully_shard, world_sizes=(3,))


@pytest.mark.slow
def test_the_model_solution_passes_the_defaults() -> None:
    """Do the checks as the grade cells call them (2, 3 and 4 ranks, twice) pass it?"""
    assert "2 runs each" in check_fully_shard(fully_shard)
    assert "world sizes 2 and 3" in check_fsdp_mixed_precision(fully_shard)


@pytest.mark.parametrize(
    "name",
    [pytest.param(n, marks=pytest.mark.deadlocks) if n == "deadlock" else n for n in sorted(WRONG)],
)
def test_a_wrong_fully_shard_fails_with_its_reason(name: str) -> None:
    """Does each known-wrong fully_shard fail its check with a message naming the mistake?"""
    _knobs, check, words = WRONG[name]
    with pytest.raises(AssertionError) as failure:
        CHECKS[check](student_fn(name))
    message = str(failure.value)
    assert all(w in message for w in words), message


@pytest.mark.parametrize(
    "name",
    [
        "no_free_after_forward",
        "keeps_params",
        "keeps_params_dummy_gather",
        "bf16_reduce",
        "bf16_average",
    ],
)
def test_what_only_one_check_sees_passes_the_values(name: str) -> None:
    """Is a mistake that moves or holds the wrong bytes (but trains right in fp32) given the
    values' points?"""
    assert "largest difference" in check_fully_shard(student_fn(name), world_sizes=(2,), repeats=1)


@pytest.mark.parametrize("name", KEPT_FOR_BACKWARD)
def test_keeping_the_forwards_parameters_loses_the_same_checks(name: str) -> None:
    """Does a fully_shard that keeps the forward's parameters for the backward lose the same
    checks (traffic, memory, mixed precision; not the values) whether or not it makes a dummy
    all-gather in the backward for the traffic to count?"""
    lost = {}
    for check in LOST_BY_KEEPING:
        try:
            CHECKS[check](student_fn(name))
            lost[check] = False
        except AssertionError:
            lost[check] = True
    assert lost == LOST_BY_KEEPING


def _trained_runs(trajectory: list[list[torch.Tensor]], n: int) -> list[dict]:
    """What n ranks would send back had their shards followed ``trajectory``, step by step."""
    start = torch.zeros(1)
    after = [[[_shard(w, r, n) for w in step] for step in trajectory] for r in range(n)]
    return [{"after": mine, "start": start} for mine in after]


def test_the_use_verdict_names_a_backward_that_kept_the_forwards_parameters() -> None:
    """After the step whose backward gathers were scaled, do the scaled oracle's shards pass
    (and its summed twin's, which the values check fails), and the unscaled oracle's (what a
    backward that kept the forward's parameters gives) fail with that hint?"""
    batches = [make_batches(5, g) for g in rank_generators(3, 2)]
    chosen = backward_rescale(units(tiny_lm()))
    back = backward_values(chosen, 2)
    judge_use(_trained_runs(oracle(batches, "sgd", backward=back), 2), batches, 2, chosen, 3)
    summed = oracle(batches, "sgd", scale=2, backward=back)
    judge_use(_trained_runs(summed, 2), batches, 2, chosen, 3)
    kept = _trained_runs(oracle(batches, "sgd"), 2)
    with pytest.raises(AssertionError, match="the backward used parameters gathered in the"):
        judge_use(kept, batches, 2, chosen, 3)


def test_torch_fully_shard_is_not_the_exercise() -> None:
    """Is torch's own fully_shard (DTensors, no flat_shard) failed with a message saying so?"""
    from torch.distributed.fsdp import fully_shard as torch_fully_shard

    def fn(module, *, param_dtype=None, reduce_dtype=None):
        return torch_fully_shard(module)

    with pytest.raises(AssertionError, match="has no flat_shard tensor"):
        check_fully_shard(fn, world_sizes=(2,), repeats=1, **QUICK)


def test_the_sum_hint_needs_the_sum() -> None:
    """Is the "summed" hint given only when the shards are the summed oracle's (and the
    tolerance met by the mean's own shards)?"""
    batches = [[b] * 5 for b in _two_batches()]
    mean, summed = oracle(batches, "sgd")[-1], oracle(batches, "sgd", scale=2)[-1]
    run = {"frozen": torch.zeros(1), "start": torch.zeros(1)}
    for shards, expect in ((mean, None), (summed, "summed")):
        got = {**run, "shards": [_shard(w, 0, 2) for w in shards]}
        err, why = value_problem(got, 0, 2, mean, {"summed": lambda: summed})
        assert why == expect, (err, why)


def test_the_traffic_verdict_counts_per_unit() -> None:
    """Is a step with one all-gather too few, or an extra all-reduce, named?"""
    layout = units(tiny_lm())
    want = expected_step(layout, 3, 4, 4)
    assert traffic_problem(want, want, layout, 3) is None
    fewer = want.copy()
    fewer["all_gather", layout[0].padded(3), 4] -= 1
    assert "block 0 or block 1 or block 2" in traffic_problem(fewer, want, layout, 3)
    extra = want.copy()
    extra["all_reduce", 10, 4] += 1
    assert "all_reduce" in traffic_problem(extra, want, layout, 3)


def _two_batches() -> list:
    from course.lessons.fsdp.model import make_batches

    return [make_batches(1, torch.Generator().manual_seed(s))[0] for s in (1, 2)]


def _shard(flat: torch.Tensor, rank: int, n: int) -> torch.Tensor:
    s = -(-flat.numel() // n)
    full = torch.zeros(n * s)
    full[: flat.numel()] = flat
    return full[rank * s : (rank + 1) * s].clone()


def test_a_reply_the_check_cannot_read_fails_with_a_message() -> None:
    """Is a malformed reply (not the rank code's shape), or a shard of the wrong dtype or
    size after training, failed with words before any arithmetic?"""
    with pytest.raises(AssertionError, match="cannot read"):
        valid_reply([{"sizes": ["x"]}], 1, 0, 2)
    batches = [[b] * 5 for b in _two_batches()]
    want = oracle(batches, "sgd")[-1]
    run = {"frozen": torch.zeros(1), "start": torch.zeros(1)}
    half = [_shard(w, 0, 2).half() for w in want]
    assert "1-D float32" in value_problem({**run, "shards": half}, 0, 2, want, {})[1]
    short = [_shard(w, 0, 2)[:-1] for w in want]
    assert "after training" in value_problem({**run, "shards": short}, 0, 2, want, {})[1]
    moved = {**run, "frozen": None, "shards": [_shard(w, 0, 2) for w in want]}
    assert "gone from its module" in value_problem(moved, 0, 2, want, {})[1]


def test_the_judge_draws_no_case_whose_answer_hangs_on_how_the_mean_is_rounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On 3 ranks, case 944897542 ends 2.5e-4 of the largest update apart (tolerance 1e-5)
    whether the mean gradient is summed then divided or divided then summed, both right (a
    master on a bf16 rounding boundary): does the judge draw another, and replay a seed given?"""
    start = unit_flats(tiny_lm(MODEL_SEED))
    drawn = iter([944897542, 1])
    monkeypatch.setattr(memory, "fresh_seed", lambda _seed: next(drawn))
    assert memory.settled_case(None, 3, start) == 1
    assert memory.settled_case(944897542, 3, start) == 944897542
