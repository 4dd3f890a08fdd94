"""The 2**r encoding on tensors: rank r's input says, in every element, who it came from.

Rank r holds ``(1 + i * 2**N) * 2**r`` at index i (float64), so any partial sum of chunks
spells out which ranks it holds and where in the tensor it starts (``trace.decode``, the
pure form). The recorder decodes every payload it sees with :func:`decode_tensor`.
"""

from __future__ import annotations

import math

import torch

__all__ = ["check_encodable", "decode_tensor", "encoded_tensor", "max_numel"]


def encoded_tensor(rank: int, numel: int, world_size: int) -> torch.Tensor:
    """Rank ``rank``'s encoded float64 input (``trace.encoded_value`` in every element)."""
    scale = float(1 << world_size)
    return (1 + torch.arange(numel, dtype=torch.float64) * scale) * float(1 << rank)


def decode_tensor(
    payload: torch.Tensor, world_size: int, bits: int | None = None
) -> tuple[int | None, int | None]:
    """``course.ring.trace.decode`` of a whole payload, vectorised: ``(offset, holds)`` or Nones.

    ``bits`` (default ``world_size``): the width of the marks, for inputs whose ranks were
    given other bits than their own numbers (``course.ring.relayed``).
    """
    flat = payload.detach().reshape(-1)
    if flat.numel() == 0 or flat.is_complex() or flat.dtype == torch.bool:
        return None, None
    values = flat.to(torch.float64)
    first = values[0].item()
    scale = 1 << (world_size if bits is None else bits)
    if first == 0:
        return (None, 0) if not values.any() else (None, None)
    if not math.isfinite(first) or first < 0 or first != int(first) or first >= 2**53:
        return None, None
    mask = int(first) % scale
    if mask == 0 or (int(first) - mask) % (mask * scale):
        return None, None
    offset = (int(first) - mask) // (mask * scale)
    index = torch.arange(offset, offset + flat.numel(), dtype=torch.float64)
    expected = (1 + index * float(scale)) * float(mask)
    return (offset, mask) if torch.equal(values, expected) else (None, None)


def max_numel(world_size: int) -> int:
    """The most elements a run on ``world_size`` ranks can record exactly (at least 1 up to
    N = 52): 2**N * (1 + (numel - 1) * 2**N) < 2**53."""
    scale = 1 << world_size
    return max(1, ((1 << 53) - scale - 1) // (scale * scale) + 1)


def check_encodable(world_size: int, numel: int) -> None:
    """Refuse sizes whose encoded values would not be exact in float64."""
    if numel and (1 << world_size) * (1 + (numel - 1) * (1 << world_size)) >= 2**53:
        raise ValueError(
            f"numel={numel} on {world_size} ranks is too large to record exactly: the encoded "
            "values need 2**N * (1 + numel * 2**N) < 2**53. Use fewer elements or ranks."
        )
