"""fault_tolerant_step, right and wrong: the model solution and the mistakes students make.

Each wrong one is a belief about a step that loses a rank: that the error need not be caught,
that the step can be skipped, that the failed all-reduce's buffer still holds this rank's
gradients, that the old group can be used again, that the mean is over the world size the
job started with, that a quorum at every step's start is enough, that an all-reduce of one
rank can take the death, that an all-gather does the all-reduce's job, that the old group
can be handed on. ``WRONG`` maps each to a phrase of the hint it must get.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F  # noqa: N812 - torch's own alias

__all__ = ["RIGHT", "WRONG", "apply_step", "fault_tolerant_step"]


def fault_tolerant_step(model, x, y, lr, group, lighthouse):
    """The model solution: a kept copy, re-reduced over the quorum's group."""
    model.zero_grad()
    F.mse_loss(model(x), y).backward()
    params = list(model.parameters())
    grads = torch.cat([p.grad.reshape(-1) for p in params])
    summed = grads.clone()
    size = dist.get_world_size(group)
    try:
        dist.all_reduce(summed, group=group)
    except RuntimeError:
        members = lighthouse.quorum()
        group = dist.new_group(members)
        summed = grads.clone()
        dist.all_reduce(summed, group=group)
        size = len(members)
    with torch.no_grad():
        at = 0
        for p in params:
            p.sub_(lr * summed[at : at + p.numel()].view_as(p) / size)
            at += p.numel()
    return group


def per_parameter(model, x, y, lr, group, lighthouse):
    """Right too: one all-reduce per parameter, the whole step redone on a failure."""
    model.zero_grad()
    F.mse_loss(model(x), y).backward()
    grads = [p.grad.clone() for p in model.parameters()]
    while True:
        reduced = [g.clone() for g in grads]
        try:
            for g in reduced:
                dist.all_reduce(g, group=group)
            break
        except RuntimeError:
            group = dist.new_group(lighthouse.quorum())
    with torch.no_grad():
        for p, g in zip(model.parameters(), reduced, strict=True):
            p.sub_(lr * g / dist.get_world_size(group))
    return group


def future_waited(model, x, y, lr, group, lighthouse):
    """Right too: the all-reduce's future waited on, as torchft's code waits."""
    model.zero_grad()
    F.mse_loss(model(x), y).backward()
    grads = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    summed = grads.clone()
    try:
        dist.all_reduce(summed, group=group, async_op=True).get_future().wait()
    except RuntimeError:
        group = dist.new_group(lighthouse.quorum())
        summed = grads.clone()
        dist.all_reduce(summed, group=group)
    apply_step(model, summed / dist.get_world_size(group), lr)
    return group


def barrier_first(model, x, y, lr, group, lighthouse):
    """Right too: a barrier of the step's group before its all-reduce."""
    model.zero_grad()
    F.mse_loss(model(x), y).backward()
    dist.barrier(group=group)
    grads = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    summed = grads.clone()
    try:
        dist.all_reduce(summed, group=group)
    except RuntimeError:
        group = dist.new_group(lighthouse.quorum())
        summed = grads.clone()
        dist.all_reduce(summed, group=group)
    apply_step(model, summed / dist.get_world_size(group), lr)
    return group


def uncaught(model, x, y, lr, group, lighthouse):
    model.zero_grad()
    F.mse_loss(model(x), y).backward()
    grads = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    dist.all_reduce(grads, group=group)
    apply_step(model, grads / dist.get_world_size(group), lr)
    return group


def skips_the_step(model, x, y, lr, group, lighthouse):
    model.zero_grad()
    F.mse_loss(model(x), y).backward()
    grads = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    try:
        dist.all_reduce(grads, group=group)
    except RuntimeError:
        return dist.new_group(lighthouse.quorum())  # the next step will be right
    apply_step(model, grads / dist.get_world_size(group), lr)
    return group


def reuses_the_buffer(model, x, y, lr, group, lighthouse):
    model.zero_grad()
    F.mse_loss(model(x), y).backward()
    grads = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    try:
        dist.all_reduce(grads, group=group)
    except RuntimeError:
        group = dist.new_group(lighthouse.quorum())
        dist.all_reduce(grads, group=group)  # what the failed all-reduce left in it
    apply_step(model, grads / dist.get_world_size(group), lr)
    return group


def old_world_size(model, x, y, lr, group, lighthouse):
    model.zero_grad()
    F.mse_loss(model(x), y).backward()
    grads = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    summed = grads.clone()
    try:
        dist.all_reduce(summed, group=group)
    except RuntimeError:
        group = dist.new_group(lighthouse.quorum())
        summed = grads.clone()
        dist.all_reduce(summed, group=group)
    apply_step(model, summed / dist.get_world_size(), lr)
    return group


def retries_the_old_group(model, x, y, lr, group, lighthouse):
    model.zero_grad()
    F.mse_loss(model(x), y).backward()
    grads = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    summed = grads.clone()
    try:
        dist.all_reduce(summed, group=group)
    except RuntimeError:
        summed = grads.clone()
        dist.all_reduce(summed, group=group)  # the same group, the dead rank still in it
    apply_step(model, summed / dist.get_world_size(group), lr)
    return group


def quorum_first_uncaught(model, x, y, lr, group, lighthouse):
    """A quorum at the start of every step, torchft's way, and no failure handled inside one."""
    members = lighthouse.quorum()
    if len(members) != dist.get_world_size(group):
        group = dist.new_group(members)
    model.zero_grad()
    F.mse_loss(model(x), y).backward()
    grads = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    dist.all_reduce(grads, group=group)
    apply_step(model, grads / len(members), lr)
    return group


def alone_first(model, x, y, lr, group, lighthouse):
    """An all-reduce of this rank alone first, as if a death could land there and spare the
    step's own all-reduce; then the quorum every step."""
    model.zero_grad()
    F.mse_loss(model(x), y).backward()
    grads = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    mine = [dist.new_group([r]) for r in range(dist.get_world_size())][dist.get_rank()]
    dist.all_reduce(torch.zeros(1), group=mine)
    members = lighthouse.quorum()
    group = dist.new_group(members)
    dist.all_reduce(grads, group=group)
    apply_step(model, grads / len(members), lr)
    return group


def gathered(model, x, y, lr, group, lighthouse):
    """The gradients all-gathered and averaged, no all-reduce."""
    model.zero_grad()
    F.mse_loss(model(x), y).backward()
    grads = torch.cat([p.grad.reshape(-1) for p in model.parameters()])

    def mean(g):
        out = [torch.empty_like(grads) for _ in range(dist.get_world_size(g))]
        dist.all_gather(out, grads, group=g)
        return torch.stack(out).mean(0)

    try:
        avg = mean(group)
    except RuntimeError:
        group = dist.new_group(lighthouse.quorum())
        avg = mean(group)
    apply_step(model, avg, lr)
    return group


def forgets_the_new_group(model, x, y, lr, group, lighthouse):
    """The step right, and the old group returned: every later step fails in it first."""
    model.zero_grad()
    F.mse_loss(model(x), y).backward()
    grads = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    summed = grads.clone()
    try:
        dist.all_reduce(summed, group=group)
        size = dist.get_world_size(group)
    except RuntimeError:
        members = lighthouse.quorum()
        new = dist.new_group(members)
        summed = grads.clone()
        dist.all_reduce(summed, group=new)
        size = len(members)
    apply_step(model, summed / size, lr)
    return group


def apply_step(model, flat, lr):
    """SGD: each parameter moved by -lr times its slice of ``flat``."""
    with torch.no_grad():
        at = 0
        for p in model.parameters():
            p.sub_(lr * flat[at : at + p.numel()].view_as(p))
            at += p.numel()


RIGHT = (fault_tolerant_step, per_parameter, future_waited, barrier_first)
WRONG = {
    uncaught: "catch that error",
    skips_the_step: "the step was skipped",
    reuses_the_buffer: "partly summed",
    old_world_size: "the world size the job started with",
    retries_the_old_group: "any later call on a group that holds the dead rank fails",
    quorum_first_uncaught: "catch that error",
    alone_first: "catch that error",
    gathered: "it made none",
    forgets_the_new_group: "returned a group of 3 ranks, and 2 ranks were left",
}
