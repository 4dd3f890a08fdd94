"""The relay, in the launching process: every message of a relay run passes through it.

    with Relay(world_size=3, timeout=10.0) as relay:   # hand relay.ends[r] to rank r
        ...                                           # the ranks join (course.ranks.relay)
    relay.events                                      # every send, recv and collective

Its thread (:mod:`course.ranks.switchboard`) routes point-to-point messages, computes each
collective once every member called it (:mod:`course.ranks.combine`) and records each as
an :class:`~course.ranks.frames.Event` from the bytes it received. It keeps the deadlines
(a receive or a collective its peers never match fails after ``timeout`` seconds, naming
whom it waited for; at once, when every rank has returned or waits in a call that no rank
left can match: a deadlock, which gloo would wait out) and refuses, to the calling rank, a
frame that is malformed, too large or inconsistent; it holds what was sent until it is
received, at most ``MAX_HELD`` bytes. It makes the stragglers a check asks for
(:mod:`course.ranks.holds`), scales the all-gathers a check chose by their place in its
marked parts (:mod:`course.ranks.rescale`), and keeps the storage a checkpoint is written to
and read from (:mod:`course.ranks.objects`), and kills the rank a fault plan names, failing
what needed it, and forms the quorum of the ranks left (:mod:`course.ranks.faults`).

A deadlock is found from what each rank says on its link, in order with its calls: which
request its job blocks on (:mod:`course.ranks.link`: DDP's reducer's wait on its buckets too,
said just before it), and, last, that its job returned. Any other wait inside torch's C++
says nothing: only the deadline ends it.

It keeps gloo's semantics, so that a program that deadlocks or fails on gloo does so here: a
send completes only once a receive takes it (a blocking ``dist.send`` to a rank that sends
first waits forever, and fails as a deadlock); a message larger than the buffer posted to
receive it fails the receive (gloo aborts that rank), a smaller one fills the buffer's first
bytes; every rank calls ``new_group`` for every group in the same order, and a group's
members wait for each other there. Its error messages never quote what a peer sent (a
shape, a dtype, a list of ranks): what crosses from one rank to another is only what the
record counts.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch

from course.ranks.combine import Call, Pending, compute
from course.ranks.faults import Fault, Faults, Quorum
from course.ranks.frames import (
    COLLECTIVES,
    DEADLOCK,
    DTYPES,
    Event,
    RelayError,
    check_bytes,
    check_recv,
    raw_bytes,
)
from course.ranks.groups import Groups
from course.ranks.holds import Hold, Holds
from course.ranks.mailbox import ANY, Mailbox, Posted
from course.ranks.memory import Probe
from course.ranks.objects import Objects, Stored
from course.ranks.rescale import Rescale
from course.ranks.switchboard import Switchboard

__all__ = ["MAX_HELD", "MAX_KEPT", "Hold", "Relay"]

MAX_HELD = 256 * 2**20  # bytes of sent messages the relay holds for receivers, in all
MAX_KEPT = 64 * 2**20  # bytes of messages a Relay(keep=True) records, in all


class Relay(Faults, Switchboard):
    """The router between ``world_size`` ranks: what each request means, and what it records."""

    def __init__(
        self, world_size: int, timeout: float, keep: bool = False, holds: Sequence[Hold] = (),
        rescale: Rescale | None = None, stored: dict[str, Stored] | None = None,
        fault: Fault | None = None,
    ) -> None:  # fmt: skip
        """``keep``: record the bytes of every message (at most ``MAX_KEPT`` in all);
        ``holds``: the stragglers the relay makes (:class:`Hold`); ``rescale``: the
        all-gathers whose results it scales (:class:`Rescale`); ``stored``: the objects its
        storage starts with (:mod:`course.ranks.objects`; ``self.objects.held`` at the end);
        ``fault``: the rank it kills, and when (:mod:`course.ranks.faults`; the launcher sets
        ``stop_rank``, which kills a rank's process). With a fault planned, a rank whose
        process ended for any reason is treated as gloo's peers treat it: gone."""
        super().__init__(world_size, Holds(holds, world_size, timeout / 2))
        self.timeout, self.keep, self.rescale = timeout, keep, rescale
        self._places: list[tuple[int | None, int]] = [(None, 0)] * world_size  # see _collective
        self._kept = 0
        self.events: list[Event] = []
        self._mail = Mailbox()  # sent, not yet received
        self._recvs: list[Pending] = []
        self._calls: dict[tuple[tuple[int, ...], int], Call] = {}
        self._groups = Groups(world_size)
        self._count: dict[tuple[tuple[int, ...], int], int] = {}  # (group, rank) -> calls made
        self.probe = Probe()  # what a snapshot reads: the launcher names the ranks' processes
        self.objects = Objects(stored)
        self.fault, self.dead, self.quorum = fault, set[int](), Quorum(world_size)
        self.stop_rank: Any = None  # rank -> None: kills its process (set by the launcher)
        self._doomed: tuple[tuple[int, ...], int] | None = None  # the call the fault's rank dies in
        self._open: list[set[int]] = [set() for _ in range(world_size)]  # requests unanswered
        self._blocked: dict[int, int] = {}  # rank -> the unanswered request its job waits on
        self._finished: set[int] = set()  # ranks whose job returned (each said so, last)

    # -- requests ------------------------------------------------------------------------

    def _handle(self, rank: int, header: dict[str, Any], payload: bytes, seq: int) -> None:
        kind = header["kind"]
        if kind in ("waiting", "finished"):
            self._notice(rank, kind, header)
            return
        self._open[rank].add(header["req"])
        group = self._group(header, rank)
        if kind == "send":
            self._send(rank, group, header, payload, seq)
        elif kind == "recv":
            check_recv(header, group, rank)
            self._refuse_gone([header["src"]])
            since = time.monotonic()
            self._recvs.append(Pending(rank, int(header["req"]), since, header, seq=seq))
            self._match()
        elif kind == "mark":
            tag = int(header["tag"])
            self._places[rank] = (tag, 0)
            self.events.append(Event("mark", (rank,), rank, tag=tag, time=self._now(), seq=(seq,)))
            self._reply(rank, {"req": int(header["req"]), "ok": True})
        elif kind == "new_group":
            self._new_group(rank, header, seq)
        elif kind in ("put", "get", "keys"):
            self._storage(rank, kind, header, payload, seq)
        elif kind == "quorum":
            self.quorum.ask(Pending(rank, int(header["req"]), time.monotonic(), header, seq=seq))
            self._form_quorums()
        elif kind in COLLECTIVES:
            self._collective(rank, group, header, payload, seq)
        else:
            raise RelayError(f"the relay knows no call {kind!r}")

    def _notice(self, rank: int, kind: str, header: dict[str, Any]) -> None:
        """A notice, not a call: the job blocks on a request, or returned after all it sent."""
        if kind == "finished":
            self._finished.add(rank)
        elif header.get("on") in self._open[rank]:
            self._blocked[rank] = header["on"]

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
        """Hold a sent message, and the sender's call, until a receive takes it."""
        dst, tag = int(header["dst"]), int(header.get("tag", 0))
        self._refuse_gone([dst])
        if dst not in group or dst == rank:
            raise RelayError(f"rank {rank} sent to rank {dst}, which is not a peer in its group")
        check_bytes(header, payload)
        if self._mail.held + len(payload) > MAX_HELD:
            raise RelayError(f"over {MAX_HELD >> 20} MB sent that no rank has received")
        self._message("send", group, rank, dst, tag, header, payload, seq)
        since = time.monotonic()
        self._mail.post(Posted(group, rank, dst, tag, header, payload, int(header["req"]), since))
        self._match()

    def _match(self) -> None:
        """Deliver every posted receive whose message has arrived, and complete its send."""
        waiting = []
        for pending in self._recvs:
            h = pending.header
            group, src, tag = tuple(h["group"]), int(h["src"]), int(h.get("tag", 0))
            sent = self._mail.take(group, src, pending.rank, tag)
            if sent is None:
                waiting.append(pending)
                continue
            self._reply(sent.src, {"req": sent.req, "ok": True})  # as on gloo: the send is done
            room = _nbytes(h)
            if len(sent.payload) > room:
                why = (
                    f"rank {pending.rank} received from rank {sent.src} into a buffer of {room} "
                    f"bytes, and the message sent is larger: a message must fit the buffer "
                    f"posted to receive it (on gloo the receiving rank aborts)"
                )
                self._reply(pending.rank, {"req": pending.req, "error": why})
                continue
            header = {**h, "dtype": sent.header["dtype"]}  # the bytes, as they were sent
            self._message("recv", group, sent.src, pending.rank, tag, header, sent.payload,
                          pending.seq)  # fmt: skip
            reply = {"req": pending.req, "ok": True, "src": sent.src}
            self._reply(pending.rank, reply, sent.payload)
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

    def _storage(self, rank: int, kind: str, header: dict, payload: bytes, seq: int) -> None:
        """A put, a ranged get or a listing of the storage's keys, answered at once; a put or
        a get recorded with the bytes it moved and its key (the event's ``op``)."""
        req = int(header["req"])
        if kind == "keys":
            self._reply(rank, {"req": req, "ok": True, "keys": self.objects.keys()})
            return
        key = header.get("key")
        if kind == "put":
            stored = self.objects.put(key, header, payload)
            dtype, moved, out = stored.dtype, len(payload), b""
        else:
            dtype, out = self.objects.get(key, header.get("start"), header.get("stop"))
            moved = len(out)
        event = Event(kind, (rank,), rank, nbytes=(moved,), dtype=dtype, op=key, time=self._now())
        self.events.append(replace(event, seq=(seq,)))
        self._reply(rank, {"req": req, "ok": True, "dtype": dtype}, out)

    def _collective(
        self, rank: int, group: tuple[int, ...], header: dict, payload: bytes, seq: int
    ) -> None:
        check_bytes(header, payload)
        self._doom_or_refuse(rank, group, header)
        n = self._count.get((group, rank), 0)
        self._count[(group, rank)] = n + 1
        call = self._calls.setdefault((group, n), Call(group))
        since = time.monotonic()
        pending = Pending(rank, int(header["req"]), since, header, payload, seq)
        if header["kind"] == "allgather" and group == tuple(range(self.world_size)):
            part, index = self._places[rank]  # the part the rank marked last, its gathers in it
            pending.place, self._places[rank] = (part, index), (part, index + 1)
        call.calls[rank] = pending
        if len(call.calls) == len(group) and self._doomed == (group, n):
            self._kill(self.fault.rank)  # type: ignore[union-attr]
        elif len(call.calls) == len(group):
            del self._calls[(group, n)]
            self._complete(call)

    def _new_group(self, rank: int, header: dict, seq: int) -> None:
        """A rank's next ``dist.new_group`` (:mod:`course.ranks.groups`)."""
        group = self._groups.members(header)
        if rank in group:
            self._refuse_gone(group)
        pending = Pending(rank, int(header["req"]), time.monotonic(), header, b"", seq)
        answered = self._groups.call(pending, group)
        if len(answered) > 1 or (answered and rank in group):
            seqs = tuple(p.seq for p in answered)
            arrived = tuple(p.since - self._start for p in answered)
            event = Event("new_group", group, time=self._now(), seq=seqs, arrived=arrived)
            self.events.append(event)
        for p in answered:
            self._reply(p.rank, {"req": p.req, "ok": True})

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
            results = self._rescaled(first["kind"], order, compute(first["kind"], order))
            snapshot = first["kind"] == "snapshot"
            extra = self.probe.at([p.header for p in order], self.world_size) if snapshot else {}
        except Exception as err:  # noqa: BLE001 - what the ranks sent: every member is told
            for p in order:
                self._reply(p.rank, {"req": p.req, "error": str(err)})
            return
        if first["kind"] == "barrier" and call.group == tuple(range(self.world_size)):
            self.holds.barrier_done(time.monotonic())
        sizes, seqs = tuple(len(p.payload) for p in order), tuple(p.seq for p in order)
        kind, dtype, op = first["kind"], first["dtype"], first.get("op", "")
        root = first.get("root")  # a rooted collective's, in the group: its global rank
        src = call.group[root] if isinstance(root, int) and 0 <= root < len(order) else -1
        event = Event(kind, call.group, src, -1, 0, sizes, dtype, op, self._now(), seqs)
        arrived = tuple(p.since - self._start for p in order)
        self.events.append(
            replace(event, **extra, held=self._mail.held if extra else 0, arrived=arrived)
        )
        for p, out in zip(order, results, strict=True):
            self._reply(p.rank, {"req": p.req, "ok": True}, out)

    def _rescaled(self, kind: str, order: list[Pending], results: list[bytes]) -> list[bytes]:
        """``results``, or a chosen all-gather's (:mod:`course.ranks.rescale`) scaled."""
        places = [p.place for p in order if p.place is not None]
        if self.rescale is None or kind != "allgather" or len(places) < len(order):
            return results
        if not results[0] or not self.rescale.chosen(places):
            return results
        dtype = DTYPES[order[0].header["dtype"]]
        flat = torch.frombuffer(bytearray(results[0]), dtype=torch.uint8).view(dtype)
        return [raw_bytes(self.rescale.scaled(flat))] * len(order)

    def _reply(self, rank: int, header: dict[str, Any], payload: bytes = b"") -> None:
        """Answer a request (:class:`Switchboard`), which no longer blocks its rank."""
        req = header.get("req")
        self._open[rank].difference_update(self._open[rank] if req == -1 else {req})  # -1: all
        if self._blocked.get(rank) not in self._open[rank]:
            self._blocked.pop(rank, None)
        super()._reply(rank, header, payload)

    def _gone(self, rank: int) -> None:
        """Rank ``rank``'s process ended: it waits on nothing (:class:`Faults` says the rest)."""
        self._blocked.pop(rank, None)
        super()._gone(rank)

    def _tick(self) -> None:
        self._release()
        if self._deadlocked():
            self._expire(math.inf, DEADLOCK)
        else:
            self._expire(time.monotonic() - self.timeout, f"timed out after {self.timeout:g} s")

    def _deadlocked(self) -> bool:
        """Whether no rank can go on: each has returned, died, or waits on a request of its
        own that the relay holds (it said so), while no rank is held. What is held then can
        only be matched by a call no rank will make."""
        if self.holds.active or not self._blocked:
            return False
        gone = self.dead | self._finished
        alive = [r for r in range(self.world_size) if r not in gone]
        return bool(alive) and all(r in self._blocked for r in alive)

    def _release(self) -> None:
        """End the holds that are due (:mod:`course.ranks.holds`), and read what each held."""
        if not self.holds.active:
            return
        world = tuple(range(self.world_size))
        pending = [c for c in self._calls.values() if c.group == world]
        at_barrier = {
            r for c in pending for r, p in c.calls.items() if p.header["kind"] == "barrier"
        }
        waiting = {p.rank for p in self._recvs} | {r for c in self._calls.values() for r in c.calls}
        waiting |= self._groups.waiting()
        waiting |= {r for r in world if self._mail.waiting(r)}
        for hold in self.holds.due(at_barrier, waiting, self.probe.pids, time.monotonic()):
            self.events.append(Event("release", (hold.rank,), hold.rank, tag=hold.after,
                                     time=self._now()))  # fmt: skip
            self.read_deferred(hold.rank)

    def _expire(self, before: float, said: str) -> None:
        """Fail every wait that began before ``before``, saying ``said`` and whom it waited for."""
        late = [p for p in self._recvs if p.since < before]
        for p in late:
            self._recvs.remove(p)
            src = p.header["src"]
            whom = "any rank" if src == ANY else f"rank {src}"
            why = f"{said}: rank {p.rank} waited for a message from {whom} that never came"
            self._reply(p.rank, {"req": p.req, "error": why})
        for sent in self._mail.expired(before):
            why = (
                f"{said}: rank {sent.src} waited for rank {sent.dst} to receive its message "
                f"(tag {sent.tag}), and it never did. As on gloo, a send completes only once its "
                "receive is posted: two ranks that both send first wait for each other forever"
            )
            self._reply(sent.src, {"req": sent.req, "error": why})
        for calls, why in self._groups.expired(before):
            for p in calls:
                self._reply(p.rank, {"req": p.req, "error": f"{said}: {why}"})
        for calls in self.quorum.expired(before):
            absent = [r for r in range(self.world_size) if r not in calls and r not in self.dead]
            why = (f"{said}: quorum() waited for rank(s) {', '.join(map(str, absent))}, alive, "
                   "which never asked for it")  # fmt: skip
            for p in calls.values():
                self._reply(p.rank, {"req": p.req, "error": why})
        for key, call in list(self._calls.items()):
            if min(p.since for p in call.calls.values()) < before:
                del self._calls[key]
                absent = [r for r in call.group if r not in call.calls]
                kind = next(iter(call.calls.values())).header["kind"]
                why = (f"{said}: {kind} waited for rank(s) {', '.join(map(str, absent))}, which "
                       "never called it")  # fmt: skip
                for p in call.calls.values():
                    self._reply(p.rank, {"req": p.req, "error": why})


def _nbytes(header: dict[str, Any]) -> int:
    """The bytes of the tensor a header describes (checked by ``check_recv`` before)."""
    numel = 1
    for s in header["shape"]:
        numel *= s
    return numel * DTYPES[header["dtype"]].itemsize
