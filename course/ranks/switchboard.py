"""The relay's switchboard: one socket pair per rank, and a thread that reads and answers them.

    class Relay(Switchboard):                 # course.ranks.router: what requests mean
        def _handle(self, rank, header, payload, seq): ...
        def _tick(self): ...                  # deadlines, between reads

    with Relay(...) as relay:                 # hand relay.ends[r] to rank r, then close_ends()

Frames (:mod:`course.ranks.frames`) are read as they come, numbered per rank (``seq``), and
handed on; a frame over the caps refuses the rank's link; a request that fails fails that
call, never the thread. A rank the relay holds (:mod:`course.ranks.holds`) has its frames
kept, unread, until :meth:`read_deferred`. Replies are written without blocking.
"""

from __future__ import annotations

import contextlib
import json
import selectors
import socket
import threading
import time
from typing import Any, Self

from course.ranks.frames import LEN, MAX_FRAME, MAX_HEADER, frame
from course.ranks.holds import Holds

__all__ = ["Switchboard"]


class Switchboard:
    """Sockets to ``world_size`` ranks, a thread reading them, and the replies written back."""

    def __init__(self, world_size: int, holds: Holds) -> None:
        self.world_size, self.holds = world_size, holds
        self._seq = [0] * world_size  # requests read from each rank so far
        self._deferred: dict[int, list[tuple[bytes, bytes, int]]] = {}  # held ranks' requests
        pairs = [socket.socketpair() for _ in range(world_size)]
        self.ends = [theirs for _, theirs in pairs]  # hand end r to rank r, then close_ends()
        self._mine = [mine for mine, _ in pairs]
        self._out: dict[int, bytearray] = {r: bytearray() for r in range(world_size)}
        self._sel = selectors.DefaultSelector()
        self._stop = threading.Event()
        self._start = time.monotonic()
        self._thread = threading.Thread(target=self._serve, name="relay", daemon=True)

    def _handle(self, rank: int, header: dict[str, Any], payload: bytes, seq: int) -> None:
        raise NotImplementedError

    def _tick(self) -> None:
        """Called between reads, at least every 50 ms."""

    def _gone(self, rank: int) -> None:
        """Called once rank ``rank``'s end of its link is closed: its process ended."""

    def __enter__(self) -> Self:
        for rank, sock in enumerate(self._mine):
            sock.setblocking(False)
            self._sel.register(sock, selectors.EVENT_READ, rank)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        for sock in [*self._mine, *self.ends]:
            sock.close()
        self._sel.close()

    def close_ends(self) -> None:
        """Close this process's copies of the ranks' ends, once the ranks hold them."""
        for sock in self.ends:
            sock.close()

    # -- the loop ------------------------------------------------------------------------

    def _serve(self) -> None:
        buffers = {r: bytearray() for r in range(self.world_size)}
        while not self._stop.is_set():
            for key, mask in self._sel.select(timeout=0.05):
                rank = key.data
                if mask & selectors.EVENT_READ:
                    try:
                        data = key.fileobj.recv(2**20)
                    except (BlockingIOError, InterruptedError):
                        data = None
                    except OSError:
                        data = b""
                    if data == b"":  # the rank is gone
                        self._sel.unregister(key.fileobj)
                        self._gone(rank)
                        continue
                    if data:
                        buffers[rank] += data
                        self._parse(rank, buffers[rank])
                if mask & selectors.EVENT_WRITE:
                    self._flush(rank)
            self._tick()

    def _parse(self, rank: int, buf: bytearray) -> None:
        while len(buf) >= LEN.size:
            hlen, plen = LEN.unpack_from(buf)
            if hlen > MAX_HEADER or plen > MAX_FRAME:
                self._refuse_link(rank, f"a message of {plen} bytes is over the relay's cap")
                buf.clear()
                return
            end = LEN.size + hlen + plen
            if len(buf) < end:
                return
            raw = bytes(buf[LEN.size : LEN.size + hlen])
            payload = bytes(buf[LEN.size + hlen : end])
            del buf[:end]
            seq, self._seq[rank] = self._seq[rank], self._seq[rank] + 1
            if self.holds.holding(rank):  # a straggler's request waits, unread, for its release
                self._deferred.setdefault(rank, []).append((raw, payload, seq))
            else:
                self._dispatch(rank, raw, payload, seq)

    def _dispatch(self, rank: int, raw: bytes, payload: bytes, seq: int) -> None:
        header: Any = None
        try:
            header = json.loads(raw)
            self._handle(rank, header, payload, seq)
        except Exception as err:  # noqa: BLE001 - whatever a rank sent fails its call, never the relay
            req = header.get("req") if isinstance(header, dict) else None
            if isinstance(req, int) and not isinstance(req, bool) and req >= 0:
                self._reply(rank, {"req": req, "error": f"the relay refused a request: {err}"})
            # else: no call of the rank's is waiting on it, so there is no one to tell

    def _refuse_link(self, rank: int, why: str) -> None:
        self._reply(rank, {"req": -1, "error": why})

    def _reply(self, rank: int, header: dict[str, Any], payload: bytes = b"") -> None:
        self._out[rank] += frame(header, payload)
        self._flush(rank)

    def _flush(self, rank: int) -> None:
        out, sock = self._out[rank], self._mine[rank]
        try:
            while out:
                sent = sock.send(out[: 2**20])
                del out[:sent]
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:  # the rank is gone (or the run is over): no one reads what it is owed
            out.clear()
        with contextlib.suppress(KeyError, ValueError, OSError):
            events = selectors.EVENT_READ | (selectors.EVENT_WRITE if out else 0)
            self._sel.modify(sock, events, rank)

    def read_deferred(self, rank: int) -> None:
        """Read, in order, the frames kept while ``rank`` was held."""
        for raw, payload, seq in self._deferred.pop(rank, []):
            self._dispatch(rank, raw, payload, seq)

    def _now(self) -> float:
        return time.monotonic() - self._start
