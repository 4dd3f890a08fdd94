"""What gloo's own collectives send, measured on the wire: the ring lessons' experiments.

Each function runs on every rank of an initialised gloo process group and returns plain data,
so the same code runs from a notebook (``course.ranks.run(allreduce_traffic, 4, 2**18)``),
from a test, or under ``torchrun``::

    torchrun --nproc-per-node 4 -m course.ring.traffic

The bytes are the kernel's own count of what each rank put on its TCP connections
(``course.ring.wire``), so nothing in gloo is wrapped or patched: its C++ ring is measured as
it runs. Every call is made once before it is measured, so that one-time set-up traffic is
not counted.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from course.ring.wire import WireMeter

__all__ = ["COLLECTIVES", "allreduce_traffic", "collective_traffic"]


def _all_reduce(t: torch.Tensor) -> None:
    dist.all_reduce(t)


def _shard(t: torch.Tensor) -> int:
    return t.numel() // dist.get_world_size()


def _reduce_scatter(t: torch.Tensor) -> None:
    n = _shard(t)  # the tensor, cut to a whole number of shards
    dist.reduce_scatter_tensor(torch.empty(n, dtype=t.dtype), t[: n * dist.get_world_size()])


def _all_gather(t: torch.Tensor) -> None:
    n = _shard(t)
    dist.all_gather_into_tensor(t[: n * dist.get_world_size()], t[:n].clone())


def _broadcast(t: torch.Tensor) -> None:
    dist.broadcast(t, 0)


COLLECTIVES: dict[str, Callable[[torch.Tensor], None]] = {
    "all_reduce": _all_reduce,
    "reduce_scatter_tensor": _reduce_scatter,
    "all_gather_into_tensor": _all_gather,
    "broadcast": _broadcast,
}


def collective_traffic(name: str, numel: int) -> dict[str, Any]:
    """Bytes this rank sends to each peer in one gloo collective over a ``numel`` tensor.

    For the sharded collectives ``numel`` is the full tensor's size: ``reduce_scatter_tensor``
    reduces it into one shard per rank, ``all_gather_into_tensor`` gathers the shards into it
    (cut to a whole number of shards when the world size does not divide it).
    """
    if name not in COLLECTIVES:
        raise ValueError(f"no collective {name!r}; choose one of {', '.join(COLLECTIVES)}")
    call = COLLECTIVES[name]
    tensor = torch.ones(numel)
    call(tensor)
    with WireMeter() as wire:
        call(tensor)
    return {
        "rank": dist.get_rank(),
        "nbytes": numel * tensor.element_size(),
        "sent": wire.total_sent,
        "to": {peer: n for peer, n in wire.sent.items() if n},
    }


def allreduce_traffic(numel: int) -> int:
    """Bytes this rank sends in one ``dist.all_reduce`` of a ``numel``-element float32 tensor."""
    return collective_traffic("all_reduce", numel)["sent"]


if __name__ == "__main__":  # torchrun --nproc-per-node 4 -m course.ring.traffic
    dist.init_process_group("gloo")
    for name in COLLECTIVES:
        print(collective_traffic(name, 2**20))
    dist.barrier()  # no rank closes its connections while a peer still uses them
    dist.destroy_process_group()
