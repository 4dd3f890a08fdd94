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
    place: tuple[int | None, int] | None = None  # an all-gather of the world: where its rank was


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
_COMBINE |= {"BAND": torch.bitwise_and, "BOR": torch.bitwise_or, "BXOR": torch.bitwise_xor}
OPS = {*_COMBINE, "AVG"}  # gloo's: PREMUL_SUM is refused there too


def _reduce(tensors: Sequence[torch.Tensor], op: str) -> torch.Tensor:
    """The reduction, in group order (not gloo's ring order: sums may differ in the last bit)."""
    if op not in OPS:
        raise RelayError(f"ReduceOp.{op} is not supported on gloo: use one of {sorted(OPS)}")
    _same_shapes(tensors, "reduced")
    out = tensors[0].clone()
    for t in tensors[1:]:
        out = _COMBINE["SUM" if op == "AVG" else op](out, t)
    if op == "AVG":
        return out / len(tensors) if out.is_floating_point() else out // len(tensors)
    return out


def _same_shapes(tensors: Sequence[torch.Tensor], did: str) -> None:
    """Refuse members' tensors of different shapes, naming the ranks but not the shapes (what a
    peer sent is not told to another rank)."""
    odd = [i for i, t in enumerate(tensors) if t.shape != tensors[0].shape]
    if odd:
        ranks = ", ".join(map(str, odd))
        raise RelayError(f"ranks {did} tensors of different shapes: rank(s) {ranks} of the "
                         "group differ from its first")  # fmt: skip


def _root(order: list[Pending]) -> int:
    root = order[0].header["root"]
    if any(p.header.get("root") != root for p in order) or not 0 <= root < len(order):
        raise RelayError("ranks named different roots, or a root outside the group")
    return root


def _splits(order: list[Pending], key: str) -> list | None:
    """The ``key`` splits each member gave (checked by the caller), or None: all even."""
    given = [p.header.get(key) or None for p in order]
    return None if all(g is None for g in given) else given


def compute(kind: str, order: list[Pending]) -> list[bytes]:  # noqa: PLR0911 - one case per collective
    """Each member's result bytes, computed here from what each member sent."""
    tensors = [_tensor(p) for p in order]
    n = len(order)
    if kind in ("barrier", "snapshot"):
        return [b""] * n
    if kind == "allreduce":
        return [raw_bytes(_reduce(tensors, order[0].header["op"]))] * n
    if kind == "reduce":
        root = _root(order)
        total = raw_bytes(_reduce(tensors, order[0].header["op"]))
        return [total if i == root else b"" for i in range(n)]
    if kind == "broadcast":
        root = _root(order)
        return [raw_bytes(tensors[root])] * n
    if kind == "allgather":  # each sends its own; each gets all, in group order
        _same_shapes(tensors, "all-gathered")
        return [b"".join(raw_bytes(t) for t in tensors)] * n
    if kind == "gather":
        root = _root(order)
        _same_shapes(tensors, "gathered")
        return [b"".join(raw_bytes(t) for t in tensors) if i == root else b"" for i in range(n)]
    if kind == "scatter":
        return _scatter(order, tensors)
    if kind == "reduce_scatter":
        return _reduce_scatter(order, tensors)
    if kind == "alltoall":
        return _alltoall(order, tensors)
    raise RelayError(f"the relay knows no collective {kind!r}")


def _scatter(order: list[Pending], tensors: list[torch.Tensor]) -> list[bytes]:
    """The root sent its n pieces stacked; member i gets piece i, of the size it asked for."""
    root, n = _root(order), len(order)
    if tensors[root].dim() == 0 or tensors[root].shape[0] != n:
        raise RelayError(f"the root scattered a list that is not one tensor per rank ({n})")
    pieces = tensors[root].reshape(n, -1)
    wrong = [i for i, p in enumerate(order) if p.header.get("into") != pieces[i].numel()]
    if wrong:
        raise RelayError(f"rank(s) {', '.join(map(str, wrong))} of the group received a scatter "
                         "into a tensor whose size is not the root's piece for it")  # fmt: skip
    return [raw_bytes(pieces[i]) for i in range(n)]


def _reduce_scatter(order: list[Pending], tensors: list[torch.Tensor]) -> list[bytes]:
    """Each sends its whole input and gets the reduction of its own piece: equal rows, or the
    ``splits`` (elements per member) each gave, the same on every member."""
    total, n = _reduce(tensors, order[0].header["op"]), len(order)
    splits = _splits(order, "splits")
    if splits is None:
        if total.dim() == 0 or total.shape[0] % n:
            raise RelayError(f"a reduce-scatter whose rows do not split evenly over {n} ranks")
        return [raw_bytes(c) for c in total.chunk(n)]
    first = splits[0]
    if any(s != first for s in splits) or len(first) != n or sum(first) != total.numel():
        raise RelayError("ranks reduce-scattered lists of different sizes")
    return [raw_bytes(c) for c in total.reshape(-1).split(first)]


def _alltoall(order: list[Pending], tensors: list[torch.Tensor]) -> list[bytes]:
    """Member src's rows split by its ``in_split`` (even when none); member dst gets the dst-th
    piece of each, in group order, which must be its ``out_split`` rows."""
    n = len(order)
    parts = []
    for p, t in zip(order, tensors, strict=True):
        rows = t.shape[0] if t.dim() else 0
        split = p.header.get("in_split") or ([rows // n] * n if rows % n == 0 else None)
        if split is None or len(split) != n or sum(split) != rows:
            raise RelayError(f"rank {p.rank}'s all-to-all input does not split as it said")
        parts.append(t.split(split))
    out = []
    for dst, p in enumerate(order):
        want = p.header.get("out_split")
        got = [parts[src][dst] for src in range(n)]
        if want and [g.shape[0] for g in got] != want:
            raise RelayError(f"rank {p.rank}'s all-to-all output splits do not match what the "
                             "others send it")  # fmt: skip
        out.append(b"".join(raw_bytes(g) for g in got))
    return out
