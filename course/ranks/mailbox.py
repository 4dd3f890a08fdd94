"""What the relay holds between a send and its receive: messages by sender, receiver and tag.

    box = Mailbox()
    box.post(Posted(group, src, dst, tag, header, payload, req, since))  # a send has arrived
    box.take(group, src, dst, tag)          # a receive: the Posted message, or None
    box.take(group, ANY, dst, tag)          # from any source: the earliest arrival
    box.expired(deadline)                   # the sends no receive took before ``deadline``

Messages between one pair with one tag are delivered in the order they were sent, as gloo
delivers them; a receive from any source takes whichever matching message arrived first. A
send's own call waits in here too: as on gloo, it completes once a receive takes it.
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ANY", "Mailbox", "Posted"]

ANY = -1  # the source of a receive from any rank (``dist.recv(t)`` with no ``src``)

Key = tuple[tuple[int, ...], int, int, int]  # (group, src, dst, tag)


@dataclass
class Posted:
    """One sent message, and the sender's call that waits until a receive takes it."""

    group: tuple[int, ...]
    src: int
    dst: int
    tag: int
    header: dict[str, Any]
    payload: bytes
    req: int  # the sender's request, answered when the message is received
    since: float  # when it reached the relay (time.monotonic)
    arrival: int = field(default=0)


class Mailbox:
    """Sent messages not yet received, and how many bytes they hold."""

    def __init__(self) -> None:
        self._boxes: dict[Key, deque[Posted]] = {}
        self._arrivals = itertools.count()
        self.held = 0  # bytes of payload held

    def post(self, message: Posted) -> None:
        message.arrival = next(self._arrivals)
        key = (message.group, message.src, message.dst, message.tag)
        self._boxes.setdefault(key, deque()).append(message)
        self.held += len(message.payload)

    def take(self, group: tuple[int, ...], src: int, dst: int, tag: int) -> Posted | None:
        """The next message for this receive, removed, or None."""
        sources = [s for s in group if s != dst] if src == ANY else [src]
        boxes = [(s, self._boxes.get((group, s, dst, tag))) for s in sources]
        ready = [(box[0].arrival, s) for s, box in boxes if box]
        if not ready:
            return None
        _, sender = min(ready)
        message = self._boxes[group, sender, dst, tag].popleft()
        self.held -= len(message.payload)
        return message

    def waiting(self, rank: int) -> bool:
        """Whether a send of ``rank``'s waits here for its receive."""
        return any(m.src == rank for box in self._boxes.values() for m in box)

    def addressed_to(self, dst: int) -> list[Posted]:
        """Remove and return every message sent to rank ``dst``."""
        out = []
        for key, box in list(self._boxes.items()):
            if key[2] == dst:
                out += box
                self.held -= sum(len(m.payload) for m in box)
                del self._boxes[key]
        return out

    def expired(self, deadline: float) -> list[Posted]:
        """Remove and return every message that reached the relay before ``deadline``."""
        late = []
        for key, box in list(self._boxes.items()):
            while box and box[0].since < deadline:
                late.append(box.popleft())
                self.held -= len(late[-1].payload)
            if not box:
                del self._boxes[key]
        return late
