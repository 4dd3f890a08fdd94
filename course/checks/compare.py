"""Numbers the checks compare: gradients to float32 tolerance, constant factors, seeds."""

from __future__ import annotations

import random

import torch

__all__ = ["ATOL", "RTOL", "close", "fresh_seed", "near", "ratio"]

RTOL, ATOL = 1e-4, 1e-5


def fresh_seed(seed: int | None) -> int:
    """A new random seed unless one is given (failure messages print it to replay a case)."""
    return random.randrange(2**31) if seed is None else seed  # noqa: S311 - a seed for test data, not a secret


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two gradients agree to float32 tolerance."""
    return a.shape == b.shape and torch.allclose(a, b, rtol=RTOL, atol=ATOL)


def ratio(got: torch.Tensor, want: torch.Tensor) -> float | None:
    """The constant factor ``got / want``, if there is one (else None)."""
    mask = want.abs() > 1e-3
    if got.shape != want.shape or not mask.any():
        return None
    r = got[mask] / want[mask]
    return r.median().item() if torch.allclose(r, r.median(), rtol=1e-3) else None


def near(x: float | None, target: float) -> bool:
    return x is not None and abs(x - target) <= 1e-3 * max(1.0, abs(target))
