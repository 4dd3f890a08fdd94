"""Recursive doubling as plain data: its schedule, and the verdict on a trace of one.

Pure Python, no torch. On N ranks, with p the largest power of two not above N
(Thakur, Rabenseifner & Gropp, 2005):

- the fold: when N > p, rank q >= p sends its whole tensor to q - p, which adds it;
- log2(p) exchange steps: at step k rank q < p swaps its whole tensor with q XOR 2**k and
  adds what it receives, so after step k it holds the sum over its block of 2**(k+1) ranks
  (the folded ranks included);
- the unfold: rank q < p sends the result back to q + p where that rank exists.

Every message is the whole tensor; a rank that takes part in every step makes log2(p)
exchanges, plus one message each way with its folded partner. :func:`tree_violations`
judges a :class:`~course.ring.trace.Trace` (the relay's record under grading, the
recorder's in a notebook) against that plan, rank by rank.
"""

from __future__ import annotations

from dataclasses import dataclass

from course.ranks.wording import count
from course.ring.trace import Message, Trace, full_mask, ranks_in
from course.ring.verdict import Violation, collective_violations, unfinished_violations

__all__ = ["Expected", "largest_power_of_two", "tree_schedule", "tree_trace", "tree_violations"]


@dataclass(frozen=True, slots=True)
class Expected:
    """One message recursive doubling makes on a rank: with whom, holding whom, and why."""

    peer: int
    holds: int  # the mask of ranks its payload sums
    step: str  # "the fold", "step 1", ..., "the unfold": what a message names it by
    why: str  # the rule that picks ``peer``, in words


def largest_power_of_two(n: int) -> int:
    """The largest power of two not above ``n`` (n >= 1)."""
    return 1 << (n.bit_length() - 1)


def _folded(q: int, n: int, p: int) -> int:
    """The mask rank ``q < p`` holds after the fold: its own bit, and its folded partner's."""
    return (1 << q) | ((1 << (q + p)) if q + p < n else 0)


def _block(q: int, k: int, n: int, p: int) -> int:
    """What rank ``q < p`` holds before exchange step ``k``: its aligned block of ``2**k``."""
    start = q & ~((1 << k) - 1)
    mask = 0
    for j in range(start, start + (1 << k)):
        mask |= _folded(j, n, p)
    return mask


def tree_schedule(rank: int, world_size: int) -> dict[str, list[Expected]]:
    """Rank ``rank``'s sends and receives, in order, under recursive doubling."""
    n, p = world_size, largest_power_of_two(world_size)
    full = full_mask(n)
    if rank >= p:
        fold = Expected(
            rank - p, 1 << rank, "the fold", f"rank {rank} >= p = {p} folds into {rank} - p"
        )
        back = Expected(
            rank - p, full, "the unfold", f"rank {rank - p} sends the result back to {rank}"
        )
        return {"send": [fold], "recv": [back]}
    sends, recvs = [], []
    if rank + p < n:
        recvs.append(
            Expected(rank + p, 1 << (rank + p), "the fold", f"rank {rank + p} folds into {rank}")
        )
    for k in range(p.bit_length() - 1):
        peer = rank ^ (1 << k)
        why = f"{rank} XOR 2**{k} = {peer}"
        sends.append(Expected(peer, _block(rank, k, n, p), f"step {k + 1}", why))
        recvs.append(Expected(peer, _block(peer, k, n, p), f"step {k + 1}", why))
    if rank + p < n:
        sends.append(
            Expected(rank + p, full, "the unfold", f"rank {rank} + p = {rank + p} was folded")
        )
    return {"send": sends, "recv": recvs}


def tree_trace(world_size: int, numel: int, itemsize: int = 8) -> Trace:
    """What a recorder records of recursive doubling on encoded inputs (the simulator)."""
    messages = []
    for rank in range(world_size):
        for op, plan in tree_schedule(rank, world_size).items():
            messages += [
                Message(rank, e.peer, op, k, numel, numel * itemsize, 0, e.holds)  # type: ignore[arg-type]
                for k, e in enumerate(plan)
            ]
    return Trace(world_size, numel, itemsize, tuple(messages))


def tree_violations(trace: Trace) -> list[Violation]:
    """Every way ``trace`` departs from recursive doubling, rank by rank (empty: it is it).

    Each rank finishes, calls no collective that moves data, and makes exactly the schedule's
    sends and receives (:func:`tree_schedule`), in order: each with the schedule's partner,
    each the whole tensor, each send holding the block of ranks that step has summed.
    """
    found = unfinished_violations(trace) + collective_violations(trace, "a tree all-reduce is")
    n = trace.world_size
    p = largest_power_of_two(n)
    rule = _rule(n, p)
    departures: list[tuple[tuple[int, int, int], Violation]] = []
    counts = []
    for rank in range(n):
        plan = tree_schedule(rank, n)
        for op, noun in (("send", "send"), ("recv", "receive")):
            made = trace.of(rank, op)
            want = plan[op]
            if len(made) != len(want):
                counts.append(
                    Violation(
                        rank,
                        None,
                        f"rank {rank} made {count(len(made), noun)}; recursive doubling on "
                        f"{n} ranks makes {len(want)} on rank {rank} ({rule})",
                    )
                )
            for v in _first_departure(trace, rank, op, made, want):
                stage = _stage(want[v.step].step, p) if v.step is not None else 0
                departures.append(((stage, op != "send", rank), v))
    # The first departure in the order the run makes them (sends first), then the counts,
    # then the other departures.
    ordered = [v for _, v in sorted(departures, key=lambda d: d[0])]
    return found + ordered[:1] + counts + ordered[1:]


def _stage(step: str, p: int) -> int:
    """When a step happens: the fold first, the exchange steps, the unfold last."""
    if step == "the fold":
        return 0
    if step == "the unfold":
        return p.bit_length() + 1
    return int(step.removeprefix("step "))


def _rule(n: int, p: int) -> str:
    steps = p.bit_length() - 1
    exchange = f"{count(steps, 'exchange step')} (log2 {p})"
    if n == p:
        return exchange
    folded = f"rank {p}" if n == p + 1 else f"ranks {p}..{n - 1}"
    return f"the fold of {folded}, then {exchange}, then the result sent back"


def _first_departure(
    trace: Trace, rank: int, op: str, made: list[Message], want: list[Expected]
) -> list[Violation]:
    """The first of ``rank``'s ``op`` messages that differs from the schedule, if any."""
    verb, moved, way = (
        ("sent to", "sent", "to") if op == "send" else ("received from", "received", "from")
    )
    for k, (m, e) in enumerate(zip(made, want, strict=False)):
        where = f"rank {rank}, {e.step}"
        if m.peer != e.peer:
            peer = "an unknown rank" if m.peer < 0 else f"rank {m.peer}"
            return [Violation(rank, k, f"{where}: {verb} {peer}, expected rank {e.peer} ({e.why})")]
        if m.numel != trace.numel:
            return [
                Violation(
                    rank,
                    k,
                    f"{where}: {moved} {count(m.numel, 'element')} {way} "
                    f"rank {m.peer}; every message "
                    f"of recursive doubling is the whole tensor ({count(trace.numel, 'element')})",
                )
            ]
        if op != "send":
            continue  # what a receive holds is its sender's send, judged there
        if not m.holds:
            return [
                Violation(
                    rank,
                    k,
                    f"{where}: sent values that are not a sum of whole ranks' inputs (scaled, "
                    "converted to another dtype, or mixed from different elements?)",
                )
            ]
        if m.holds != e.holds:
            return [
                Violation(
                    rank,
                    k,
                    f"{where}: sent a tensor holding ranks {_ranks(m.holds)}, but by then it "
                    f"should hold the sum of {count(e.holds.bit_count(), 'rank')} "
                    f"({_ranks(e.holds)})",
                )
            ]
    return []


def _ranks(mask: int) -> str:
    return "{" + ", ".join(map(str, ranks_in(mask))) + "}"
