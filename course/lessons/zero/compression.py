"""Compressed gradients measured: DDP's fp16 comm hook.

The hook is PyTorch's (``torch.distributed.algorithms.ddp_comm_hooks``): ``fp16_compress_hook``
casts each bucket to float16 before the all-reduce and back after it. Every function here is a
rank-side program: run it with ``course.ranks.run``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

__all__ = ["fp16_hook_grads"]


def fp16_hook_grads(values: Sequence[float]) -> dict[str, list[float]]:
    """The gradient of ``w . x`` with ``x = values`` is ``values``: DDP's averaged gradient
    without a hook and with ``fp16_compress_hook``, every rank feeding the same values."""
    out = {}
    for name, hook in (("fp32", None), ("fp16 hook", default_hooks.fp16_compress_hook)):
        model = nn.Linear(len(values), 1, bias=False)
        ddp = nn.parallel.DistributedDataParallel(model)
        if hook is not None:
            ddp.register_comm_hook(dist.group.WORLD, hook)
        ddp(torch.tensor([list(values)])).sum().backward()
        out[name] = model.weight.grad.reshape(-1).tolist()
    return out
