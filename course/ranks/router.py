"""The relay, in the launching process: every message of a relay run passes through it.

    with Relay(world_size=3, timeout=10.0) as relay:   # hand relay.ends[r] to rank r
        ...                                           # the ranks join (course.ranks.relay)
    relay.events                                      # every send, recv and collective

A thread routes point-to-point messages, computes each collective once every member called
it (:mod:`course.ranks.combine`) and records each as an :class:`~course.ranks.frames.Event`
from the bytes it received. It keeps the deadlines (a receive or a collective its peers
never match fails after ``timeout`` seconds, naming whom it waited for) and refuses, to the
calling rank, a frame that is malformed, too large or inconsistent; it holds what was sent
until it is received, at most ``MAX_HELD`` bytes.
"""

from __future__ import annotations

import contextlib
import json
import selectors
import socket
import threading
import time
from dataclasses import replace
from typing import Any, Self

from course.ranks.combine import Call, Pending, compute
from course.ranks.frames import (
    COLLECTIVES,
    LEN,
    MAX_FRAME,
    MAX_HEADER,
    Event,
    RelayError,
    check_bytes,
    check_recv,
    frame,
)
from course.ranks.mailbox import ANY, Mailbox
from course.ranks.memory import Probe

__all__ = ["MAX_HELD", "MAX_KEPT", "Relay"]

MAX_HELD = 256 * 2**20  # bytes of sent messages the relay holds for receivers, in all
MAX_KEPT = 64 * 2**20  # bytes of messages a Relay(keep=True) records, in all


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
        self._mail = Mailbox()  # sent, not yet received
        self._recvs: list[Pending] = []
        self._calls: dict[tuple[tuple[int, ...], int], Call] = {}
        self._count: dict[tuple[tuple[int, ...], int], int] = {}  # (group, rank) -> calls made
        self._out: dict[int, bytearray] = {r: bytearray() for r in range(world_size)}
        self._sel = selectors.DefaultSelector()
        self._stop = threading.Event()
        self._start = time.monotonic()
        self.probe = Probe()  # what a snapshot reads: the launcher names the ranks' processes
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
        while len(buf) >= LEN.size:
            hlen, plen = LEN.unpack_from(buf)
            if hlen > MAX_HEADER or plen > MAX_FRAME:
                self._refuse_link(rank, f"a message of {plen} bytes is over the relay's cap")
                buf.clear()
                return
            end = LEN.size + hlen + plen
            if len(buf) < end:
                return
            raw = bytes(buf[LEN.size : LEN.size + hlen])
            payload = bytes(buf[LEN.size + hlen : end])
            del buf[:end]
            seq, self._seq[rank] = self._seq[rank], self._seq[rank] + 1
            header: Any = None
            try:
                header = json.loads(raw)
                self._handle(rank, header, payload, seq)
            except Exception as err:  # noqa: BLE001 - whatever a rank sent fails its call, never the relay
                req = header.get("req") if isinstance(header, dict) else None
                if isinstance(req, int) and not isinstance(req, bool) and req >= 0:
                    self._reply(rank, {"req": req, "error": f"the relay refused a request: {err}"})
                # else: no call of the rank's is waiting on it, so there is no one to tell

    def _refuse_link(self, rank: int, why: str) -> None:
        self._reply(rank, {"req": -1, "error": why})

    def _reply(self, rank: int, header: dict[str, Any], payload: bytes = b"") -> None:
        self._out[rank] += frame(header, payload)
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
            check_recv(header, group, rank)
            since = time.monotonic()
            self._recvs.append(Pending(rank, int(header["req"]), since, header, seq=seq))
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
        check_bytes(header, payload)
        if self._mail.held + len(payload) > MAX_HELD:
            raise RelayError(f"over {MAX_HELD >> 20} MB sent that no rank has received")
        self._message("send", group, rank, dst, tag, header, payload, seq)
        self._mail.post(group, rank, dst, tag, header, payload)
        self._reply(rank, {"req": int(header["req"]), "ok": True})
        self._match()

    def _match(self) -> None:
        """Deliver every posted receive whose message has arrived."""
        waiting = []
        for pending in self._recvs:
            h = pending.header
            group, src, tag = tuple(h["group"]), int(h["src"]), int(h.get("tag", 0))
            taken = self._mail.take(group, src, pending.rank, tag)
            if taken is None:
                waiting.append(pending)
                continue
            src, sent, payload = taken
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
        check_bytes(header, payload)
        n = self._count.get((group, rank), 0)
        self._count[(group, rank)] = n + 1
        call = self._calls.setdefault((group, n), Call(group))
        since = time.monotonic()
        call.calls[rank] = Pending(rank, int(header["req"]), since, header, payload, seq)
        if len(call.calls) == len(group):
            del self._calls[(group, n)]
            self._complete(call)

    def _complete(self, call: Call) -> None:
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
            results = compute(first["kind"], order)
            snapshot = first["kind"] == "snapshot"
            extra = self.probe.at([p.header for p in order], self.world_size) if snapshot else {}
        except Exception as err:  # noqa: BLE001 - what the ranks sent: every member is told
            for p in order:
                self._reply(p.rank, {"req": p.req, "error": str(err)})
            return
        sizes, seqs = tuple(len(p.payload) for p in order), tuple(p.seq for p in order)
        kind, dtype, op = first["kind"], first["dtype"], first.get("op", "")
        event = Event(kind, call.group, -1, -1, 0, sizes, dtype, op, self._now(), seqs)
        self.events.append(replace(event, **extra, held=self._mail.held if extra else 0))
        for p, out in zip(order, results, strict=True):
            self._reply(p.rank, {"req": p.req, "ok": True}, out)

    def _expire(self) -> None:
        """Fail every wait older than the timeout, naming whom it waited for."""
        now = time.monotonic()
        late = [p for p in self._recvs if now - p.since > self.timeout]
        for p in late:
            self._recvs.remove(p)
            src = p.header["src"]
            whom = "any rank" if src == ANY else f"rank {src}"
            why = f"timed out after {self.timeout:g} s: rank {p.rank} waited for a message from {whom} that never came"  # noqa: E501
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
