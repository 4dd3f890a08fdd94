"""Graded check for the accumulation assignment's last exercise: a loop for uneven data.

The student's loop runs on fresh ranks that hold different numbers of batches, under a short
gloo timeout: a loop that leaves a rank waiting for peers that ran out of data fails after
that timeout (not the whole deadline) with what each rank was doing. The exercise asks for the
loop without ``torch.distributed.algorithms.join.Join``, so the grading ranks refuse it; the
oracle is still what Join gives, simulated in the checker without ranks. The checker makes
every rank's batches from a fresh seed and sends each rank its own only.
"""

# No "from __future__ import annotations", as in the other checks that hand functions to DDP.

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from course.checks.compare import MODEL_SEED, close, fresh_seed, rank_generators
from course.checks.refusals import JOIN, refusing
from course.checks.teaching import failure_message, teaches
from course.ranks import PerRank

__all__ = ["check_train_uneven", "join_oracle"]

UNEVEN_TIMEOUT, UNEVEN_PG_TIMEOUT = 40.0, 6.0  # a hang costs the gloo timeout, not the deadline
LR = 0.1
AGREE_HINT = (
    "Agree each step whether anyone still has data: all-reduce a 'have I a batch?' flag, stop "
    "when the sum is 0, and let a rank that has run out still run a backward of its last batch "
    "with the loss multiplied by 0 and step its optimizer, so that DDP's all-reduce sees every "
    "rank (what Join's shadowing does, question accumulation_6)."
)


Batches = list[tuple[torch.Tensor, torch.Tensor]]


def _rank_batches(counts: Sequence[int], seed: int) -> list[Batches]:
    """Every rank's batches, ``counts[r]`` for rank r, made in the checker from ``seed``."""
    gens = rank_generators(seed, len(counts))
    return [
        [(torch.randn(2, 3, generator=g), torch.randn(2, 1, generator=g)) for _ in range(n)]
        for g, n in zip(gens, counts, strict=True)
    ]


def _model() -> nn.Module:
    torch.manual_seed(MODEL_SEED)
    return nn.Linear(3, 1)


def _params(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()]).clone()


def join_oracle(batches: Sequence[Batches], lr: float = LR) -> torch.Tensor:
    """The weights Join gives when rank r holds ``batches[r]``, simulated in one process.

    It replays, step by step, what Join does with DDP's all-reduces by default (PyTorch
    docs, ``torch.distributed.algorithms.Join``), then the copy of the last rank's weights
    to the others when it leaves Join.
    """
    model, world_size = _model(), len(batches)
    for t in range(max(map(len, batches))):
        model.zero_grad()
        losses = [nn.functional.mse_loss(model(b[t][0]), b[t][1]) for b in batches if t < len(b)]
        (sum(losses) / world_size).backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= lr * p.grad  # noqa: PLW2901 - in place: p is the parameter itself
    return _params(model)


def _uneven_trial(train: Any, batches: Batches) -> dict[str, Any]:
    """On each rank: the student's loop on the batches this rank was sent; its final weights."""
    model = _model()
    ddp = DDP(model)
    train(ddp, torch.optim.SGD(ddp.parameters(), lr=LR), batches)
    return {"rank": dist.get_rank(), "student": _params(model)}


@teaches
def check_train_uneven(
    train_uneven: Callable[..., Any], world_sizes: Sequence[int] = (2,), seed: int | None = None
) -> str:
    """Run the loop on ranks with different numbers of batches: no hang, Join's weights."""
    from course.ranks import launch

    for world_size in world_sizes:
        s = fresh_seed(seed)
        counts = [3 + 2 * r for r in range(world_size)][::-1]  # rank 0 has the most batches
        batches = _rank_batches(counts, s)
        result = launch(
            _uneven_trial,
            world_size,
            train_uneven,
            PerRank(batches),
            timeout=UNEVEN_TIMEOUT,
            pg_timeout=UNEVEN_PG_TIMEOUT,
            before=refusing(JOIN),
        )
        if not result.ok:
            raise AssertionError(_uneven_failure(result, counts))
        problem = _weights_problem([r["student"] for r in result.results], batches, s)
        if problem:
            raise AssertionError(problem)
    return (
        f"train_uneven finishes on {list(world_sizes)} ranks with uneven data, without Join, "
        "with the weights Join gives the rank with the most batches."
    )


def _weights_problem(weights: list[torch.Tensor], batches: list[Batches], seed: int) -> str | None:
    """What is wrong with the ranks' final weights against Join's (None: nothing)."""
    counts = [len(b) for b in batches]
    want, start = join_oracle(batches), _params(_model())
    where = f"(batches per rank {counts}, seed {seed})"
    if any(close(w, start) for w in weights):
        rank = next(r for r, w in enumerate(weights) if close(w, start))
        return (
            f"On rank {rank} of {len(counts)}: train_uneven left the weights where they "
            "started. Implement it above: one optimizer step per step of the loop."
        )
    if not all(close(w, weights[0]) for w in weights):
        shown = "; ".join(f"rank {r} {_show(w)}" for r, w in enumerate(weights))
        return (
            f"The ranks end with different weights {where}: {shown}. A rank that has run out "
            "of data must still step its optimizer each step, with the averaged gradient DDP "
            "gives it, until no rank has data: then every rank takes the same steps."
        )
    if close(weights[0], join_oracle([b[: min(counts)] for b in batches])):
        return (
            f"The weights {_show(weights[0])} {where} are those after only {min(counts)} "
            "steps: the loop stopped when the first rank ran out of data. Keep stepping until "
            f"no rank has data ({max(counts)} steps here), the ranks that ran out adding zeros."
        )
    if not close(weights[0], want):
        return (
            f"The final weights {_show(weights[0])} {where} differ from what one SGD step per "
            "step of the loop gives when the ranks that ran out of data add zeros and the sum "
            f"is divided by the starting world size (as Join does): {_show(want)}."
        )
    return None


def _show(t: torch.Tensor) -> str:
    return "[" + ", ".join(f"{v:.4g}" for v in t.tolist()) + "]"


def _waited(f: Any) -> bool:
    """A rank that waited on its peers until gloo gave up (the launcher's wording of it)."""
    return f.kind == "deadlock" or "gloo gave up" in f.message or "Timed out" in f.message


def _uneven_failure(result: Any, counts: list[int]) -> str:
    """What went wrong, in the student's terms: a crash shows its traceback, a hang says why."""
    failures = result.failures
    if any(JOIN.message in f.message for f in failures.values()):
        return f"train_uneven used Join on {len(counts)} ranks: {JOIN.message}."
    hung = any(_waited(f) for f in failures.values())
    causes = [f for f in failures.values() if f.is_cause and not _waited(f)]
    if causes and not hung:
        return failure_message("train_uneven", len(counts), failures)
    lines = []
    for rank, count in enumerate(counts):
        f = failures.get(rank)
        if f is None:
            lines.append(f"  rank {rank} ({count} batches): finished its loop")
        elif _waited(f):
            at = f" at {f.where}" if f.where else ""
            lines.append(f"  rank {rank} ({count} batches): waited in a collective{at}, in vain")
        else:
            lines.append(f"  rank {rank} ({count} batches): {f.message}")
    return (
        f"train_uneven did not finish: the ranks had {counts} batches. A rank that still had a "
        "batch waited in the all-reduce of its backward for ranks that had run out of data, "
        f"until gloo gave up ({UNEVEN_PG_TIMEOUT:.0f} s here; 30 minutes by default):\n"
        + "\n".join(lines)
        + "\n"
        + AGREE_HINT
    )
