"""Reading what the FSDP checks' ranks send back: a reply's shape, the shards' sizes, the
registered parameters left, the frozen table and the shards after training, each checked
before any arithmetic; what is wrong comes back as words for the failure message."""

from __future__ import annotations

import math
from typing import Any

import torch

from course.checks.teaching import CheckFailed
from course.lessons.fsdp.model import Unit

__all__ = ["readback_problem", "shard_problem", "unit_error", "valid_reply"]


def valid_reply(reply: Any, runs: int, rank: int, n: int) -> list[dict]:
    """The rank's reply if it has the shape the check's rank code sends, else a failure."""
    bad = CheckFailed(f"rank {rank} of {n} sent back something the check cannot read: rerun it")
    if not isinstance(reply, list) or len(reply) != runs:
        raise bad
    for run in reply:
        if not isinstance(run, dict) or not isinstance(run.get("sizes"), list):
            raise bad
        if not all(isinstance(v, int) for v in run["sizes"]):
            raise bad
        if not isinstance(run.get("problems"), list) or not isinstance(run.get("left"), list):
            raise bad
        if "shards" in run and not isinstance(run["shards"], list):
            raise bad
    return reply


def _size_hint(u: Unit, got: int, n: int, frozen: int, tied: int) -> str:
    """Why a shard of ``got`` elements is not ceil(P/N)."""
    s = u.padded(n)
    if got == math.ceil((u.numel + frozen) / n) and u.path == "":
        return "the frozen parameter (requires_grad=False) was sharded: leave it where it is"
    if got == math.ceil((u.numel + tied) / n) and u.path == "":
        return "the tied weight was counted twice: the head's weight is the embedding's"
    if got in (u.numel // n, s - 1):
        return f"pad the flat parameters with zeros to N*s = {n * s} elements"
    return "shard only the unit's own trainable parameters, each counted once"


def shard_problem(  # noqa: PLR0911 - one return per mistake it names
    run: dict, n: int, layout: list[Unit], model: Any
) -> str | None:
    """What is wrong with the shards' sizes and the registered parameters, in words."""
    if run["problems"]:
        return run["problems"][0]
    frozen, tied = model.pos.numel(), model.embed.weight.numel()
    sizes = run["sizes"]
    if len(sizes) != n * len(layout):
        return "the check could not read every rank's shard sizes"
    for r in range(n):
        for i, u in enumerate(layout):
            got, s = sizes[r * len(layout) + i], u.padded(n)
            if got == -1:
                return (
                    f"{u.name} has no flat_shard tensor on rank {r} of {n}: fully_shard must "
                    "register module.flat_shard, an nn.Parameter (torch's own fully_shard "
                    "makes DTensors instead: it is not this exercise)"
                )
            if got != s:
                hint = _size_hint(u, got, n, frozen, tied)
                return (
                    f"{u.name}'s shard holds {got} elements on rank {r} of {n}; "
                    f"ceil({u.numel}/{n}) = {s} on every rank: {hint}"
                )
    for name in run["left"]:
        if name == "head.weight":
            return (
                "head.weight is still a registered parameter: the head and the embedding "
                "differ: a tied weight must be replaced under both names"
            )
        return f"{name} is still a registered parameter: fully_shard must replace it"
    return None


def readback_problem(  # noqa: PLR0911 - one return per mistake it names
    run: dict, n: int, want: list[torch.Tensor], names: list[str]
) -> str | None:
    """What makes the shards and the frozen table sent back unusable, in words; else None."""
    shards = run.get("shards")
    frozen, start = run.get("frozen"), run.get("start")
    if not isinstance(start, torch.Tensor):
        return "the check could not read the frozen parameter back"
    if not isinstance(frozen, torch.Tensor):
        return (
            "the frozen parameter (model.pos, requires_grad=False) is gone from its module: "
            "leave frozen parameters where they are, unsharded"
        )
    if frozen.shape != start.shape or not torch.equal(frozen, start):
        return "the frozen parameter changed: one with requires_grad=False stays as is"
    if not isinstance(shards, list) or len(shards) != len(want):
        return "the check could not read every unit's flat_shard back"
    bad = [
        i
        for i, s in enumerate(shards)
        if not isinstance(s, torch.Tensor) or s.dtype != torch.float32 or s.dim() != 1
    ]
    if bad:
        got = shards[bad[0]]
        what = got.dtype if isinstance(got, torch.Tensor) else type(got).__name__
        return (
            f"{names[bad[0]]}'s flat_shard "
            f"came back as {what}: the master shard is a 1-D float32 tensor"
        )
    for i, (shard, w) in enumerate(zip(shards, want, strict=True)):
        if shard.numel() != -(-w.numel() // n):
            return (
                f"{names[i]}'s flat_shard holds {shard.numel()} elements after training, not "
                f"ceil({w.numel()}/{n}): keep module.flat_shard the parameter the optimizer steps"
            )
    return None


def unit_error(shards: list, i: int, rank: int, n: int, want: torch.Tensor) -> float:
    """Largest difference of unit ``i``'s shard on ``rank`` from its slice of ``want``."""
    s = shards[i].numel()
    full = torch.zeros(n * s)
    full[: want.numel()] = want
    return (shards[i].reshape(-1) - full[rank * s : (rank + 1) * s]).abs().max().item()
