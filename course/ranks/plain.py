"""Plain data from a rank to its caller: JSON, with tensors as raw bytes, dtype and shape.

A rank that ran a student's code is not trusted: what it sends back must not be able to run
code in the caller, so grading never unpickles it. :func:`dumps` (on the rank) writes None,
bools, numbers, strings, lists, tuples, dicts and dense CPU tensors; :func:`loads` (in the
caller) accepts only that, within size and depth limits, and rebuilds each tensor from its
bytes with ``torch.frombuffer``. Anything else is a :class:`PlainDataError` that says what.
"""

from __future__ import annotations

import base64
import json
import math
import numbers
from typing import Any

import torch

__all__ = ["MAX_BYTES", "PlainDataError", "dumps", "loads", "too_many_values"]

MAX_BYTES = 48 * 2**20  # one rank's reply, encoded (within a message's 64 MiB)
MAX_NODES = 2_000_000  # lists, objects and items in one reply: what decoding may cost
MAX_DEPTH = 32
DTYPES = {
    str(d).removeprefix("torch."): d
    for d in (
        *(torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64),
        *(torch.float16, torch.bfloat16, torch.float32, torch.float64),
        *(torch.complex64, torch.complex128),
    )
}


class PlainDataError(ValueError):
    """A value that is not plain data, or a reply that does not decode as plain data."""


def dumps(value: Any) -> bytes:
    """Encode ``value`` as plain data (on the rank), or say which part cannot be."""
    return json.dumps(_encode(value, 0), allow_nan=True, separators=(",", ":")).encode()


def _encode(value: Any, depth: int) -> Any:  # noqa: PLR0911 - one return per kind of value
    if depth > MAX_DEPTH:
        raise PlainDataError(f"nested deeper than {MAX_DEPTH} levels")
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, torch.Tensor):
        return {"$t": _tensor(value)}
    if isinstance(value, tuple):
        return {"$tuple": [_encode(v, depth + 1) for v in value]}
    if isinstance(value, list):
        return [_encode(v, depth + 1) for v in value]
    if isinstance(value, dict):
        if not all(isinstance(k, str | int) and not isinstance(k, bool) for k in value):
            raise PlainDataError("a dict's keys must be strings or integers")
        return {"$dict": [[k, _encode(v, depth + 1)] for k, v in value.items()]}
    raise PlainDataError(f"a {type(value).__name__} is not plain data")


def _tensor(t: torch.Tensor) -> list:
    t = t.detach().as_subclass(torch.Tensor)
    t = (t.to_dense() if t.layout != torch.strided else t).cpu()
    dtype = str(t.dtype).removeprefix("torch.")
    if dtype not in DTYPES:
        raise PlainDataError(f"a tensor of dtype {t.dtype} is not plain data")
    flat = t.contiguous().reshape(-1)
    raw = flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""
    return [dtype, list(t.shape), base64.b64encode(raw).decode("ascii")]


def loads(data: bytes) -> Any:
    """Decode a rank's reply (in the caller), accepting plain data only."""
    if not isinstance(data, bytes | bytearray) or len(data) > MAX_BYTES:
        raise PlainDataError(f"a reply must be at most {MAX_BYTES} bytes")
    if too_many_values(data):
        raise PlainDataError(f"a reply may hold at most {MAX_NODES} values")
    try:
        tree = json.loads(data)
    except (ValueError, RecursionError) as err:
        raise PlainDataError(f"the reply is not JSON: {err}") from None
    return _decode(tree, 0)


def too_many_values(data: bytes) -> bool:
    """Would parsing ``data`` as JSON build more than MAX_NODES values? Counted before parsing:
    a few MB of ``[[],[],...]`` would otherwise cost the caller gigabytes."""
    return data.count(b"[") + data.count(b"{") + data.count(b",") > MAX_NODES


def _decode(tree: Any, depth: int) -> Any:
    if depth > MAX_DEPTH:
        raise PlainDataError(f"nested deeper than {MAX_DEPTH} levels")
    if tree is None or isinstance(tree, bool | int | float | str):
        return tree
    if isinstance(tree, list):
        return [_decode(v, depth + 1) for v in tree]
    if not isinstance(tree, dict) or len(tree) != 1:
        raise PlainDataError("an object in the reply is not a tagged value")
    ((tag, body),) = tree.items()
    if tag == "$t":
        return _untensor(body)
    if tag == "$tuple" and isinstance(body, list):
        return tuple(_decode(v, depth + 1) for v in body)
    if tag == "$dict" and isinstance(body, list):
        pairs = [p for p in body if isinstance(p, list) and len(p) == 2]
        if len(pairs) != len(body) or not all(_key(k) for k, _ in pairs):
            raise PlainDataError("a dict in the reply is malformed")
        return {k: _decode(v, depth + 1) for k, v in pairs}
    raise PlainDataError(f"unknown tag {tag!r} in the reply")


def _key(k: Any) -> bool:
    return isinstance(k, str) or (isinstance(k, int) and not isinstance(k, bool))


def _untensor(body: Any) -> torch.Tensor:
    if not (isinstance(body, list) and len(body) == 3 and body[0] in DTYPES):
        raise PlainDataError("a tensor in the reply is malformed")
    dtype, shape, text = DTYPES[body[0]], body[1], body[2]
    if not (isinstance(shape, list) and all(_size(s) for s in shape) and isinstance(text, str)):
        raise PlainDataError("a tensor in the reply is malformed")
    try:
        raw = base64.b64decode(text, validate=True)
    except ValueError:
        raise PlainDataError("a tensor's bytes are not base64") from None
    itemsize = torch.empty((), dtype=dtype).element_size()
    if len(raw) != math.prod(shape) * itemsize:
        raise PlainDataError("a tensor's bytes do not match its shape and dtype")
    if not raw:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(raw), dtype=dtype).reshape(shape)


def _size(s: Any) -> bool:
    return isinstance(s, int) and not isinstance(s, bool) and 0 <= s < 2**40
