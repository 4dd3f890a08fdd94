"""What the relay holds between a send and its receive: messages by sender, receiver and tag.

    box = Mailbox()
    box.post(group, src, dst, tag, header, payload)    # a send has arrived
    box.take(group, src, dst, tag)                     # a receive: (src, header, payload) or None
    box.take(group, ANY, dst, tag)                     # from any source: the earliest arrival

Messages between one pair with one tag are delivered in the order they were sent, as gloo
delivers them; a receive from any source takes whichever matching message arrived first.
"""

from __future__ import annotations

import itertools
from collections import deque

__all__ = ["ANY", "Mailbox"]

ANY = -1  # the source of a receive from any rank (``dist.recv(t)`` with no ``src``)

Key = tuple[tuple[int, ...], int, int, int]  # (group, src, dst, tag)


class Mailbox:
    """Sent messages not yet received, and how many bytes they hold."""

    def __init__(self) -> None:
        self._boxes: dict[Key, deque[tuple[int, dict, bytes]]] = {}
        self._arrivals = itertools.count()
        self.held = 0  # bytes of payload held

    def post(
        self, group: tuple[int, ...], src: int, dst: int, tag: int, header: dict, payload: bytes
    ) -> None:
        self._boxes.setdefault((group, src, dst, tag), deque()).append(
            (next(self._arrivals), header, payload)
        )
        self.held += len(payload)

    def take(
        self, group: tuple[int, ...], src: int, dst: int, tag: int
    ) -> tuple[int, dict, bytes] | None:
        """The next message for this receive, removed: ``(src, header, payload)``, or None."""
        sources = [s for s in group if s != dst] if src == ANY else [src]
        ready = [(box[0][0], s) for s in sources if (box := self._boxes.get((group, s, dst, tag)))]
        if not ready:
            return None
        _, sender = min(ready)
        _, header, payload = self._boxes[group, sender, dst, tag].popleft()
        self.held -= len(payload)
        return sender, header, payload
