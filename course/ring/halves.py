"""The ring's two halves on their own: reduce-scatter and all-gather as plain data.

Pure Python, no torch. Sharded data parallelism (ZeRO, FSDP) runs the two phases of the ring
all-reduce (``course.ring.schedule``) as separate collectives, with one contract for both:

- the shard of rank ``r`` is chunk ``r`` of the flattened tensor, with the ring's own
  ``chunk_bounds`` (the first ``numel % N`` chunks one element longer; empty when numel < N);
- ``reduce_scatter``: after ``N-1`` steps rank ``r`` holds the sum over ranks of chunk ``r``.
  At step ``s`` rank ``r`` sends chunk ``(r - s - 1) % N`` to ``r + 1`` and adds the chunk
  ``(r - s - 2) % N`` it receives from ``r - 1`` (the ring's schedule, shifted by one chunk so
  that rank ``r`` ends with chunk ``r``, as ``dist.reduce_scatter_tensor`` does);
- ``all_gather``: rank ``r`` starts with chunk ``r`` only; at step ``s`` it sends chunk
  ``(r - s) % N`` to ``r + 1`` and copies in chunk ``(r - s - 1) % N`` from ``r - 1``.

Each sends ``(N-1)/N`` of the tensor per rank in ``N-1`` steps: half a ring all-reduce.
The traces are ``course.ring.trace.Trace``; for an all-gather the shards are encoded as fully
reduced values (every rank's bit), so a payload says which chunk it is and that it is whole.
"""

from __future__ import annotations

from typing import Literal

from course.ring.schedule import chunk_bounds, expected_holds
from course.ring.trace import Message, Trace, full_mask, steps
from course.ring.verdict import (
    Violation,
    collective_violations,
    count_violations,
    neighbour_violations,
    ring_direction,
    unfinished_violations,
)

__all__ = [
    "HALVES",
    "Half",
    "half_bytes_formula",
    "half_states",
    "half_trace",
    "half_violations",
    "recv_chunk",
    "send_chunk",
]

Half = Literal["reduce-scatter", "all-gather"]
HALVES: tuple[Half, Half] = ("reduce-scatter", "all-gather")


def _check(half: str) -> None:
    if half not in HALVES:
        raise ValueError(f"half must be 'reduce-scatter' or 'all-gather', got {half!r}")


def send_chunk(half: Half, rank: int, step: int, world_size: int) -> int:
    """The chunk ``rank`` sends to ``rank + 1`` at ``step`` (0-based) of one half."""
    _check(half)
    shift = 1 if half == "reduce-scatter" else 0
    return (rank - step - shift) % world_size


def recv_chunk(half: Half, rank: int, step: int, world_size: int) -> int:
    """The chunk ``rank`` receives from ``rank - 1`` at ``step``: adds it, or copies it in."""
    return send_chunk(half, (rank - 1) % world_size, step, world_size)


def half_bytes_formula(size_bytes: float, world_size: int) -> float:
    """The textbook bytes each rank sends in one half: ``(N-1)/N`` times the tensor size."""
    return (world_size - 1) / world_size * size_bytes


def _payload(half: Half, rank: int, step: int, world_size: int) -> int:
    if half == "all-gather":
        return full_mask(world_size)
    return expected_holds(rank, step, world_size)


def half_trace(half: Half, world_size: int, numel: int, itemsize: int = 4) -> Trace:
    """What a recorder records of the reference half on encoded inputs (the simulator)."""
    _check(half)
    bounds = chunk_bounds(numel, world_size)
    messages: list[Message] = []
    for s in range(world_size - 1):
        for r in range(world_size):
            lo, hi = bounds[send_chunk(half, r, s, world_size)]
            n, right = hi - lo, (r + 1) % world_size
            holds = _payload(half, r, s, world_size) if n else None
            offset = lo if n else None
            messages.append(Message(r, right, "send", s, n, n * itemsize, offset, holds))
            messages.append(Message(right, r, "recv", s, n, n * itemsize, offset, holds))
    return Trace(world_size, numel, itemsize, tuple(messages))


def half_states(trace: Trace, half: Half) -> list[list[list[int]]]:
    """``states[k][rank][chunk]``: the mask each chunk holds after ``k`` steps.

    Reduce-scatter starts with every rank's own bit in every chunk; all-gather with each
    rank's own shard whole (every bit) and nothing elsewhere (mask 0). A received payload
    adds its bits to every chunk it overlaps, as ``course.ring.trace.chunk_states`` does.
    """
    _check(half)
    n, full = trace.world_size, full_mask(trace.world_size)
    bounds = chunk_bounds(trace.numel, n)
    if half == "reduce-scatter":
        state = [[1 << r for _ in bounds] for r in range(n)]
    else:
        state = [[full if c == r else 0 for c in range(n)] for r in range(n)]
    states = [[row[:] for row in state]]
    for k in range(steps(trace)):
        for m in trace.messages:
            if m.op != "recv" or m.order != k or m.holds is None or m.offset is None:
                continue
            for c, (lo, hi) in enumerate(bounds):
                if lo < hi and m.offset < hi and lo < m.offset + m.numel:
                    state[m.rank][c] |= m.holds
        states.append([row[:] for row in state])
    return states


def half_violations(trace: Trace, half: Half) -> list[Violation]:
    """Every way ``trace`` departs from one half of a ring, rank by rank (empty: it is one).

    Each rank finishes, calls no collective that moves data, sends only to one neighbour and
    receives only from the other (the same way round for all), makes ``N-1`` sends and
    receives (0-element ones may be skipped when numel < N), sends about ``(N-1)/N`` of the
    tensor, and sends at step ``s`` a chunk holding ``s + 1`` ranks (reduce-scatter) or one
    whole shard (all-gather).
    """
    _check(half)
    found = unfinished_violations(trace) + collective_violations(
        trace, f"your {half.replace('-', '_')} must be"
    )
    if trace.world_size > 1:
        direction = ring_direction(trace)
        for rank in range(trace.world_size):
            found += neighbour_violations(trace, rank, direction)
            want = trace.world_size - 1
            found += count_violations(trace, rank, want, f"a ring {half} makes N-1 = {want}")
            found += _volume(trace, rank, half)
            found += _payloads(trace, rank, direction, half)
    return found


def _volume(trace: Trace, rank: int, half: Half) -> list[Violation]:
    n = trace.world_size
    sent = sum(m.nbytes for m in trace.of(rank, "send"))
    want = half_bytes_formula(trace.nbytes, n)
    if abs(sent - want) <= (n - 1) * trace.itemsize:
        return []
    return [
        Violation(
            rank,
            None,
            f"rank {rank} sent {sent} bytes; a ring {half} sends (N-1)/N times the tensor's "
            f"{trace.nbytes} bytes = {want:.0f} bytes (give or take one element per chunk)",
        )
    ]


def _payloads(trace: Trace, rank: int, direction: int, half: Half) -> list[Violation]:
    """The first send whose payload is unreadable or not what its step should carry."""
    n = trace.world_size
    sends = trace.of(rank, "send")
    if len(sends) != n - 1:
        return []  # steps cannot be matched up; count_violations has said why
    bounds = {lo for lo, hi in chunk_bounds(trace.numel, n) if hi > lo}
    for step, m in enumerate(sends):
        if m.numel == 0:
            continue
        where = f"rank {rank}, step {step}"
        if not m.holds:
            return [Violation(rank, step, f"{where}: sent values that are not a sum of inputs")]
        if half == "all-gather":
            if m.holds != full_mask(n) or m.offset not in bounds:
                text = f"{where}: sent something other than one whole shard (a chunk)"
                return [Violation(rank, step, text)]
            continue
        want = expected_holds(rank, step, n, direction)
        if m.holds != want:
            return [
                Violation(
                    rank,
                    step,
                    f"{where}: sent a chunk holding {m.holds.bit_count()} ranks' contributions; "
                    f"a reduce-scatter step {step} chunk holds {step + 1} "
                    "(the partial sum it received, plus its own)",
                )
            ]
    return []
