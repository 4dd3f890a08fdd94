"""Numbers the checks compare: gradients to float32 tolerance, constant factors, seeds."""

from __future__ import annotations

import random
from collections.abc import Callable

import torch

__all__ = [
    "ATOL",
    "MODEL_SEED",
    "RTOL",
    "close",
    "comparable",
    "fresh_seed",
    "local_grads",
    "mean_over_ranks",
    "near",
    "rank_generators",
    "ratio",
]

RTOL, ATOL = 1e-4, 1e-5
# The initial weights every rank builds: from a seed of their own, never the data's, so that
# what a rank is told about its model says nothing about the other ranks' batches.
MODEL_SEED = 0


def fresh_seed(seed: int | None) -> int:
    """A new random seed unless one is given (failure messages print it to replay a case)."""
    return random.randrange(2**31) if seed is None else seed  # noqa: S311 - a seed for test data, not a secret


def rank_generators(seed: int, world_size: int) -> list[torch.Generator]:
    """One generator per rank, for the data the checker makes for each rank."""
    return [torch.Generator().manual_seed(seed * 1009 + r) for r in range(world_size)]


def mean_over_ranks(per_rank: list[list[torch.Tensor]]) -> list[torch.Tensor]:
    """Tensor by tensor, the mean over ranks of each rank's list."""
    return [sum(ts) / len(per_rank) for ts in zip(*per_rank, strict=True)]


def local_grads(
    model: torch.nn.Module,
    batches: list[list[torch.Tensor]],
    loss: Callable[[torch.Tensor], torch.Tensor],
) -> list[list[list[torch.Tensor]]]:
    """Per rank and step, ``model``'s own gradient of ``loss(model(x))`` on that rank's batch,
    computed by the checker in one process (the parameters do not move between steps)."""

    def grads(x: torch.Tensor) -> list[torch.Tensor]:
        model.zero_grad()
        loss(model(x)).backward()
        return [p.grad.detach().clone() for p in model.parameters()]

    return [[grads(x) for x in mine] for mine in batches]


def comparable(got: object, want: torch.Tensor, what: str = "values") -> torch.Tensor:
    """``got`` (what the ranks sent back) if it is a tensor of ``want``'s dtype; otherwise an
    AssertionError that says what came back and what the model holds, before any arithmetic
    (``torch.allclose`` of float64 and float32, or of bool and float, raises)."""
    if not isinstance(got, torch.Tensor):
        raise AssertionError(  # noqa: TRY004 - a verdict on the student's work, as every check raises
            f"your code's {what} came back as {type(got).__name__}, not a tensor: "
            "return (or leave in place) the tensors the exercise asks for"
        )
    if got.dtype != want.dtype:
        mine, theirs = _dtype(got.dtype), _dtype(want.dtype)
        raise AssertionError(
            f"your function left {mine} {what}; the model is {theirs}: keep the model's dtype "
            f"(a {mine} tensor or .to()/.double() in the step changes it)"
        )
    return got


def _dtype(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` (the student's) agrees with ``b`` (the oracle's) to float32 tolerance.

    A tensor of another dtype, or not a tensor, fails with its reason (:func:`comparable`)."""
    a = comparable(a, b)
    return a.shape == b.shape and torch.allclose(a, b, rtol=RTOL, atol=ATOL)


def ratio(got: torch.Tensor, want: torch.Tensor) -> float | None:
    """The constant factor ``got / want``, if there is one (else None)."""
    got = comparable(got, want)
    mask = want.abs() > 1e-3
    if got.shape != want.shape or not mask.any():
        return None
    r = got[mask] / want[mask]
    return r.median().item() if torch.allclose(r, r.median(), rtol=1e-3) else None


def near(x: float | None, target: float) -> bool:
    return x is not None and abs(x - target) <= 1e-3 * max(1.0, abs(target))
