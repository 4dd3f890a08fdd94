"""The tensors a ring is graded on: every world size, sizes that do and don't divide by N.

Each rank's input is made by the checker (seeded), never by the ranks, so the oracle the
verdict compares with cannot be touched by the code under test.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["DTYPES", "Case", "inputs", "pattern_cases", "sum_cases"]

DTYPES = (torch.float32, torch.float64, torch.int32, torch.int64)


@dataclass(frozen=True)
class Case:
    """One call of the student's function: a tensor shape and dtype, or a recorded run."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    recorded: bool = False

    def __str__(self) -> str:
        dtype = str(self.dtype).removeprefix("torch.")
        kind = " (recorded, encoded inputs)" if self.recorded else ""
        return f"a {dtype} tensor of shape {tuple(self.shape)}{kind}"


def sum_cases(world_size: int) -> list[Case]:
    """Tensors for one world size: each shape in two dtypes, every dtype in several shapes."""
    n = world_size
    shapes = [(1,), (n - 1 or 1,), (4 * n,), (4 * n + 3,), (3, n + 1), (2, 3, 5), (5, 1, 7)]
    return [
        Case(shape, DTYPES[(i + k) % len(DTYPES)]) for i, shape in enumerate(shapes) for k in (0, 1)
    ]


def pattern_cases(world_size: int) -> list[Case]:
    """Recorded runs: uneven, fewer elements than ranks, even."""
    n = world_size
    return [Case((numel,), torch.float64, True) for numel in (3 * n + 1, n - 1 or 1, 4 * n)]


def inputs(case: Case, world_size: int, seed: int) -> list[torch.Tensor]:
    """Each rank's input for a sums case, made here so the ranks cannot change the oracle."""
    g = torch.Generator().manual_seed(seed)
    if case.dtype.is_floating_point:
        return [torch.randn(case.shape, generator=g).to(case.dtype) for _ in range(world_size)]
    return [
        torch.randint(-99, 100, case.shape, generator=g, dtype=case.dtype)
        for _ in range(world_size)
    ]
