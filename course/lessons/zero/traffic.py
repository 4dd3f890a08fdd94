"""What sharding sends per training step, measured: DDP, ZeRO-1/2 from your halves, ZeRO-3.

DDP's step, torch's ``fully_shard`` step (FSDP2, ZeRO-3) and torch's
``ZeroRedundancyOptimizer`` are measured on the wire (``course.ring.wire``: the kernel's TCP
counters, gloo's own collectives as they run); the halves you wrote are recorded message by
message (``course.ring.recorder``). Rank-side programs: run them with ``course.ranks.run``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from course.lessons.zero.experiment import toy_model

__all__ = [
    "gloo_reduce_scatter",
    "halves_sent",
    "powersgd_traffic",
    "shard_dependence",
    "torch_zero_traffic",
    "traffic_on_ranks",
    "traffic_per_step",
]


def _ddp_step(model: nn.Module, meter: Any) -> None:
    """One forward and backward of DDP (built before the meter starts), the wire metered."""
    net = nn.parallel.DistributedDataParallel(model)
    x = torch.randn(16, model[0].in_features)
    with meter:
        nn.functional.mse_loss(net(x), x).backward()


def _fsdp_step(model: nn.Module, meters: dict[str, Any]) -> list[str]:
    """One step of torch's ``fully_shard`` (FSDP2: ZeRO-3, each layer a unit, resharded after
    forward), the wire metered in forward and in backward; the collectives it called."""
    from torch.distributed.fsdp import fully_shard

    from course.ring.recorder import Recorder

    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    x = torch.randn(16, model[0].in_features)
    nn.functional.mse_loss(model(x), x).backward()  # once first: FSDP sets itself up
    calls: list[str] = []
    with meters["forward"], Recorder() as recorder:
        loss = nn.functional.mse_loss(model(x), x)
    calls += [c.name for c in recorder.collectives]
    with meters["backward"], Recorder() as recorder:
        loss.backward()
    return calls + [c.name for c in recorder.collectives]


def traffic_per_step(reduce_scatter: Callable, all_gather: Callable) -> dict[str, Any]:
    """Rank side: bytes this rank sends in one training step of the toy model, in model sizes.

    DDP's step and torch's ``fully_shard`` step (ZeRO-3) are measured on the wire (the
    kernel's TCP counters, ``course.ring.wire``: gloo's own collectives as they run); the
    halves you wrote are recorded message by message, once each and in a ZeRO-1/2 step (a
    reduce-scatter of the gradient, then an all-gather of the updated parameters).
    """
    from course.ring.recorder import Recorder
    from course.ring.schedule import chunk_bounds
    from course.ring.wire import WireMeter

    def model() -> nn.Module:  # 4 layers of 256 KiB: headers are a small share of the bytes
        return toy_model(width=256, depth=4)

    model_bytes = sum(p.nbytes for p in model().parameters())
    numel = model_bytes // 4
    lo, hi = chunk_bounds(numel, dist.get_world_size())[dist.get_rank()]
    grad, params = torch.ones(numel), torch.zeros(numel)

    def recorded(step: Callable[[], object]) -> float:
        with Recorder() as recorder:
            step()
        return sum(m.nbytes for m in recorder.messages if m.op == "send") / model_bytes

    _ddp_step(model(), WireMeter())  # once first: gloo sets itself up
    ddp_wire, fsdp = WireMeter(), {"forward": WireMeter(), "backward": WireMeter()}
    _ddp_step(model(), ddp_wire)
    calls = _fsdp_step(model(), fsdp)
    return {
        "DDP": ddp_wire.total_sent / model_bytes,
        "reduce_scatter": recorded(lambda: reduce_scatter(grad.clone())),
        "all_gather": recorded(lambda: all_gather(params[lo:hi].clone(), params)),
        "ZeRO-1/2": recorded(lambda: all_gather(reduce_scatter(grad.clone()), params)),
        "FSDP forward": fsdp["forward"].total_sent / model_bytes,
        "FSDP backward": fsdp["backward"].total_sent / model_bytes,
        "FSDP calls": {name: calls.count(name) for name in sorted(set(calls))},
        "layers": sum(isinstance(m, nn.Linear) for m in model()),
    }


def torch_zero_traffic() -> dict[str, float]:
    """Rank side: bytes a training step sends on the wire, in model sizes, with DDP + Adam and
    with DDP + torch's ``ZeroRedundancyOptimizer`` (ZeRO-1), on the toy model."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    from course.ring.wire import WireMeter

    sent = {}
    for kind in ("DDP", "torch ZeRO-1"):
        model = toy_model()
        net = nn.parallel.DistributedDataParallel(model)
        if kind == "DDP":
            optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
        else:
            optimizer = ZeroRedundancyOptimizer(
                model.parameters(), optimizer_class=torch.optim.Adam, lr=1e-2
            )
        x = torch.randn(16, 64)
        for _ in range(2):  # the second step is measured: the first builds buckets and state
            with WireMeter() as wire:
                nn.functional.mse_loss(net(x), x).backward()
                optimizer.step()
            optimizer.zero_grad()
        sent[kind] = wire.total_sent / sum(p.nbytes for p in model.parameters())
    return sent


def traffic_on_ranks(
    reduce_scatter: Callable, all_gather: Callable, world_size: int = 4
) -> dict[str, Any]:
    """:func:`traffic_per_step` on fresh ranks: the most any rank sent, per measurement."""
    from course.ranks import run

    per_rank = run(traffic_per_step, world_size, reduce_scatter, all_gather, timeout=60)
    return {
        k: max(r[k] for r in per_rank) if isinstance(v, float) else v
        for k, v in per_rank[0].items()
    }


def powersgd_traffic(
    rank: int,
    start_iter: int,
    shape: tuple[int, int] = (256, 256),
    batch: int = 8,
    steps: int = 4,
) -> list[dict[str, float]]:
    """Rank side: per step of DDP with ``powerSGD_hook`` (error feedback off) on one bias-free
    ``rows x cols`` layer, fed batches of ``batch`` samples: the bytes this rank hands to
    ``all_reduce`` and the gradient's relative error against the exact average."""
    import copy

    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd

    from course.ring.recorder import Recorder

    rows, cols = shape
    torch.manual_seed(0)
    model = nn.Linear(cols, rows, bias=False)
    local = copy.deepcopy(model)
    ddp = nn.parallel.DistributedDataParallel(model)
    state = powersgd.PowerSGDState(
        process_group=None,
        matrix_approximation_rank=rank,
        start_powerSGD_iter=start_iter,
        use_error_feedback=False,
    )
    ddp.register_comm_hook(state, powersgd.powerSGD_hook)
    g = torch.Generator().manual_seed(dist.get_rank())
    out = []
    for _ in range(steps):
        x = torch.randn(batch, cols, generator=g)
        with Recorder() as recorder:
            ddp(x).pow(2).sum().backward()
        sent = sum(c.nbytes for c in recorder.collectives if c.name == "all_reduce")
        local.zero_grad()
        local(x).pow(2).sum().backward()
        exact = local.weight.grad.clone()
        dist.all_reduce(exact)
        exact /= dist.get_world_size()
        err = (model.weight.grad - exact).norm() / exact.norm()
        out.append({"bytes": sent, "error": err.item(), "full": exact.nbytes})
        model.zero_grad()
    return out


def halves_sent(reduce_scatter: Callable, numel: int) -> float:
    """Rank side: the bytes this rank sends in ``reduce_scatter`` of a ``numel``-element
    float32 tensor, recorded message by message, in units of the tensor's size."""
    from course.ring.recorder import Recorder

    tensor = torch.ones(numel)
    with Recorder() as recorder:
        reduce_scatter(tensor.clone())
    return sum(m.nbytes for m in recorder.messages if m.op == "send") / tensor.nbytes


def gloo_reduce_scatter(tensor: torch.Tensor) -> torch.Tensor:
    """gloo's own ``dist.reduce_scatter_tensor`` in the notebook's ``reduce_scatter(tensor) ->
    shard`` form (rank r gets the sum of chunk r); the tensor's size must divide evenly."""
    flat = tensor.reshape(-1)
    shard = torch.empty(flat.numel() // dist.get_world_size(), dtype=flat.dtype)
    dist.reduce_scatter_tensor(shard, flat)
    return shard


def shard_dependence(
    reduce_scatter: Callable,
    numel: int,
    source: int = 0,
    bounds: list[tuple[int, int]] | None = None,
) -> list[bool]:
    """Rank side: for each chunk c of rank ``source``'s tensor, whether changing that chunk
    (and nothing else, on no other rank) changes this rank's shard of the sum. The chunks
    are ``chunk_bounds(numel, world_size)`` unless ``bounds`` gives others (uneven shards,
    for a ``reduce_scatter`` that cuts the tensor there)."""
    from course.ring.schedule import chunk_bounds

    rank, n = dist.get_rank(), dist.get_world_size()
    base = torch.randn(numel, generator=torch.Generator().manual_seed(rank))
    before = reduce_scatter(base.clone())
    changed = []
    for lo, hi in chunk_bounds(numel, n) if bounds is None else bounds:
        tensor = base.clone()
        if rank == source:
            tensor[lo:hi] += 1.0
        changed.append(not torch.equal(reduce_scatter(tensor), before))
    return changed
