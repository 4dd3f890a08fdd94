"""Record what a rank really sends: every point-to-point message, and any collective call.

    from course.ring.recorder import record
    trace = record(ring_allreduce, 4, numel=10)   # a course.ring.trace.Trace, even if it deadlocks

Each rank runs the code under :class:`Recorder`, which wraps the process group's own
``send``/``recv``/``recv_anysource`` methods. Every point-to-point path in
``torch.distributed`` ends there exactly once: ``send`` calls ``isend``, ``recv`` calls
``irecv``, ``batch_isend_irecv`` calls whatever op its ``P2POp`` holds, and each of those calls
``group.send``/``group.recv`` once. Wrapping that one layer (instead of the module functions)
counts each message once however the code imported ``send`` (``from torch.distributed import
send`` included) and leaves ``P2POp``'s check of its op untouched. Collectives are flagged the
same way, at the process group's methods, plus the ``_functional_collectives`` functions,
each as a :class:`Collective` (name, elements, ``async_op``, time; at a process group's method
also the group's global ranks and the bytes this rank put in): the bucket checks read them,
and the hierarchical all-reduce's notebook verdict.
``barrier`` is recorded as a collective too; whether it breaks a ring is for the verdict
(``course.ring.verdict.ring_violations`` lets it pass: it moves no tensor data).

A send's payload is read when it is posted; a receive's when its ``Work`` completes (``wait``
or ``is_completed``), or at the rank's next point-to-point call or exit if the code waited some
other way. Each message is appended to a per-rank JSON-lines file as it happens, so a rank that
deadlocks or is killed still leaves its messages for the caller to assemble a partial trace.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any, Self

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import ProcessGroup

from course.ranks.confined import rank_dir
from course.ring.collectives import (
    COLLECTIVES,
    FUNCTIONAL,
    Collective,
    async_op,
    contributed,
    root_of,
    sizes_of,
)
from course.ring.encoding import check_encodable, decode_tensor, encoded_tensor
from course.ring.logs import as_list, log_path, open_log, read_trace
from course.ring.trace import Message, Trace

__all__ = ["Collective", "Recorder", "record", "scratch_dir"]

_active: list[Recorder] = []
_INHERITED = object()  # a patched attribute the owner did not define itself


class _RecvWork:
    """A receive's ``Work`` that records the payload once the receive has completed."""

    def __init__(self, work: Any, done: Callable[[], None]) -> None:
        self._work, self._done = work, done

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        result = self._work.wait(*args, **kwargs)
        self._done()
        return result

    def is_completed(self) -> bool:
        completed = self._work.is_completed()
        if completed:
            self._done()
        return completed

    def __getattr__(self, name: str) -> Any:
        return getattr(self._work, name)

    def __bool__(self) -> bool:
        return True


class Recorder:
    """Context manager, on one rank: record every message this rank sends or receives."""

    def __init__(self, path: str | os.PathLike | None = None) -> None:
        self.path = Path(path) if path is not None else None
        self.messages: list[Message] = []
        self.collectives: list[Collective] = []
        self._file: Any = None
        self._orders = {"send": 0, "recv": 0}
        self._pending: list[tuple[int, Any, list[torch.Tensor], Any]] = []
        self._saved: list[tuple[Any, str, Any]] = []

    def __enter__(self) -> Self:
        if _active:
            raise RuntimeError("a Recorder is already active on this rank; nest them not")
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        if self.path is not None:
            self._file = open_log(self.path)
        # A Python backend (the relay) defines its own methods: patch those where it has them.
        group = type(dist.group.WORLD)
        owners = [ProcessGroup] + ([group] if group is not ProcessGroup else [])
        for owner in owners:
            mine = vars(owner) if owner is not ProcessGroup else dir(owner)
            for method, wrap in (("send", self._wrap_send), ("recv", self._wrap_recv),
                                 ("recv_anysource", self._wrap_recv_anysource)):  # fmt: skip
                if method in mine:
                    self._patch(owner, method, wrap)
            for method, name in COLLECTIVES.items():
                if method in mine:
                    wrap = functools.partial(self._wrap_coll, name, method=method)
                    self._patch(owner, method, wrap)
        with contextlib.suppress(ImportError):
            import torch.distributed._functional_collectives as fc

            for name in FUNCTIONAL:
                if hasattr(fc, name):
                    self._patch(fc, name, functools.partial(self._wrap_coll, name))
        _active.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.flush()
        finally:
            for owner, name, raw in reversed(self._saved):
                if raw is _INHERITED:
                    delattr(owner, name)
                else:
                    setattr(owner, name, raw)
            self._saved.clear()
            _active.remove(self)
            if self._file is not None:
                self._file.close()

    def flush(self) -> None:
        """Record every receive that has completed but was never waited on through its Work."""
        for entry in list(self._pending):
            if entry[3].is_completed():
                self._complete(entry)

    # --- the wrappers -----------------------------------------------------------------

    def _patch(self, owner: Any, name: str, make: Callable[[Any], Any]) -> None:
        # Save the raw attribute (vars(), not getattr): getattr on a pybind11 class gives the
        # unbound function, and putting that back would leave the method without its self.
        raw = vars(owner).get(name, _INHERITED)
        self._saved.append((owner, name, raw))
        setattr(owner, name, make(getattr(owner, name)))

    def _wrap_send(self, original: Callable) -> Callable:
        def send(group: Any, tensors: list[torch.Tensor], dst: int, *args: Any, **kw: Any) -> Any:
            self.flush()
            for t in tensors:
                self._emit("send", self._global(group, dst), t, *decode_tensor(t, self.world_size))
            return original(group, tensors, dst, *args, **kw)

        return send

    def _wrap_recv(self, original: Callable) -> Callable:
        def recv(group: Any, tensors: list[torch.Tensor], src: int, *args: Any, **kw: Any) -> Any:
            self.flush()
            work = original(group, tensors, src, *args, **kw)
            return self._post(self._global(group, src), tensors, work)

        return recv

    def _wrap_recv_anysource(self, original: Callable) -> Callable:
        def recv_anysource(group: Any, tensors: list[torch.Tensor], *args: Any, **kw: Any) -> Any:
            self.flush()
            return self._post(None, tensors, original(group, tensors, *args, **kw))

        return recv_anysource

    def _wrap_coll(self, name: str, original: Callable, method: str | None = None) -> Callable:
        def collective(*args: Any, **kwargs: Any) -> Any:
            group, put_in, rest = (), -1, args
            if method is not None and args:  # a process group's method: args[0] is the group
                group, put_in, rest = _ranks_of(args[0]), contributed(method, args[1:]), args[1:]
            sizes, root = sizes_of(args), root_of(method, name, group, rest)
            call = Collective(name, *sizes, async_op(), time.perf_counter(), group, put_in, root)
            self.collectives.append(call)
            self._write({"op": "collective", **asdict(call)})
            return original(*args, **kwargs)

        return collective

    # --- bookkeeping --------------------------------------------------------------------

    def _global(self, group: Any, peer: int) -> int:
        if group is None or group is dist.GroupMember.WORLD:
            return peer
        with contextlib.suppress(Exception):
            return dist.get_global_rank(group, peer)
        return peer

    def _post(self, peer: int | None, tensors: list[torch.Tensor], work: Any) -> Any:
        order = self._orders["recv"]
        for t in tensors:
            self._emit("recv", -1 if peer is None else peer, t, None, None, final=False)
        entry = (order, peer, tensors, work)
        self._pending.append(entry)
        return _RecvWork(work, lambda: self._complete(entry))

    def _complete(self, entry: tuple[int, Any, list[torch.Tensor], Any]) -> None:
        if entry not in self._pending:
            return
        self._pending.remove(entry)
        order, peer, tensors, work = entry
        if peer is None:
            with contextlib.suppress(Exception):
                peer = work._source_rank()  # noqa: SLF001 - gloo's Work knows the sender of recv_anysource
        for i, t in enumerate(tensors):
            holds = decode_tensor(t, self.world_size)
            self._emit("recv", -1 if peer is None else peer, t, *holds, order=order + i)

    def _emit(
        self,
        op: str,
        peer: int,
        t: torch.Tensor,
        offset: int | None,
        holds: int | None,
        *,
        order: int | None = None,
        final: bool = True,
    ) -> None:
        if order is None:
            order = self._orders[op]
            self._orders[op] += 1
        numel, nbytes = t.numel(), t.numel() * t.element_size()
        message = Message(self.rank, peer, op, order, numel, nbytes, offset, holds)  # type: ignore[arg-type]
        if final:
            self.messages.append(message)
        self._write({"op": op, "message": as_list(message), "final": final})

    def _write(self, record: dict[str, Any]) -> None:
        if self._file is not None:
            self._file.write(json.dumps(record) + "\n")


def _ranks_of(group: Any) -> tuple[int, ...]:
    """The global ranks of a process group, or () where torch does not know it."""
    with contextlib.suppress(Exception):
        return tuple(dist.get_process_group_ranks(group))
    return ()


def _record_rank(fn: Callable[[torch.Tensor], Any], numel: int, directory: str) -> None:
    """Rank side of :func:`record`: run ``fn`` once on this rank's encoded input."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    tensor = encoded_tensor(rank, numel, world_size)
    with Recorder(log_path(directory, rank)):
        fn(tensor)


@contextlib.contextmanager
def scratch_dir() -> Iterator[str]:
    directory = rank_dir("course-trace-")  # the ranks write it, wherever they run
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def record(
    fn: Callable[[torch.Tensor], Any], world_size: int, numel: int = 24, timeout: float = 20.0
) -> Trace:
    """Run ``fn(tensor)`` once on ``world_size`` fresh ranks with encoded float64 inputs and
    return what they sent; a deadlocked or crashed run still gives a (partial) trace."""
    from course.ranks import launch

    check_encodable(world_size, numel)
    with scratch_dir() as directory:
        result = launch(_record_rank, world_size, fn, numel, directory, timeout=timeout)
        return read_trace(directory, world_size, numel, 8, result.failures)
