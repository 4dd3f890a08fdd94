"""Faults the relay injects, and the quorum the ranks left after one form.

    launch(job, 4, fault=Fault(rank=2, step=1))   # under the relay: rank 2 dies in step 1

A :class:`Fault` is the judge's, told to no rank: the relay SIGKILLs rank ``rank`` in its
first all-reduce of every live rank after it marked step ``step`` (``relay.mark(step)``),
once the others are in it too, so the rank dies in the middle of that step, as a process
whose host fails does. (An all-reduce of fewer ranks is not the step's: a rank's all-reduce
of itself alone cannot take the death for the others.) From then on the relay treats it as
gloo's peers do a rank whose connections closed: the all-reduce its peers wait in fails at
once, for each of them, with the buffer each passed in partly reduced (gloo's ring had summed
some chunks of it into place before the failure: measured, 1/4 and 1/8 of a 4096-element
buffer on two of three survivors), and every later call on a group that holds the dead rank
fails as it is made. :class:`Faults` is that part of the relay.

:class:`Quorum` is what a Lighthouse does for torchft: each round (a rank's n-th
``quorum()`` is its round n) is answered, to every rank that asked, once every rank still
alive has asked, with the list of those ranks. A rank that dies while others wait completes
the round without it; a rank asks for one round at a time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from course.ranks.combine import Call, Pending, compute
from course.ranks.frames import DTYPES, Event, RelayError

__all__ = ["GONE", "Fault", "Faults", "Quorum"]

GONE = (
    "Connection closed by peer: rank {rank}'s process ended, so no call of a group that holds "
    "it can complete (as on gloo)"
)


@dataclass(frozen=True)
class Fault:
    """Kill rank ``rank`` at its first all-reduce after it marked step ``step``."""

    rank: int
    step: int


@dataclass
class Quorum:
    """The rounds of ``quorum()`` calls: each answered once every live rank has asked."""

    world_size: int
    _asked: dict[int, int] = field(default_factory=dict)  # rank -> rounds asked
    _waiting: dict[int, dict[int, Pending]] = field(default_factory=dict)  # round -> calls

    def ask(self, pending: Pending) -> int:
        """Rank ``pending.rank``'s next round: its number. RelayError while its last call
        waits (a real ``quorum()`` blocks, so a second call is no rank's)."""
        if any(pending.rank in calls for calls in self._waiting.values()):
            raise RelayError("quorum() called again while this rank's last call still waits")
        n = self._asked[pending.rank] = self._asked.get(pending.rank, 0) + 1
        self._waiting.setdefault(n, {})[pending.rank] = pending
        return n

    def complete(self, dead: set[int]) -> list[tuple[list[Pending], list[int]]]:
        """The rounds every live rank has asked: their calls, and the members to answer."""
        live = [r for r in range(self.world_size) if r not in dead]
        out = []
        for n, calls in sorted(self._waiting.items()):
            members = sorted(r for r in calls if r not in dead)
            if members and members == live:
                del self._waiting[n]
                out.append(([calls[r] for r in members], members))
        return out

    def expired(self, deadline: float) -> list[dict[int, Pending]]:
        """Remove every round whose first call came before ``deadline``: its calls, by rank."""
        out = []
        for n, calls in list(self._waiting.items()):
            if min(p.since for p in calls.values()) < deadline:
                out.append(self._waiting.pop(n))
        return out


class Faults:
    """The relay's side of a fault plan (mixed into :class:`course.ranks.router.Relay`, whose
    calls, mailbox, groups and replies it fails): the kill, and what a dead rank fails."""

    fault: Fault | None
    dead: set[int]
    quorum: Quorum
    stop_rank: Any
    events: list[Event]
    _calls: dict[tuple[tuple[int, ...], int], Call]
    _count: dict[tuple[tuple[int, ...], int], int]
    _places: list[tuple[int | None, int]]
    _doomed: tuple[tuple[int, ...], int] | None
    _recvs: list[Pending]
    _mail: Any
    _groups: Any
    _reply: Any
    _now: Any

    def _doom_or_refuse(self, rank: int, group: tuple[int, ...], header: dict) -> None:
        """Note the call the fault plan's rank dies in, if this is it (the router's
        ``_collective`` kills it once every member is in it: :meth:`_kill`); refuse a call of
        a group that holds a dead rank."""
        if self.fault is None:
            return
        fault, (part, _index) = self.fault, self._places[rank]
        everyone = set(group) == set(range(len(self._places))) - self.dead
        if (rank, part, header["kind"], everyone) == (fault.rank, fault.step, "allreduce", True):
            if self._doomed is None and rank not in self.dead:
                self._doomed = (group, self._count.get((group, rank), 0))
            return
        self._refuse_gone(group)

    def _refuse_gone(self, ranks: Any) -> None:
        """RelayError if a call needs one of ``ranks`` and it is dead, as gloo's closed
        connection fails it."""
        gone = self.dead & set(ranks)
        if gone:
            raise RelayError(GONE.format(rank=min(gone)))

    def _kill(self, rank: int) -> None:
        """The fault plan's rank dies in its all-reduce, every peer in it too: each is left
        with the parts that arrived summed into its buffer, as gloo's ring leaves them."""
        part = self._places[rank][0]
        self.events.append(Event("killed", (rank,), rank, tag=part or 0, time=self._now()))
        if self.stop_rank is not None:
            self.stop_rank(rank)
        self._lose(rank)

    def _gone(self, rank: int) -> None:
        """Rank ``rank``'s link closed: its process ended. With a fault plan, it is lost."""
        if self.fault is not None and rank not in self.dead:
            self._lose(rank)

    def _lose(self, rank: int) -> None:
        """Fail every wait that needs ``rank``, as gloo's closed connections fail them."""
        self.dead.add(rank)
        why = GONE.format(rank=rank)
        for key, call in list(self._calls.items()):
            if rank not in call.group:
                continue
            del self._calls[key]
            here = [p for r, p in call.calls.items() if r != rank]
            partial = _partial(here)
            for p in here:
                left = partial.get(p.rank, b"")
                self._reply(p.rank, {"req": p.req, "error": why, "partial": bool(left)}, left)
        for p in [p for p in self._recvs if p.header["src"] == rank]:
            self._recvs.remove(p)
            self._reply(p.rank, {"req": p.req, "error": why})
        for sent in self._mail.addressed_to(rank):
            self._reply(sent.src, {"req": sent.req, "error": why})
        for calls in self._groups.lost(rank):
            for p in calls:
                self._reply(p.rank, {"req": p.req, "error": why})
        self._form_quorums()

    def _form_quorums(self) -> None:
        """Answer every round of ``quorum()`` that every live rank has asked."""
        for calls, members in self.quorum.complete(self.dead):
            seqs = tuple(p.seq for p in calls)
            self.events.append(Event("quorum", tuple(members), time=self._now(), seq=seqs))
            for p in calls:
                self._reply(p.rank, {"req": p.req, "ok": True, "members": members})


def _partial(calls: list[Pending]) -> dict[int, bytes]:
    """What a failed all-reduce leaves in each survivor's buffer: its first half summed over
    the parts that arrived, the rest its own (gloo's ring leaves some chunks of a buffer summed
    in place, and others not); nothing for any other collective, or parts that do not add up."""
    if not calls or any(p.header["kind"] != "allreduce" for p in calls):
        return {}
    try:
        summed = compute("allreduce", calls)[0]
    except Exception:  # noqa: BLE001 - parts that disagree leave the buffers as they were
        return {}
    itemsize = DTYPES[calls[0].header["dtype"]].itemsize
    half = len(summed) // itemsize // 2 * itemsize
    return {p.rank: summed[:half] + p.payload[half:] for p in calls}
