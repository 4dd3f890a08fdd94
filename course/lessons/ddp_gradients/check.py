"""Graded checks for the DDP assignment: an averaging comm hook, and a loss for uneven batches.

Each check runs the student's function on fresh gloo ranks. Every rank's data is made here
from a fresh seed and each rank is sent its own only (the model's initial weights come from
``MODEL_SEED``). The checker compares with an oracle (DDP's own averaging; a single-process
run on the pooled data) and fails with an ``AssertionError`` that says what was wrong and what
to try. The diagnosis runs in the caller on plain data the ranks send back; a crash or a
deadlock in the student's code comes back as the student's own traceback.
"""

# No "from __future__ import annotations": the hook wrapper below is handed to DDP, which
# compares annotations as objects.

import random
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

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
from course.checks.refusals import DDP_HOOKS, refusing
from course.checks.teaching import on_ranks, teaches, user_traceback
from course.lessons.ddp_gradients.hooks import guard_hook, hook_signature_problem
from course.ranks import PerRank

__all__ = ["check_reduce_hook", "check_weighted_loss"]

# --- exercise (a): an averaging comm hook -----------------------------------------


def _hook_model() -> nn.Module:
    torch.manual_seed(MODEL_SEED)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 8), nn.Tanh(), nn.Linear(8, 3))


def _hook_batches(world_size: int, seed: int, steps: int) -> list[list[torch.Tensor]]:
    """Each rank's inputs, one batch per step (rank r's batches hold 1 + r samples)."""
    gens = rank_generators(seed, world_size)
    return [
        [torch.randn(1 + r, 6, generator=gens[r]) for _ in range(steps)] for r in range(world_size)
    ]


def _hook_trial(hook: Any, batches: list[torch.Tensor]) -> dict[str, Any]:
    """On each rank: the student's hook on the batches this rank was sent, one step each.

    The hook's signature is checked here, where the hook is defined (the grader holds only
    its name and cells); what DDP's default would give is computed by the checker.
    """
    rank = dist.get_rank()
    signature = hook_signature_problem(hook)
    if signature:
        return {"rank": rank, "signature": signature, "problems": [], "steps": []}
    student = DDP(_hook_model(), bucket_cap_mb=0.0005)  # ~500 bytes: several buckets
    problems: list[str] = []
    student.register_comm_hook(None, guard_hook(hook, problems))
    out = []
    for x in batches:
        student.zero_grad()
        student(x).square().sum().backward()
        out.append([p.grad.detach().clone() for p in student.parameters()])
        if problems:
            break
    return {"rank": rank, "problems": problems, "steps": out}


def _hook_oracle(batches: list[list[torch.Tensor]]) -> list[list[dict[str, list]]]:
    """Per rank and step: the local gradient and DDP's default (their mean over ranks)."""
    local = local_grads(_hook_model(), batches, lambda out: out.square().sum())
    steps = range(len(batches[0]))
    mean = [mean_over_ranks([r[k] for r in local]) for k in steps]
    return [[{"local": mine[k], "default": mean[k]} for k in steps] for mine in local]


@teaches
def check_reduce_hook(
    reduce_hook: Callable[..., Any], world_sizes: Sequence[int] = (2, 3), seed: int | None = None
) -> str:
    """Check a comm hook on fresh ranks: .grad must equal what DDP's default gives."""
    for world_size in world_sizes:
        s = fresh_seed(seed)
        batches = _hook_batches(world_size, s, 2)
        args = (reduce_hook, PerRank(batches))
        results = on_ranks(
            "reduce_hook", _hook_trial, world_size, *args, before=refusing(DDP_HOOKS)
        )
        if results[0].get("signature"):
            raise AssertionError(results[0]["signature"])
        for r in results:
            if r["problems"]:
                raise AssertionError(f"On rank {r['rank']} of {world_size}: {r['problems'][0]}")
        oracle = _hook_oracle(batches)
        for rank, r in enumerate(results):
            for step, got in enumerate(r["steps"]):
                _diagnose_hook(got, oracle[rank][step], rank, world_size, step, s)
    return f"reduce_hook matches DDP's averaged gradients on {list(world_sizes)} ranks."


def _diagnose_hook(
    student: list, oracle: dict[str, list], rank: int, world_size: int, step: int, seed: int
) -> None:
    where = f"rank {rank} of {world_size}, step {step + 1} (seed {seed})"
    for i, (got, want, local) in enumerate(
        zip(student, oracle["default"], oracle["local"], strict=True)
    ):
        if close(got, want):
            continue
        r = ratio(got, want)
        if near(r, world_size):
            hint = (
                f"it is world_size ({world_size}) times too large: that is the SUM over ranks. "
                "Divide by dist.get_world_size() to get the average, as DDP does."
            )
        elif near(r, 1 / world_size):
            hint = f"it is world_size ({world_size}) times too small: you divided twice."
        elif close(got, local):
            hint = (
                "it is this rank's own local gradient, not synced: the hook must all-reduce "
                "bucket.buffer() and return a future of the result."
            )
        else:
            hint = f"expected {_show(want)}, got {_show(got)}."
        raise AssertionError(f"parameter {i} ({tuple(want.shape)}) on {where}: {hint}")


def _show(t: torch.Tensor, n: int = 4) -> str:
    flat = t.flatten()[:n].tolist()
    return "[" + ", ".join(f"{v:.4g}" for v in flat) + (", ...]" if t.numel() > n else "]")


# --- exercise (b): a loss whose synced gradient is the pooled per-sample mean ------


def _local_batch_sizes(world_size: int, seed: int) -> list[int]:
    """Unequal local batch sizes: at least two different sizes among the ranks."""
    rng = random.Random(seed)  # noqa: S311 - test data, not a secret
    sizes = [rng.randint(1, 5) for _ in range(world_size)]
    if len(set(sizes)) == 1:
        sizes[0] = sizes[0] % 5 + 1
    return sizes


Samples = tuple[torch.Tensor, torch.Tensor]


def _weighted_data(sizes: list[int], seed: int) -> list[Samples]:
    """Each rank's samples, made by the checker: ``sizes[r]`` of them for rank r, x (k, 4) and
    y (k, 2)."""
    gens = rank_generators(seed, len(sizes))
    return [
        (torch.randn(k, 4, generator=g), torch.randn(k, 2, generator=g))
        for g, k in zip(gens, sizes, strict=True)
    ]


def _per_sample(m: nn.Module, xs: torch.Tensor, ys: torch.Tensor) -> torch.Tensor:
    return (m(xs) - ys).square().mean(dim=1)


def _weighted_model() -> nn.Module:
    torch.manual_seed(MODEL_SEED)
    return nn.Linear(4, 2)


def _weighted_trial(weighted_loss: Any, mine: Samples) -> dict[str, Any]:
    """On each rank: a DDP step with the student's loss on the samples this rank was sent."""
    rank = dist.get_rank()
    x, y = mine
    model = _weighted_model()
    ddp = DDP(model)
    result: dict[str, Any] = {"rank": rank, "problem": None}
    losses = _per_sample(ddp, x, y)
    try:
        loss = weighted_loss(losses)
    except Exception as exc:  # noqa: BLE001 - the student's code may raise anything; each becomes a message
        result["problem"] = f"weighted_loss raised an exception:\n{user_traceback(exc)}"
        return result
    result["problem"] = _loss_problem(loss, len(x))
    if result["problem"]:
        return result
    loss.backward()
    result["student"] = [p.grad.clone() for p in model.parameters()]
    return result


def _weighted_oracle(data: list[Samples]) -> dict[str, list]:
    """Computed by the checker from every rank's samples: the pooled per-sample mean's
    gradient, and the mean of the local means'."""
    oracle = _weighted_model()

    def grad_of(loss_value: torch.Tensor) -> list[torch.Tensor]:
        oracle.zero_grad()
        loss_value.backward()
        return [p.grad.clone() for p in oracle.parameters()]

    means = [grad_of(_per_sample(oracle, x, y).mean()) for x, y in data]
    x, y = (torch.cat(ts) for ts in zip(*data, strict=True))
    pooled = grad_of(_per_sample(oracle, x, y).mean())
    return {"pooled": pooled, "flat": [sum(g) / len(data) for g in zip(*means, strict=True)]}


def _loss_problem(loss: Any, count: int) -> str | None:
    if loss is None:
        return "weighted_loss returned None: implement it above and return the loss tensor."
    if not isinstance(loss, torch.Tensor):
        return f"weighted_loss should return a tensor, but it returned {type(loss).__name__}."
    if loss.numel() != 1:
        return (
            f"weighted_loss returned a tensor of shape {tuple(loss.shape)} for {count} samples; "
            "return one number (a 0-d tensor) that backward() can start from."
        )
    if not loss.requires_grad:
        return (
            "weighted_loss returned a tensor that does not require grad: compute it from "
            "loss_per_sample (not from .item() or a new tensor), so backward reaches the model."
        )
    return None


@teaches
def check_weighted_loss(
    weighted_loss: Callable[[torch.Tensor], torch.Tensor],
    world_sizes: Sequence[int] = (2, 3),
    seed: int | None = None,
) -> str:
    """Check on ranks with unequal batches that .grad after DDP equals the pooled mean gradient."""
    for world_size in world_sizes:
        s = fresh_seed(seed)
        sizes = _local_batch_sizes(world_size, s)
        data = _weighted_data(sizes, s)
        results = on_ranks(
            "weighted_loss", _weighted_trial, world_size, weighted_loss, PerRank(data)
        )
        for r in results:
            if r["problem"]:
                raise AssertionError(f"On rank {r['rank']} of {world_size}: {r['problem']}")
        oracle = _weighted_oracle(data)
        for r in results:
            _diagnose_weighted(r | oracle | {"sizes": sizes}, world_size, s)
    return f"weighted_loss gives the pooled per-sample mean gradient on {list(world_sizes)} ranks."


def _diagnose_weighted(r: dict[str, Any], world_size: int, seed: int) -> None:
    sizes, n = r["sizes"], sum(r["sizes"])
    where = f"rank {r['rank']} of {world_size}, local batch sizes {sizes} (seed {seed})"
    for got, want, flat in zip(r["student"], r["pooled"], r["flat"], strict=True):
        if close(got, want):
            continue
        k = ratio(got, want)
        if close(got, flat):
            hint = (
                "this is DDP's flat average of the ranks' local means (what "
                "loss_per_sample.mean() gives): every rank counts the same whatever its batch "
                "size. Weight each rank by its share of all the samples instead: all-reduce the "
                "sample count."
            )
        elif near(k, 1 / world_size):
            hint = (
                f"it is world_size ({world_size}) times too small: DDP still divides the summed "
                "gradients by world_size after your loss; multiply by dist.get_world_size()."
            )
        elif near(k, world_size):
            hint = f"it is world_size ({world_size}) times too large."
        elif near(k, n / world_size) or near(k, n):
            hint = (
                f"it is off by a factor {k:.3g}, the batch ratio ({n} samples over "
                f"{world_size} ranks): divide the summed loss by the total sample count."
            )
        else:
            hint = f"expected {_show(want)}, got {_show(got)}."
        raise AssertionError(f".grad does not equal the pooled per-sample mean on {where}: {hint}")
