"""Graded checks for the accumulation assignment's second exercise: an accumulation step.

The student's step runs only on fresh rank processes. The check makes every rank's
micro-batches from a fresh seed and sends each rank its own only (the model's initial weights
come from ``MODEL_SEED``); it records the collectives of the step
(``course.ring.recorder.Recorder``) and counts DDP's bucket all-reduces with a comm hook, on
the rank; under grading those counts give way to the relay's record of the step (every
collective the rank took part in, DDP's own included: ``course.ring.relayed``). The
sampler's indices are checked in ``course.lessons.accumulation.indices``, the uneven-data loop in
``course.lessons.accumulation.uneven``.
"""

# No "from __future__ import annotations": a comm hook handed to DDP is inspected as objects.

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from course.checks.compare import (
    MODEL_SEED,
    close,
    comparable,
    fresh_seed,
    near,
    rank_generators,
)
from course.checks.teaching import TIMEOUT, on_recorded_ranks, read_record, teaches, user_traceback
from course.lessons.accumulation.experiment import counting_hook
from course.ranks import PerRank, relay
from course.ring.recorder import Recorder
from course.ring.relayed import all_reduces_in, collectives_in

__all__ = [
    "accumulation_trial",
    "check_accumulation_syncs",
    "check_accumulation_values",
    "try_accumulation_step",
]

# --- exercise 2: one optimizer step from K micro-batches -----------------------------------


def _accum_model() -> nn.Module:
    torch.manual_seed(MODEL_SEED)
    return nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 2))


def _params(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()]).clone()


MicroBatches = list[tuple[torch.Tensor, torch.Tensor]]


def _micro_batches(world_size: int, k: int, seed: int) -> list[MicroBatches]:
    """Every rank's K micro-batches of 3 samples, x (3, 5) and y (3, 2), made by the checker."""
    return [
        [(torch.randn(3, 5, generator=g), torch.randn(3, 2, generator=g)) for _ in range(k)]
        for g in rank_generators(seed, world_size)
    ]


def _large_update(micro: list[MicroBatches]) -> torch.Tensor:
    """The oracle, computed by the checker: one SGD step on the whole global batch."""
    large = _accum_model()
    before = _params(large)
    pairs = [pair for mine in micro for pair in mine]
    x, y = torch.cat([x for x, _ in pairs]), torch.cat([y for _, y in pairs])
    nn.functional.mse_loss(large(x), y).backward()
    with torch.no_grad():  # SGD's step by hand: an optimizer would bring torch._dynamo (80 MB)
        for p in large.parameters():
            p.add_(p.grad, alpha=-0.1)
    return _params(large) - before


def accumulation_trial(step: Any, micro: MicroBatches) -> dict[str, Any]:
    """On each rank: the student's step on the micro-batches it was sent, and DDP's syncs."""
    rank = dist.get_rank()
    model = _accum_model()
    ddp = DDP(model)
    syncs: list[int] = []
    ddp.register_comm_hook(syncs, counting_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    before = _params(model)
    forwards: list[int] = []
    model.register_forward_pre_hook(lambda *_: forwards.append(1))
    result: dict[str, Any] = {"rank": rank, "problem": None}
    relay.mark(0)  # under grading, the relay counts from here: the student's step alone
    with Recorder() as rec:
        try:
            step(ddp, opt, [tuple(pair) for pair in micro])
        except Exception as exc:  # noqa: BLE001 - the student's code may raise anything; each becomes a message
            result["problem"] = f"accumulation_step raised an exception:\n{user_traceback(exc)}"
    if not forwards and not result["problem"]:
        result["problem"] = (
            "accumulation_step never ran the model: implement it above (a forward and a "
            "backward per micro-batch, then one optimizer step)."
        )
    relay.mark(1)
    names = [c.name for c in rec.collectives]
    return result | {"syncs": len(syncs), "collectives": names, "update": _params(model) - before}


def try_accumulation_step(step: Any, world_size: int = 2, k: int = 4, seed: int = 0) -> dict:
    """Rank 0's trial of ``step`` on micro-batches made from ``seed`` (raises RankError if a
    rank fails), with the oracle's update."""
    from course.ranks import run

    micro = _micro_batches(world_size, k, seed)
    first = run(accumulation_trial, world_size, step, PerRank(micro), timeout=60)[0]
    return first | {"large_update": _large_update(micro)}


def _accumulation_results(step: Any, world_sizes: Sequence[int], k: int, seed: int | None) -> list:
    out = []
    for world_size in world_sizes:
        s = fresh_seed(seed)
        micro = _micro_batches(world_size, k, s)
        results, relayed = on_recorded_ranks(
            "accumulation_step",
            accumulation_trial,
            world_size,
            step,
            PerRank(micro),
            timeout=TIMEOUT,
        )
        large = _large_update(micro)
        for r in results:
            if r["problem"]:
                raise AssertionError(f"On rank {r['rank']} of {world_size}: {r['problem']}")
            r["large_update"] = large
            if relayed:  # graded: what was communicated is the relay's record, not the rank's
                _count_relayed(r, relayed)
        out.append((world_size, s, results))
    return out


def _count_relayed(r: dict[str, Any], relayed: tuple) -> None:
    """Replace what rank ``r`` counted of its step with the relay's record of it: every
    collective it took part in after its mark (DDP's included), and no more syncs than the
    all-reduces of the whole run (DDP's set-up makes none: no mark its code could move
    hides one)."""
    seen = read_record("accumulation_step's run", "", collectives_in, relayed, r["rank"], 0)
    every = len(all_reduces_in(relayed, r["rank"], None))
    r["collectives"] = seen + ["all_reduce"] * (every - seen.count("all_reduce"))
    r["syncs"] = min(r["syncs"], every)


@teaches
def check_accumulation_values(
    accumulation_step: Callable[..., Any],
    world_sizes: Sequence[int] = (2,),
    k: int = 4,
    seed: int | None = None,
) -> str:
    """The step must move the weights exactly as one SGD step on the whole global batch."""
    for world_size, s, results in _accumulation_results(accumulation_step, world_sizes, k, seed):
        for r in results:
            want = r["large_update"]
            got = comparable(r["update"], want, "weights")
            if close(got, want):
                continue
            where = f"rank {r['rank']} of {world_size}, K = {k} micro-batches (seed {s})"
            raise AssertionError(
                "the weights moved differently from one step on the whole batch, on "
                f"{where}: {_update_hint(got, want, k)}"
            )
    return f"accumulation_step gives the large-batch step on {list(world_sizes)} ranks, K = {k}."


def _update_hint(got: torch.Tensor, want: torch.Tensor, k: int) -> str:
    if not got.abs().max() > 0:
        return (
            "the weights did not move at all: call optimizer.step() once, after the last backward."
        )
    mask = want.abs() > 1e-4
    r = (got[mask] / want[mask]).median().item() if mask.any() else None
    if near(r, k):
        return (
            f"the update is K = {k} times too large: .grad adds up the K micro-batch gradients, "
            f"so divide each micro-batch's loss by K."
        )
    if near(r, 1 / k):
        return f"the update is K = {k} times too small: divide the loss by K once, not twice."
    if r is not None and 0 < r < 1 and near(r * k, round(r * k)):
        return (
            "the update uses only some of the micro-batches: call backward on all K of them "
            "before optimizer.step()."
        )
    return f"expected an update starting {want[:3].tolist()}, got {got[:3].tolist()}."


@teaches
def check_accumulation_syncs(
    accumulation_step: Callable[..., Any],
    world_sizes: Sequence[int] = (2,),
    k: int = 4,
    seed: int | None = None,
) -> str:
    """DDP must communicate as little as no_sync allows, and nothing else may communicate."""
    for world_size, _, results in _accumulation_results(accumulation_step, world_sizes, k, seed):
        for r in results:
            where = f"On rank {r['rank']} of {world_size} (K = {k})"
            extra = len(r["collectives"]) - r["syncs"]
            if r["syncs"] == 0:
                raise AssertionError(
                    f"{where}, DDP never all-reduced the gradients: no backward ran outside "
                    "no_sync(). The last micro-batch's backward must run outside it."
                )
            if r["syncs"] > 1:
                raise AssertionError(
                    f"{where}, DDP all-reduced the gradients {r['syncs']} times in one step: "
                    "once per backward outside no_sync(). Run the first K - 1 = "
                    f"{k - 1} backward passes inside `with ddp.no_sync():` and only the last "
                    "one outside."
                )
            if extra > 0:
                names = sorted(set(r["collectives"]) - {"all_reduce"}) or ["all_reduce"]
                raise AssertionError(
                    f"{where}, the step made {extra} collective call(s) of its own "
                    f"({', '.join(names)}) besides DDP's: DDP already averages the "
                    "gradients; remove them."
                )
    return f"accumulation_step all-reduces once per step on {list(world_sizes)} ranks, K = {k}."
