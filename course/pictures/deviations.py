"""What the picture says about a run that is not a ring: deviations, collapsed and in order.

``course.ring.verdict.ring_violations`` lists every departure rank by rank; on 16 or 32 ranks
the same mistake repeats on every rank. Here each repeated deviation becomes one line with a
count, and a rank that never finished is reported once, as blocked, without the message
counts that follow from it (a rank stuck in its first receive did not "make 1 receive").
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from course.pictures.style import runs_text
from course.ranks.wording import count
from course.ring.trace import Message, Trace
from course.ring.verdict import Violation, ring_violations

__all__ = ["Deviation", "deviations", "pending_receives", "pending_sends"]

_NUMBER = re.compile(r"\d+")


@dataclass(frozen=True)
class Deviation:
    """One line of the report: a deviation and the ranks on which it repeats."""

    text: str  # the first occurrence, as ring_violations words it
    step: int | None  # 0-based ring step it belongs to (None: the whole run)
    ranks: tuple[int, ...]  # every rank it happened on (empty: not about one rank)
    same: bool = True  # the other ranks' texts are this one's, but for the rank itself

    @property
    def line(self) -> str:
        """The text, with ``(the same on 15 more ranks: 1-15)`` when it repeats, or
        ``(likewise on ..., with their own numbers)`` when bytes or peers differ."""
        more = self.ranks[1:]
        if not more:
            return self.text
        where = f"{count(len(more), 'more rank')}: {runs_text(list(more))}"
        if self.same:
            return f"{self.text} (the same on {where})"
        return f"{self.text} (likewise on {where}, with their own numbers)"


def _relevant(trace: Trace, v: Violation) -> bool:
    """Drop what only follows from a rank never finishing (too few messages, bytes)."""
    if v.rank in trace.unfinished and v.step is None:
        return v.text.startswith(f"rank {v.rank} never finished")
    return True


def deviations(trace: Trace, found: list[Violation] | None = None) -> list[Deviation]:
    """The trace's deviations (``found``, else from a ring all-reduce), each repeated one
    collapsed into one line, first seen first."""
    groups: dict[tuple[str, int | None], list[Violation]] = {}
    for v in ring_violations(trace) if found is None else found:
        if _relevant(trace, v):
            shape = _NUMBER.sub("#", v.text)
            groups.setdefault((shape, v.step), []).append(v)
    return [
        Deviation(
            vs[0].text,
            step,
            tuple(v.rank for v in vs if v.rank is not None),
            len({_anonymous(v) for v in vs}) == 1,
        )
        for (_, step), vs in groups.items()
    ]


def _anonymous(v: Violation) -> str:
    """The text with its own rank's number taken out: what must match to say "the same"."""
    return v.text if v.rank is None else re.sub(rf"\brank {v.rank}\b", "rank #", v.text)


def pending_sends(trace: Trace) -> list[Message]:
    """Blocking sends that were posted and never completed: the last send of each unfinished
    rank that was stuck in ``dist.send``."""
    pending = []
    for rank in trace.unfinished:
        sends = trace.of(rank, "send")
        if sends and "dist.send " in trace.blocked.get(rank, ""):
            pending.append(sends[-1])
    return pending


def pending_receives(trace: Trace) -> list[Message]:
    """Receives that were posted and never completed: each unfinished rank's last receive,
    when the recorder could not read its payload (nothing arrived)."""
    pending = []
    for rank in trace.unfinished:
        recvs = trace.of(rank, "recv")
        if recvs and recvs[-1].offset is None and recvs[-1].holds is None:
            pending.append(recvs[-1])
    return pending
