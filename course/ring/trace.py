"""The trace: who sent which chunk to whom, in one format for the simulator, the recorder,
the grader and the widget.

A trace is plain data (no torch). The simulator in ``course.ring.schedule`` writes the reference
ring's trace; ``course.ring.recorder`` writes the trace of real code on real ranks. Both fill the
same :class:`Message` records, so "is this a ring?" and "animate this run" are questions about
a trace, whoever made it.

What a payload carried is read off its values. Rank ``r`` starts with
``2**r * (1 + i * 2**N)`` in element ``i`` (see :func:`encoded_value`). Any sum of such
tensors, element by element, is ``mask * (1 + i * 2**N)`` where bit ``r`` of ``mask`` says
that rank ``r``'s contribution is in it; so the first element of a payload tells which ranks
it holds *and* where in the tensor it starts, whatever slicing or copies the code made. The
values are exact in float64 while ``mask * (1 + i * 2**N) < 2**53``, for example for
N <= 16 and up to 2**21 elements.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Literal

from course.ring.schedule import chunk_bounds, expected_holds, num_steps, send_chunk, send_peer

__all__ = [
    "Message",
    "Trace",
    "bytes_sent",
    "chunk_states",
    "decode",
    "encoded_value",
    "full_mask",
    "ranks_in",
    "ring_trace",
    "steps",
]

Op = Literal["send", "recv"]


@dataclass(frozen=True, slots=True)
class Message:
    """One point-to-point call made by one rank, as the caller saw it."""

    rank: int  # the rank that made the call
    peer: int  # the rank at the other end
    op: Op  # "send" or "recv"
    order: int  # position among this rank's calls of the same op: 0, 1, ... (the ring step)
    numel: int  # elements in the payload
    nbytes: int  # bytes in the payload (numel * element size of the buffer actually used)
    offset: int | None  # where the payload starts in the flattened tensor; None if unreadable
    holds: int | None  # bitmask of the ranks whose contributions it carries; None if unreadable


@dataclass(frozen=True, slots=True)
class Trace:
    """Every point-to-point message of one all-reduce over ``world_size`` ranks."""

    world_size: int
    numel: int  # elements in the tensor being reduced
    itemsize: int  # bytes per element of that tensor
    messages: tuple[Message, ...]
    collectives: tuple[tuple[int, str], ...] = ()  # (rank, name) of each collective called
    unfinished: tuple[int, ...] = ()  # ranks that never returned (deadlocked or crashed)
    blocked: dict[int, str] = field(default_factory=dict)  # rank -> where it was stuck

    @property
    def nbytes(self) -> int:
        """Size of the tensor being reduced, in bytes."""
        return self.numel * self.itemsize

    def of(self, rank: int, op: Op) -> list[Message]:
        """This rank's messages of one kind, in call order."""
        return sorted(
            (m for m in self.messages if m.rank == rank and m.op == op), key=lambda m: m.order
        )

    def to_json(self) -> str:
        """Serialise for a feedback page or a file; :meth:`from_json` reads it back."""
        data = asdict(self)
        data["blocked"] = {str(k): v for k, v in self.blocked.items()}
        return json.dumps(data)

    @classmethod
    def from_json(cls, text: str) -> Trace:
        """Inverse of :meth:`to_json`."""
        data = json.loads(text)
        return cls(
            world_size=data["world_size"],
            numel=data["numel"],
            itemsize=data["itemsize"],
            messages=tuple(Message(**m) for m in data["messages"]),
            collectives=tuple((int(r), str(n)) for r, n in data["collectives"]),
            unfinished=tuple(data["unfinished"]),
            blocked={int(k): v for k, v in data["blocked"].items()},
        )


def full_mask(world_size: int) -> int:
    """The mask of a fully reduced value: every rank's bit set."""
    return (1 << world_size) - 1


def ranks_in(mask: int) -> list[int]:
    """The ranks whose bits are set in ``mask``, ascending."""
    return [r for r in range(mask.bit_length()) if mask >> r & 1]


def encoded_value(rank: int, index: int, world_size: int) -> int:
    """The starting value of element ``index`` on ``rank``: ``2**rank * (1 + index * 2**N)``."""
    return (1 << rank) * (1 + index * (1 << world_size))


def decode(values: Sequence[float], world_size: int) -> tuple[int | None, int | None]:
    """Read ``(offset, holds)`` off a payload's values; ``(None, None)`` if they are not a
    consistent sum of encoded contributions (scaled, corrupted, or from another slice)."""
    if not values:
        return None, None
    scale = 1 << world_size
    first = values[0]
    if not math.isfinite(first) or first != int(first) or first <= 0:  # garbage received
        return (None, 0) if first == 0 and all(v == 0 for v in values) else (None, None)
    first = int(first)
    mask = first % scale
    if mask == 0 or (first - mask) % (mask * scale):
        return None, None
    offset = (first - mask) // (mask * scale)
    expected_last = mask * (1 + (offset + len(values) - 1) * scale)
    if values[-1] != expected_last or any(
        v != mask * (1 + (offset + j) * scale) for j, v in enumerate(values)
    ):
        return None, None
    return offset, mask


def steps(trace: Trace) -> int:
    """Number of steps: the most sends any one rank made."""
    counts = [len(trace.of(r, "send")) for r in range(trace.world_size)]
    return max(counts, default=0)


def bytes_sent(trace: Trace, upto_step: int | None = None) -> list[int]:
    """Bytes each rank has sent, in total or in its first ``upto_step`` sends."""
    sent = [0] * trace.world_size
    for m in trace.messages:
        if m.op == "send" and (upto_step is None or m.order < upto_step):
            sent[m.rank] += m.nbytes
    return sent


def chunk_states(trace: Trace) -> list[list[list[int]]]:
    """``states[k][rank][chunk]``: the mask each chunk holds after ``k`` steps, k = 0..steps.

    A rank's chunk starts with its own bit and gains the bits of every payload it receives
    that overlaps the chunk. That is exactly what a correct ring does (add in reduce-scatter,
    copy a full chunk in all-gather); for wrong code, the payloads it sends next tell the truth.
    """
    n = trace.world_size
    bounds = chunk_bounds(trace.numel, n)
    state = [[1 << r for _ in bounds] for r in range(n)]
    states = [[row[:] for row in state]]
    recvs = [trace.of(r, "recv") for r in range(n)]
    for k in range(steps(trace)):
        for r in range(n):
            for m in recvs[r]:
                if m.order != k or m.holds is None or m.offset is None:
                    continue
                for c, (lo, hi) in enumerate(bounds):
                    if lo < hi and m.offset < hi and lo < m.offset + m.numel:
                        state[r][c] |= m.holds
        states.append([row[:] for row in state])
    return states


def ring_trace(world_size: int, numel: int, itemsize: int = 4) -> Trace:
    """The trace a recorder would record of the reference ring run on encoded inputs.

    Every step gives each rank one send and one receive (``order`` = step). A payload's
    ``holds`` is the mask it carries; an empty chunk is still sent, as a 0-element message
    whose ``offset`` and ``holds`` are ``None`` (nothing to decode). Practical up to N ~ 64.
    """
    bounds = chunk_bounds(numel, world_size)
    messages: list[Message] = []
    for s in range(num_steps(world_size)):
        for r in range(world_size):
            c = send_chunk(r, s, world_size)
            lo, hi = bounds[c]
            holds = expected_holds(r, s, world_size) if hi > lo else None
            offset = lo if hi > lo else None
            n = hi - lo
            nxt = send_peer(r, world_size)
            messages.append(Message(r, nxt, "send", s, n, n * itemsize, offset, holds))
            messages.append(Message(nxt, r, "recv", s, n, n * itemsize, offset, holds))
    return Trace(world_size, numel, itemsize, tuple(messages))
