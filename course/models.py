"""The toy model the sharding lessons train: equal square layers, the same on every rank.

ZeRO's and FSDP's experiments measure what a rank holds of it; its size is
``depth * width**2`` parameters, so a measured byte count reads as a count of layers.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["toy_model"]


def toy_model(seed: int = 0, width: int = 64, depth: int = 12) -> nn.Module:
    """Equal square layers without bias: ``depth * width**2`` parameters, the same on every rank."""
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width, bias=False), nn.Tanh()]
    return nn.Sequential(*layers)
