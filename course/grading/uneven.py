"""Graded check for the accumulation assignment's last exercise: a loop for uneven data.

The student's loop runs on fresh ranks that hold different numbers of batches, under a short
gloo timeout: a loop that leaves a rank waiting for peers that ran out of data fails after
that timeout (not the whole deadline) with what each rank was doing. The oracle is the same
loop inside ``torch.distributed.algorithms.join.Join``, run on the same ranks first.
"""

# No "from __future__ import annotations", as in the other checks that hand functions to DDP.

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel as DDP

from course.grading.ddp import close, fresh_seed

__all__ = ["check_train_uneven", "reference_loop"]

UNEVEN_TIMEOUT, UNEVEN_PG_TIMEOUT = 40.0, 6.0  # a hang costs the gloo timeout, not the deadline


def reference_loop(ddp: DDP, opt: torch.optim.Optimizer, batches: list) -> None:
    """The oracle: one SGD step per batch, inside Join so ranks may run out of data early."""
    with Join([ddp]):
        for x, y in batches:
            opt.zero_grad()
            nn.functional.mse_loss(ddp(x), y).backward()
            opt.step()


def _params(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()]).clone()


def _uneven_trial(train: Any, counts: list[int], seed: int) -> dict[str, Any]:
    """On each rank: the reference loop first, then the student's loop on the same data."""
    rank = dist.get_rank()
    gen = torch.Generator().manual_seed(seed + rank)
    batches = [
        (torch.randn(2, 3, generator=gen), torch.randn(2, 1, generator=gen))
        for _ in range(counts[rank])
    ]
    finals = {}
    for name, loop in (("reference", reference_loop), ("student", train)):
        torch.manual_seed(seed)
        model = nn.Linear(3, 1)
        ddp = DDP(model)
        loop(ddp, torch.optim.SGD(ddp.parameters(), lr=0.1), batches)
        finals[name] = _params(model)
    return {"rank": rank, **finals}


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
        for r in result.results:
            if not close(r["student"], r["reference"]):
                raise AssertionError(
                    f"On rank {r['rank']} of {world_size} (batches per rank {counts}, seed {s}): "
                    "the final weights differ from a loop of zero_grad, MSE loss, backward, "
                    "optimizer.step() per batch inside `with Join([ddp]):`."
                )
    return f"train_uneven finishes on {list(world_sizes)} ranks with uneven data, as with Join."


def _uneven_failure(result: Any, counts: list[int]) -> str:
    """What went wrong, in the student's terms: a crash shows its traceback, a hang says why."""
    from course.recorder import describe_failure, is_secondary

    failures = result.failures.values()
    lines = "\n".join(
        f"  rank {k}: {describe_failure(f)}" for k, f in sorted(result.failures.items())
    )
    hung = any("Timed out" in f.message or f.kind in {"deadlock", "blocked"} for f in failures)
    causes = [f for f in failures if not is_secondary(f) and "Timed out" not in f.message]
    if causes and not hung:
        return f"train_uneven failed:\n{lines}\n{causes[0].traceback}"
    return (
        f"train_uneven did not finish: the ranks had {counts} batches. A rank that still had a "
        "batch waited in the all-reduce of its backward for ranks that had run out of data, "
        f"until gloo gave up ({UNEVEN_PG_TIMEOUT:.0f} s here; 30 minutes by default):\n{lines}\n"
        "Wrap the loop in `with Join([ddp]):`, so that ranks that are done answer the others' "
        "all-reduces with zeros."
    )
