"""Fully sharded data parallel measured: torch's own ``fully_shard`` (FSDP2) on gloo ranks.

What a rank holds, what it sends and what it gathers, read from torch's FSDP2 as it runs:

* **held**: each rank's parameters, gradients and Adam state: the bytes of its local
  tensors (the DTensors' local shards);
* **unsharded**: the full parameters FSDP2 all-gathers for a unit's forward and backward,
  sampled before every op the rank runs (a ``TorchDispatchMode``) as the bytes of every
  storage FSDP2's state for them holds at that moment, each counted once; these are FSDP2's
  internal attributes in torch 2.13, read, never changed;
* **sent**: bytes on the wire per step (``course.ring.wire``: the kernel's TCP counters).

Rank-side functions take plain arguments and return plain numbers; ``*_on_ranks`` drivers run
them with ``course.ranks.run``. The package holds no FSDP of its own: every sharded step here
is torch's.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from course.models import toy_model

__all__ = [
    "LowRank",
    "UnshardedPeak",
    "layout_on_ranks",
    "memory_on_ranks",
    "memory_per_rank",
    "partly_sharded_on_ranks",
    "partly_sharded_step",
    "shard",
    "shard_layout",
    "traffic_on_ranks",
    "traffic_per_step",
    "unit_size_on_ranks",
    "unit_size_step",
    "units",
    "unsharded_bytes",
]


def units(model: nn.Module) -> list[nn.Module]:
    """The model's layers that carry parameters (``nn.Linear`` or :class:`LowRank` layers)."""
    return [m for m in model if isinstance(m, nn.Linear | LowRank)]


def shard(model: nn.Module, per_layer: bool = True, **options: Any) -> nn.Module:
    """torch's ``fully_shard`` on each layer (``per_layer``), then on the root; ``options`` go
    to every call (``reshard_after_forward``, ``mp_policy``)."""
    from torch.distributed.fsdp import fully_shard

    if per_layer:
        for layer in units(model):
            fully_shard(layer, **options)
    fully_shard(model, **options)
    return model


def _groups(model: nn.Module) -> Iterator[Any]:
    for module in model.modules():
        state = getattr(module, "_get_fsdp_state", None)
        group = state()._fsdp_param_group if state is not None else None  # noqa: SLF001
        if group is not None:
            yield group


def unsharded_bytes(model: nn.Module) -> int:
    """Bytes of the unsharded parameters FSDP2 holds for ``model`` now (storages counted once)."""
    storages: dict[int, int] = {}
    for group in _groups(model):
        kept = group.comm_ctx.all_gather_state
        pending = [group._all_gather_result, kept.all_gather_result if kept else None]  # noqa: SLF001
        tensors = [p.all_gather_output for p in pending if p is not None]
        for param in group.fsdp_params:
            tensors += list(getattr(param, "all_gather_outputs", []))
            if hasattr(param, "_unsharded_param"):
                tensors.append(param._unsharded_param)  # noqa: SLF001
        for t in tensors:
            storage = t.untyped_storage()
            storages[storage.data_ptr()] = max(
                storages.get(storage.data_ptr(), 0), storage.nbytes()
            )
    return sum(storages.values())


class UnshardedPeak(TorchDispatchMode):
    """Samples :func:`unsharded_bytes` before every op the rank dispatches; ``peak`` the most."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model, self.peak = model, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        self.peak = max(self.peak, unsharded_bytes(self.model))
        return func(*args, **(kwargs or {}))


def _local_bytes(tensors: Any) -> int:
    return sum(getattr(t, "_local_tensor", t).nbytes for t in tensors if t is not None)


def _held(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Bytes of the full fp32 model, and of this rank's parameters, gradients and Adam state
    (the local shards, for what FSDP sharded)."""
    state = [v for s in optimizer.state.values() for v in s.values() if v.dim() > 0]
    return {
        "model": sum(p.numel() * 4 for p in model.parameters()),
        "params": _local_bytes(model.parameters()),
        "grads": _local_bytes(p.grad for p in model.parameters()),
        "state": _local_bytes(state),
    }


def memory_per_rank(
    per_layer: bool = True, reshard_after_forward: bool = True, width: int = 128, depth: int = 8
) -> dict[str, int]:
    """Rank side: bytes this rank holds (params, grads, Adam state: local shards) after a step,
    and the peak of unsharded parameter bytes during the next forward and backward."""
    model = shard(toy_model(width=width, depth=depth), per_layer, reshard_after_forward=True)
    if not reshard_after_forward:
        for layer in units(model) if per_layer else []:
            layer.set_reshard_after_forward(False)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(16, width)
    nn.functional.mse_loss(model(x), x).backward()  # once first: FSDP sets itself up
    optimizer.step()
    with UnshardedPeak(model) as peak:
        nn.functional.mse_loss(model(x), x).backward()
    return {**_held(model, optimizer), "peak unsharded": peak.peak, "layer": width * width * 4}


def memory_on_ranks(world_size: int = 4, **options: Any) -> list[dict[str, int]]:
    """:func:`memory_per_rank` on fresh ranks, one dict per rank."""
    from course.ranks import run

    return run(memory_per_rank, world_size, timeout=60, **options)


def partly_sharded_step(
    wrapped: int = 4, root: bool = False, width: int = 128, depth: int = 8
) -> dict[str, Any]:
    """Rank side: torch's ``fully_shard`` on the first ``wrapped`` layers, one unit each, and on
    the model if ``root``, then one Adam step on this rank's own batch. Per layer: its weight's
    type and placements, the part of it this rank holds, and a sum of the whole weight
    (gathered, for a sharded one) to compare across ranks; and the bytes held."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    model = toy_model(width=width, depth=depth)
    for layer in units(model)[:wrapped]:
        fully_shard(layer)
    if root:
        fully_shard(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    x = torch.randn(16, width, generator=torch.Generator().manual_seed(7 + dist.get_rank()))
    nn.functional.mse_loss(model(x), x).backward()
    optimizer.step()
    layers = []
    for layer in units(model):
        weight = layer.weight
        whole = weight.full_tensor() if hasattr(weight, "full_tensor") else weight.detach()
        layers.append({
            "type": type(weight).__name__,
            "placements": [str(p) for p in getattr(weight, "placements", ())],
            "held": tuple(getattr(weight, "_local_tensor", weight).shape),
            "shape": tuple(weight.shape),
            "sum": float(whole.double().sum()),
        })  # fmt: skip
    return {"layers": layers, **_held(model, optimizer)}


def partly_sharded_on_ranks(world_size: int = 2, **options: Any) -> list[dict[str, Any]]:
    """:func:`partly_sharded_step` on fresh ranks, one dict per rank."""
    from course.ranks import run

    return run(partly_sharded_step, world_size, timeout=60, **options)


class LowRank(nn.Module):
    """A residual layer ``x + (x Wᵀ) W`` with one weight of shape (rows, width) and no bias:
    few rows, so that ``fully_shard`` cuts dim 0 into uneven, padded pieces."""

    def __init__(self, rows: int, width: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(rows, width) / width**0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + (x @ self.weight.T) @ self.weight


def _traffic_model(width: int, rows: int | None) -> nn.Sequential:
    if rows is None:
        return toy_model(width=width, depth=4)
    torch.manual_seed(0)
    return nn.Sequential(*(LowRank(rows, width) for _ in range(4)))


def traffic_per_step(
    reshard_after_forward: bool = True, width: int = 256, rows: int | None = None
) -> dict[str, Any]:
    """Rank side: bytes this rank sent in a forward and a backward of torch's ``fully_shard``
    (each of 4 layers a unit), in model sizes, and the collectives FSDP2 called. ``rows``: 4
    :class:`LowRank` layers of (rows, width) weights instead of square ones."""
    from course.ring.recorder import Recorder
    from course.ring.wire import WireMeter

    model = _traffic_model(width, rows)
    size = sum(p.numel() * 4 for p in model.parameters())  # the full fp32 model
    shard(model, reshard_after_forward=reshard_after_forward)
    x = torch.randn(16, width)
    nn.functional.mse_loss(model(x), x).backward()  # once first: gloo and FSDP set up
    forward, backward = WireMeter(), WireMeter()
    with forward, Recorder() as recorder:
        loss = nn.functional.mse_loss(model(x), x)
    calls = [c.name for c in recorder.collectives]
    with backward, Recorder() as recorder:
        loss.backward()
    calls += [c.name for c in recorder.collectives]
    return {
        "forward": forward.total_sent / size,
        "backward": backward.total_sent / size,
        "calls": {name: calls.count(name) for name in sorted(set(calls))},
    }


def traffic_on_ranks(world_size: int = 4, **options: Any) -> dict[str, Any]:
    """:func:`traffic_per_step` on fresh ranks: the most any rank sent, and rank 0's calls."""
    from course.ranks import run

    per_rank = run(traffic_per_step, world_size, timeout=60, **options)
    return {
        "forward": max(r["forward"] for r in per_rank),
        "backward": max(r["backward"] for r in per_rank),
        "calls": per_rank[0]["calls"],
    }


def shard_layout(shape: tuple[int, ...]) -> dict[str, Any]:
    """Rank side: what torch's ``fully_shard`` makes of one parameter of ``shape`` on this
    rank: its placements, the local shard's shape, and the bytes of the storage behind it."""
    layer = nn.Module()
    layer.weight = nn.Parameter(torch.zeros(shape))
    shard(layer, per_layer=False)
    local = layer.weight.to_local()
    return {
        "placements": [str(p) for p in layer.weight.placements],
        "global": tuple(layer.weight.shape),
        "local": tuple(local.shape),
        "storage": local.untyped_storage().nbytes(),
    }


def layout_on_ranks(shape: tuple[int, ...], world_size: int = 3) -> list[dict[str, Any]]:
    """:func:`shard_layout` on fresh ranks, one dict per rank."""
    from course.ranks import run

    return run(shard_layout, world_size, tuple(shape), timeout=60)


def unit_size_step(layers_per_unit: int = 1, width: int = 128, depth: int = 8) -> dict[str, Any]:
    """Rank side: torch's ``fully_shard`` on groups of ``layers_per_unit`` consecutive layers
    (one unit each, then the root): the peak of unsharded parameter bytes in a forward and
    backward, the bytes this rank sent in them (model sizes), and the collectives called."""
    from torch.distributed.fsdp import fully_shard

    from course.ring.recorder import Recorder
    from course.ring.wire import WireMeter

    model = toy_model(width=width, depth=depth)
    layers = units(model)
    for start in range(0, len(layers), layers_per_unit):
        fully_shard(layers[start : start + layers_per_unit], reshard_after_forward=True)
    fully_shard(model, reshard_after_forward=True)
    x = torch.randn(16, width)
    nn.functional.mse_loss(model(x), x).backward()  # once first: gloo and FSDP set up
    sent = WireMeter()
    with sent, Recorder() as recorder:
        nn.functional.mse_loss(model(x), x).backward()
    with UnshardedPeak(model) as peak:
        nn.functional.mse_loss(model(x), x).backward()
    calls = [c.name for c in recorder.collectives]
    return {
        "peak unsharded": peak.peak,
        "layer": width * width * 4,
        "sent": sent.total_sent / (depth * width * width * 4),
        "calls": {name: calls.count(name) for name in sorted(set(calls))},
    }


def unit_size_on_ranks(world_size: int = 4, **options: Any) -> list[dict[str, Any]]:
    """:func:`unit_size_step` on fresh ranks, one dict per rank."""
    from course.ranks import run

    return run(unit_size_step, world_size, timeout=90, **options)
