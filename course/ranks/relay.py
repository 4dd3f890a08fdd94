"""The relay backend, on the ranks: a process group whose every call asks the relay.

    relay = Relay(world_size=3, timeout=10.0)      # in the caller (course.ranks.router)
    ...each rank r gets relay.ends[r] and calls join(end, r, 3, timeout)...
    relay.events                                   # every send, recv and collective, as seen

On the ranks, ``join`` makes ``"relay"`` the default process group: ``dist.send``,
``dist.all_reduce``, DDP's buckets, ``all_gather_into_tensor``, ``new_group`` and every
other route to a collective end in :class:`RelayGroup`, which sends the request and its
bytes down one socket to the caller (:mod:`course.ranks.frames`). There is no store, no
port and no peer address: a rank can reach another only through the relay, which routes
point-to-point messages, computes collectives itself (:mod:`course.ranks.combine`) and
records each from what it received, not from what a rank says it did. The relay also
keeps the deadlines, and refuses, to the calling rank, a frame that is malformed, too large
or inconsistent.

Costs: every byte crosses two sockets and the caller's Python loop: fine for the small
tensors of grading checks (``benchmarks/relay.py``), not a fast path for training.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.futures import Future

from course.ranks.frames import RelayError, describe, fill_from, frame, raw_bytes, read_frame
from course.ranks.mailbox import ANY

__all__ = ["BACKEND", "BASELINE", "RelayGroup", "join", "mark", "snapshot"]

BACKEND = "relay"


class _Link:
    """A rank's one socket to the relay: requests out, a thread matching replies in."""

    def __init__(self, sock: socket.socket, fatal: Any = None) -> None:
        """``fatal(error)``: how the rank fails when a call that torch's C++ waits on (DDP's
        buckets) is refused: a Python exception cannot travel through its future."""
        self.sock, self.fatal = sock, fatal
        self._lock = threading.Lock()
        self._next = 0
        self._waiting: dict[int, tuple[Future, Any]] = {}
        self.native: set[int] = set()  # ids of futures handed to torch's C++
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
            self.sock.sendall(frame({**header, "req": req}, payload))
        return fut

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
        if "error" in header:
            self._fail(fut, RelayError(header["error"]))
            return
        try:
            fut.set_result(on_reply(header, payload))
        except Exception as err:  # noqa: BLE001 - the waiting call raises it
            fut.set_exception(err)


class _Work(dist._Work):  # noqa: SLF001 - the Work base that C++ callers (DDP) wait on
    """A call in flight: ``wait`` returns once the relay answered, or raises what it said."""

    def __init__(self, fut: Future, link: _Link, sender: Sequence[int] = ()) -> None:
        """``sender``: where a receive's handler puts its sender's group rank."""
        super().__init__()
        self._fut, self._link, self._sender = fut, link, sender

    def wait(self, timeout: timedelta | None = None) -> bool:  # noqa: ARG002 - torch's signature
        self._fut.wait()  # the relay's own deadline ends every wait
        return True

    def is_completed(self) -> bool:
        return self._fut.done()

    def get_future(self) -> Future:
        self._link.native.add(id(self._fut))  # torch's C++ waits on it, not Python
        return self._fut

    def _source_rank(self) -> int:
        """The sender of a receive (torch asks it of ``dist.recv`` with no ``src``)."""
        return self._sender[0] if self._sender else -1


class RelayGroup(dist.ProcessGroup):
    """A process group whose calls all go to the :class:`Relay` (blocking or not, as asked)."""

    def __init__(self, link: _Link, rank: int, ranks: Sequence[int], timeout: timedelta) -> None:
        super().__init__(rank, len(ranks))
        self._link, self._ranks, self._timeout = link, list(ranks), timeout
        self._name = ""

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return BACKEND

    @property
    def group_name(self) -> str:
        """The name the dispatcher's collectives look this group up by."""
        return self._name

    def _set_group_name(self, name: str) -> None:
        self._name = name

    # -- helpers -------------------------------------------------------------------------

    def _ask(
        self, kind: str, tensor: torch.Tensor, targets: Sequence[torch.Tensor], **extra: Any
    ) -> Any:
        header = {"kind": kind, "group": self._ranks, **describe(tensor), **extra}
        return _Work(
            self._link.request(header, raw_bytes(tensor.detach()), fill_from(targets)), self._link
        )

    def _global(self, group_rank: int) -> int:
        return self._ranks[group_rank]

    # -- point to point --------------------------------------------------------------------

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int) -> Any:
        (t,) = tensors
        return self._ask("send", t, [], dst=self._global(dst), tag=tag)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int) -> Any:
        return self._recv(tensors, self._global(src), tag)

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int) -> Any:
        """``dist.recv(t)`` with no ``src``: the first message from any rank of the group."""
        return self._recv(tensors, ANY, tag)

    def _recv(self, tensors: list[torch.Tensor], src: int, tag: int) -> Any:
        (t,) = tensors
        header = {"kind": "recv", "group": self._ranks, **describe(t), "src": src, "tag": tag}
        sender: list[int] = []
        fill = fill_from([t])

        def delivered(reply: dict[str, Any], payload: bytes) -> list[torch.Tensor]:
            sender.append(self._ranks.index(reply["src"]))
            return fill(reply, payload)

        return _Work(self._link.request(header, b"", delivered), self._link, sender)

    # -- collectives: torch's signatures, options read where they mean something -----------

    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        (t,) = tensors
        return self._ask("allreduce", t, [t], op=_op_name(opts))

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> Any:
        flat = torch.cat([t.detach().reshape(-1) for t in tensors])
        return self._ask("allreduce", flat, tensors, op=_op_name(opts))

    def broadcast(self, tensors: list[torch.Tensor], opts: Any) -> Any:
        (t,) = tensors
        return self._ask("broadcast", t, [t], root=opts.rootRank)

    def allgather(self, outputs: list, inputs: list, opts: Any = None) -> Any:  # noqa: ARG002 - torch's signature
        ((out,), (t,)) = (outputs, inputs)
        return self._ask("allgather", t, out)

    def _allgather_base(self, output: torch.Tensor, tensor: torch.Tensor, opts: Any = None) -> Any:  # noqa: ARG002 - torch's signature
        return self._ask("allgather", tensor, [output])

    def allgather_into_tensor_coalesced(self, outputs: list, inputs: list, opts: Any = None) -> Any:  # noqa: ARG002 - torch's signature
        return [self._allgather_base(o, i) for o, i in zip(outputs, inputs, strict=True)][-1]

    def _reduce_scatter_list(
        self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]], opts: Any = None
    ) -> Any:
        ((out,), (chunks,)) = (outputs, inputs)
        flat = torch.stack([c.detach() for c in chunks])
        return self._ask("reduce_scatter", flat, [out], op=_op_name(opts))

    def _reduce_scatter_base(
        self, output: torch.Tensor, tensor: torch.Tensor, opts: Any = None
    ) -> Any:
        return self._ask("reduce_scatter", tensor, [output], op=_op_name(opts))

    def reduce_scatter_tensor_coalesced(self, outputs: list, inputs: list, opts: Any = None) -> Any:
        pairs = zip(outputs, inputs, strict=True)
        return [self._reduce_scatter_base(o, i, opts) for o, i in pairs][-1]

    def alltoall_base(
        self,
        output: torch.Tensor,
        tensor: torch.Tensor,
        out_split: list[int],
        in_split: list[int],
        opts: Any = None,  # noqa: ARG002 - torch's signature
    ) -> Any:
        if out_split or in_split:
            raise RelayError("the relay's all-to-all splits evenly only")
        return self._ask("alltoall", tensor, [output])

    def barrier(self, opts: Any = None) -> Any:  # noqa: ARG002 - torch's signature
        return self._ask("barrier", torch.empty(0), [])

    # torch's Python API calls these names; its C++ (DDP, the dispatcher's ops) the ones above.
    reduce_scatter = _reduce_scatter_list
    all_gather_single = _allgather_base
    reduce_scatter_single = _reduce_scatter_base
    all_gather_single_coalesced = allgather_into_tensor_coalesced
    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced
    all_to_all_single = alltoall_base


def _op_name(opts: Any) -> str:
    op = getattr(opts, "reduceOp", dist.ReduceOp.SUM)
    return str(getattr(op, "op", op)).rsplit(".", 1)[-1]


_LINK: _Link | None = None


def _create(opts: Any, _backend_options: Any = None) -> RelayGroup:
    """torch's backend creator (its extended form): the default group, or a ``new_group``."""
    if _LINK is None:
        raise RelayError("this process has no link to a relay")
    ranks = list(opts.global_ranks_in_group) or list(range(opts.group_size))
    group = RelayGroup(_LINK, opts.group_rank, ranks, opts.timeout)
    group._set_group_name(opts.group_id)  # noqa: SLF001 - what the dispatcher looks groups up by
    return group


def mark(tag: int) -> None:
    """Mark, in the relay's record, that this rank starts the ``tag``-th part of its run (a
    check's next case, say); a no-op on any other backend."""
    if _LINK is None or dist.get_backend() != BACKEND:
        return
    rank = dist.get_rank()
    header = {"kind": "mark", "group": [rank], "tag": tag}
    _Work(_LINK.request(header, b"", lambda _h, _p: None), _LINK).wait()


BASELINE = -1  # the tag of a launch's snapshot before its job is unpickled (``measured``)


def snapshot(tag: int) -> None:
    """Wait until every rank has called ``snapshot(tag)``; meanwhile the relay measures, from
    outside, the memory each holds (:mod:`course.ranks.memory`); a no-op on any other
    backend."""
    if _LINK is None or dist.get_backend() != BACKEND:
        return
    header = {"kind": "snapshot", "group": list(range(dist.get_world_size())), "tag": tag}
    empty = torch.empty(0)
    _Work(_LINK.request(header | describe(empty), b"", lambda _h, _p: None), _LINK).wait()


def join(
    sock: socket.socket, rank: int, world_size: int, timeout: float, fatal: Any = None
) -> None:
    """Make the relay behind ``sock`` this rank's default process group; ``fatal(error)``
    ends the rank when a call torch's C++ waits on fails (see :class:`_Link`)."""
    global _LINK  # noqa: PLW0603 - one link per rank process, which torch's creator reads
    _LINK = _Link(sock, fatal)
    if BACKEND.upper() not in dist.Backend._plugins:  # noqa: SLF001 - registered once per process
        dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["cpu"])
    dist.init_process_group(
        BACKEND, rank=rank, world_size=world_size, store=dist.HashStore(),
        timeout=timedelta(seconds=timeout),
    )  # fmt: skip
    os.environ.pop("MASTER_ADDR", None)
