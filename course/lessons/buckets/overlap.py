"""Graded check for the buckets assignment's second exercise: OverlappingDDP, whose bucket
all-reduces start during backward.

Each rank trains through the student's wrapper on its own batches, made here from a fresh seed
(each rank is sent its own only; the model's initial weights come from ``MODEL_SEED``); the
course's recorder (``course.ring.recorder``) times every all-reduce against the gradients
becoming ready. The gradients are compared with DDP's, the average over ranks of each rank's own
gradient, computed here; the calls with the bucket rule of
:func:`course.lessons.buckets.check.ddp_bucket_rule`. Under grading the all-reduces the rank
recorded of each step must be those the relay carried (count and sizes); when each started,
against the gradients becoming ready, is the rank's own record.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from course.checks.compare import (
    MODEL_SEED,
    close,
    fresh_seed,
    local_grads,
    mean_over_ranks,
    near,
    rank_generators,
    ratio,
)
from course.checks.refusals import DDP_ITSELF, DDP_RULE, refusing
from course.checks.teaching import TIMEOUT, on_recorded_ranks, teaches, user_traceback
from course.lessons.buckets.check import all_reduces, ddp_bucket_rule, relayed_all_reduces
from course.ranks import PerRank, relay
from course.ring.recorder import Recorder

__all__ = ["check_overlapping_ddp"]


def _overlap_model(layers: int = 6, width: int = 48) -> nn.Module:
    torch.manual_seed(MODEL_SEED)
    mods: list[nn.Module] = []
    for _ in range(layers):
        mods += [nn.Linear(width, width), nn.Tanh()]
    return nn.Sequential(*mods)


def _overlap_inputs(world_size: int, seed: int, steps: int) -> list[list[torch.Tensor]]:
    """Each rank's batches, made by the checker."""
    gens = rank_generators(seed, world_size)
    return [[torch.randn(8, 48, generator=g) for _ in range(steps)] for g in gens]


def _expected(inputs: list[list[torch.Tensor]]) -> list[list[torch.Tensor]]:
    """The oracle, computed by the checker: per step, the average over ranks of each rank's
    own gradient (what DDP gives)."""
    local = local_grads(_overlap_model(), inputs, lambda out: out.square().mean())
    return [mean_over_ranks([r[k] for r in local]) for k in range(len(inputs[0]))]


def _overlap_trial(cls: Any, cap: float, inputs: list[torch.Tensor]) -> dict[str, Any]:
    """On each rank: a training step per batch it was sent, through the student's wrapper."""
    rank = dist.get_rank()
    model = _overlap_model()
    out: dict[str, Any] = {"rank": rank, "problem": None, "steps": []}
    ready: list[float] = []
    with Recorder() as recorder:
        try:
            wrapper = cls(model, cap)
        except Exception as exc:  # noqa: BLE001 - the student's code may raise anything; each becomes a message
            out["problem"] = f"OverlappingDDP(module, bucket_cap_mb) raised:\n{user_traceback(exc)}"
            return out
        for p in model.parameters():  # after the student's hooks, so they fire first
            p.register_post_accumulate_grad_hook(lambda _p: ready.append(time.perf_counter()))
        for i, x in enumerate(inputs):
            relay.mark(i)  # under grading, the relay's record of step i starts here
            recorder.collectives.clear()
            ready.clear()
            model.zero_grad()
            loss = model(x).square().mean()
            try:
                loss.backward()
                returned = time.perf_counter()
                wrapper.finish()
            except Exception as exc:  # noqa: BLE001 - the student's code may raise anything; each becomes a message
                out["problem"] = f"backward or finish() raised:\n{user_traceback(exc)}"
                return out
            grads = [p.grad.clone() if p.grad is not None else None for p in model.parameters()]
            out["steps"].append(
                {"calls": all_reduces(recorder), "ready": list(ready), "returned": returned}
                | {"grads": grads}
            )
    relay.mark(len(inputs))
    out["nbytes"] = [p.numel() * p.element_size() for p in model.parameters()]
    return out


@teaches
def check_overlapping_ddp(
    OverlappingDDP: type,  # noqa: N803 - the name of the class the student wrote
    world_sizes: Sequence[int] = (2,),
    bucket_cap_mb: float = 0.01,
    seed: int | None = None,
) -> str:
    """Check the wrapper on fresh ranks: DDP's averaged gradients, buckets started in backward."""
    for world_size in world_sizes:
        s = fresh_seed(seed)
        inputs = _overlap_inputs(world_size, s, 2)
        args = (OverlappingDDP, bucket_cap_mb, PerRank(inputs))
        results, relayed = on_recorded_ranks(
            "OverlappingDDP",
            _overlap_trial,
            world_size,
            *args,
            timeout=TIMEOUT,
            before=refusing(DDP_RULE, DDP_ITSELF),
        )
        expected = _expected(inputs)
        buckets = ddp_bucket_rule(_nbytes(), bucket_cap_mb)
        for rank, r in enumerate(results):
            where = f"rank {rank} of {world_size} (bucket_cap_mb={bucket_cap_mb}, seed {s})"
            if r["problem"]:
                raise AssertionError(f"On {where}: {r['problem']}")
            for i, step in enumerate(r["steps"]):
                step_where = f"{where}, step {i + 1}"
                if relayed:
                    _as_relayed(step["calls"], relayed, rank, i, step_where)
                _diagnose_overlap(step | {"expected": expected[i]}, buckets, world_size, step_where)
    return f"OverlappingDDP averages like DDP, overlapping backward, on {list(world_sizes)} ranks."


def _as_relayed(calls: list[dict], relayed: tuple, rank: int, step: int, where: str) -> None:
    """Under grading: the all-reduces the rank recorded of a step are those the relay
    carried (their count and sizes; when each started is the rank's own record)."""
    carried = [c["numel"] for c in relayed_all_reduces(relayed, rank, step, "OverlappingDDP")]
    recorded = [c["numel"] for c in calls]
    if recorded != carried:
        raise AssertionError(
            f"On {where}: the relay carried all-reduces of {carried} elements, but the rank's "
            f"own record says {recorded}: make every all-reduce with dist.all_reduce on the "
            "default group, from the gradient hooks."
        )


def _nbytes() -> list[int]:
    return [p.numel() * p.element_size() for p in _overlap_model().parameters()]


def _diagnose_overlap(
    step: dict[str, Any], buckets: list[list[int]], world_size: int, where: str
) -> None:
    calls, ready = step["calls"], sorted(step["ready"])
    if not calls:
        raise AssertionError(
            f"On {where}: no dist.all_reduce call was made. Register a hook on each parameter "
            "(p.register_post_accumulate_grad_hook) that launches its bucket's all-reduce "
            "once the bucket is full, and wait for them in finish()."
        )
    for i, (got, want) in enumerate(zip(step["grads"], step["expected"], strict=True)):
        if got is None or not close(got, want):
            if got is None:
                hint = "it is None"
            elif near(ratio(got, want), world_size):
                hint = f"it is the SUM over ranks; divide by world_size ({world_size})"
            else:
                hint = "it differs from the average over ranks (what DDP gives)"
            raise AssertionError(f"On {where}, parameter {i}'s .grad after finish(): {hint}.")
    if not all(c["async_op"] for c in calls):
        raise AssertionError(
            f"On {where}: call dist.all_reduce(..., async_op=True) so backward goes on while "
            "the bucket is reduced; keep the returned Work and wait() for it in finish()."
        )
    if len(calls) != len(buckets):
        raise AssertionError(
            f"On {where}: {len(calls)} all-reduce calls for {len(buckets)} buckets. Use the "
            f"rule of bucketed_allreduce (parameters from last to first, close at >= "
            f"bucket_cap_mb): buckets {buckets}."
        )
    done = 0
    for k, (call, bucket) in enumerate(zip(calls, buckets, strict=True)):
        done += len(bucket)
        seen = sum(t < call["t"] for t in ready)
        if seen > done or call["t"] > step["returned"]:
            raise AssertionError(
                f"On {where}: bucket {k} was full once {done} gradients were ready, but its "
                f"all-reduce started only after {seen} were (of {len(ready)}). Start each "
                "bucket's all-reduce from the gradient hook that completes it, during backward."
            )
