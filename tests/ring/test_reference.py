"""The reference ring: does it sum like dist.all_reduce, for any size, shape and dtype?"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from course.instructor.reference import ring_allreduce

pytestmark = pytest.mark.ranks

DTYPES = [torch.float32, torch.float64, torch.int32, torch.int64]
TOL = {torch.float32: 1e-5, torch.float64: 1e-12}  # inputs are ~100: atol covers cancellation


def against_all_reduce(shapes: list[tuple[int, ...]]) -> list[str]:
    """On each rank: ring_allreduce and dist.all_reduce on the same inputs; list mismatches."""
    rank, bad = dist.get_rank(), []
    for i, shape in enumerate(shapes):
        for dtype in DTYPES:
            g = torch.Generator().manual_seed(1000 * i + rank)
            x = torch.randn(shape, generator=g) * 100
            x = x.to(dtype)
            ours, theirs = x.clone(), x.clone()
            assert ring_allreduce(ours) is None
            dist.all_reduce(theirs)
            same = (
                torch.equal(ours, theirs)
                if not dtype.is_floating_point
                else torch.allclose(ours, theirs, rtol=TOL[dtype], atol=TOL[dtype] * 100)
            )
            if not same or ours.shape != x.shape or ours.dtype != dtype:
                bad.append(f"{shape} {dtype}")
    return bad


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_matches_all_reduce_on_shapes_and_dtypes(run_ranks, world_size: int) -> None:
    """Equal to dist.all_reduce: exactly on integers, to float tolerance on floats?"""
    shapes = [(), (1,), (world_size - 1,), (5 * world_size,), (5 * world_size + 2,), (3, 4, 5)]
    assert run_ranks(against_all_reduce, world_size, shapes) == [[]] * world_size


def non_contiguous() -> bool:
    """A transposed (non-contiguous) tensor is summed in place too."""
    x = torch.arange(12.0).reshape(3, 4).t() * (dist.get_rank() + 1)
    ring_allreduce(x)
    return torch.equal(x, torch.arange(12.0).reshape(3, 4).t() * 3)


def test_non_contiguous_tensor(run_ranks) -> None:
    """Does a non-contiguous tensor come back summed, in place?"""
    assert run_ranks(non_contiguous, 2) == [True, True]


@settings(
    max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    world_size=st.integers(2, 5),
    lengths=st.lists(st.integers(0, 40), min_size=1, max_size=8),
)
def test_uneven_lengths(run_ranks, world_size: int, lengths: list[int]) -> None:
    """Any world size and lengths that do not divide evenly (many lengths per launch)?"""
    shapes = [(n,) for n in lengths]
    assert run_ranks(against_all_reduce, world_size, shapes) == [[]] * world_size
