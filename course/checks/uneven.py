"""Graded check for the accumulation assignment's last exercise: a loop for uneven data.

The student's loop runs on fresh ranks that hold different numbers of batches, under a short
gloo timeout: a loop that leaves a rank waiting for peers that ran out of data fails after
that timeout (not the whole deadline) with what each rank was doing. The oracle is what
``torch.distributed.algorithms.join.Join`` gives, simulated in the checker without ranks.
"""

# No "from __future__ import annotations", as in the other checks that hand functions to DDP.

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from course.checks.compare import close, fresh_seed
from course.checks.teaching import failure_message

__all__ = ["check_train_uneven", "join_oracle"]

UNEVEN_TIMEOUT, UNEVEN_PG_TIMEOUT = 40.0, 6.0  # a hang costs the gloo timeout, not the deadline
LR = 0.1


def _batches(seed: int, rank: int, count: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Rank ``rank``'s batches: the same on the rank and in the checker."""
    gen = torch.Generator().manual_seed(seed + rank)
    return [
        (torch.randn(2, 3, generator=gen), torch.randn(2, 1, generator=gen)) for _ in range(count)
    ]


def _model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Linear(3, 1)


def _params(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()]).clone()


def join_oracle(counts: Sequence[int], seed: int, lr: float = LR) -> torch.Tensor:
    """The weights Join gives, simulated in one process without any rank.

    At step t every rank that still has a batch contributes its gradient and a rank that has
    run out contributes zeros; the sum is divided by the initial world size (Join's default).
    When the last rank leaves Join, DDP copies its weights to the others.
    """
    model, world_size = _model(seed), len(counts)
    data = [_batches(seed, r, n) for r, n in enumerate(counts)]
    for t in range(max(counts)):
        model.zero_grad()
        losses = [nn.functional.mse_loss(model(b[t][0]), b[t][1]) for b in data if t < len(b)]
        (sum(losses) / world_size).backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= lr * p.grad  # noqa: PLW2901 - in place: p is the parameter itself
    return _params(model)


def _uneven_trial(train: Any, counts: list[int], seed: int) -> dict[str, Any]:
    """On each rank: the student's loop on this rank's batches; its final weights."""
    rank = dist.get_rank()
    model = _model(seed)
    ddp = DDP(model)
    train(ddp, torch.optim.SGD(ddp.parameters(), lr=LR), _batches(seed, rank, counts[rank]))
    return {"rank": rank, "student": _params(model)}


def check_train_uneven(
    train_uneven: Callable[..., Any], world_sizes: Sequence[int] = (2,), seed: int | None = None
) -> str:
    """Run the loop on ranks with different numbers of batches: no hang, Join's weights."""
    from course.ranks import launch

    for world_size in world_sizes:
        s = fresh_seed(seed)
        counts = [3 + 2 * r for r in range(world_size)][::-1]  # rank 0 has the most batches
        result = launch(
            _uneven_trial,
            world_size,
            train_uneven,
            counts,
            s,
            timeout=UNEVEN_TIMEOUT,
            pg_timeout=UNEVEN_PG_TIMEOUT,
        )
        if not result.ok:
            raise AssertionError(_uneven_failure(result, counts))
        want, start = join_oracle(counts, s), _params(_model(s))
        for r in result.results:
            if close(r["student"], start):
                raise AssertionError(
                    f"On rank {r['rank']} of {world_size}: train_uneven left the weights where "
                    "they started. Implement it above: one optimizer step per batch."
                )
            if not close(r["student"], want):
                raise AssertionError(
                    f"On rank {r['rank']} of {world_size} (batches per rank {counts}, seed {s}): "
                    f"the final weights {_show(r['student'])} differ from what one SGD step per "
                    f"batch gives when the ranks that ran out of data add zeros: {_show(want)}."
                )
    return f"train_uneven finishes on {list(world_sizes)} ranks with uneven data, as with Join."


def _show(t: torch.Tensor) -> str:
    return "[" + ", ".join(f"{v:.4g}" for v in t.tolist()) + "]"


def _uneven_failure(result: Any, counts: list[int]) -> str:
    """What went wrong, in the student's terms: a crash shows its traceback, a hang says why."""
    failures = result.failures
    hung = any("Timed out" in f.message or f.kind == "deadlock" for f in failures.values())
    causes = [f for f in failures.values() if f.is_cause and "Timed out" not in f.message]
    if causes and not hung:
        return failure_message("train_uneven", len(counts), failures)
    lines = []
    for rank, count in enumerate(counts):
        f = failures.get(rank)
        if f is None:
            lines.append(f"  rank {rank} ({count} batches): finished its loop")
        elif "Timed out" in f.message or f.kind == "deadlock":
            at = f" at {f.where}" if f.where else ""
            lines.append(f"  rank {rank} ({count} batches): waited in a collective{at}, in vain")
        else:
            lines.append(f"  rank {rank} ({count} batches): {f.message}")
    return (
        f"train_uneven did not finish: the ranks had {counts} batches. A rank that still had a "
        "batch waited in the all-reduce of its backward for ranks that had run out of data, "
        f"until gloo gave up ({UNEVEN_PG_TIMEOUT:.0f} s here; 30 minutes by default):\n"
        + "\n".join(lines)
        + "\nWrap the loop in `with Join([ddp]):`, so that ranks that are done answer the "
        "others' all-reduces with zeros (question accumulation_6)."
    )
