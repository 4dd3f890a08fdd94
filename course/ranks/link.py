"""A rank's side of the relay's wire: one socket, requests out, a thread matching replies in.

    link = Link(sock)                                   # course.ranks.relay makes one a rank
    work = Work(link.request(header, payload, on_reply), link)
    work.wait()                                         # the relay answered, or raise why

Each request carries a number; the relay's reply names it, and :class:`Link` hands the reply
to the call that waits on it (``on_reply`` turns its bytes into the call's result). A
:class:`Work` is what torch's calls return: DDP's C++ waits on its future. A wait that blocks
first tells the relay which request it waits on (a frame of kind ``waiting``), so that the
relay finds a deadlock as soon as every rank is stuck, not at its deadline. DDP's reducer
waits in C++, at the end of backward (``finalize_backward``), on every bucket it launched:
the first bucket's future it asks for (itself, or through a comm hook) queues a callback
that runs just before that wait and says so, for the last of them (the group answers them in
order). Any other wait inside torch's C++ says nothing, and is ended by the deadline. A rank
whose job returned says so last (``finished``), after everything it sent.
"""

from __future__ import annotations

import contextlib
import socket
import sys
import threading
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.futures import Future

from course.ranks.frames import RelayError, frame, read_frame

__all__ = ["Link", "Work"]


class Link:
    """A rank's one socket to the relay: requests out, a thread matching replies in."""

    def __init__(self, sock: socket.socket, fatal: Any = None) -> None:
        """``fatal(error)``: how the rank fails when a call that torch's C++ waits on (DDP's
        buckets) is refused: a Python exception cannot travel through its future."""
        self.sock, self.fatal = sock, fatal
        self._lock = threading.Lock()
        self._next = 0
        self._waiting: dict[int, tuple[Future, Any]] = {}
        self._reqs: dict[int, int] = {}  # id of an unanswered future -> its request's number
        self.native: set[int] = set()  # ids of futures handed to torch's C++
        self._buckets: list[Future] = []  # futures DDP's reducer waits on when backward ends
        self._backward = -1  # the backward (autograd graph task) they were launched in
        threading.Thread(target=self._read, name="relay-link", daemon=True).start()

    def _fail(self, fut: Future, error: RelayError) -> None:
        if id(fut) in self.native and self.fatal is not None:
            self.fatal(error)
        else:
            fut.set_exception(error)

    def request(self, header: dict[str, Any], payload: bytes, on_reply: Any) -> Future:
        fut: Future = Future()
        with self._lock:
            req = self._next = self._next + 1
            self._waiting[req] = (fut, on_reply)
            self._reqs[id(fut)] = req
            self.sock.sendall(frame({**header, "req": req}, payload))
        return fut

    def wait(self, fut: Future) -> Any:
        """Wait for ``fut``'s reply; if it has not come, first tell the relay this rank's job
        is blocked on it."""
        req = self._reqs.get(id(fut))
        if req is not None and not fut.done():
            self.tell({"kind": "waiting", "on": req})
        return fut.wait()

    def bucket(self, fut: Future) -> None:
        """``fut`` is a bucket's, which DDP's reducer waits on when this backward ends: the
        first of a backward queues :meth:`_finalizing`, which runs before that wait (DDP
        queues its own once the last bucket is launched, after this). A backward that raised
        before its end left its buckets here: a new one starts afresh."""
        backward = torch._C._current_graph_task_id()  # noqa: SLF001 - torch's own "which backward"
        if backward != self._backward:
            self._backward, self._buckets = backward, []
            torch.autograd.Variable._execution_engine.queue_callback(self._finalizing)  # noqa: SLF001 - how DDP queues its own
        self._buckets.append(fut)

    def _finalizing(self) -> None:
        """Tell the relay this rank waits on its last unanswered bucket, as DDP does next."""
        buckets, self._buckets, self._backward = self._buckets, [], -1
        pending = [self._reqs.get(id(f)) for f in buckets if not f.done()]
        pending = [req for req in pending if req is not None]
        if pending:
            self.tell({"kind": "waiting", "on": max(pending)})

    def tell(self, header: dict[str, Any]) -> None:
        """Send the relay a notice, after every request sent before it: nothing answers it."""
        with self._lock:
            self.sock.sendall(frame(header, b""))

    def _read(self) -> None:
        try:
            while True:  # no reply stays referenced here once handled: a rank's memory is measured
                self._answer(*read_frame(self.sock))
        except (OSError, ConnectionError, RelayError, ValueError):
            error = RelayError("the relay is gone: the run has ended")
            for fut, _ in list(self._waiting.values()):
                with contextlib.suppress(RuntimeError):
                    fut.set_exception(error)

    def _answer(self, header: dict[str, Any], payload: bytes) -> None:
        """Hand one reply to the call that waits for it."""
        req = header.get("req", -1)
        if req == -1:  # the relay refused the link itself: every call fails
            error = RelayError(header.get("error", "the relay closed the link"))
            for waiting, _ in self._waiting.values():
                self._fail(waiting, error)
            return
        fut, on_reply = self._waiting.pop(req, (None, None))
        if fut is None:  # an answer to a request this link never made
            return
        self._reqs.pop(id(fut), None)
        if "error" in header:
            if header.get("partial") and payload:  # a failed all-reduce's partly summed buffer
                with contextlib.suppress(Exception):
                    on_reply(header, payload)
            self._fail(fut, RelayError(header["error"]))
            return
        try:
            fut.set_result(on_reply(header, payload))
        except Exception as err:  # noqa: BLE001 - the waiting call raises it
            fut.set_exception(err)


class Work(dist._Work):  # noqa: SLF001 - the Work base that C++ callers (DDP) wait on
    """A call in flight: ``wait`` returns once the relay answered, or raises what it said."""

    def __init__(self, fut: Future, link: Link, sender: Sequence[int] = ()) -> None:
        """``sender``: where a receive's handler puts its sender's group rank."""
        super().__init__()
        self._fut, self._link, self._sender = fut, link, sender

    def wait(self, timeout: timedelta | None = None) -> bool:  # noqa: ARG002 - torch's signature
        self._link.wait(self._fut)  # the relay's own deadline ends every wait
        return True

    def is_completed(self) -> bool:
        return self._fut.done()

    def get_future(self) -> Future:
        """The call's future. One asked for during backward (DDP's buckets, a comm hook's)
        or by no Python code is waited on by torch's C++, which cannot take a Python exception
        through it (it crashes): its failure ends the rank (``Link.fatal``). One asked for by
        Python code outside backward raises on ``wait()``, as gloo's does."""
        if _native_caller():
            self._link.native.add(id(self._fut))
            if _reducer_caller():
                self._link.bucket(self._fut)
        return self._fut

    def _source_rank(self) -> int:
        """The sender of a receive (torch asks it of ``dist.recv`` with no ``src``)."""
        return self._sender[0] if self._sender else -1


def _reducer_caller() -> bool:
    """Is ``Work.get_future``'s caller DDP's reducer in backward: its C++ (the default hook:
    no Python frame between it and the autograd engine's), or a comm hook it called (the
    outermost Python function there was given a ``GradBucket``)?"""
    try:
        outermost, frame = None, sys._getframe(2)  # noqa: SLF001 - get_future's caller
    except ValueError:  # no Python frame at all: not a backward this thread runs
        return False
    while frame is not None and frame.f_code.co_name != "_engine_run_backward":
        outermost, frame = frame, frame.f_back
    if frame is None:  # not backward on this thread: nothing known of who waits
        return False
    if outermost is None:
        return True
    code = outermost.f_code
    given = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
    return any(isinstance(outermost.f_locals.get(name), dist.GradBucket) for name in given)


def _native_caller() -> bool:
    """Is ``Work.get_future``'s caller torch's C++, or code running inside backward?"""
    if torch._C._current_graph_task_id() != -1:  # noqa: SLF001 - torch's own test for "in backward"
        return True
    try:
        sys._getframe(2)  # noqa: SLF001 - get_future's caller, if Python called it
    except ValueError:
        return True
    return False
