"""Which calls are collectives, and what the recorder writes down for each one."""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch

__all__ = [
    "COLLECTIVES", "FUNCTIONAL", "ROOTED", "Collective", "async_op", "contributed", "root_of",
    "sizes_of",
]  # fmt: skip

# ProcessGroup method -> the torch.distributed name a student would recognise
COLLECTIVES = {
    "allreduce": "all_reduce",
    "allreduce_coalesced": "all_reduce_coalesced",
    "allgather": "all_gather",
    "allgather_coalesced": "all_gather_coalesced",
    "allgather_into_tensor_coalesced": "all_gather_into_tensor",
    "_allgather_base": "all_gather_into_tensor",
    "all_gather_single": "all_gather_into_tensor",
    "reduce_scatter": "reduce_scatter",
    "_reduce_scatter_base": "reduce_scatter_tensor",
    "reduce_scatter_single": "reduce_scatter_tensor",
    "reduce_scatter_tensor_coalesced": "reduce_scatter_tensor",
    "broadcast": "broadcast",
    "reduce": "reduce",
    "scatter": "scatter",
    "gather": "gather",
    "alltoall": "all_to_all",
    "alltoall_base": "all_to_all_single",
    "all_to_all_single": "all_to_all_single",
    "barrier": "barrier",
    "monitored_barrier": "monitored_barrier",
}
FUNCTIONAL = (
    "all_reduce",
    "all_reduce_coalesced",
    "all_gather_tensor",
    "all_gather_into_tensor_coalesced",
    "reduce_scatter_tensor",
    "reduce_scatter_tensor_coalesced",
    "all_to_all_single",
    "broadcast",
)


@dataclass(frozen=True)
class Collective:
    """One collective call on this rank: its torch.distributed name, elements, and when."""

    name: str
    numel: int  # elements of every tensor passed in (inputs and outputs alike)
    nbytes: int  # their bytes
    async_op: bool | None  # as the caller of the torch.distributed function asked; None: unknown
    t: float  # time.perf_counter() when the call was made
    group: tuple[int, ...] = ()  # the global ranks it ran on; () where the recorder cannot tell
    contributed: int = -1  # bytes this rank put in, as the relay counts them; -1: unknown
    root: int = -1  # a broadcast's, scatter's, gather's or reduce's root (global); -1: none


def sizes_of(args: tuple) -> tuple[int, int]:
    """Elements and bytes of the tensors among a collective's arguments (lists included)."""
    tensors = []
    for a in args:
        items = a if isinstance(a, list | tuple) else [a]
        tensors += [t for t in items if isinstance(t, torch.Tensor)]
    return sum(t.numel() for t in tensors), sum(t.numel() * t.element_size() for t in tensors)


# Methods whose first argument is the input; the others take (outputs, inputs, ...).
_INPUT_FIRST = {"allreduce", "allreduce_coalesced", "broadcast", "reduce", "barrier"}


def contributed(method: str, args: tuple) -> int:
    """The bytes a process group method's caller put in (``args`` after the group itself):
    what the relay records per member (an all-reduce's tensor, a reduce-scatter's whole
    input, an all-gather's shard)."""
    position = 0 if method in _INPUT_FIRST or method == "monitored_barrier" else 1
    if len(args) <= position:
        return 0
    return sizes_of((args[position],))[1]


ROOTED = ("broadcast", "scatter", "gather", "reduce")  # the process group methods with a root


def root_of(method: str | None, name: str, group: tuple[int, ...], args: tuple) -> int:
    """The global rank of a rooted collective's root, from a process group method's options
    (``args`` after the group itself; the root is the group's) or a functional broadcast's
    ``src`` (already global); -1 for any other call."""
    if method in ROOTED and args:
        root = getattr(args[-1], "rootRank", None)
        if isinstance(root, int):
            return group[root] if 0 <= root < len(group) else root
    if method is None and name == "broadcast" and len(args) > 1 and isinstance(args[1], int):
        return args[1]
    return -1


def async_op() -> bool | None:
    """The ``async_op`` argument of the ``torch.distributed`` function that called us, if any.

    ``dist.all_reduce(t, async_op=...)`` calls the process group's method and then waits on
    its ``Work`` or not: the flag lives only in that caller's frame.
    """
    frame = sys._getframe(2)  # noqa: SLF001 - the only way to read the caller's arguments
    for _ in range(4):
        if frame is None:
            break
        if (
            frame.f_code.co_filename.endswith("distributed_c10d.py")
            and "async_op" in frame.f_locals
        ):
            return bool(frame.f_locals["async_op"])
        frame = frame.f_back
    return None
