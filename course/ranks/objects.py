"""Storage the relay keeps for its ranks: objects written whole, read back by element range.

    objects = Objects({"exp_avg/0-4": Stored("float32", b"...")})   # what a launch starts with
    objects.put(key, header, payload)            # a rank's put: a 1-D tensor's bytes
    objects.get(key, start, stop)                # a ranged get: (dtype, the elements' bytes)
    objects.keys()                               # every key, sorted

This is a checkpoint's storage as an object store gives it (whole objects written, byte
ranges read, as from S3 or GCS). Under grading the relay carries each rank's puts and gets
(:mod:`course.ranks.relay`'s ``put``, ``get`` and ``keys``), so what each rank wrote and
read is in the relay's own record (events ``put`` and ``get``, ``nbytes`` the bytes moved),
and what the storage holds after a launch is the caller's, never a rank's report. A request
that breaks the limits or asks for what is not there fails that call with the reason.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import torch

from course.ranks.frames import DTYPES, RelayError, check_bytes

__all__ = ["KEY", "MAX_KEYS", "MAX_STORED", "Objects", "Stored", "key_error", "range_error"]

MAX_STORED = 64 * 2**20  # bytes the storage holds, in all
MAX_KEYS = 4096
KEY = re.compile(r"[A-Za-z0-9_.:=/-]{1,200}")


@dataclass(frozen=True)
class Stored:
    """One object: its elements' dtype (a name of ``DTYPES``) and raw bytes."""

    dtype: str
    data: bytes

    @property
    def numel(self) -> int:
        return len(self.data) // DTYPES[self.dtype].itemsize

    def tensor(self) -> torch.Tensor:
        """The object as a 1-D tensor (a copy)."""
        if not self.data:
            return torch.empty(0, dtype=DTYPES[self.dtype])
        return torch.frombuffer(bytearray(self.data), dtype=DTYPES[self.dtype])


def key_error(key: Any) -> str | None:
    """Why ``key`` cannot name an object, or None."""
    if not isinstance(key, str) or not KEY.fullmatch(key):
        said = repr(key)[:200]
        return f"a key must be a string of 1 to 200 letters, digits and _ . : = / -, got {said}"
    return None


def range_error(key: str, start: Any, stop: Any, numel: int) -> str | None:
    """Why ``start:stop`` is not a range of the ``numel`` elements of object ``key``, or None."""
    ints = all(isinstance(v, int) and not isinstance(v, bool) for v in (start, stop))
    if not ints or not 0 <= start <= stop <= numel:
        return (
            f"get({key!r}, {start!r}, {stop!r}): start and stop must be whole numbers with "
            f"0 <= start <= stop <= {numel}, the object's number of elements"
        )[:400]
    return None


class Objects:
    """The objects of one launch's storage, by key."""

    def __init__(self, start: dict[str, Stored] | None = None) -> None:
        self.held: dict[str, Stored] = dict(start or {})

    def put(self, key: Any, header: dict[str, Any], payload: bytes) -> Stored:
        """Store a rank's tensor (flattened) under ``key``, replacing what was there."""
        why = key_error(key)
        if why:
            raise RelayError(why)
        check_bytes(header, payload)
        old = self.held.get(key)
        total = sum(len(s.data) for s in self.held.values()) - (len(old.data) if old else 0)
        if total + len(payload) > MAX_STORED:
            raise RelayError(f"the storage holds at most {MAX_STORED >> 20} MB")
        if old is None and len(self.held) >= MAX_KEYS:
            raise RelayError(f"the storage holds at most {MAX_KEYS} objects")
        stored = Stored(header["dtype"], payload)
        self.held[key] = stored
        return stored

    def get(self, key: Any, start: Any, stop: Any) -> tuple[str, bytes]:
        """Elements ``start:stop`` of object ``key`` (Nones: its first and its last)."""
        why = key_error(key)
        if why:
            raise RelayError(why)
        if key not in self.held:
            raise RelayError(f"get({key!r}): the storage holds no object of that key")
        stored = self.held[key]
        start = 0 if start is None else start
        stop = stored.numel if stop is None else stop
        why = range_error(key, start, stop, stored.numel)
        if why:
            raise RelayError(why)
        size = DTYPES[stored.dtype].itemsize
        return stored.dtype, stored.data[start * size : stop * size]

    def keys(self) -> list[str]:
        return sorted(self.held)
