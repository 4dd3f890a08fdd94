"""heal, right and wrong: the model solution and the mistakes students make.

Each wrong one is a belief about a rank that comes back: that rank 0 is always a good source,
that averaging everyone's parameters catches the late ones up, that any rank past step 0 is up
to date, that the step need not travel with the parameters, that a tensor made from the
parameters is the parameters, that only the ranks behind need to call the collective, that
gathering every model and keeping the newest is a copy. ``WRONG`` maps each to a phrase of
the hint it must get.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

__all__ = ["RIGHT", "WRONG", "heal"]


def heal(model, step):
    """The model solution: the steps all-gathered, a broadcast from the first rank ahead."""
    steps = [torch.zeros(1, dtype=torch.int64) for _ in range(dist.get_world_size())]
    dist.all_gather(steps, torch.tensor([step]))
    steps = [int(s) for s in steps]
    ahead = max(steps)
    flat = nn.utils.parameters_to_vector(model.parameters()).detach().clone()
    dist.broadcast(flat, src=steps.index(ahead))
    with torch.no_grad():
        nn.utils.vector_to_parameters(flat, model.parameters())
    return ahead


def per_parameter(model, step):
    """Right too: the largest step by an all-reduce, the source by a second one, and one
    broadcast per parameter, into the parameter itself."""
    ahead = torch.tensor([step])
    dist.all_reduce(ahead, op=dist.ReduceOp.MAX)
    mine = dist.get_rank() if step == int(ahead) else dist.get_world_size()
    src = torch.tensor([mine])
    dist.all_reduce(src, op=dist.ReduceOp.MIN)
    with torch.no_grad():
        for p in model.parameters():
            dist.broadcast(p.data, src=int(src))
    return int(ahead)


def sent_to_the_late(model, step):
    """Right too: the steps as objects, and the source sends to each rank behind."""
    steps = [None] * dist.get_world_size()
    dist.all_gather_object(steps, step)
    ahead = max(steps)
    src, me = steps.index(ahead), dist.get_rank()
    flat = nn.utils.parameters_to_vector(model.parameters()).detach().clone()
    if me == src:
        for r, s in enumerate(steps):
            if s < ahead:
                dist.send(flat, dst=r)
    elif step < ahead:
        dist.recv(flat, src=src)
        with torch.no_grad():
            nn.utils.vector_to_parameters(flat, model.parameters())
    return ahead


def from_rank_zero(model, step):
    """Rank 0 as the source, always, as for a job's first broadcast of its weights."""
    ahead = torch.tensor([step])
    dist.all_reduce(ahead, op=dist.ReduceOp.MAX)
    flat = nn.utils.parameters_to_vector(model.parameters()).detach().clone()
    dist.broadcast(flat, src=0)
    with torch.no_grad():
        nn.utils.vector_to_parameters(flat, model.parameters())
    return int(ahead)


def averaged(model, step):
    """The parameters averaged over every rank, as DDP averages gradients."""
    ahead = torch.tensor([step])
    dist.all_reduce(ahead, op=dist.ReduceOp.MAX)
    flat = nn.utils.parameters_to_vector(model.parameters()).detach().clone()
    dist.all_reduce(flat)
    with torch.no_grad():
        nn.utils.vector_to_parameters(flat / dist.get_world_size(), model.parameters())
    return int(ahead)


def first_past_zero(model, step):
    """The source: the first rank that is not at step 0, as if only fresh models were behind."""
    steps = [torch.zeros(1, dtype=torch.int64) for _ in range(dist.get_world_size())]
    dist.all_gather(steps, torch.tensor([step]))
    steps = [int(s) for s in steps]
    src = next(r for r, s in enumerate(steps) if s > 0)
    flat = nn.utils.parameters_to_vector(model.parameters()).detach().clone()
    dist.broadcast(flat, src=src)
    with torch.no_grad():
        nn.utils.vector_to_parameters(flat, model.parameters())
    return max(steps)


def keeps_its_step(model, step):
    """The parameters copied right, and this rank's own step returned."""
    steps = [torch.zeros(1, dtype=torch.int64) for _ in range(dist.get_world_size())]
    dist.all_gather(steps, torch.tensor([step]))
    steps = [int(s) for s in steps]
    flat = nn.utils.parameters_to_vector(model.parameters()).detach().clone()
    dist.broadcast(flat, src=steps.index(max(steps)))
    with torch.no_grad():
        nn.utils.vector_to_parameters(flat, model.parameters())
    return step


def never_copied_back(model, step):
    """The broadcast received into a flat tensor made from the parameters, and left there."""
    steps = [torch.zeros(1, dtype=torch.int64) for _ in range(dist.get_world_size())]
    dist.all_gather(steps, torch.tensor([step]))
    steps = [int(s) for s in steps]
    flat = nn.utils.parameters_to_vector(model.parameters())
    dist.broadcast(flat, src=steps.index(max(steps)))
    return max(steps)


def only_the_late(model, step):
    """Only the ranks behind call the broadcast: the others have nothing to learn."""
    steps = [torch.zeros(1, dtype=torch.int64) for _ in range(dist.get_world_size())]
    dist.all_gather(steps, torch.tensor([step]))
    steps = [int(s) for s in steps]
    ahead = max(steps)
    if step < ahead:
        flat = nn.utils.parameters_to_vector(model.parameters()).detach().clone()
        dist.broadcast(flat, src=steps.index(ahead))
        with torch.no_grad():
            nn.utils.vector_to_parameters(flat, model.parameters())
    return ahead


def gathers_every_model(model, step):
    """Every rank's parameters all-gathered, and the newest kept."""
    steps = [torch.zeros(1, dtype=torch.int64) for _ in range(dist.get_world_size())]
    dist.all_gather(steps, torch.tensor([step]))
    steps = [int(s) for s in steps]
    flat = nn.utils.parameters_to_vector(model.parameters()).detach().clone()
    models = [torch.empty_like(flat) for _ in steps]
    dist.all_gather(models, flat)
    with torch.no_grad():
        nn.utils.vector_to_parameters(models[steps.index(max(steps))], model.parameters())
    return max(steps)


RIGHT = (heal, per_parameter, sent_to_the_late)
WRONG = {
    from_rank_zero: "the copy's source must be a rank at the largest step",
    averaged: "the mean of every rank's parameters",
    first_past_zero: "they are step 1's",
    keeps_its_step: "returned step 0",
    never_copied_back: "still the ones it came back with",
    only_the_late: "the ranks ahead take part in the copy too",
    gathers_every_model: "the parameters went through it",
}
