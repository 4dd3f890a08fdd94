"""The verdict on a trace: is it a ring all-reduce, and where does it depart from one?

Rank by rank, from plain data only (a :class:`~course.ring.trace.Trace`): messages only to
one neighbour, as many as the ring's schedule makes and about its bytes, payloads that hold
exactly the ranks a ring's would at each step, no collective that moves data, every rank
finished.
"""

from __future__ import annotations

from dataclasses import dataclass

from course.ranks.wording import count
from course.ring.schedule import expected_holds
from course.ring.trace import Trace, ranks_in

__all__ = [
    "Violation",
    "collective_violations",
    "count_violations",
    "neighbour_violations",
    "ring_direction",
    "ring_violations",
    "unfinished_violations",
]

_NO_DATA = frozenset({"barrier", "monitored_barrier"})  # collectives that move no tensor data


@dataclass(frozen=True, slots=True)
class Violation:
    """One way a trace is not a ring all-reduce: on ``rank`` (or all), at ``step`` (or any)."""

    rank: int | None
    step: int | None
    text: str

    def __str__(self) -> str:
        return self.text


def ring_direction(trace: Trace) -> int:
    """``+1`` if most sends go to ``rank + 1``, ``-1`` if most go to ``rank - 1``."""
    n = trace.world_size
    sends = [m for m in trace.messages if m.op == "send"]
    up = sum(m.peer == (m.rank + 1) % n for m in sends)
    down = sum(m.peer == (m.rank - 1) % n for m in sends)
    return 1 if up >= down else -1


def ring_violations(trace: Trace) -> list[Violation]:
    """Every way ``trace`` departs from a ring all-reduce, rank by rank (empty: it is one).

    A ring, in either direction but the same for every rank: each rank finishes, calls no
    collective that moves data, sends only to one neighbour and receives only from the other,
    makes the schedule's sends and receives (with fewer elements than ranks, 0-element ones may
    be skipped), sends about the schedule's bytes (one element per chunk of slack), and at
    step ``s`` sends a chunk holding ``s + 1`` ranks in reduce-scatter, all ``N`` in all-gather.
    """
    found = unfinished_violations(trace) + collective_violations(trace)
    n = trace.world_size
    if n > 1:
        direction = ring_direction(trace)
        want = 2 * (n - 1)
        rule = (
            f"a ring makes 2(N-1) = {want} "
            f"(N-1 = {n - 1} reduce-scatter steps, then {n - 1} all-gather steps)"
        )
        for rank in range(n):
            found += neighbour_violations(trace, rank, direction)
            found += count_violations(trace, rank, want, rule)
            found += _volume(trace, rank)
            found += _payloads(trace, rank, direction)
    return found


def unfinished_violations(trace: Trace) -> list[Violation]:
    return [
        Violation(r, None, f"rank {r} never finished: {trace.blocked.get(r, 'it did not return')}")
        for r in trace.unfinished
    ]


def collective_violations(trace: Trace, what: str = "a ring all-reduce is") -> list[Violation]:
    """Every collective that moves data: ``what`` must be built from point-to-point calls."""
    return [
        Violation(
            r,
            None,
            f"rank {r} called the collective dist.{name}: {what} built from point-to-point "
            "calls only (send/recv, isend/irecv or batch_isend_irecv)",
        )
        for r, name in trace.collectives
        if name not in _NO_DATA
    ]


def neighbour_violations(trace: Trace, rank: int, direction: int) -> list[Violation]:
    """The first send to a non-neighbour and the first receive from one, if any."""
    n = trace.world_size
    found = []
    for op, want, verb in (
        ("send", (rank + direction) % n, "sent to"),
        ("recv", (rank - direction) % n, "received from"),
    ):
        bad = next((m for m in trace.of(rank, op) if m.peer != want), None)
        if bad is not None:
            peer = "an unknown rank" if bad.peer < 0 else f"rank {bad.peer}"
            found.append(
                Violation(
                    rank,
                    bad.order,
                    f"rank {rank}, step {bad.order + 1}: {verb} {peer}, expected its ring "
                    f"neighbour rank {want} (in a ring every rank {verb.split()[0]} only "
                    f"{'to' if op == 'send' else 'from'} one neighbour, the same way round "
                    "for every rank)",
                )
            )
    return found


def count_violations(trace: Trace, rank: int, want: int, rule: str) -> list[Violation]:
    """``want`` sends and receives on ``rank`` (fewer only by skipping 0-element messages);
    ``rule`` says what makes that many, after "a ring ..." in the message."""
    found = []
    for op, noun in (("send", "send"), ("recv", "receive")):
        made = trace.of(rank, op)
        skipped_empties = (
            trace.numel < trace.world_size and len(made) < want and all(m.numel for m in made)
        )
        if len(made) != want and not skipped_empties:
            found.append(
                Violation(rank, None, f"rank {rank} made {count(len(made), noun)}; {rule}")
            )
    return found


def _volume(trace: Trace, rank: int) -> list[Violation]:
    """Bytes sent within one element per chunk of the ring's bytes for the tensor's size."""
    n = trace.world_size
    sent = sum(m.nbytes for m in trace.of(rank, "send"))
    want = 2 * (n - 1) * trace.nbytes / n
    slack = 2 * (n - 1) * trace.itemsize
    if abs(sent - want) <= slack:
        return []
    return [
        Violation(
            rank,
            None,
            f"rank {rank} sent {sent} bytes; a ring sends 2(N-1)/N times the tensor's "
            f"{trace.nbytes} bytes = {want:.0f} bytes (give or take one element per chunk)",
        )
    ]


def _payloads(trace: Trace, rank: int, direction: int) -> list[Violation]:
    """The first send whose payload is unreadable or holds the wrong ranks for its step."""
    n = trace.world_size
    sends = trace.of(rank, "send")
    if len(sends) != 2 * (n - 1):
        return []  # steps cannot be matched up; count_violations has said why
    for step, m in enumerate(sends):
        if m.numel == 0:
            continue
        want = expected_holds(rank, step, n, direction)
        where = f"rank {rank}, step {step + 1}"  # steps count from 1 in words
        if m.holds is None or m.holds == 0:
            return [
                Violation(
                    rank,
                    step,
                    f"{where}: sent values that are not a sum of whole ranks' inputs (scaled, "
                    "converted to another dtype, or mixed from different elements?)",
                )
            ]
        if m.holds != want:
            stage = "reduce-scatter" if step < n - 1 else "all-gather"
            return [
                Violation(
                    rank,
                    step,
                    f"{where}: sent a chunk holding ranks {_ranks(m.holds)} but a {stage} step "
                    f"{step + 1} chunk should hold {count(want.bit_count(), 'rank')} "
                    f"({_ranks(want)})",
                )
            ]
    return []


def _ranks(mask: int) -> str:
    return "{" + ", ".join(map(str, ranks_in(mask))) + "}"
