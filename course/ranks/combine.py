"""The collectives the relay computes: each member's result, from what each member sent.

The relay (:mod:`course.ranks.router`) keeps each member's call as a :class:`Pending` in the
group's :class:`Call` and, once every member has made it, calls :func:`compute`: the bytes
each gets back are computed here, in the caller, with torch, from the tensors the members'
frames carried. Reductions run in group order (not gloo's ring order: a float sum may differ
from gloo's in the last bit).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from course.ranks.frames import DTYPES, RelayError, raw_bytes

__all__ = ["OPS", "Call", "Pending", "compute"]


@dataclass
class Pending:
    """A receive or a collective call waiting for its peers."""

    rank: int
    req: int
    since: float
    header: dict[str, Any]
    payload: bytes = b""
    seq: int = 0


@dataclass
class Call:
    """The n-th collective call on one group: what each member sent, as they arrive."""

    group: tuple[int, ...]
    calls: dict[int, Pending] = field(default_factory=dict)


def _tensor(p: Pending) -> torch.Tensor:
    dtype = DTYPES[p.header["dtype"]]
    if not p.payload:
        return torch.empty(p.header["shape"], dtype=dtype)
    flat = torch.frombuffer(bytearray(p.payload), dtype=torch.uint8).view(dtype)
    return flat.reshape(p.header["shape"])


_COMBINE = {"SUM": torch.add, "PRODUCT": torch.mul, "MIN": torch.minimum, "MAX": torch.maximum}
OPS = {*_COMBINE, "AVG"}


def _reduce(tensors: Sequence[torch.Tensor], op: str) -> torch.Tensor:
    """The reduction, in group order (not gloo's ring order: sums may differ in the last bit)."""
    if op not in OPS:
        raise RelayError(f"the relay reduces with {sorted(OPS)}, not {op}")
    if len({(t.shape, t.dtype) for t in tensors}) != 1:
        shapes = ", ".join(str(tuple(t.shape)) for t in tensors)
        raise RelayError(f"ranks reduced tensors of different shapes: {shapes}")
    out = tensors[0].clone()
    for t in tensors[1:]:
        out = _COMBINE["SUM" if op == "AVG" else op](out, t)
    if op == "AVG":
        return out / len(tensors) if out.is_floating_point() else out // len(tensors)
    return out


def compute(kind: str, order: list[Pending]) -> list[bytes]:  # noqa: C901 - one case per collective
    """Each member's result bytes, computed here from what each member sent."""
    tensors = [_tensor(p) for p in order]
    n = len(order)
    if kind in ("barrier", "snapshot"):
        return [b""] * n
    if kind == "allreduce":
        return [raw_bytes(_reduce(tensors, order[0].header["op"]))] * n
    if kind == "broadcast":
        root = order[0].header["root"]
        if any(p.header["root"] != root for p in order):
            raise RelayError("ranks broadcast from different roots")
        return [raw_bytes(tensors[root])] * n
    if kind == "allgather":  # each sends its own; each gets all, in group order
        if len({t.shape for t in tensors}) != 1:
            raise RelayError("ranks all-gathered tensors of different shapes")
        return [b"".join(raw_bytes(t) for t in tensors)] * n
    if kind == "reduce_scatter":  # each sends its whole input, gets the sum of its own chunk
        total = _reduce(tensors, order[0].header["op"])
        if total.shape[0] % n:
            raise RelayError(f"a reduce-scatter of {total.shape[0]} rows over {n} ranks")
        return [raw_bytes(c) for c in total.chunk(n)]
    if kind == "alltoall":
        if any(t.shape[0] % n for t in tensors):
            raise RelayError("an all-to-all whose rows do not split evenly over the ranks")
        parts = [t.chunk(n) for t in tensors]
        return [b"".join(raw_bytes(parts[src][dst]) for src in range(n)) for dst in range(n)]
    raise RelayError(f"the relay knows no collective {kind!r}")
