"""The trace of a run as the relay saw it: the ring's verdict from the caller's own record.

    inputs = SecretEncoding.draw(world_size)       # in the judge: which bit is whose, secret
    ...rank r runs on inputs.tensor(r, numel); the run's backend is the relay...
    trace = relayed_trace(result.relayed, world_size, numel, inputs, part=i)

Under grading, ranks reach each other only through :mod:`course.ranks.relay`, which records
every message with its bytes. This module reads those bytes here, in the caller, so the
pattern verdict needs nothing a rank wrote or said: not the recorder's log, not the rank's
own decoding. Rank r's input holds ``2**b_r * (1 + i * 2**BITS)`` at index i, where the bits
``b_r`` are drawn afresh for every case from ``BITS`` and told to no rank: a payload that
carries rank q's contribution cannot be made without rank q's tensor, so a rank cannot
forge the messages a ring would send (the fixed ``2**r`` encoding of the notebook path can
be computed by anyone).
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from course.ranks.frames import DTYPES, Event
from course.ring.encoding import decode_tensor
from course.ring.hierarchy import Call
from course.ring.trace import Message, Trace

__all__ = [
    "BITS",
    "SecretEncoding",
    "all_reduces_in",
    "bytes_between_snapshots",
    "bytes_sent",
    "collectives_in",
    "part_span",
    "relayed_calls",
    "relayed_trace",
]

BITS = 20  # the bits a rank's mark is drawn from: exact in float64 up to 8192 elements
MAX_NUMEL = (1 << (53 - 2 * BITS)) - 1
NAMES = {
    "allreduce": "all_reduce",
    "allgather": "all_gather",
    "reduce_scatter": "reduce_scatter",
    "broadcast": "broadcast",
    "alltoall": "all_to_all",
    "reduce": "reduce",
    "gather": "gather",
    "scatter": "scatter",
    "barrier": "barrier",
}


@dataclass(frozen=True)
class SecretEncoding:
    """Which bit marks each rank's contributions: drawn in the caller, never sent whole."""

    bits: tuple[int, ...]  # bits[r]: rank r's

    @classmethod
    def draw(cls, world_size: int) -> SecretEncoding:
        return cls(tuple(random.SystemRandom().sample(range(BITS), world_size)))

    def tensor(self, rank: int, numel: int) -> torch.Tensor:
        """Rank ``rank``'s float64 input: its bit's value, times ``1 + i * 2**BITS``."""
        if numel > MAX_NUMEL:
            raise ValueError(f"{numel} elements are more than {MAX_NUMEL} can mark exactly")
        scale = float(1 << BITS)
        return (1 + torch.arange(numel, dtype=torch.float64) * scale) * float(1 << self.bits[rank])

    def decode(self, payload: torch.Tensor) -> tuple[int | None, int | None]:
        """``(offset, ranks mask)`` of a payload's values, or Nones where they are not a sum
        of marked contributions (scaled, mixed, from another slice, or of an unknown bit)."""
        if not payload.is_floating_point():
            return None, None
        offset, marks = decode_tensor(payload, len(self.bits), BITS)
        if not marks:
            return offset, marks
        owner = {b: r for r, b in enumerate(self.bits)}
        if any(marks >> b & 1 and b not in owner for b in range(BITS)):
            return None, None  # a bit no rank was given: not made from the inputs
        return offset, sum(1 << owner[b] for b in range(BITS) if marks >> b & 1)


def relayed_trace(
    events: Sequence[Event], world_size: int, numel: int, encoding: SecretEncoding, part: int
) -> Trace:
    """The trace of part ``part`` of a run (what each rank did after its ``mark(part)`` and
    before its next mark), from the relay's record alone.

    Raises ValueError when a rank's marks are not ``0, 1, 2, ...`` once each, in order: the
    record cannot then be split into the check's cases.
    """
    spans = {r: part_span(events, r, part) for r in range(world_size)}
    messages: list[Message] = []
    collectives: list[tuple[int, str]] = []
    for kind, mine in (("send", "src"), ("recv", "dst")):
        for rank in range(world_size):
            lo, hi = spans[rank]
            calls = [e for e in events if e.kind == kind and getattr(e, mine) == rank]
            calls = sorted((e for e in calls if lo <= e.seq[0] < hi), key=lambda e: e.seq[0])
            messages += [_message(e, rank, kind, k, encoding) for k, e in enumerate(calls)]
    for e in events:
        if e.kind in NAMES:
            for member, seq in zip(e.group, e.seq, strict=True):
                lo, hi = spans[member]
                if lo <= seq < hi:
                    collectives.append((member, NAMES[e.kind]))
    return Trace(world_size, numel, 8, tuple(messages), tuple(dict.fromkeys(collectives)))


def collectives_in(events: Sequence[Event], rank: int, part: int) -> list[str]:
    """The collectives (torch.distributed's names) ``rank`` took part in during part ``part``
    of a run, in the order it called them, from the relay's record; ValueError as for
    :func:`relayed_trace`."""
    return [NAMES[e.kind] for e in _rank_collectives(events, rank, part)]


def all_reduces_in(events: Sequence[Event], rank: int, part: int | None) -> list[int]:
    """The elements of each all-reduce ``rank`` made during part ``part`` of a run (``None``:
    the whole run, bounded by no mark its code could move), in the order it called them,
    from the relay's record; ValueError as for :func:`relayed_trace`."""
    return [
        e.nbytes[e.group.index(rank)] // torch.empty((), dtype=DTYPES[e.dtype]).element_size()
        for e in _rank_collectives(events, rank, part)
        if e.kind == "allreduce"
    ]


def bytes_between_snapshots(events: Sequence[Event], rank: int) -> list[int]:
    """The bytes ``rank`` put into sends and data-moving collectives in each stretch of its
    run its snapshots bound (before the first, between each two, after the last), from the
    relay's record: where the snapshots fall among the run's traffic, which the rank's code
    could not move without moving the traffic too."""
    cuts = sorted(
        e.seq[e.group.index(rank)] for e in events if e.kind == "snapshot" and rank in e.group
    )
    stretches = [0] * (len(cuts) + 1)
    for e in events:
        if e.kind == "send" and e.src == rank:
            stretches[bisect.bisect(cuts, e.seq[0])] += e.nbytes[0]
        elif e.kind in NAMES and e.kind != "barrier" and rank in e.group:
            i = e.group.index(rank)
            stretches[bisect.bisect(cuts, e.seq[i])] += e.nbytes[i]
    return stretches


def bytes_sent(events: Sequence[Event], rank: int) -> int:
    """The bytes ``rank`` put into sends and data-moving collectives in the whole run, from
    the relay's record: no mark of the rank's (which its code could move) bounds the count."""
    total = 0
    for e in events:
        if e.kind == "send" and e.src == rank:
            total += e.nbytes[0]
        elif e.kind in NAMES and e.kind != "barrier" and rank in e.group:
            total += e.nbytes[e.group.index(rank)]
    return total


def _rank_collectives(events: Sequence[Event], rank: int, part: int | None) -> list[Event]:
    lo, hi = part_span(events, rank, part) if part is not None else (0, float("inf"))
    mine = [(e.seq[e.group.index(rank)], e) for e in events if e.kind in NAMES and rank in e.group]
    return [e for seq, e in sorted(mine, key=lambda pair: pair[0]) if lo <= seq < hi]


def part_span(events: Sequence[Event], rank: int, part: int) -> tuple[int, float]:
    """The positions (``seq``) of ``rank``'s requests in part ``part`` of its run: from its
    ``mark(part)`` to its next mark; ValueError as for :func:`relayed_trace`."""
    marks = sorted((e for e in events if e.kind == "mark" and e.src == rank), key=lambda e: e.seq)
    tags = [e.tag for e in marks]
    if tags != list(range(len(tags))) or part >= len(tags):
        raise ValueError(f"rank {rank} marked its cases {tags}, not 0, 1, 2, ... in order")
    end = marks[part + 1].seq[0] if part + 1 < len(marks) else float("inf")
    return marks[part].seq[0], end


def _message(event: Event, rank: int, op: str, order: int, encoding: SecretEncoding) -> Message:
    peer = event.dst if op == "send" else event.src
    dtype = DTYPES[event.dtype]
    itemsize = torch.empty((), dtype=dtype).element_size()
    nbytes = event.nbytes[0]
    offset = holds = None
    if event.data and dtype.is_floating_point:
        payload = torch.frombuffer(bytearray(event.data), dtype=torch.uint8).view(dtype)
        offset, holds = encoding.decode(payload)
    return Message(rank, peer, op, order, nbytes // itemsize, nbytes, offset, holds)


def relayed_calls(events: Sequence[Event], world_size: int, part: int) -> list[Call]:
    """Part ``part`` of a run as a list of calls (collectives with their groups and each
    member's bytes, and point-to-point sends), from the relay's record alone, in the order
    the relay completed them; ValueError as for :func:`relayed_trace`."""
    spans = {r: part_span(events, r, part) for r in range(world_size)}
    calls = []
    for e in events:
        if e.kind in NAMES:
            inside = [spans[m][0] <= s < spans[m][1] for m, s in zip(e.group, e.seq, strict=True)]
            if any(inside):
                size = torch.empty((), dtype=DTYPES[e.dtype]).element_size() if e.dtype else 1
                calls.append(Call(NAMES[e.kind], tuple(e.group), tuple(e.nbytes), size))
        elif e.kind == "send" and spans[e.src][0] <= e.seq[0] < spans[e.src][1]:
            calls.append(Call("send", (e.src, e.dst), tuple(e.nbytes)))
    return calls
