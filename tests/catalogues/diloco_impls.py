"""diloco_outer_step, right and wrong: the model solution and the mistakes students make.

Each wrong one is a belief about the outer step: the sum where DiLoCo averages, a sign
flipped, plain momentum for Nesterov's, no all-reduce, twice the traffic, tensors rebound
instead of updated, a deadlock. ``WRONG`` maps each to a phrase of the hint it must get.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

__all__ = ["RIGHT", "WRONG", "diloco_outer_step"]


def diloco_outer_step(params, global_params, momentum, outer_lr, mu):
    """The model solution: one all-reduce per tensor of the pseudo-gradient, Nesterov."""
    world_size = dist.get_world_size()
    for p, g, m in zip(params, global_params, momentum, strict=True):
        delta = g - p
        dist.all_reduce(delta)
        delta /= world_size
        m.mul_(mu).add_(delta)
        g.sub_(outer_lr * (delta + mu * m))
        p.copy_(g)


def flat(params, global_params, momentum, outer_lr, mu):
    """Right too: every pseudo-gradient in one flat all-reduce."""
    deltas = torch.cat([(g - p).flatten() for p, g in zip(params, global_params, strict=True)])
    dist.all_reduce(deltas)
    deltas /= dist.get_world_size()
    at = 0
    for p, g, m in zip(params, global_params, momentum, strict=True):
        delta = deltas[at : at + g.numel()].view_as(g)
        at += g.numel()
        m.mul_(mu).add_(delta)
        g.sub_(outer_lr * (delta + mu * m))
        p.copy_(g)


def mean_of_params(params, global_params, momentum, outer_lr, mu):
    """Right too: all-reduce the parameters, then delta = global - their mean."""
    for p, g, m in zip(params, global_params, momentum, strict=True):
        mean = p.clone()
        dist.all_reduce(mean)
        delta = g - mean / dist.get_world_size()
        m.mul_(mu).add_(delta)
        g.sub_(outer_lr * (delta + mu * m))
        p.copy_(g)


def summed(params, global_params, momentum, outer_lr, mu):
    for p, g, m in zip(params, global_params, momentum, strict=True):
        delta = g - p
        dist.all_reduce(delta)
        m.mul_(mu).add_(delta)
        g.sub_(outer_lr * (delta + mu * m))
        p.copy_(g)


def flipped(params, global_params, momentum, outer_lr, mu):
    for p, g, m in zip(params, global_params, momentum, strict=True):
        delta = p - g
        dist.all_reduce(delta)
        delta /= dist.get_world_size()
        m.mul_(mu).add_(delta)
        g.sub_(outer_lr * (delta + mu * m))
        p.copy_(g)


def heavy_ball(params, global_params, momentum, outer_lr, mu):
    for p, g, m in zip(params, global_params, momentum, strict=True):
        delta = g - p
        dist.all_reduce(delta)
        delta /= dist.get_world_size()
        m.mul_(mu).add_(delta)
        g.sub_(outer_lr * m)
        p.copy_(g)


def alone(params, global_params, momentum, outer_lr, mu):
    for p, g, m in zip(params, global_params, momentum, strict=True):
        delta = g - p
        m.mul_(mu).add_(delta)
        g.sub_(outer_lr * (delta + mu * m))
        p.copy_(g)


def momentum_too(params, global_params, momentum, outer_lr, mu):
    for p, g, m in zip(params, global_params, momentum, strict=True):
        delta = g - p
        dist.all_reduce(delta)
        delta /= dist.get_world_size()
        m.mul_(mu).add_(delta)
        dist.all_reduce(m)
        m.div_(dist.get_world_size())
        g.sub_(outer_lr * (delta + mu * m))
        p.copy_(g)


def rebound(params, global_params, momentum, outer_lr, mu):
    for i, (p, g) in enumerate(zip(params, global_params, strict=True)):
        delta = g - p
        dist.all_reduce(delta)
        delta /= dist.get_world_size()
        m = mu * momentum[i] + delta
        g.sub_(outer_lr * (delta + mu * m))
        p.copy_(g)


def not_copied(params, global_params, momentum, outer_lr, mu):
    for p, g, m in zip(params, global_params, momentum, strict=True):
        delta = g - p
        dist.all_reduce(delta)
        delta /= dist.get_world_size()
        m.mul_(mu).add_(delta)
        g.sub_(outer_lr * (delta + mu * m))


def deadlock(params, global_params, momentum, outer_lr, mu):
    for p, g, m in zip(params, global_params, momentum, strict=True):
        delta = g - p
        if dist.get_rank() != 0:
            dist.all_reduce(delta)
        delta /= dist.get_world_size()
        m.mul_(mu).add_(delta)
        g.sub_(outer_lr * (delta + mu * m))
        p.copy_(g)


def torch_sgd(params, global_params, momentum, outer_lr, mu):
    opt = torch.optim.SGD(global_params, lr=outer_lr, momentum=mu, nesterov=True)
    for p, g, m in zip(params, global_params, momentum, strict=True):
        delta = g - p
        dist.all_reduce(delta)
        g.grad = delta / dist.get_world_size()
        opt.state[g]["momentum_buffer"] = m
    opt.step()
    for p, g in zip(params, global_params, strict=True):
        p.copy_(g)


RIGHT = (diloco_outer_step, flat, mean_of_params)
WRONG = {
    summed: "not their mean",
    flipped: "sign flipped",
    heavy_ball: "plain momentum",
    alone: "all-reduce it",
    momentum_too: "nothing else",
    rebound: "unchanged",
    not_copied: "still this worker's own",
    deadlock: "failed on 2 ranks",
    torch_sgd: "torch's SGD",
}
