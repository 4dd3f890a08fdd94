"""Accumulation, sampling and uneven data: experiments that run on real gloo ranks.

Each function that takes no ``world_size`` runs on every rank of an initialised default
process group and returns plain data, so the same code runs from a notebook
(``course.ranks.run(accumulation_counts, 2)``), from a test, or under ``torchrun``::

    torchrun --nproc-per-node 2 -m course.lessons.accumulation.experiment

The sampler's experiments are ``course.lessons.accumulation.sampler``. PyTorch docs:
``DistributedDataParallel.no_sync`` and ``torch.distributed.algorithms.Join``
(https://pytorch.org/docs/stable/distributed.algorithms.join.html).
"""

# No "from __future__ import annotations": DDP.register_comm_hook compares the hook's
# annotations as objects.

import contextlib
import copy
import os
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel as DDP

__all__ = [
    "accumulation_counts",
    "batchnorm_buffers",
    "branch_grads",
    "clipped_norms",
    "counting_hook",
    "dropout_masks",
    "swapped_all_reduce",
    "sync_batchnorm_on_cpu",
    "uneven_loop",
    "unused_parameter_steps",
]


def counting_hook(state: list, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP's default reduction (torch's ``allreduce_hook``), appending each bucket's index to
    ``state``: one entry per all-reduce DDP launches."""
    state.append(bucket.index())
    return allreduce_hook(None, bucket)


def _mlp(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))


def _flat_grad(model: nn.Module) -> list[float]:
    return torch.cat([p.grad.flatten() for p in model.parameters()]).tolist()


def accumulation_counts(
    use_no_sync: bool = True,
    k: int = 4,
    seed: int = 0,
    reduction: str = "mean",
    sync_first: bool = False,
    max_norm_ratio: float | None = None,
    samples: int = 2,
) -> dict[str, Any]:
    """K micro-batches of ``samples`` samples per rank into one ``.grad``: all-reduces per
    backward.

    Each micro-batch's ``mse_loss(..., reduction)`` is backpropagated as it is (``sync_first``:
    only the first backward outside ``no_sync``). Beside ``.grad``: the global batch's mean-loss
    gradient in one process, its norm, each micro-batch's local gradient (no DDP), and with
    ``max_norm_ratio`` the norm one ``clip_grad_norm_`` saw at that times the large norm, and
    ``.grad`` before that clip.
    """
    rank, world_size = dist.get_rank(), dist.get_world_size()
    model = _mlp(seed)
    large, local = copy.deepcopy(model), copy.deepcopy(model)
    ddp = DDP(model)
    calls: list[int] = []
    ddp.register_comm_hook(calls, counting_hook)
    gen = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(world_size, k, samples, 4, generator=gen)
    y = torch.randn(world_size, k, samples, 1, generator=gen)
    synced = [i == 0 if sync_first else not use_no_sync or i == k - 1 for i in range(k)]
    per_backward, local_grads = [], []
    for i, sync in enumerate(synced):
        before = len(calls)
        with contextlib.nullcontext() if sync else ddp.no_sync():
            nn.functional.mse_loss(ddp(x[rank, i]), y[rank, i], reduction=reduction).backward()
        per_backward.append(len(calls) - before)
        local.zero_grad()
        nn.functional.mse_loss(local(x[rank, i]), y[rank, i], reduction=reduction).backward()
        local_grads.append(_flat_grad(local))
    nn.functional.mse_loss(large(x.reshape(-1, 4)), y.reshape(-1, 1)).backward()
    large_norm = nn.utils.clip_grad_norm_(large.parameters(), float("inf")).item()
    norm, unclipped = None, _flat_grad(model)
    if max_norm_ratio is not None:
        norm = nn.utils.clip_grad_norm_(model.parameters(), max_norm_ratio * large_norm).item()
    return {
        "rank": rank,
        "allreduces_per_backward": per_backward,
        "grad": _flat_grad(model),
        "unclipped_grad": unclipped,
        "large_batch_grad": _flat_grad(large),
        "large_batch_norm": large_norm,
        "norm": norm,
        "local_grads": local_grads,
    }


def uneven_loop(
    batches_per_rank: Sequence[int] = (3, 2),
    join: bool = False,
    then: str = "return",
    lr: float = 0.0,
    divide_by_initial_world_size: bool = True,
) -> list[dict]:
    """Train ``nn.Linear(2, 1)`` under DDP, rank r on ``batches_per_rank[r]`` batches.

    Batch i of rank r is one sample with both inputs ``10 r + i + 1``, so the local gradient
    of ``sum(w . x)`` is that input. Returns, per step, the input and ``.grad`` after backward.
    Once its batches are done a rank returns (``then="return"``: its process stays, idle),
    calls ``dist.barrier()`` (``"barrier"``), ends its process (``"exit"``), or all-reduces a
    zero weight-shaped tensor once per batch it lacks against the longest rank (``"zeros"``).
    With ``lr``: weights from 0, an SGD step after each backward, weights recorded per step
    and, in a last entry, after the loop (after the ``with`` block). With ``join``,
    ``divide_by_initial_world_size`` is Join's option of that name for DDP.
    """
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Linear(2, 1, bias=False)
    if lr:
        nn.init.zeros_(model.weight)
    ddp = DDP(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=lr)  # lr 0: the weights stay
    steps = []
    with (
        Join([ddp], divide_by_initial_world_size=divide_by_initial_world_size)
        if join  # built only when used: building Join already sets DDP's join config
        else contextlib.nullcontext()
    ):
        for i in range(batches_per_rank[rank]):
            model.zero_grad()
            x = torch.full((1, 2), float(10 * rank + i + 1))
            ddp(x).sum().backward()
            optimizer.step()
            step = {"local": x.flatten().tolist(), "grad": model.weight.grad.flatten().tolist()}
            steps.append(
                {**step, "weight": model.weight.detach().flatten().tolist()} if lr else step
            )
    if lr:
        steps.append({"weight": model.weight.detach().flatten().tolist()})
    if then == "barrier":
        dist.barrier()
    elif then == "exit":
        os._exit(0)
    elif then == "zeros":
        for _ in range(max(batches_per_rank) - batches_per_rank[rank]):
            dist.all_reduce(torch.zeros_like(model.weight).flatten())
    return steps


class _TwoHeads(nn.Module):
    """Two linear heads; ``forward`` runs the one it is given, by default only the first."""

    def __init__(self) -> None:
        super().__init__()
        self.used = nn.Linear(2, 1, bias=False)
        self.unused = nn.Linear(2, 1, bias=False)

    def forward(self, x: torch.Tensor, head: str = "used") -> torch.Tensor:
        return getattr(self, head)(x)


def unused_parameter_steps(find_unused_parameters: bool = False, steps: int = 2) -> list[dict]:
    """DDP steps of a model with a parameter the loss never uses; what each step gives."""
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = _TwoHeads()
    ddp = DDP(model, find_unused_parameters=find_unused_parameters)
    out: list[dict] = []
    for _ in range(steps):
        model.zero_grad()
        x = torch.full((1, 2), float(rank + 1))
        try:
            ddp(x).sum().backward()
        except RuntimeError as err:
            out.append({"error": str(err).split("\n")[0]})
            continue
        g = _head_grads(model)
        out.append({"local": x.flatten().tolist(), "grad": g["used"], "unused_grad": g["unused"]})
    return out


def _head_grads(model: _TwoHeads) -> dict[str, list[float] | None]:
    grads = {h: getattr(model, h).weight.grad for h in ("used", "unused")}
    return {h: None if g is None else g.flatten().tolist() for h, g in grads.items()}


def branch_grads(
    find_unused_parameters: bool = True, heads: Sequence[str] = ("used", "unused")
) -> dict[str, list[float] | None]:
    """One DDP backward of the two-headed module in which rank r runs only head ``heads[r]``,
    on input ``2 r + 1``: each head's ``.grad`` on this rank (None where it has none)."""
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = _TwoHeads()
    ddp = DDP(model, find_unused_parameters=find_unused_parameters)
    ddp(torch.full((1, 2), float(2 * rank + 1)), heads[rank]).sum().backward()
    return _head_grads(model)


def swapped_all_reduce(
    loss: float = 1.0,
    samples: float = 100.0,
    swapped: Sequence[int] | None = None,
    per_rank: bool = True,
) -> dict[str, Any]:
    """Two same-shaped all-reduces: rank r's loss sum ``loss + r`` and count ``samples * (r + 1)``
    (``samples`` unless ``per_rank``), the ranks in ``swapped`` (default: all but rank 0) reducing
    the count first, the others the loss first."""
    rank = dist.get_rank()
    loss_sum = torch.tensor([loss + rank])
    count = torch.tensor([samples * (rank + 1) if per_rank else samples])
    late = rank in swapped if swapped is not None else rank != 0
    for t in [count, loss_sum] if late else [loss_sum, count]:
        dist.all_reduce(t)
    return {"rank": rank, "loss_sum": loss_sum.item(), "count": count.item()}


def clipped_norms(max_norm: float = 0.1, seed: int = 0) -> dict[str, Any]:
    """``clip_grad_norm_`` after a DDP backward: the norm each rank sees, and any collective;
    beside it, the norm of the large-batch gradient in one process (what it would clip by)."""
    from course.ring.recorder import Recorder

    rank, world_size = dist.get_rank(), dist.get_world_size()
    model = _mlp(seed)
    large = copy.deepcopy(model)
    ddp = DDP(model)
    gen = torch.Generator().manual_seed(seed + 1)
    x, y = (
        torch.randn(world_size, 4, 4, generator=gen),
        torch.randn(world_size, 4, 1, generator=gen),
    )
    nn.functional.mse_loss(ddp(x[rank]), y[rank]).backward()
    local = copy.deepcopy(model)
    local.zero_grad()
    nn.functional.mse_loss(local(x[rank]), y[rank]).backward()
    with Recorder() as rec:
        norm = nn.utils.clip_grad_norm_(model.parameters(), max_norm).item()
    nn.functional.mse_loss(large(x.reshape(-1, 4)), y.reshape(-1, 1)).backward()
    return {
        "rank": rank,
        "norm": norm,
        "local_norm": nn.utils.clip_grad_norm_(local.parameters(), float("inf")).item(),
        "large_batch_norm": nn.utils.clip_grad_norm_(large.parameters(), float("inf")).item(),
        "collectives": rec.collectives,
        "clipped": _flat_grad(model),
    }


def batchnorm_buffers(
    broadcast_buffers: bool = True, steps: int = 2, spacing: float = 10.0, micro_batches: int = 1
) -> list[float]:
    """A ``BatchNorm1d``'s running mean on this rank after each DDP forward (batch mean
    ``spacing * r + 1.5``): ``micro_batches`` forwards and backwards per step, all but the last
    of a step under ``no_sync``, as in gradient accumulation."""
    rank = dist.get_rank()
    model = nn.BatchNorm1d(1)  # momentum 0.1: running = 0.9 running + 0.1 batch mean
    ddp = DDP(model, broadcast_buffers=broadcast_buffers)
    x = spacing * rank + torch.arange(4.0).view(4, 1)
    means = []
    for _ in range(steps):
        for i in range(micro_batches):
            with ddp.no_sync() if i < micro_batches - 1 else contextlib.nullcontext():
                ddp(x).sum().backward()
            means.append(model.running_mean.item())
    return means


def sync_batchnorm_on_cpu() -> dict[str, str]:
    """What ``nn.SyncBatchNorm`` does on a CPU gloo rank: in a forward, and under DDP."""
    out = {}
    for what in ("forward", "DDP"):
        try:
            layer = nn.SyncBatchNorm(1)
            (DDP(layer) if what == "DDP" else layer)(torch.randn(4, 1))
            out[what] = "no error"
        except (ValueError, RuntimeError) as err:
            out[what] = f"{type(err).__name__}: {str(err).splitlines()[0]}"
    return out


def dropout_masks(seed_per_rank: bool = False, n: int = 12, wrap: bool = True) -> list[float]:
    """The dropout mask (0 or 2) this rank draws after ``torch.manual_seed`` and, with
    ``wrap``, after building a DDP model (which could have touched the generator)."""
    torch.manual_seed(dist.get_rank() if seed_per_rank else 0)
    if wrap:
        DDP(nn.Sequential(nn.Linear(n, n), nn.Dropout(0.5)))
    return nn.functional.dropout(torch.ones(n), 0.5).tolist()


if __name__ == "__main__":  # torchrun --nproc-per-node 2 -m course.lessons.accumulation.experiment
    dist.init_process_group("gloo")
    print(accumulation_counts())
    dist.barrier()  # no rank closes its connections while a peer still uses them
    dist.destroy_process_group()
