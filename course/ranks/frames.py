"""The relay's wire: how a rank and the relay frame a request, and what each side checks.

A frame is two lengths (``LEN``: header, payload), a JSON header and the payload's bytes: a
tensor's raw bytes, described by the header's ``dtype`` and ``shape``. Both sides refuse a
frame over its caps; the relay (:mod:`course.ranks.router`) also checks that a payload is
exactly the tensor its header describes (:func:`check_bytes`). What the relay records of a
run is a list of :class:`Event`.
"""

from __future__ import annotations

import json
import socket
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = [
    "COLLECTIVES", "DEADLOCK", "DTYPES", "LEN", "MAX_FRAME", "MAX_HEADER", "Event", "RelayError",
    "check_bytes", "check_recv", "describe", "fill_from", "fill_prefix", "frame", "raw_bytes",
    "read_frame", "recv_exact",
]  # fmt: skip


MAX_FRAME = 64 * 2**20  # bytes of one request's payload
MAX_HEADER = 64 * 2**10
_CARRIED = (torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64)
_CARRIED += (torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool)
_CARRIED += (torch.complex64, torch.complex128)  # gloo's dtypes: no uint16..64, no float8
DTYPES = {str(t).removeprefix("torch."): t for t in _CARRIED}
COLLECTIVES = {"allreduce", "broadcast", "allgather", "reduce_scatter", "barrier", "alltoall"}
COLLECTIVES |= {"reduce", "gather", "scatter"}
COLLECTIVES |= {"snapshot"}  # a barrier of every rank at which the relay measures their memory
LEN = struct.Struct(">II")  # header length, payload length
# What the relay says first when it fails the waits of a deadlock it found: gloo would wait
# each out (course.ranks.router; course.ranks.report words the rank's failure from it).
DEADLOCK = (
    "deadlock: every rank has finished or waits in a call that no rank left can match (on gloo "
    "each would wait out its timeout)"
)


class RelayError(RuntimeError):
    """A call the relay refused or could not complete: the message says why, for a student."""


@dataclass(frozen=True)
class Event:
    """One message or collective, as the relay saw it.

    ``kind`` is ``send`` (``src`` to ``dst``, recorded when the relay received it), ``recv``
    (the same message, recorded when the relay delivered it to ``dst``), ``mark`` (rank
    ``src`` marked the ``tag``-th part of its run: see :func:`mark`), ``snapshot`` (every
    rank stopped at snapshot ``tag``: ``memory`` is the bytes each held, ``box`` the whole
    sandbox's, -1 where not measured, ``held`` the bytes sent that no rank had yet received;
    see :mod:`course.ranks.memory`), ``put`` or ``get`` (rank ``src`` wrote or read ``nbytes``
    of the storage's object ``op``: :mod:`course.ranks.objects`), ``killed`` (the fault plan
    killed rank ``src`` in its part ``tag``) or ``quorum`` (a round of ``quorum()`` answered
    with the ranks of ``group``: :mod:`course.ranks.faults`) or a collective (``dst`` = -1,
    ``src`` its root's global rank where it has one, a broadcast's, scatter's, gather's or
    reduce's, else -1; ``nbytes`` the bytes each member contributed, in group order). ``group``
    is the tuple of global ranks it ran in; ``seq`` the position of the call among its
    rank's requests (a collective: each member's, in group order), so a rank's events can
    be put in the order it made them; a collective's ``arrived``, when each member's call
    reached the relay (seconds from its start, as ``time``, when it completed). With
    ``Relay(keep=True)`` a send or recv keeps its ``data``, the bytes as sent.
    """

    kind: str
    group: tuple[int, ...]
    src: int = -1
    dst: int = -1
    tag: int = 0
    nbytes: tuple[int, ...] = ()
    dtype: str = ""
    op: str = ""
    time: float = 0.0
    seq: tuple[int, ...] = ()
    data: bytes = field(default=b"", repr=False, compare=False)
    memory: tuple[int, ...] = ()
    box: int = -1
    held: int = 0
    arrived: tuple[float, ...] = ()


def frame(header: dict[str, Any], payload: bytes = b"") -> bytes:
    """One request or reply, framed."""
    raw = json.dumps(header, separators=(",", ":")).encode()
    return LEN.pack(len(raw), len(payload)) + raw + payload


def recv_exact(sock: socket.socket, n: int) -> bytes:
    """Exactly ``n`` bytes from a blocking socket (ConnectionError if it closes first)."""
    chunks, left = [], n
    while left:
        chunk = sock.recv(min(left, 2**20))
        if not chunk:
            raise ConnectionError("the relay's peer closed its socket")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def read_frame(sock: socket.socket) -> tuple[dict[str, Any], bytes]:
    hlen, plen = LEN.unpack(recv_exact(sock, LEN.size))
    if hlen > MAX_HEADER or plen > MAX_FRAME:
        raise RelayError(f"a message of {plen} bytes is over the relay's {MAX_FRAME} bytes")
    header = json.loads(recv_exact(sock, hlen))
    if not isinstance(header, dict):
        raise RelayError("a request that is not an object")
    return header, recv_exact(sock, plen)


def check_recv(header: dict[str, Any], group: tuple[int, ...], rank: int) -> None:
    """A receive names a peer in its group (or any, ``-1``), an int tag and a tensor the
    relay carries."""
    src, tag = header.get("src"), header.get("tag", 0)
    anyone = src == -1 and type(src) is int
    if not anyone and (not isinstance(src, int) or src not in group or src == rank):
        raise RelayError(f"rank {rank} received from {src!r}, which is not a peer in its group")
    if not isinstance(tag, int):
        raise RelayError(f"a receive's tag must be an int, not {tag!r}")
    check_bytes(header, b"", sized=False)


def check_bytes(header: dict[str, Any], payload: bytes, sized: bool = True) -> None:
    """The payload is exactly the tensor the header describes (``sized=False``: a tensor the
    relay could carry, for a receive, which sends none)."""
    dtype = DTYPES.get(header.get("dtype", ""))
    shape = header.get("shape")
    if dtype is None:
        raise RelayError(f"the relay carries no tensors of dtype {header.get('dtype')!r}")
    if not isinstance(shape, list) or not all(isinstance(s, int) and s >= 0 for s in shape):
        raise RelayError("a tensor without a shape of non-negative sizes")
    numel = 1
    for s in shape:
        numel *= s
    itemsize = torch.empty((), dtype=dtype).element_size()
    if not sized:
        if numel * itemsize > MAX_FRAME:
            raise RelayError(f"a tensor of {shape} is over the relay's {MAX_FRAME} bytes")
    elif numel * itemsize != len(payload):
        raise RelayError(f"{len(payload)} bytes sent for a {header['dtype']} tensor of {shape}")


def raw_bytes(t: torch.Tensor) -> bytes:
    """A tensor's bytes, as a frame carries them."""
    return t.contiguous().view(-1).view(torch.uint8).numpy().tobytes()


def describe(t: torch.Tensor) -> dict[str, Any]:
    """A tensor's dtype and shape, as a request's header names them."""
    return {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape)}


def fill_from(targets: Sequence[torch.Tensor]) -> Any:
    """A reply handler that copies the reply's bytes, in order, into ``targets``."""

    def fill(_header: dict[str, Any], payload: bytes) -> list[torch.Tensor]:
        view = memoryview(payload)
        at = 0
        with torch.no_grad():
            for t in targets:
                n = t.numel() * t.element_size()
                if n:
                    src = torch.frombuffer(bytearray(view[at : at + n]), dtype=torch.uint8)
                    t.detach().copy_(src.view(t.dtype).reshape(t.shape))
                at += n
        return list(targets)

    return fill


def fill_prefix(t: torch.Tensor, payload: bytes) -> list[torch.Tensor]:
    """Copy a received message into the first bytes of ``t``, as gloo does: a message may be
    smaller than the buffer posted for it (the relay refuses a larger one)."""
    if payload:
        src = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
        with torch.no_grad():
            t.detach().view(-1).view(torch.uint8)[: len(payload)].copy_(src)
    return [t]
