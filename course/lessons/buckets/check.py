"""Graded check for the buckets assignment's first exercise: a bucketed all-reduce.

The checks record every all-reduce the student's code makes on each rank with the course's
one interception layer (``course.ring.recorder``: size, ``async_op``, when, however it was
imported), compare the gradients with the average over ranks of each rank's own gradient
(what DDP gives), and compare the calls with DDP's own bucket rule, :func:`ddp_bucket_rule`
(torch's reducer function, called directly: the oracle is PyTorch itself). Under grading
the calls compared are those the relay carried (``course.ring.relayed.all_reduces_in``),
whatever route reached them, not the rank's record. The overlap exercise is
``course.lessons.buckets.overlap``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from course.checks.compare import (
    close,
    fresh_seed,
    mean_over_ranks,
    near,
    rank_generators,
    ratio,
)
from course.checks.refusals import DDP_RULE, refusing
from course.checks.teaching import TIMEOUT, on_recorded_ranks, read_record, teaches, user_traceback
from course.lessons.buckets.experiment import MB
from course.ranks import PerRank, relay
from course.ranks.wording import count
from course.ring.recorder import Recorder
from course.ring.relayed import all_reduces_in

__all__ = ["all_reduces", "check_bucketed_allreduce", "ddp_bucket_rule", "relayed_all_reduces"]

# (shapes, dtype, bucket_cap_mb): tensors of 4-byte floats, caps of a few tensors each
VISIBLE_CASES: list[tuple[list[tuple[int, ...]], str, float]] = [
    ([(300,), (3000,), (40, 50), (1000,), (5000,), (10,), (2500,)], "float32", 0.02),
]
HIDDEN_CASES: list[tuple[list[tuple[int, ...]], str, float]] = [
    ([(300,), (3000,), (40, 50), (1000,), (5000,), (10,), (2500,)], "float32", 0.02),
    ([(7, 300), (20000,), (5,), (64, 64), (1,), (900,)], "float32", 0.015),  # one over the cap
    ([(100,), (200,), (300,)], "float32", 25.0),  # everything in one bucket
    ([(1500,), (700,), (3, 4, 5), (2600,)], "float64", 0.01),
]


def ddp_bucket_rule(
    nbytes: Sequence[int], bucket_cap_mb: float, first_bucket_mb: float | None = None
) -> list[list[int]]:
    """DDP's buckets for tensors of these sizes (in registration order), as index lists.

    The rule of DDP's reducer from the second step on, asked of torch itself
    (``dist._compute_bucket_assignment_by_size``, which ``DistributedDataParallel`` calls), the
    tensors handed over in the order a plain stack's backward produces them; with
    ``first_bucket_mb`` the limits are the two DDP's constructor passes when ``bucket_cap_mb``
    is not given.
    """
    if bucket_cap_mb <= 0:
        raise ValueError(f"bucket_cap_mb must be positive, got {bucket_cap_mb}")
    order = list(reversed(range(len(nbytes))))
    tensors = [torch.empty(nbytes[i], dtype=torch.uint8) for i in order]
    limits = [int(bucket_cap_mb * MB)]
    if first_bucket_mb is not None:
        limits.insert(0, int(first_bucket_mb * MB))
    rule = dist._compute_bucket_assignment_by_size  # noqa: SLF001 - DDP's own rule
    buckets, _ = rule(tensors, limits, [False] * len(order), order)
    return [list(b) for b in buckets]


def all_reduces(recorder: Recorder) -> list[dict[str, Any]]:
    """The all-reduces a rank made, however it imported them: elements, async_op, time.

    ``async_op`` is unknown (None) only for functional collectives, which are asynchronous.
    """
    return [
        {"numel": c.numel, "async_op": c.async_op is not False, "t": c.t}
        for c in recorder.collectives
        if c.name == "all_reduce"
    ]


# --- exercise (a): bucketed_allreduce(grads, bucket_cap_mb) ----------------------


def _bucket_grads(
    world_size: int, shapes: list[tuple[int, ...]], dtype: str, seed: int
) -> list[list[torch.Tensor]]:
    """Each rank's random gradients, made by the checker."""
    gens = rank_generators(seed, world_size)
    return [
        [torch.randn(s, generator=gens[r], dtype=getattr(torch, dtype)) for s in shapes]
        for r in range(world_size)
    ]


def _bucketed_trial(fn: Any, grads: list[torch.Tensor], cap: float) -> dict[str, Any]:
    """On each rank: the student's call on this rank's own gradients, recorded (under
    grading, the relay records it too, from its mark 0 on)."""
    rank = dist.get_rank()
    given = list(grads)
    out: dict[str, Any] = {"rank": rank, "calls": [], "problem": None}
    relay.mark(0)
    with Recorder() as recorder:
        try:
            fn(given, cap)
        except Exception as exc:  # noqa: BLE001 - the student's code may raise anything; each becomes a message
            out["problem"] = f"bucketed_allreduce raised an exception:\n{user_traceback(exc)}"
            return out
    relay.mark(1)
    out["calls"] = all_reduces(recorder)
    out["replaced"] = [i for i, (a, b) in enumerate(zip(given, grads, strict=True)) if a is not b]
    out["result"] = grads
    return out


@teaches
def check_bucketed_allreduce(
    bucketed_allreduce: Callable[[list[torch.Tensor], float], None],
    world_sizes: Sequence[int] = (2, 3),
    cases: Sequence[tuple[list[tuple[int, ...]], str, float]] = tuple(VISIBLE_CASES),
    seed: int | None = None,
) -> str:
    """Check results, call count and bucket sizes of ``bucketed_allreduce`` on fresh ranks."""
    for world_size in world_sizes:
        for shapes, dtype, cap in cases:
            s = fresh_seed(seed)
            grads = _bucket_grads(world_size, shapes, dtype, s)
            args = (bucketed_allreduce, PerRank(grads), cap)
            results, relayed = on_recorded_ranks(
                "bucketed_allreduce",
                _bucketed_trial,
                world_size,
                *args,
                timeout=TIMEOUT,
                before=refusing(DDP_RULE),
            )
            case = f"{len(shapes)} {dtype} tensors {shapes}, bucket_cap_mb={cap}, seed {s}"
            expected = mean_over_ranks(grads)  # the oracle
            for rank, r in enumerate(results):
                known = {"rank": rank, "before": grads[rank], "expected": expected}
                if relayed and not r["problem"]:  # graded: the calls as the relay saw them
                    known["calls"] = relayed_all_reduces(relayed, rank, None, "bucketed_allreduce")
                _diagnose_bucketed(r | known, world_size, shapes, cap, case)
    return f"bucketed_allreduce: right averages and buckets on {list(world_sizes)} ranks."


def relayed_all_reduces(
    relayed: tuple, rank: int, part: int | None, name: str
) -> list[dict[str, Any]]:
    """The all-reduces ``rank`` made in part ``part`` (None: the whole run), from the relay's
    record, in the shape of :func:`all_reduces` (their times are the rank's own, so none)."""
    numels = read_record(f"{name}'s run", "", all_reduces_in, relayed, rank, part)
    return [{"numel": n, "async_op": None, "t": None} for n in numels]


def _diagnose_bucketed(
    r: dict[str, Any], world_size: int, shapes: list[tuple[int, ...]], cap: float, case: str
) -> None:
    where = f"rank {r['rank']} of {world_size} ({case})"
    if r["problem"]:
        raise AssertionError(f"On {where}: {r['problem']}")
    calls = [c["numel"] for c in r["calls"]]
    unchanged = all(torch.equal(a, b) for a, b in zip(r["result"], r["before"], strict=True))
    if unchanged and not calls:
        raise AssertionError(
            "bucketed_allreduce left the gradients unchanged and made no dist.all_reduce call: "
            "implement it above."
        )
    if r["replaced"]:
        raise AssertionError(
            f"bucketed_allreduce replaced grads[{r['replaced'][0]}] in the list instead of "
            "writing into the tensor: the caller's tensors must hold the result (use "
            "grad.copy_(...)), as they would for a model's .grad."
        )
    _check_results(r, world_size, unchanged, where)
    _check_calls(calls, shapes, r["result"][0].element_size(), cap, where)


def _check_results(r: dict[str, Any], world_size: int, unchanged: bool, where: str) -> None:
    for i, (got, want) in enumerate(zip(r["result"], r["expected"], strict=True)):
        if close(got, want):
            continue
        k = ratio(got, want)
        if unchanged:
            hint = (
                "the gradients are unchanged: copy each bucket's all-reduced values back into "
                "its gradients (in place)."
            )
        elif torch.equal(got, r["before"][i]):
            hint = (
                "this gradient is unchanged while others were averaged: every gradient must "
                "be in a bucket (the last, smaller one too) and get its values copied back."
            )
        elif near(k, world_size):
            hint = f"it is the SUM over ranks; divide by world_size ({world_size}) to average."
        else:
            err = (got - want).abs().max().item()
            hint = f"it differs from the average over ranks (max error {err:.3g})."
        raise AssertionError(f"grads[{i}] (shape {tuple(want.shape)}) on {where}: {hint}")


def _check_calls(
    calls: list[int], shapes: list[tuple[int, ...]], itemsize: int, cap: float, where: str
) -> None:
    numels = [int(torch.Size(s).numel()) for s in shapes]
    buckets = ddp_bucket_rule([n * itemsize for n in numels], cap)
    want = [sum(numels[i] for i in b) for b in buckets]
    if calls == want:
        return
    rule = (
        f"go through the gradients from the LAST to the first, adding each to the current "
        f"bucket, and close the bucket as soon as it holds at least bucket_cap_mb={cap} MiB "
        f"({cap * MB:.0f} bytes). Expected buckets (gradient indices): {buckets}, so "
        f"{count(len(want), 'all-reduce call')} of {want} elements."
    )
    if len(calls) == len(numels) and len(numels) > len(want):
        got = f"one all-reduce per gradient ({len(calls)} calls): pack gradients into buckets"
    elif sorted(calls) == sorted(want):
        got = f"the right buckets in the wrong order (calls of {calls} elements)"
    else:
        got = f"{count(len(calls), 'all-reduce call')} of {calls} elements"
    raise AssertionError(f"On {where}: bucketed_allreduce made {got}. The rule: {rule}")
