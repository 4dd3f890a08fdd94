"""Compressed gradients measured: DDP's fp16 and PowerSGD comm hooks, and torch's own ZeRO.

The hooks are PyTorch's (``torch.distributed.algorithms.ddp_comm_hooks``): ``fp16_compress_hook``
casts each bucket to float16 before the all-reduce; ``powerSGD_hook`` (Vogels et al. 2019,
"PowerSGD: Practical low-rank gradient compression for distributed optimization") all-reduces
two thin factors P (n x r) and Q (m x r) of each n x m gradient (the notebook measures when,
and what each sends). The bytes are counted by the course's
recorder (``course.ring.recorder``), at the process group, on each rank. Every function here
is a rank-side program: run it with ``course.ranks.run``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

__all__ = ["fp16_hook_grads", "torch_zero_state"]


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


def torch_zero_state(shapes: Sequence[tuple[int, int]] = ((1000, 10),)) -> dict:
    """Whose Adam state this rank holds under torch's ``ZeroRedundancyOptimizer`` for a stack
    of ``nn.Linear(in, out)`` layers, after one step: each parameter's name and elements, and
    the bytes of state."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    torch.manual_seed(0)
    model = nn.Sequential(*(nn.Linear(a, b) for a, b in shapes))
    ddp = nn.parallel.DistributedDataParallel(model)
    optimizer = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.Adam, lr=0.01)
    ddp(torch.randn(4, shapes[0][0])).sum().backward()
    optimizer.step()
    names = {id(p): name for name, p in model.named_parameters()}
    owned = [p for group in optimizer.optim.param_groups for p in group["params"]]
    state = optimizer.optim.state.values()
    return {
        "params": {names[id(p)]: p.numel() for p in owned},
        "nbytes": sum(v.nbytes for s in state for v in s.values() if torch.is_tensor(v)),
    }
