"""What more ranks do to training when each rank keeps its batch: the global batch grows.

    from course.lessons.synchrony.batch_size import sweep
    curves = sweep(world_sizes=(1, 2, 4, 8))   # {(N, rule): loss per epoch}

Each of N ranks trains the same small classifier (a 2-layer MLP) under DDP on its shard of
one fixed data set, with a fixed per-rank batch, for the same number of epochs. Three
learning-rate
rules, after Goyal et al. 2017 ("Accurate, Large Minibatch SGD: Training ImageNet in 1
Hour"): the N = 1 learning rate unchanged (``"same lr"``), the linear scaling rule
``lr * N`` from the first step (``"lr x N"``), and the linear rule reached by a linear warmup
over the first steps (``"lr x N, warmup"``). The loss is the whole data set's, after each
epoch (the first value before any step); every rank holds the same model, so rank 0's is
every rank's.

    torchrun --nproc-per-node 4 -m course.lessons.synchrony.batch_size
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from course.ranks import run

__all__ = ["RULES", "classification_data", "sweep", "train_rank"]

RULES = ("same lr", "lr x N", "lr x N, warmup")


def classification_data(
    samples: int = 1024, features: int = 16, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """A fixed two-class data set ``(X, y)``, labels from a random linear teacher, the same
    on every rank: the features are scaled up so that a large step overshoots."""
    g = torch.Generator().manual_seed(seed)
    x = 3 * torch.randn(samples, features, generator=g)
    teacher = torch.randn(features, generator=g)
    return x, (x @ teacher > 0).float()


def _lr_at(rule: str, lr: float, world_size: int, step: int, warmup_steps: int) -> float:
    if rule == "same lr":
        return lr
    if rule == "lr x N":
        return lr * world_size
    ramp = min(1.0, (step + 1) / warmup_steps)  # from lr to lr * N, linearly
    return lr * (1 + (world_size - 1) * ramp)


def _epoch_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return nn.functional.binary_cross_entropy_with_logits(model(x).squeeze(1), y).item()


def train_rank(
    rule: str,
    lr: float = 0.2,
    batch_per_rank: int = 16,
    epochs: int = 4,
    warmup_steps: int = 16,
    seed: int = 0,
    hidden: int = 64,
) -> list[float]:
    """On every rank: DDP training with one learning-rate rule; the loss after each epoch.

    The model is a 2-layer ReLU MLP with ``hidden`` units (logistic regression for 0).
    """
    if rule not in RULES:
        raise ValueError(f"no rule {rule!r}; choose one of {', '.join(RULES)}")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    x, y = classification_data(seed=seed)
    shard_x, shard_y = x[rank::world_size], y[rank::world_size]
    torch.manual_seed(seed)
    model = (
        nn.Sequential(nn.Linear(x.shape[1], hidden), nn.ReLU(), nn.Linear(hidden, 1))
        if hidden
        else nn.Linear(x.shape[1], 1)
    )
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=lr)
    losses, step = [_epoch_loss(model, x, y)], 0
    for _ in range(epochs):
        for start in range(0, len(shard_y) - batch_per_rank + 1, batch_per_rank):
            for group in opt.param_groups:
                group["lr"] = _lr_at(rule, lr, world_size, step, warmup_steps)
            batch = slice(start, start + batch_per_rank)
            out = ddp(shard_x[batch]).squeeze(1)
            nn.functional.binary_cross_entropy_with_logits(out, shard_y[batch]).backward()
            opt.step()
            opt.zero_grad()
            step += 1
        losses.append(_epoch_loss(model, x, y))
    return losses


def _rules_rank(rules: Sequence[str], kwargs: dict[str, float]) -> dict[str, list[float]]:
    if dist.get_world_size() == 1:  # every rule is the same learning rate: train once
        losses = train_rank(rules[0], **kwargs)
        return {rule: list(losses) for rule in rules}
    return {rule: train_rank(rule, **kwargs) for rule in rules}


def sweep(
    world_sizes: Sequence[int] = (1, 2, 4, 8), rules: Sequence[str] = RULES, **kwargs: float
) -> dict[tuple[int, str], list[float]]:
    """Loss per epoch for each world size and rule, on fresh gloo ranks (one launch per N);
    ``kwargs`` go to ``train_rank`` (``lr``, ``batch_per_rank``, ``epochs``, ...)."""
    curves = {}
    for n in world_sizes:
        losses = run(_rules_rank, n, tuple(rules), kwargs)[0]
        curves.update({(n, rule): losses[rule] for rule in rules})
    return curves


if __name__ == "__main__":  # torchrun --nproc-per-node 4 -m course.lessons.synchrony.batch_size
    dist.init_process_group("gloo")
    for rule in RULES:
        print(rule, train_rank(rule))
    dist.barrier()  # no rank closes its connections while a peer still uses them
    dist.destroy_process_group()
