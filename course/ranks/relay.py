"""The relay backend, on the ranks: a process group whose every call asks the relay.

    relay = Relay(world_size=3, timeout=10.0)      # in the caller (course.ranks.router)
    ...each rank r gets relay.ends[r] and calls join(end, r, 3, timeout)...
    relay.events                                   # every send, recv and collective, as seen

On the ranks, ``join`` makes ``"relay"`` the default process group: ``dist.send``,
``dist.all_reduce``, DDP's buckets, ``all_gather_into_tensor``, ``new_group`` and every
other route to a collective end in :class:`RelayGroup`, which sends the request and its
bytes down one socket (:mod:`course.ranks.link`) to the caller. There is no store, no
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
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from course.ranks.frames import RelayError, describe, fill_from, fill_prefix, raw_bytes
from course.ranks.link import Link, Work
from course.ranks.mailbox import ANY
from course.ranks.objects import Stored

__all__ = [
    "BACKEND", "BASELINE", "RelayGroup", "finished", "get", "join", "keys", "mark", "put",
    "quorum", "relayed", "snapshot",
]  # fmt: skip

BACKEND = "relay"


class RelayGroup(dist.ProcessGroup):
    """A process group whose calls all go to the :class:`Relay` (blocking or not, as asked)."""

    def __init__(self, link: Link, rank: int, ranks: Sequence[int], timeout: timedelta) -> None:
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
        return Work(
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

        def delivered(reply: dict[str, Any], payload: bytes) -> list[torch.Tensor]:
            sender.append(self._ranks.index(reply["src"]))
            return fill_prefix(t, payload)

        return Work(self._link.request(header, b"", delivered), self._link, sender)

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

    def reduce(self, tensors: list[torch.Tensor], opts: Any) -> Any:
        (t,) = tensors
        mine = [t] if self.rank() == opts.rootRank else []
        return self._ask("reduce", t, mine, op=_op_name(opts), root=opts.rootRank)

    def gather(self, outputs: list, inputs: list[torch.Tensor], opts: Any) -> Any:
        (t,) = inputs
        mine = list(outputs[0]) if self.rank() == opts.rootRank else []
        _fits(mine, t, "gather")
        return self._ask("gather", t, mine, root=opts.rootRank)

    def scatter(self, outputs: list[torch.Tensor], inputs: list, opts: Any) -> Any:
        (out,) = outputs
        if self.rank() == opts.rootRank:
            (pieces,) = inputs
            _fits(pieces, out, "scatter")
            sent = torch.stack([p.detach().reshape(out.shape) for p in pieces])
        else:
            sent = torch.empty((0, *out.shape), dtype=out.dtype)
        return self._ask("scatter", sent, [out], root=opts.rootRank, into=out.numel())

    def allgather_coalesced(self, outputs: list, inputs: list, opts: Any = None) -> Any:  # noqa: ARG002 - torch's signature
        flat = torch.cat([t.detach().reshape(-1) for t in inputs])
        return self._ask("allgather", flat, [o for per_rank in outputs for o in per_rank])

    def _reduce_scatter_list(
        self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]], opts: Any = None
    ) -> Any:
        ((out,), (chunks,)) = (outputs, inputs)
        flat = torch.cat([c.detach().reshape(-1) for c in chunks])
        splits = [c.numel() for c in chunks]
        return self._ask("reduce_scatter", flat, [out], op=_op_name(opts), splits=splits)

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
        splits = {"in_split": list(in_split), "out_split": list(out_split)}
        return self._ask("alltoall", tensor, [output], **splits)

    def alltoall(
        self,
        outputs: list[torch.Tensor],
        inputs: list[torch.Tensor],
        opts: Any = None,  # noqa: ARG002 - torch's signature
    ) -> Any:
        """``dist.all_to_all``: pieces of one size (gloo's rule, checked here as gloo checks it
        on the rank), sent as one flat tensor."""
        _fits([*inputs, *outputs], inputs[0], "alltoall")
        flat = torch.cat([t.detach().reshape(-1) for t in inputs])
        return self._ask("alltoall", flat, outputs)

    def barrier(self, opts: Any = None) -> Any:  # noqa: ARG002 - torch's signature
        return self._ask("barrier", torch.empty(0), [])

    def monitored_barrier(self, timeout: Any = None, wait_all_ranks: bool = False) -> None:  # noqa: ARG002 - torch's signature
        self.barrier().wait()

    def new_group(
        self,
        ranks: Sequence[int],
        timeout: timedelta | None = None,
        pg_options: Any = None,  # noqa: ARG002 - torch's signature
        group_name: str | None = None,
        group_desc: str | None = None,  # noqa: ARG002 - torch's signature
    ) -> RelayGroup | None:
        """``dist.new_group`` (torch delegates it to the default group): every rank calls it,
        for every group, in the same order, as torch requires; the relay checks that and
        makes the members wait for each other. The group for its members, None for others."""
        members = [int(r) for r in ranks] or list(self._ranks)
        empty = torch.empty(0)
        self._ask("new_group", empty, [], members=members).wait()
        me = self._ranks[self.rank()]
        if me not in members:
            return None
        group = RelayGroup(self._link, members.index(me), members, timeout or self._timeout)
        group._set_group_name(group_name or "")
        return group

    # torch's Python API calls these names; its C++ (DDP, the dispatcher's ops) the ones above.
    reduce_scatter = _reduce_scatter_list
    all_gather_single = _allgather_base
    reduce_scatter_single = _reduce_scatter_base
    all_gather_single_coalesced = allgather_into_tensor_coalesced
    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced
    all_to_all_single = alltoall_base


def _fits(pieces: Sequence[torch.Tensor], like: torch.Tensor, call: str) -> None:
    """A list for ``gather``'s root, ``scatter``'s or ``all_to_all``: each tensor like
    ``like``, as gloo requires (it checks the same on the rank)."""
    if any(p.numel() != like.numel() or p.dtype != like.dtype for p in pieces):
        raise ValueError(
            f"ProcessGroup relay::{call}: invalid tensor size: every tensor of the list must "
            "have the size and dtype of the rank's own, as on gloo"
        )  # fmt: skip


def _op_name(opts: Any) -> str:
    op = getattr(opts, "reduceOp", dist.ReduceOp.SUM)
    return str(getattr(op, "op", op)).rsplit(".", 1)[-1]


_LINK: Link | None = None


def _create(opts: Any, _backend_options: Any = None) -> RelayGroup:
    """torch's backend creator (its extended form): the default group, or a ``new_group``."""
    if _LINK is None:
        raise RelayError("this process has no link to a relay")
    ranks = list(opts.global_ranks_in_group) or list(range(opts.group_size))
    group = RelayGroup(_LINK, opts.group_rank, ranks, opts.timeout)
    group._set_group_name(opts.group_id)  # noqa: SLF001 - what the dispatcher looks groups up by
    return group


def relayed() -> bool:
    """Does this rank's default process group go through the relay?"""
    return _LINK is not None and dist.is_initialized() and dist.get_backend() == BACKEND


def finished() -> None:
    """Tell the relay this rank's job has returned: it will make no call again. Sent on the
    link, after every request the job made, so the relay has read them all before it counts
    the rank out (:meth:`course.ranks.router.Relay._deadlocked`)."""
    if _LINK is not None:
        with contextlib.suppress(OSError):  # the job closed the link: the deadline ends waits
            _LINK.tell({"kind": "finished"})


def mark(tag: int) -> None:
    """Mark, in the relay's record, that this rank starts the ``tag``-th part of its run (a
    check's next case, say); a no-op on any other backend."""
    if not relayed():
        return
    rank = dist.get_rank()
    header = {"kind": "mark", "group": [rank], "tag": tag}
    Work(_LINK.request(header, b"", lambda _h, _p: None), _LINK).wait()


def _stored(header: dict[str, Any], payload: bytes = b"", on_reply: Any = None) -> Any:
    """Ask the relay's storage (:mod:`course.ranks.objects`); what ``on_reply`` makes of it."""
    if not relayed():
        raise RelayError("the relay's storage is reached only from a relay run's ranks")
    header = {**header, "group": [dist.get_rank()]}
    reply = on_reply or (lambda _reply, _data: None)
    return _LINK.wait(_LINK.request(header, payload, reply))  # type: ignore[union-attr]


def put(key: str, tensor: torch.Tensor) -> None:
    """Write ``tensor``'s elements (flattened) to the relay's storage under ``key``."""
    t = tensor.detach().reshape(-1)
    _stored({"kind": "put", "key": key, **describe(t)}, raw_bytes(t))


def get(key: str, start: int | None = None, stop: int | None = None) -> torch.Tensor:
    """Elements ``start:stop`` of the object ``key`` in the relay's storage, a 1-D tensor."""

    def tensor(reply: dict[str, Any], data: bytes) -> torch.Tensor:
        return Stored(reply["dtype"], data).tensor()

    return _stored({"kind": "get", "key": key, "start": start, "stop": stop}, b"", tensor)


def keys() -> list[str]:
    """The keys of every object in the relay's storage, sorted."""
    return _stored({"kind": "keys"}, b"", lambda reply, _data: list(reply["keys"]))


def quorum() -> list[int]:
    """This rank's next round of the relay's quorum (:mod:`course.ranks.faults`): the ranks
    still alive, once every one of them has asked."""
    if not relayed():
        raise RelayError("the relay's quorum is reached only from a relay run's ranks")
    header = {"kind": "quorum", "group": [dist.get_rank()]}
    reply = _LINK.request(header, b"", lambda reply, _data: list(reply["members"]))  # type: ignore[union-attr]
    return _LINK.wait(reply)  # type: ignore[union-attr]


BASELINE = -1  # the tag of a launch's snapshot before its job is unpickled (``measured``)


def snapshot(tag: int) -> None:
    """Wait until every rank has called ``snapshot(tag)``; meanwhile the relay measures, from
    outside, the memory each holds (:mod:`course.ranks.memory`); a no-op on any other
    backend."""
    if not relayed():
        return
    header = {"kind": "snapshot", "group": list(range(dist.get_world_size())), "tag": tag}
    empty = torch.empty(0)
    Work(_LINK.request(header | describe(empty), b"", lambda _h, _p: None), _LINK).wait()


def join(
    sock: socket.socket, rank: int, world_size: int, timeout: float, fatal: Any = None
) -> None:
    """Make the relay behind ``sock`` this rank's default process group; ``fatal(error)``
    ends the rank when a call torch's C++ waits on fails (see :class:`Link`)."""
    global _LINK  # noqa: PLW0603 - one link per rank process, which torch's creator reads
    _LINK = Link(sock, fatal)
    if BACKEND.upper() not in dist.Backend._plugins:  # noqa: SLF001 - registered once per process
        dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["cpu"])
    dist.init_process_group(
        BACKEND, rank=rank, world_size=world_size, store=dist.HashStore(),
        timeout=timedelta(seconds=timeout),
    )  # fmt: skip
    os.environ.pop("MASTER_ADDR", None)
    dist.monitored_barrier = dist.distributed_c10d.monitored_barrier = _monitored_barrier


def _monitored_barrier(
    group: Any = None,
    timeout: Any = None,  # noqa: ARG001 - torch's signature: the relay's own deadline holds
    wait_all_ranks: bool = False,  # noqa: ARG001 - torch's signature
) -> None:
    """``dist.monitored_barrier``, which torch allows on gloo only: a barrier on the relay, whose
    deadline names the ranks that never came, as gloo's does."""
    dist.barrier(group)
