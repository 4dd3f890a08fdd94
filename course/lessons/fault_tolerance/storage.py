"""A checkpoint's storage, as an object store gives it: objects written whole, read by range.

    storage = Storage("/tmp/ckpt")                # in the caller; handed to every rank
    storage.put("exp_avg/0-8", shard)             # on a rank: a tensor's elements, flattened
    storage.list()                                # every object's key, sorted
    storage.get("exp_avg/0-8", 2, 5)              # elements 2:5 of that object, a 1-D tensor
    storage.got, storage.log                      # this rank's copy: bytes read; every put and get

Cloud checkpoints are written this way (``torch.distributed.checkpoint`` writes one file per
rank plus an index, and an object store serves byte ranges), so a rank that loads a
sharded checkpoint can read only the elements it needs. On gloo the objects are files under
``path`` (``<key>.bin`` beside ``<key>.json``, the key's ``/`` as ``%2F``), and each rank
counts its own bytes. On the relay (under grading) the same calls go to the relay's storage
(:mod:`course.ranks.objects`), which the caller holds and counts, and ``path`` is not used.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from urllib.parse import quote, unquote

import torch

from course.ranks import relay
from course.ranks.frames import DTYPES, describe, raw_bytes
from course.ranks.objects import Stored, key_error, range_error

__all__ = ["Storage", "read_objects", "write_objects"]


class Storage:
    """A checkpoint's storage: ``put`` whole objects, ``get`` element ranges, ``list`` keys."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = str(path)
        self.log: list[tuple[str, str, int]] = []  # (put or get, key, bytes), in order

    def __repr__(self) -> str:
        return f"Storage({self.path!r})"

    @property
    def got(self) -> int:
        """The bytes this copy of the storage read (its gets), on this rank."""
        return sum(nbytes for op, _key, nbytes in self.log if op == "get")

    def put(self, key: str, tensor: torch.Tensor) -> None:
        """Write ``tensor``'s elements, flattened, as the object ``key`` (replacing one there)."""
        if not isinstance(tensor, torch.Tensor) or tensor.dtype not in DTYPES.values():
            raise TypeError(f"put({key!r}, ...) stores a CPU tensor, got {type(tensor).__name__}")
        _valid(key)
        flat = tensor.detach().reshape(-1).contiguous()
        if relay.relayed():
            relay.put(key, flat)
        else:
            _write(Path(self.path), key, Stored(describe(flat)["dtype"], raw_bytes(flat)))
        self.log.append(("put", key, flat.numel() * flat.element_size()))

    def get(self, key: str, start: int | None = None, stop: int | None = None) -> torch.Tensor:
        """Elements ``start:stop`` of the object ``key`` (its first and last by default), as a
        new 1-D tensor; only those elements' bytes are read."""
        _valid(key)
        if relay.relayed():
            out = relay.get(key, start, stop)
        else:
            out = _read_range(Path(self.path), key, start, stop)
        self.log.append(("get", key, out.numel() * out.element_size()))
        return out

    def list(self) -> list[str]:
        """Every object's key, sorted."""
        if relay.relayed():
            return relay.keys()
        return sorted(unquote(p.name[: -len(".json")]) for p in Path(self.path).glob("*.json"))


def read_objects(path: str | os.PathLike) -> dict[str, Stored]:
    """Every object under ``path``, whole (the caller's view of a gloo run's storage)."""
    root = Path(path)
    return {key: _read(root, key) for key in Storage(root).list()}


def write_objects(path: str | os.PathLike, objects: dict[str, Stored]) -> None:
    """Make ``path`` hold exactly ``objects``."""
    root = Path(path)
    for old in [*root.glob("*.json"), *root.glob("*.bin")]:
        old.unlink()
    for key, stored in objects.items():
        _write(root, key, stored)


# --- files ------------------------------------------------------------------------------


def _valid(key: str) -> None:
    why = key_error(key)
    if why:
        raise ValueError(why)


def _files(root: Path, key: str) -> tuple[Path, Path]:
    name = quote(key, safe="")
    return root / f"{name}.json", root / f"{name}.bin"


def _write(root: Path, key: str, stored: Stored) -> None:
    meta, data = _files(root, key)
    root.mkdir(parents=True, exist_ok=True)
    data.write_bytes(stored.data)
    meta.write_text(json.dumps({"dtype": stored.dtype, "numel": stored.numel}))


def _meta(root: Path, key: str) -> tuple[str, int]:
    meta, _ = _files(root, key)
    if not meta.exists():
        raise KeyError(f"get({key!r}): the storage holds no object of that key")
    info = json.loads(meta.read_text())
    return info["dtype"], int(info["numel"])


def _read(root: Path, key: str) -> Stored:
    dtype, _ = _meta(root, key)
    return Stored(dtype, _files(root, key)[1].read_bytes())


def _read_range(root: Path, key: str, start: int | None, stop: int | None) -> torch.Tensor:
    dtype, numel = _meta(root, key)
    start = 0 if start is None else start
    stop = numel if stop is None else stop
    why = range_error(key, start, stop, numel)
    if why:
        raise ValueError(why)
    size = DTYPES[dtype].itemsize
    with _files(root, key)[1].open("rb") as f:
        f.seek(start * size)
        return Stored(dtype, f.read((stop - start) * size)).tensor()
