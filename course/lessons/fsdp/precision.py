"""Mixed precision under torch's ``fully_shard``, measured: what is held, what is lost.

* :func:`held_bytes`: what a rank holds between steps, and the peak of unsharded bytes,
  under ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`` or none (fp32);
* :func:`reduce_error`: the averaged gradient that FSDP2 leaves in each rank's shard,
  reduced in bf16 or in fp32, against the fp64 mean of the very bf16 gradients the ranks
  computed (each rank recomputes its own with a plain bf16 copy of the model);
* :func:`underflow`: plain torch, one process: how many gradient elements of a small model
  computed in fp16 come out zero where fp32 has them non-zero, with and without a loss scale.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from course.lessons.fsdp.experiment import UnshardedPeak, shard
from course.models import toy_model

__all__ = [
    "held_bytes",
    "held_on_ranks",
    "reduce_error",
    "reduce_on_ranks",
    "reduce_result",
    "reduce_results_on_ranks",
    "underflow",
]

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def _policy(param_dtype: str | None, reduce_dtype: str | None) -> dict[str, Any]:
    if param_dtype is None:
        return {}
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return {
        "mp_policy": MixedPrecisionPolicy(
            param_dtype=_DTYPES[param_dtype],
            reduce_dtype=_DTYPES[reduce_dtype] if reduce_dtype else None,
        )
    }


def held_bytes(param_dtype: str | None = None, width: int = 128) -> dict[str, Any]:
    """Rank side: bytes per model parameter this rank holds after an Adam step (params,
    grads, state: local shards, with their dtypes), and the peak of unsharded parameter bytes
    per model parameter during the next step; fp32 reduce when ``param_dtype`` is set."""
    policy = _policy(param_dtype, "fp32" if param_dtype else None)
    model = shard(toy_model(width=width, depth=4), **policy)
    numel = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(16, width)
    for _ in range(2):  # the second step is sampled; the first sets FSDP and Adam up
        optimizer.zero_grad(set_to_none=False)
        with UnshardedPeak(model) as peak:
            nn.functional.mse_loss(model(x).float(), x).backward()
        optimizer.step()
    params = [p.to_local() for p in model.parameters()]
    grads = [p.grad.to_local() for p in model.parameters()]
    state = [v for s in optimizer.state.values() for v in s.values() if v.dim() > 0]
    return {
        "params": sum(t.nbytes for t in params) / numel,
        "grads": sum(t.nbytes for t in grads) / numel,
        "state": sum(getattr(t, "_local_tensor", t).nbytes for t in state) / numel,
        "dtypes": sorted({str(t.dtype) for t in params + grads}),
        "peak unsharded": peak.peak / numel,
        "layer share": width * width / numel,
    }


def held_on_ranks(world_size: int = 4, **options: Any) -> list[dict[str, Any]]:
    """:func:`held_bytes` on fresh ranks, one dict per rank."""
    from course.ranks import run

    return run(held_bytes, world_size, timeout=60, **options)


def reduce_error(reduce_dtype: str = "bf16", width: int = 256, seed: int = 0) -> float:
    """Rank side: the relative error (L2) of the gradient FSDP2 left in this rank's shards,
    against the fp64 mean over ranks of each rank's own bf16 gradient (``param_dtype=bf16``)."""
    return reduce_result(reduce_dtype, width, seed)["error"]


def reduce_result(reduce_dtype: str = "bf16", width: int = 256, seed: int = 0) -> dict[str, Any]:
    """Rank side: :func:`reduce_error`'s error, how many elements of the averaged gradient
    came out 0 where the fp64 mean is not, and the smallest non-zero magnitude of that mean."""
    torch.manual_seed(seed + 1 + dist.get_rank())
    x = torch.randn(32, width)
    model = toy_model(seed, width=width, depth=4)
    local = copy.deepcopy(model).to(torch.bfloat16)
    nn.functional.mse_loss(local(x.bfloat16()).float(), x).backward()
    shard(model, **_policy("bf16", reduce_dtype))
    nn.functional.mse_loss(model(x).float(), x).backward()
    errors, norms, zeroed, smallest = 0.0, 0.0, 0, float("inf")
    for mine, sharded in zip(local.parameters(), model.parameters(), strict=True):
        ranks = [
            torch.empty_like(mine.grad, dtype=torch.float64) for _ in range(dist.get_world_size())
        ]
        dist.all_gather(ranks, mine.grad.double())
        mean = torch.stack(ranks).mean(0)
        got = sharded.grad.full_tensor().double()
        errors += float((got - mean).square().sum())
        norms += float(mean.square().sum())
        zeroed += int(((got == 0) & (mean != 0)).sum())
        smallest = min(smallest, float(mean[mean != 0].abs().min()))
    return {"error": (errors / norms) ** 0.5, "zeroed": zeroed, "smallest": smallest}


def reduce_on_ranks(world_size: int = 4, **options: Any) -> float:
    """:func:`reduce_error` on fresh ranks: the largest error of any rank."""
    from course.ranks import run

    return max(run(reduce_error, world_size, timeout=60, **options))


def reduce_results_on_ranks(world_size: int = 4, **options: Any) -> list[dict[str, Any]]:
    """:func:`reduce_result` on fresh ranks, one dict per rank."""
    from course.ranks import run

    return run(reduce_result, world_size, timeout=60, **options)


def underflow(scale: float = 1.0, dtype: str = "fp16", size: float = 0.03) -> dict[str, Any]:
    """One process: the share of gradient elements, non-zero in fp32, that come out exactly 0
    when ``toy_model(width=64, depth=6)`` runs in ``dtype`` on a batch of 256 inputs and targets
    of standard deviation ``size``, its mean squared error times ``scale`` (the gradient
    divided by ``scale`` afterwards, in fp32), and how many come out not finite (inf or NaN)."""
    model = toy_model(0, width=64, depth=6)
    generator = torch.Generator().manual_seed(0)
    x, y = (size * torch.randn(256, 64, generator=generator) for _ in range(2))
    grads = {}
    for kind, factor in (("fp32", 1.0), (dtype, scale)):
        net = copy.deepcopy(model).to(_DTYPES[kind])
        loss = nn.functional.mse_loss(net(x.to(_DTYPES[kind])), y.to(_DTYPES[kind]))
        (loss * factor).backward()
        grads[kind] = torch.cat([p.grad.float().flatten() for p in net.parameters()]) / factor
    reference, low = grads["fp32"], grads[dtype]
    nonzero = reference != 0
    return {
        "zeroed": float(((low == 0) & nonzero).sum() / nonzero.sum()),
        "inf": int((~torch.isfinite(low)).sum()),
        "median": float(reference.abs().median()),
    }
