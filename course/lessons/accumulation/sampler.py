"""What ``DistributedSampler`` gives each rank: padding, ``drop_last`` and ``set_epoch``.

No ranks are needed: ``DistributedSampler(ds, num_replicas, rank)`` works without a process
group, so these run in the notebook's own kernel (PyTorch docs,
``torch.utils.data.distributed.DistributedSampler``).
"""

from __future__ import annotations

from typing import Any

from torch.utils.data import DistributedSampler

__all__ = ["epoch_orders", "sampler_figure", "sampler_split", "seeded_split"]


def sampler_split(
    dataset_len: int, world_size: int, shuffle: bool = False, drop_last: bool = False
) -> list[list[int]]:
    """The indices ``DistributedSampler`` gives each rank of ``world_size`` (no ranks needed)."""
    return [
        list(DistributedSampler(range(dataset_len), world_size, r, shuffle, drop_last=drop_last))
        for r in range(world_size)
    ]


def seeded_split(
    dataset_len: int, seeds: list[int], epoch: int = 0, drop_last: bool = False
) -> list[list[int]]:
    """The shuffled indices each rank's ``DistributedSampler`` gives, rank r built with
    ``seed=seeds[r]`` (``len(seeds)`` ranks) and set to ``epoch``."""
    split = []
    for r, seed in enumerate(seeds):
        s = DistributedSampler(range(dataset_len), len(seeds), r, True, seed, drop_last)
        s.set_epoch(epoch)
        split.append(list(s))
    return split


def epoch_orders(
    dataset_len: int = 10, world_size: int = 2, epochs: int = 3, set_epoch: bool = False
) -> list[list[int]]:
    """Rank 0's shuffled indices for each epoch, with or without ``sampler.set_epoch(epoch)``."""
    sampler = DistributedSampler(range(dataset_len), world_size, 0, shuffle=True)
    orders = []
    for epoch in range(epochs):
        if set_epoch:
            sampler.set_epoch(epoch)
        orders.append(list(sampler))
    return orders


def sampler_figure(split: list[list[int]], dataset_len: int) -> Any:
    """A plotly grid: which rank reads which sample, and at which position of its epoch."""
    import plotly.graph_objects as go

    fig = go.Figure()
    world_size = len(split)
    for rank, indices in enumerate(split):
        # rank r's i-th index sits at position i * world_size + r: past the data set's end?
        padded = [i * world_size + rank >= dataset_len for i in range(len(indices))]
        fig.add_scatter(
            x=indices,
            y=[f"rank {rank}"] * len(indices),
            mode="markers+text",
            text=[str(p) for p in range(len(indices))],
            textposition="top center",
            marker={"size": 16, "symbol": ["x" if c else "circle" for c in padded]},
            name=f"rank {rank}",
        )
    fig.update_layout(
        title=(
            f"DistributedSampler, {dataset_len} samples on {world_size} ranks "
            "(label: the rank's step; x: a sample read a second time)"
        ),
        xaxis={"title": "sample index", "range": [-0.5, dataset_len - 0.5], "dtick": 1},
        yaxis={"range": [-0.5, world_size - 0.2]},
        height=140 + 60 * world_size,
    )
    return fig
