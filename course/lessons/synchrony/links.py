"""Which bytes cross between nodes: an all-reduce's traffic per link, with ranks seen as nodes.

    from course.lessons.synchrony.links import peer_traffic, crossing_bytes, link_seconds
    sent = run(peer_traffic, 4, dist.all_reduce, 2**20)   # per rank: {peer: bytes sent}
    crossing_bytes(sent, ranks_per_node=2)                # per rank: bytes to other nodes
    link_seconds(sent, 2, inter_node_bps=0.3e9)           # the slowest link decides

All ranks run on this one machine; "nodes" are consecutive blocks of ``ranks_per_node``
ranks (ranks 0-1 node 0, ranks 2-3 node 1, as ``torchrun --nnodes`` numbers them). The bytes
are the kernel's TCP counters per connection (``course.ring.wire``), so any all-reduce can be
measured, gloo's own or yours; the time is then predicted, not measured: each link moves its
bytes at its own bandwidth, all links at once, and the busiest link ends last.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist

from course.ring.wire import WireMeter

__all__ = [
    "INTRA_NODE_BPS",
    "crossing_bytes",
    "link_seconds",
    "node_of",
    "peer_traffic",
]

# A link inside a node (NVLink, shared memory) against one between nodes: emulated as 10x
# slower. Real clusters: ~300 GB/s NVLink against 25-50 GB/s InfiniBand per GPU.
INTRA_NODE_BPS = 3e9


def peer_traffic(fn: Callable[[torch.Tensor], object], numel: int) -> dict[int, int]:
    """On every rank: bytes this rank sends to each peer in one ``fn(tensor)`` of ``numel``
    float32 numbers (after one call unmeasured, so that connection set-up is not counted)."""
    tensor = torch.ones(numel)
    fn(tensor)
    dist.barrier()
    with WireMeter() as wire:
        fn(tensor)
    return {peer: n for peer, n in wire.sent.items() if n}


def node_of(rank: int, ranks_per_node: int) -> int:
    """The node a rank belongs to: consecutive blocks of ``ranks_per_node`` ranks."""
    return rank // ranks_per_node


def crossing_bytes(sent: Sequence[dict[int, int]], ranks_per_node: int) -> list[int]:
    """Per rank: the bytes it sent to ranks of other nodes, from ``peer_traffic``'s results."""
    return [
        sum(
            n
            for peer, n in to.items()
            if node_of(peer, ranks_per_node) != node_of(rank, ranks_per_node)
        )
        for rank, to in enumerate(sent)
    ]


def link_seconds(
    sent: Sequence[dict[int, int]],
    ranks_per_node: int,
    inter_node_bps: float = INTRA_NODE_BPS / 10,
    intra_node_bps: float = INTRA_NODE_BPS,
) -> float:
    """Predicted seconds of the measured traffic: every link (one rank to one peer) moves its
    bytes at the bandwidth of its kind, all at once; the slowest link decides.

    A bandwidth-only prediction: latency and the order of the messages are left out, so it
    holds for large tensors, where the bytes dominate.
    """
    slowest = 0.0
    for rank, to in enumerate(sent):
        for peer, n in to.items():
            across = node_of(peer, ranks_per_node) != node_of(rank, ranks_per_node)
            slowest = max(slowest, n / (inter_node_bps if across else intra_node_bps))
    return slowest
