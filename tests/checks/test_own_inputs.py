"""Is each rank a check starts (uneven data, ZeRO, comm hook, weighted loss, overlap,
accumulation, FSDP, error feedback) sent its own inputs only?

A recording stand-in for the student's code runs the right answer, then saves what it can
reach on its rank: every tensor alive there and every int its callers hold. The checker's
inputs for every rank are made again from the seed, outside the check; a rank must reach all
of its own and none of another rank's, and must not hold the seed they were made from.
"""

from __future__ import annotations

import gc
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import cloudpickle
import fsdp_impls
import halves_impls
import pytest
import torch
import torch.distributed as dist
from accumulation_impls import (
    accumulation_step,
    no_division,
    train_no_step_when_done,
    train_uneven,
)
from buckets_impls import Blocking, OverlappingDDP
from ddp_impls import mean_loss, reduce_hook, sum_hook, weighted_loss
from wrong_fsdp import student_fn as wrong_fsdp

from course.checks.compare import rank_generators
from course.lessons.accumulation import check as accumulation_check
from course.lessons.accumulation import (
    check_accumulation_syncs,
    check_accumulation_values,
    check_train_uneven,
)
from course.lessons.accumulation import uneven as uneven_check
from course.lessons.buckets import check_overlapping_ddp
from course.lessons.buckets import overlap as overlap_check
from course.lessons.ddp_gradients import check as ddp_check
from course.lessons.ddp_gradients import check_reduce_hook, check_weighted_loss
from course.lessons.fsdp import check_fully_shard
from course.lessons.fsdp.model import STEPS as FSDP_STEPS
from course.lessons.fsdp.model import make_batches as fsdp_batches
from course.lessons.zero import check as zero_check
from course.lessons.zero import check_error_feedback_hook, check_zero_matches_ddp, check_zero_memory
from course.lessons.zero import feedback as compression_check

pytestmark = pytest.mark.ranks

SEED = 424_242  # any seed but MODEL_SEED: the data's, which no rank may hold


@pytest.fixture(autouse=True)
def _sent_by_value() -> Iterator[None]:
    """Send this module and the model solution to the ranks by value, as a cell would be."""
    modules = [sys.modules[__name__], halves_impls, fsdp_impls] + [
        sys.modules[f.__module__] for f in (train_uneven, OverlappingDDP, reduce_hook)
    ]
    for module in modules:
        cloudpickle.register_pickle_by_value(module)
    yield
    for module in modules:
        cloudpickle.unregister_pickle_by_value(module)


def _reachable() -> tuple[list[torch.Tensor], set[int]]:
    """Every tensor alive on this rank, and every int its callers hold, in containers too."""
    tensors = [o for o in gc.get_objects() if isinstance(o, torch.Tensor)]
    ints: set[int] = set()
    frame, stack, seen = sys._getframe(1), [], set()  # noqa: SLF001 - the callers are what is read
    while frame is not None:
        stack += [(v, 0) for v in frame.f_locals.values()]
        frame = frame.f_back
    while stack:
        value, depth = stack.pop()
        if type(value) is int:
            ints.add(value)
        elif isinstance(value, torch.Tensor):
            tensors.append(value)
        elif depth < 5 and isinstance(value, list | tuple | dict) and id(value) not in seen:
            seen.add(id(value))
            items = value.values() if isinstance(value, dict) else value
            stack += [(v, depth + 1) for v in items]
    return tensors, ints


def _record(where: str, shapes: set[tuple[int, ...]]) -> None:
    """Save what this rank reaches: its tensors of the batches' shapes, and its ints."""
    tensors, ints = _reachable()
    batch_like = [t.detach().clone() for t in tensors if tuple(t.shape) in shapes]
    torch.save({"tensors": batch_like, "ints": sorted(ints)}, f"{where}/{dist.get_rank()}.pt")


def _recording_loop(where: str) -> Callable[..., None]:
    """The right uneven-data loop, which then records what its rank reaches."""

    def train_and_record(ddp: Any, optimizer: Any, batches: list) -> None:
        train_uneven(ddp, optimizer, batches)
        _record(where, {(2, 3), (2, 1)})

    return train_and_record


def _recording_zero(where: str) -> type:
    """The model ZeroOptimizer, which records what its rank reaches when it is built."""

    class RecordingZero(halves_impls.ZeroOptimizer):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            _record(where, {(16, 64)})

    return RecordingZero


def _recording_hook(where: str) -> Callable[..., Any]:
    """The right averaging hook, which records what its rank reaches each time DDP calls it."""

    def recording_hook(state, bucket):
        _record(where, {(1 + r, 6) for r in range(3)})
        return reduce_hook(state, bucket)

    return recording_hook


def _recording_ef_hook(where: str) -> Callable[..., Any]:
    """The model error-feedback hook, which records what its rank reaches the first time DDP
    calls it (of 200)."""
    recorded: list[bool] = []

    def recording_ef_hook(state, bucket):
        if not recorded:
            _record(where, {(1, 8)})
            recorded.append(True)
        return halves_impls.ef_fp16_hook(state, bucket)

    return recording_ef_hook


def _recording_loss(where: str, shapes: set[tuple[int, ...]]) -> Callable[..., Any]:
    """The right weighted loss, which first records what its rank reaches."""

    def record_and_weigh(loss_per_sample: torch.Tensor) -> torch.Tensor:
        _record(where, shapes)
        return weighted_loss(loss_per_sample)

    return record_and_weigh


def _recording_overlap(where: str) -> type:
    """The model OverlappingDDP, which records what its rank reaches when it is built."""

    class RecordingOverlap(OverlappingDDP):
        def __init__(self, *args: Any) -> None:
            super().__init__(*args)
            _record(where, {(8, 48)})

    return RecordingOverlap


def _recording_fully_shard(where: str) -> Callable[..., Any]:
    """The model fully_shard, which records what its rank reaches when it shards the root."""

    def fully_shard(module: Any, **kwargs: Any) -> Any:
        sharded = fsdp_impls.fully_shard(module, **kwargs)
        if hasattr(module, "blocks"):  # the root: every block is sharded by now
            _record(where, {(4, 6)})
        return sharded

    return fully_shard


def _recording_step(where: str) -> Callable[..., None]:
    """The right accumulation step, which then records what its rank reaches."""

    def step_and_record(ddp: Any, optimizer: Any, micro_batches: list) -> None:
        accumulation_step(ddp, optimizer, micro_batches)
        _record(where, {(3, 5), (3, 2)})

    return step_and_record


def _flat(nested: Any) -> list[torch.Tensor]:
    """The tensors in ``nested``: a tensor, or lists and tuples of them at any depth."""
    if isinstance(nested, torch.Tensor):
        return [nested]
    return [t for item in nested for t in _flat(item)]


def _assert_own_batches_only(where: Path, batches: list, seed: int) -> None:
    """Rank r reached every tensor of ``batches[r]``, none of another rank's, and no seed of
    the data (``seed`` itself or a rank's generator seed)."""
    seeds = {seed} | {g.initial_seed() for g in rank_generators(seed, len(batches))}
    for rank, own in enumerate(batches):
        seen = torch.load(where / f"{rank}.pt")

        def reached(t: torch.Tensor, seen: dict = seen) -> bool:
            return any(s.shape == t.shape and torch.equal(s, t) for s in seen["tensors"])

        assert all(map(reached, _flat(own))), f"rank {rank} lacks its batches"
        others = _flat([b for q, b in enumerate(batches) if q != rank])
        assert not any(map(reached, others)), f"rank {rank} holds another rank's batches"
        assert not seeds & set(seen["ints"]), f"rank {rank} holds the data's seed"


# A check of 3 ranks, the right answer that records what its rank reaches, what the check
# says when it passes, and the inputs the checker made for each rank, made again from SEED.
SENT_OWN = {
    "uneven": (
        check_train_uneven,
        _recording_loop,
        "without Join",
        lambda: uneven_check._rank_batches([7, 5, 3], SEED),  # noqa: SLF001 - the checker's
    ),
    "zero": (
        check_zero_matches_ddp,
        _recording_zero,
        "matches DDP",
        lambda: zero_check._rank_batches(3, zero_check.STEPS, SEED),  # noqa: SLF001 - the checker's
    ),
    "hook": (
        check_reduce_hook,
        _recording_hook,
        "matches DDP",
        lambda: ddp_check._hook_batches(3, SEED, 2),  # noqa: SLF001 - the checker's
    ),
    "overlap": (
        check_overlapping_ddp,
        _recording_overlap,
        "overlapping",
        lambda: overlap_check._overlap_inputs(3, SEED, 2),  # noqa: SLF001 - the checker's
    ),
    "fsdp": (
        check_fully_shard,
        _recording_fully_shard,
        "trains like one process",
        lambda: [fsdp_batches(FSDP_STEPS, g) for g in rank_generators(SEED, 3)],
    ),
    **{
        f"accumulation {check.__name__.rsplit('_', 1)[1]}": (
            check,
            _recording_step,
            "accumulation_step",
            lambda: accumulation_check._micro_batches(3, 4, SEED),  # noqa: SLF001 - the checker's
        )
        for check in (check_accumulation_values, check_accumulation_syncs)
    },
}


@pytest.mark.parametrize("name", list(SENT_OWN))
def test_each_rank_is_sent_its_own_inputs_only(no_leftovers, tmp_path, name: str) -> None:
    """On 3 ranks (uneven data: 7, 5 and 3 batches): does each rank reach only its own
    inputs, and does the right answer pass?"""
    check, recording, passed, made = SENT_OWN[name]
    assert passed in check(recording(str(tmp_path)), world_sizes=(3,), seed=SEED)
    _assert_own_batches_only(tmp_path, made(), SEED)


def test_each_zero_memory_rank_is_sent_its_own_batches_only(
    no_leftovers, tmp_path, monkeypatch
) -> None:
    """Measuring memory on 4 ranks: does each rank reach only its own batches, and pass?"""
    monkeypatch.setattr(zero_check, "fresh_seed", lambda seed: SEED if seed is None else seed)
    assert "1/4" in check_zero_memory(_recording_zero(str(tmp_path)))
    batches = zero_check._rank_batches(4, zero_check.MEMORY_STEPS, SEED)  # noqa: SLF001 - the checker's
    _assert_own_batches_only(tmp_path, batches, SEED)


def test_each_weighted_loss_rank_is_sent_its_own_samples_only(no_leftovers, tmp_path) -> None:
    """A weighted loss on 3 ranks: does each rank reach only its own samples, and pass?"""
    sizes = ddp_check._local_batch_sizes(3, SEED)  # noqa: SLF001 - the checker's, again
    samples = ddp_check._weighted_data(sizes, SEED)  # noqa: SLF001 - the checker's, again
    shapes = {tuple(t.shape) for t in _flat(samples)}
    assert "pooled" in check_weighted_loss(
        _recording_loss(str(tmp_path), shapes), world_sizes=(3,), seed=SEED
    )
    _assert_own_batches_only(tmp_path, samples, SEED)


@pytest.mark.parametrize(
    ("check", "wrong"),
    [
        (check_train_uneven, train_no_step_when_done),
        (check_zero_matches_ddp, halves_impls.SummingZero),
        (check_reduce_hook, sum_hook),
        (check_weighted_loss, mean_loss),
        (check_overlapping_ddp, Blocking),
        (check_accumulation_values, no_division),
        (check_fully_shard, wrong_fsdp("sums")),
    ],
)
def test_a_failure_replays_from_the_seed_it_prints(no_leftovers, check, wrong) -> None:
    """Does a wrong answer fail again, with the same message, given the seed its message prints?"""
    with pytest.raises(AssertionError) as first:
        check(wrong, world_sizes=(2,))
    seed = int(re.search(r"seed (\d+)", str(first.value))[1])
    with pytest.raises(AssertionError) as again:
        check(wrong, world_sizes=(2,), seed=seed)
    assert str(again.value) == str(first.value)


def test_each_error_feedback_rank_is_sent_its_own_input_only(no_leftovers, tmp_path) -> None:
    """An error-feedback hook on 2 ranks: does each rank reach only its own input, and pass?"""
    assert "within 5%" in check_error_feedback_hook(_recording_ef_hook(str(tmp_path)), seed=SEED)
    xs = compression_check._inputs(SEED)  # noqa: SLF001 - the checker's, again
    _assert_own_batches_only(tmp_path, xs, SEED)


def test_an_error_feedback_failure_replays_from_its_seed(no_leftovers) -> None:
    """Does plain fp16 fail the error-feedback check again, alike, given the seed it prints?"""
    with pytest.raises(AssertionError) as first:
        check_error_feedback_hook(halves_impls.fp16_no_feedback)
    seed = int(re.search(r"seed (\d+)", str(first.value))[1])
    with pytest.raises(AssertionError) as again:
        check_error_feedback_hook(halves_impls.fp16_no_feedback, seed=seed)
    assert str(again.value) == str(first.value)
