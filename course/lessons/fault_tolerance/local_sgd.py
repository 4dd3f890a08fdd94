"""Synchronising less often: DDP against LocalSGD and DiLoCo, in bytes and in loss.

    from course.ranks import run
    run(train, 2, "local_sgd", steps=64, every=8)    # one record per rank

Every rank fits the same small regression network to its own shard of one teacher's data with
AdamW (lr 1e-2; ``inner`` picks another optimizer of ``INNER``). ``ddp`` all-reduces the
gradients every step (their mean); ``local_sgd`` steps alone and averages the parameters every
``every`` steps (Stich 2019, "Local SGD Converges Fast and Communicates Little"); ``diloco``
steps alone and every ``every`` steps calls ``outer_step(params, global_params, momentum,
outer_lr, mu)``, the outer step of DiLoCo (Douillard et al. 2023, arXiv:2311.08105), by default
with the paper's outer learning rate 0.7 and Nesterov momentum 0.9. Each rank's record: the
loss over all ranks' data after each synchronisation, the bytes it put into collectives,
counted by the course's recorder, and its parameters at the end, flattened. Runs under torchrun
too:

    torchrun --nproc-per-node 2 -m course.lessons.fault_tolerance.local_sgd local_sgd 8
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from course.ring.recorder import Recorder

__all__ = ["INNER", "METHODS", "OUTER_LR", "OUTER_MU", "train"]

METHODS = ("ddp", "local_sgd", "diloco")
OUTER_LR, OUTER_MU = 0.7, 0.9  # DiLoCo's outer Nesterov SGD, as in its paper
ROWS, DIM, HIDDEN = 256, 16, 32  # each rank's data, and the network
# The inner optimizers, each with a learning rate at which this problem trains stably.
INNER: dict[str, Callable[[list], torch.optim.Optimizer]] = {
    "adamw": lambda params: torch.optim.AdamW(params, lr=1e-2),
    "sgd": lambda params: torch.optim.SGD(params, lr=0.05),
    "momentum": lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9),
    "adagrad": lambda params: torch.optim.Adagrad(params, lr=0.05),
}


def _data(rank: int, world_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """This rank's shard (inputs, targets), and all ranks' inputs for the loss, from one
    fixed teacher network; each rank's inputs are shifted, so the shards differ."""
    g = torch.Generator().manual_seed(1234)
    teacher = [torch.randn(DIM, HIDDEN, generator=g), torch.randn(HIDDEN, 1, generator=g)]
    xs = [torch.randn(ROWS, DIM, generator=g) + 0.5 * r for r in range(world_size)]
    ys = [torch.tanh(x @ teacher[0]) @ teacher[1] for x in xs]
    return xs[rank], ys[rank], torch.cat(xs), torch.cat(ys)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(DIM, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, 1))


def _loss_everywhere(model: nn.Module, xs: torch.Tensor, ys: torch.Tensor) -> float:
    with torch.no_grad():
        return nn.functional.mse_loss(model(xs), ys).item()


def train(
    method: str,
    steps: int = 64,
    every: int = 8,
    outer_step: Callable[..., Any] | None = None,
    outer_lr: float = OUTER_LR,
    mu: float = OUTER_MU,
    inner: str = "adamw",
) -> dict[str, Any]:
    """On every rank: ``steps`` inner steps of ``method`` with the ``inner`` optimizer; the
    loss over all the data after each synchronisation (every step for ``ddp``), the bytes put
    into collectives and the parameters at the end. ``outer_lr`` and ``mu``: DiLoCo's outer
    learning rate and momentum."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if inner not in INNER:
        raise ValueError(f"inner must be one of {tuple(INNER)}, got {inner!r}")
    if method == "diloco" and outer_step is None:
        raise ValueError("diloco needs outer_step: your diloco_outer_step")
    rank, n = dist.get_rank(), dist.get_world_size()
    x, y, xs, ys = _data(rank, n)
    model = _model()
    params = list(model.parameters())
    opt = INNER[inner](params)
    global_params = [p.detach().clone() for p in params]
    momentum = [torch.zeros_like(p) for p in params]
    losses, sent = [], 0
    for step in range(1, steps + 1):
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        with Recorder() as seen:
            if method == "ddp":
                for p in params:
                    dist.all_reduce(p.grad)
                    p.grad /= n
            opt.step()
            if method != "ddp" and step % every == 0:
                with torch.no_grad():
                    outer = (outer_step, outer_lr, mu)
                    _synchronise(method, params, global_params, momentum, outer)
        sent += sum(max(c.contributed, 0) for c in seen.collectives)
        if method == "ddp" or step % every == 0:
            losses.append((step, _loss_everywhere(model, xs, ys)))
    weights = torch.cat([p.detach().flatten() for p in params])
    return {"rank": rank, "losses": losses, "sent": sent, "weights": weights}


def _synchronise(
    method: str, params: list, global_params: list, momentum: list, outer: tuple
) -> None:
    """LocalSGD: the parameters' mean; DiLoCo: the student's outer step (``outer``: it, and
    its learning rate and momentum)."""
    if method == "local_sgd":
        for p in params:
            dist.all_reduce(p)
            p.div_(dist.get_world_size())
        return
    outer_step, outer_lr, mu = outer
    outer_step([p.data for p in params], global_params, momentum, outer_lr, mu)


def main() -> None:
    """Under torchrun: ``method`` and ``every`` from the command line; rank 0 prints."""
    method, every = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 8
    dist.init_process_group("gloo")
    got = train(method, every=every)
    if got["rank"] == 0:
        print(got, flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
