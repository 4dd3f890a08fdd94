"""A torch.distributed backend whose every message passes through the launching process.

    relay = Relay(world_size=3, timeout=10.0)      # in the caller (the judge, when grading)
    ...each rank r gets relay.ends[r] and calls join(end, r, 3, timeout)...
    relay.events                                   # every send, recv and collective, as seen

On the ranks, ``join`` makes ``"relay"`` the default process group: ``dist.send``,
``dist.all_reduce``, DDP's buckets, ``all_gather_into_tensor``, ``new_group`` and every
other route to a collective end in :class:`RelayGroup`, which sends the request and its
bytes down one socket to the caller. There is no store, no port and no peer address:
a rank can reach another only through the :class:`Relay`, which routes point-to-point
messages, computes collectives itself, and records each as an :class:`Event` from what it
received, not from what a rank says it did.

The caller also keeps the deadlines: a receive or a collective that its peers never match
fails after ``timeout`` seconds with a message that names who was waited for, and a frame
that is malformed, too large or inconsistent (a send whose bytes do not match its shape)
fails that rank's call, never the caller.

Costs: every byte crosses two sockets and the caller's Python loop, and the caller holds what
was sent until it is received (at most ``MAX_HELD`` bytes): fine for the small tensors of
grading checks, not a fast path for training.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any, Self

import torch
import torch.distributed as dist
from torch.futures import Future

__all__ = ["BACKEND", "Event", "Relay", "RelayError", "RelayGroup", "join", "mark"]

BACKEND = "relay"
MAX_FRAME = 64 * 2**20  # bytes of one request's payload
MAX_HEADER = 64 * 2**10
MAX_HELD = 256 * 2**20  # bytes of sent messages the relay holds for receivers, in all
MAX_KEPT = 64 * 2**20  # bytes of messages a Relay(keep=True) records, in all
_CARRIED = (torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64)
_CARRIED += (torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool)
DTYPES = {str(t).removeprefix("torch."): t for t in _CARRIED}
COLLECTIVES = {"allreduce", "broadcast", "allgather", "reduce_scatter", "barrier", "alltoall"}
_LEN = struct.Struct(">II")  # header length, payload length


class RelayError(RuntimeError):
    """A call the relay refused or could not complete: the message says why, for a student."""


@dataclass(frozen=True)
class Event:
    """One message or collective, as the relay saw it.

    ``kind`` is ``send`` (``src`` to ``dst``, recorded when the relay received it), ``recv``
    (the same message, recorded when the relay delivered it to ``dst``), ``mark`` (rank
    ``src`` marked the ``tag``-th part of its run: see :func:`mark`) or a collective (``src``
    = ``dst`` = -1, ``nbytes`` the bytes each member contributed, in group order). ``group``
    is the tuple of global ranks it ran in; ``seq`` the position of the call among its
    rank's requests (a collective: each member's, in group order), so a rank's events can
    be put in the order it made them. With ``Relay(keep=True)`` a send or recv keeps its
    ``data``, the bytes as sent.
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


def _frame(header: dict[str, Any], payload: bytes = b"") -> bytes:
    raw = json.dumps(header, separators=(",", ":")).encode()
    return _LEN.pack(len(raw), len(payload)) + raw + payload


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    chunks, left = [], n
    while left:
        chunk = sock.recv(min(left, 2**20))
        if not chunk:
            raise ConnectionError("the relay's peer closed its socket")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _read_frame(sock: socket.socket) -> tuple[dict[str, Any], bytes]:
    hlen, plen = _LEN.unpack(_recv_exact(sock, _LEN.size))
    if hlen > MAX_HEADER or plen > MAX_FRAME:
        raise RelayError(f"a message of {plen} bytes is over the relay's {MAX_FRAME} bytes")
    header = json.loads(_recv_exact(sock, hlen))
    if not isinstance(header, dict):
        raise RelayError("a request that is not an object")
    return header, _recv_exact(sock, plen)


# ---------------------------------------------------------------------------------------
# The caller's side: the router.


@dataclass
class _Pending:
    """A receive or a collective call waiting for its peers."""

    rank: int
    req: int
    since: float
    header: dict[str, Any]
    payload: bytes = b""
    seq: int = 0


@dataclass
class _Call:
    """The n-th collective call on one group: what each member sent, as they arrive."""

    group: tuple[int, ...]
    calls: dict[int, _Pending] = field(default_factory=dict)


class Relay:
    """The router between ``world_size`` ranks: one socket pair per rank, a thread in here."""

    def __init__(self, world_size: int, timeout: float, keep: bool = False) -> None:
        """``keep``: record the bytes of every message (at most ``MAX_KEPT`` in all)."""
        self.world_size, self.timeout, self.keep = world_size, timeout, keep
        self._seq = [0] * world_size  # requests read from each rank so far
        self._kept = 0
        pairs = [socket.socketpair() for _ in range(world_size)]
        self.ends = [theirs for _, theirs in pairs]  # hand end r to rank r, then close_ends()
        self._mine = [mine for mine, _ in pairs]
        self.events: list[Event] = []
        self._mail: dict[tuple[tuple[int, ...], int, int, int], deque[tuple[dict, bytes]]] = {}
        self._recvs: list[_Pending] = []
        self._calls: dict[tuple[tuple[int, ...], int], _Call] = {}
        self._count: dict[tuple[tuple[int, ...], int], int] = {}  # (group, rank) -> calls made
        self._out: dict[int, bytearray] = {r: bytearray() for r in range(world_size)}
        self._held = 0  # bytes in _mail
        self._sel = selectors.DefaultSelector()
        self._stop = threading.Event()
        self._start = time.monotonic()
        self._thread = threading.Thread(target=self._serve, name="relay", daemon=True)

    def __enter__(self) -> Self:
        for rank, sock in enumerate(self._mine):
            sock.setblocking(False)
            self._sel.register(sock, selectors.EVENT_READ, rank)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        for sock in [*self._mine, *self.ends]:
            sock.close()
        self._sel.close()

    def close_ends(self) -> None:
        """Close this process's copies of the ranks' ends, once the ranks hold them."""
        for sock in self.ends:
            sock.close()

    # -- the loop ------------------------------------------------------------------------

    def _serve(self) -> None:
        buffers = {r: bytearray() for r in range(self.world_size)}
        while not self._stop.is_set():
            for key, mask in self._sel.select(timeout=0.05):
                rank = key.data
                if mask & selectors.EVENT_READ:
                    try:
                        data = key.fileobj.recv(2**20)
                    except (BlockingIOError, InterruptedError):
                        data = None
                    except OSError:
                        data = b""
                    if data == b"":  # the rank is gone
                        self._sel.unregister(key.fileobj)
                        continue
                    if data:
                        buffers[rank] += data
                        self._parse(rank, buffers[rank])
                if mask & selectors.EVENT_WRITE:
                    self._flush(rank)
            self._expire()

    def _parse(self, rank: int, buf: bytearray) -> None:
        while len(buf) >= _LEN.size:
            hlen, plen = _LEN.unpack_from(buf)
            if hlen > MAX_HEADER or plen > MAX_FRAME:
                self._refuse_link(rank, f"a message of {plen} bytes is over the relay's cap")
                buf.clear()
                return
            end = _LEN.size + hlen + plen
            if len(buf) < end:
                return
            raw = bytes(buf[_LEN.size : _LEN.size + hlen])
            payload = bytes(buf[_LEN.size + hlen : end])
            del buf[:end]
            seq, self._seq[rank] = self._seq[rank], self._seq[rank] + 1
            header: Any = None
            try:
                header = json.loads(raw)
                self._handle(rank, header, payload, seq)
            except Exception as err:  # noqa: BLE001 - whatever a rank sent fails its call, never the relay
                req = header.get("req", -1) if isinstance(header, dict) else -1
                req = req if isinstance(req, int) and not isinstance(req, bool) else -1
                self._reply(rank, {"req": req, "error": f"the relay refused a request: {err}"})

    def _refuse_link(self, rank: int, why: str) -> None:
        self._reply(rank, {"req": -1, "error": why})

    def _reply(self, rank: int, header: dict[str, Any], payload: bytes = b"") -> None:
        self._out[rank] += _frame(header, payload)
        self._flush(rank)

    def _flush(self, rank: int) -> None:
        out, sock = self._out[rank], self._mine[rank]
        with contextlib.suppress(BlockingIOError, InterruptedError):
            while out:
                sent = sock.send(out[: 2**20])
                del out[:sent]
        with contextlib.suppress(KeyError, ValueError, OSError):
            events = selectors.EVENT_READ | (selectors.EVENT_WRITE if out else 0)
            self._sel.modify(sock, events, rank)

    # -- requests ------------------------------------------------------------------------

    def _handle(self, rank: int, header: dict[str, Any], payload: bytes, seq: int) -> None:
        kind = header["kind"]
        group = self._group(header, rank)
        if kind == "send":
            self._send(rank, group, header, payload, seq)
        elif kind == "recv":
            _check_recv(header, group, rank)
            since = time.monotonic()
            self._recvs.append(_Pending(rank, int(header["req"]), since, header, seq=seq))
            self._match()
        elif kind == "mark":
            tag = int(header["tag"])
            self.events.append(Event("mark", (rank,), rank, tag=tag, time=self._now(), seq=(seq,)))
            self._reply(rank, {"req": int(header["req"]), "ok": True})
        elif kind in COLLECTIVES:
            self._collective(rank, group, header, payload, seq)
        else:
            raise RelayError(f"the relay knows no call {kind!r}")

    def _group(self, header: dict[str, Any], rank: int) -> tuple[int, ...]:
        group = header.get("group")
        if not isinstance(group, list) or not all(isinstance(r, int) for r in group):
            raise RelayError("a request without its group's ranks")
        members = tuple(group)
        if rank not in members or len(set(members)) != len(members):
            raise RelayError(f"rank {rank} called a group it is not in: {members}")
        if not all(0 <= r < self.world_size for r in members):
            raise RelayError(f"a group of ranks outside 0..{self.world_size - 1}: {members}")
        return members

    def _send(
        self, rank: int, group: tuple[int, ...], header: dict, payload: bytes, seq: int
    ) -> None:
        dst, tag = int(header["dst"]), int(header.get("tag", 0))
        if dst not in group or dst == rank:
            raise RelayError(f"rank {rank} sent to rank {dst}, which is not a peer in its group")
        _check_bytes(header, payload)
        if self._held + len(payload) > MAX_HELD:
            raise RelayError(f"over {MAX_HELD >> 20} MB sent that no rank has received")
        self._held += len(payload)
        self._message("send", group, rank, dst, tag, header, payload, seq)
        self._mail.setdefault((group, rank, dst, tag), deque()).append((header, payload))
        self._reply(rank, {"req": int(header["req"]), "ok": True})
        self._match()

    def _match(self) -> None:
        """Deliver every posted receive whose message has arrived."""
        waiting = []
        for pending in self._recvs:
            h = pending.header
            group, src, tag = tuple(h["group"]), int(h["src"]), int(h.get("tag", 0))
            box = self._mail.get((group, src, pending.rank, tag))
            if not box:
                waiting.append(pending)
                continue
            sent, payload = box.popleft()
            self._held -= len(payload)
            if (sent["dtype"], sent["shape"]) != (h["dtype"], h["shape"]):
                why = (
                    f"rank {pending.rank} received {h['dtype']} of shape {tuple(h['shape'])} "
                    f"but rank {src} sent {sent['dtype']} of shape {tuple(sent['shape'])}"
                )
                self._reply(pending.rank, {"req": pending.req, "error": why})
                continue
            self._message("recv", group, src, pending.rank, tag, h, payload, pending.seq)
            self._reply(pending.rank, {"req": pending.req, "ok": True, "src": src}, payload)
        self._recvs = waiting

    def _message(
        self, kind: str, group: tuple, src: int, dst: int, tag: int, header: dict, payload: bytes,
        seq: int,
    ) -> None:  # fmt: skip
        """Record a send or a delivered receive."""
        event = Event(kind, group, src, dst, tag, (len(payload),), header["dtype"], "", self._now())
        self.events.append(replace(event, seq=(seq,), data=self._keep(payload)))

    def _keep(self, payload: bytes) -> bytes:
        """The bytes to keep in an event: all of them while ``keep`` and under the cap."""
        if not self.keep or self._kept + len(payload) > MAX_KEPT:
            return b""
        self._kept += len(payload)
        return payload

    def _collective(
        self, rank: int, group: tuple[int, ...], header: dict, payload: bytes, seq: int
    ) -> None:
        _check_bytes(header, payload)
        n = self._count.get((group, rank), 0)
        self._count[(group, rank)] = n + 1
        call = self._calls.setdefault((group, n), _Call(group))
        since = time.monotonic()
        call.calls[rank] = _Pending(rank, int(header["req"]), since, header, payload, seq)
        if len(call.calls) == len(group):
            del self._calls[(group, n)]
            self._complete(call)

    def _complete(self, call: _Call) -> None:
        order = [call.calls[r] for r in call.group]
        first = order[0].header
        signature = [(p.header["kind"], p.header.get("op"), p.header["dtype"]) for p in order]
        if len(set(signature)) != 1:
            said = ", ".join(f"rank {p.rank}: {p.header['kind']}" for p in order)
            for p in order:
                self._reply(
                    p.rank, {"req": p.req, "error": f"ranks called different collectives ({said})"}
                )
            return
        try:
            results = _compute(first["kind"], order)
        except Exception as err:  # noqa: BLE001 - what the ranks sent: every member is told
            for p in order:
                self._reply(p.rank, {"req": p.req, "error": str(err)})
            return
        sizes, seqs = tuple(len(p.payload) for p in order), tuple(p.seq for p in order)
        kind, dtype, op = first["kind"], first["dtype"], first.get("op", "")
        self.events.append(Event(kind, call.group, -1, -1, 0, sizes, dtype, op, self._now(), seqs))
        for p, out in zip(order, results, strict=True):
            self._reply(p.rank, {"req": p.req, "ok": True}, out)

    def _expire(self) -> None:
        """Fail every wait older than the timeout, naming whom it waited for."""
        now = time.monotonic()
        late = [p for p in self._recvs if now - p.since > self.timeout]
        for p in late:
            self._recvs.remove(p)
            src = p.header["src"]
            why = f"timed out after {self.timeout:g} s: rank {p.rank} waited for a message from rank {src} that never came"  # noqa: E501
            self._reply(p.rank, {"req": p.req, "error": why})
        for key, call in list(self._calls.items()):
            oldest = min(p.since for p in call.calls.values())
            if now - oldest > self.timeout:
                del self._calls[key]
                absent = [r for r in call.group if r not in call.calls]
                kind = next(iter(call.calls.values())).header["kind"]
                why = (f"timed out after {self.timeout:g} s: {kind} waited for rank(s) "
                       f"{', '.join(map(str, absent))}, which never called it")  # fmt: skip
                for p in call.calls.values():
                    self._reply(p.rank, {"req": p.req, "error": why})

    def _now(self) -> float:
        return time.monotonic() - self._start


def _check_recv(header: dict[str, Any], group: tuple[int, ...], rank: int) -> None:
    """A receive names a peer in its group, an int tag and a tensor the relay carries."""
    src, tag = header.get("src"), header.get("tag", 0)
    if not isinstance(src, int) or src not in group or src == rank:
        raise RelayError(f"rank {rank} received from {src!r}, which is not a peer in its group")
    if not isinstance(tag, int):
        raise RelayError(f"a receive's tag must be an int, not {tag!r}")
    _check_bytes(header, b"", sized=False)


def _check_bytes(header: dict[str, Any], payload: bytes, sized: bool = True) -> None:
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


def _tensor(p: _Pending) -> torch.Tensor:
    dtype = DTYPES[p.header["dtype"]]
    if not p.payload:
        return torch.empty(p.header["shape"], dtype=dtype)
    flat = torch.frombuffer(bytearray(p.payload), dtype=torch.uint8).view(dtype)
    return flat.reshape(p.header["shape"])


def _raw(t: torch.Tensor) -> bytes:
    return t.contiguous().view(-1).view(torch.uint8).numpy().tobytes()


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


def _compute(kind: str, order: list[_Pending]) -> list[bytes]:  # noqa: C901 - one case per collective
    """Each member's result bytes, computed here from what each member sent."""
    tensors = [_tensor(p) for p in order]
    n = len(order)
    if kind == "barrier":
        return [b""] * n
    if kind == "allreduce":
        return [_raw(_reduce(tensors, order[0].header["op"]))] * n
    if kind == "broadcast":
        root = order[0].header["root"]
        if any(p.header["root"] != root for p in order):
            raise RelayError("ranks broadcast from different roots")
        return [_raw(tensors[root])] * n
    if kind == "allgather":  # each sends its own; each gets all, in group order
        if len({t.shape for t in tensors}) != 1:
            raise RelayError("ranks all-gathered tensors of different shapes")
        return [b"".join(_raw(t) for t in tensors)] * n
    if kind == "reduce_scatter":  # each sends its whole input, gets the sum of its own chunk
        total = _reduce(tensors, order[0].header["op"])
        if total.shape[0] % n:
            raise RelayError(f"a reduce-scatter of {total.shape[0]} rows over {n} ranks")
        return [_raw(c) for c in total.chunk(n)]
    if kind == "alltoall":
        if any(t.shape[0] % n for t in tensors):
            raise RelayError("an all-to-all whose rows do not split evenly over the ranks")
        parts = [t.chunk(n) for t in tensors]
        return [b"".join(_raw(parts[src][dst]) for src in range(n)) for dst in range(n)]
    raise RelayError(f"the relay knows no collective {kind!r}")


# ---------------------------------------------------------------------------------------
# The ranks' side: a ProcessGroup that asks the relay.


class _Link:
    """A rank's one socket to the relay: requests out, a thread matching replies in."""

    def __init__(self, sock: socket.socket, fatal: Any = None) -> None:
        """``fatal(error)``: how the rank fails when a call that torch's C++ waits on (DDP's
        buckets) is refused: a Python exception cannot travel through its future."""
        self.sock, self.fatal = sock, fatal
        self._lock = threading.Lock()
        self._next = 0
        self._waiting: dict[int, tuple[Future, Any]] = {}
        self.native: set[int] = set()  # ids of futures handed to torch's C++
        threading.Thread(target=self._read, name="relay-link", daemon=True).start()

    def _fail(self, fut: Future, error: RelayError) -> None:
        if id(fut) in self.native and self.fatal is not None:
            self.fatal(error)
        else:
            fut.set_exception(error)

    def request(self, header: dict[str, Any], payload: bytes, on_reply: Any) -> Future:
        fut: Future = Future()
        with self._lock:
            req = self._next = self._next + 1
            self._waiting[req] = (fut, on_reply)
            self.sock.sendall(_frame({**header, "req": req}, payload))
        return fut

    def _read(self) -> None:
        try:
            while True:
                header, payload = _read_frame(self.sock)
                req = header.get("req", -1)
                if req == -1:  # the relay refused the link itself: every call fails
                    error = RelayError(header.get("error", "the relay closed the link"))
                    for waiting, _ in self._waiting.values():
                        self._fail(waiting, error)
                    continue
                fut, on_reply = self._waiting.pop(req, (None, None))
                if fut is None:  # an answer to a request this link never made
                    continue
                if "error" in header:
                    self._fail(fut, RelayError(header["error"]))
                    continue
                try:
                    fut.set_result(on_reply(header, payload))
                except Exception as err:  # noqa: BLE001 - the waiting call raises it
                    fut.set_exception(err)
        except (OSError, ConnectionError, RelayError, ValueError):
            error = RelayError("the relay is gone: the run has ended")
            for fut, _ in list(self._waiting.values()):
                with contextlib.suppress(RuntimeError):
                    fut.set_exception(error)


class _Work(dist._Work):  # noqa: SLF001 - the Work base that C++ callers (DDP) wait on
    """A call in flight: ``wait`` returns once the relay answered, or raises what it said."""

    def __init__(self, fut: Future, link: _Link) -> None:
        super().__init__()
        self._fut, self._link = fut, link

    def wait(self, timeout: timedelta | None = None) -> bool:  # noqa: ARG002 - torch's signature
        self._fut.wait()  # the relay's own deadline ends every wait
        return True

    def is_completed(self) -> bool:
        return self._fut.done()

    def get_future(self) -> Future:
        self._link.native.add(id(self._fut))  # torch's C++ waits on it, not Python
        return self._fut


def _describe(t: torch.Tensor) -> dict[str, Any]:
    return {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape)}


def _fill(targets: Sequence[torch.Tensor]) -> Any:
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


class RelayGroup(dist.ProcessGroup):
    """A process group whose calls all go to the :class:`Relay` (blocking or not, as asked)."""

    def __init__(self, link: _Link, rank: int, ranks: Sequence[int], timeout: timedelta) -> None:
        super().__init__(rank, len(ranks))
        self._link, self._ranks, self._timeout = link, list(ranks), timeout
        self._name = ""

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return BACKEND

    @property
    def group_name(self) -> str:
        """The name the dispatcher's collectives look this group up by."""
        return self._name

    def _set_group_name(self, name: str) -> None:
        self._name = name

    # -- helpers -------------------------------------------------------------------------

    def _ask(
        self, kind: str, tensor: torch.Tensor, targets: Sequence[torch.Tensor], **extra: Any
    ) -> Any:
        header = {"kind": kind, "group": self._ranks, **_describe(tensor), **extra}
        return _Work(self._link.request(header, _raw(tensor.detach()), _fill(targets)), self._link)

    def _global(self, group_rank: int) -> int:
        return self._ranks[group_rank]

    # -- point to point --------------------------------------------------------------------

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int) -> Any:
        (t,) = tensors
        return self._ask("send", t, [], dst=self._global(dst), tag=tag)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int) -> Any:
        (t,) = tensors
        header = {"kind": "recv", "group": self._ranks, **_describe(t)}
        header |= {"src": self._global(src), "tag": tag}
        return _Work(self._link.request(header, b"", _fill([t])), self._link)

    # -- collectives: torch's signatures, options read where they mean something -----------

    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        (t,) = tensors
        return self._ask("allreduce", t, [t], op=_op_name(opts))

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        flat = torch.cat([t.detach().reshape(-1) for t in tensors])
        return self._ask("allreduce", flat, tensors, op=_op_name(opts))

    def broadcast(self, tensors: list[torch.Tensor], opts: Any) -> Any:
        (t,) = tensors
        return self._ask("broadcast", t, [t], root=opts.rootRank)

    def allgather(self, outputs: list, inputs: list, opts: Any = None) -> Any:  # noqa: ARG002 - torch's signature
        ((out,), (t,)) = (outputs, inputs)
        return self._ask("allgather", t, out)

    def _allgather_base(self, output: torch.Tensor, tensor: torch.Tensor, opts: Any = None) -> Any:  # noqa: ARG002 - torch's signature
        return self._ask("allgather", tensor, [output])

    def allgather_into_tensor_coalesced(self, outputs: list, inputs: list, opts: Any = None) -> Any:  # noqa: ARG002 - torch's signature
        return [self._allgather_base(o, i) for o, i in zip(outputs, inputs, strict=True)][-1]

    def reduce_scatter(
        self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]], opts: Any = None
    ) -> Any:
        ((out,), (chunks,)) = (outputs, inputs)
        flat = torch.stack([c.detach() for c in chunks])
        return self._ask("reduce_scatter", flat, [out], op=_op_name(opts))

    def _reduce_scatter_base(
        self, output: torch.Tensor, tensor: torch.Tensor, opts: Any = None
    ) -> Any:
        return self._ask("reduce_scatter", tensor, [output], op=_op_name(opts))

    def reduce_scatter_tensor_coalesced(self, outputs: list, inputs: list, opts: Any = None) -> Any:
        pairs = zip(outputs, inputs, strict=True)
        return [self._reduce_scatter_base(o, i, opts) for o, i in pairs][-1]

    def alltoall_base(
        self,
        output: torch.Tensor,
        tensor: torch.Tensor,
        out_split: list[int],
        in_split: list[int],
        opts: Any = None,  # noqa: ARG002 - torch's signature
    ) -> Any:
        if out_split or in_split:
            raise RelayError("the relay's all-to-all splits evenly only")
        return self._ask("alltoall", tensor, [output])

    def barrier(self, opts: Any = None) -> Any:  # noqa: ARG002 - torch's signature
        return self._ask("barrier", torch.empty(0), [])

    # torch's Python API calls these names; its C++ (DDP, the dispatcher's ops) the ones above.
    all_gather_single = _allgather_base
    reduce_scatter_single = _reduce_scatter_base
    all_gather_single_coalesced = allgather_into_tensor_coalesced
    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced
    all_to_all_single = alltoall_base


def _op_name(opts: Any) -> str:
    op = getattr(opts, "reduceOp", dist.ReduceOp.SUM)
    return str(getattr(op, "op", op)).rsplit(".", 1)[-1]


_LINK: _Link | None = None


def _create(opts: Any, _backend_options: Any = None) -> RelayGroup:
    """torch's backend creator (its extended form): the default group, or a ``new_group``."""
    if _LINK is None:
        raise RelayError("this process has no link to a relay")
    ranks = list(opts.global_ranks_in_group) or list(range(opts.group_size))
    group = RelayGroup(_LINK, opts.group_rank, ranks, opts.timeout)
    group._set_group_name(opts.group_id)  # noqa: SLF001 - what the dispatcher looks groups up by
    return group


def mark(tag: int) -> None:
    """Mark, in the relay's record, that this rank starts the ``tag``-th part of its run (a
    check's next case, say); a no-op on any other backend."""
    if _LINK is None or dist.get_backend() != BACKEND:
        return
    rank = dist.get_rank()
    header = {"kind": "mark", "group": [rank], "tag": tag}
    _Work(_LINK.request(header, b"", lambda _h, _p: None), _LINK).wait()


def join(
    sock: socket.socket, rank: int, world_size: int, timeout: float, fatal: Any = None
) -> None:
    """Make the relay behind ``sock`` this rank's default process group; ``fatal(error)``
    ends the rank when a call torch's C++ waits on fails (see :class:`_Link`)."""
    global _LINK  # noqa: PLW0603 - one link per rank process, which torch's creator reads
    _LINK = _Link(sock, fatal)
    if BACKEND.upper() not in dist.Backend._plugins:  # noqa: SLF001 - registered once per process
        dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["cpu"])
    dist.init_process_group(
        BACKEND, rank=rank, world_size=world_size, store=dist.HashStore(),
        timeout=timedelta(seconds=timeout),
    )  # fmt: skip
    os.environ.pop("MASTER_ADDR", None)
