"""heal, right and wrong: the model solution and the mistakes students make.

Each wrong one is a belief about a rank that comes back: that rank 0, or the last rank, is
always a good source, that averaging everyone's parameters catches the late ones up, that any
rank past step 0 is up to date, that the step need not travel with the parameters, that a
tensor made from the parameters is the parameters, that only the ranks behind need to call the
collective, that gathering every model (whole, in small pieces, or functionally) and keeping
the newest is a copy, that every rank may send its own and the newest kept, that a pickled
tensor is as small as the step it holds, that the model may change dtype on the way.
``WRONG`` maps each to a phrase of the hint it must get. (A broadcast with ``async_op=True``
never waited on is left out: on gloo and on the relay alike its tensor is filled whenever
the data arrives, so whether the parameters are read before or after is a race.)
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


def scattered(model, step):
    """Right too: the source scatters a copy to every rank (its own included)."""
    steps = [torch.zeros(1, dtype=torch.int64) for _ in range(dist.get_world_size())]
    dist.all_gather(steps, torch.tensor([step]))
    steps = [int(s) for s in steps]
    src = steps.index(max(steps))
    flat = nn.utils.parameters_to_vector(model.parameters()).detach().clone()
    pieces = [flat.clone() for _ in steps] if dist.get_rank() == src else None
    got = torch.empty_like(flat)
    dist.scatter(got, pieces, src=src)
    with torch.no_grad():
        nn.utils.vector_to_parameters(got, model.parameters())
    return max(steps)


def from_rank_zero(model, step):
    """Rank 0 as the source, always, as for a job's first broadcast of its weights."""
    ahead = torch.tensor([step])
    dist.all_reduce(ahead, op=dist.ReduceOp.MAX)
    flat = nn.utils.parameters_to_vector(model.parameters()).detach().clone()
    dist.broadcast(flat, src=0)
    with torch.no_grad():
        nn.utils.vector_to_parameters(flat, model.parameters())
    return int(ahead)


def from_the_last_rank(model, step):
    """The last rank as the source, as if ranks came back at the front of the order."""
    ahead = torch.tensor([step])
    dist.all_reduce(ahead, op=dist.ReduceOp.MAX)
    flat = nn.utils.parameters_to_vector(model.parameters()).detach().clone()
    dist.broadcast(flat, src=dist.get_world_size() - 1)
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


def every_rank_in_turn(model, step):
    """Each rank broadcasts its step and parameters in turn; every rank keeps the newest."""
    best, best_step = None, -1
    flat = nn.utils.parameters_to_vector(model.parameters()).detach().clone()
    for src in range(dist.get_world_size()):
        theirs = torch.tensor([step])
        dist.broadcast(theirs, src=src)
        params = flat.clone()
        dist.broadcast(params, src=src)
        if int(theirs) > best_step:
            best, best_step = params, int(theirs)
    with torch.no_grad():
        nn.utils.vector_to_parameters(best, model.parameters())
    return best_step


def every_rank_sends(model, step):
    """Every rank ahead sends to every rank behind; a rank behind takes the first to come."""
    steps = [torch.zeros(1, dtype=torch.int64) for _ in range(dist.get_world_size())]
    dist.all_gather(steps, torch.tensor([step]))
    steps = [int(s) for s in steps]
    ahead = max(steps)
    flat = nn.utils.parameters_to_vector(model.parameters()).detach().clone()
    if step == ahead:
        for r, s in enumerate(steps):
            if s < ahead:
                dist.send(flat, dst=r)
    else:
        dist.recv(flat)
        with torch.no_grad():
            nn.utils.vector_to_parameters(flat, model.parameters())
    return ahead


def chunked_gather(model, step):
    """Every rank's parameters all-gathered in pieces of 16 elements."""
    steps = [torch.zeros(1, dtype=torch.int64) for _ in range(dist.get_world_size())]
    dist.all_gather(steps, torch.tensor([step]))
    steps = [int(s) for s in steps]
    src = steps.index(max(steps))
    flat = nn.utils.parameters_to_vector(model.parameters()).detach().clone()
    out = []
    for piece in flat.split(16):
        got = [torch.empty_like(piece) for _ in steps]
        dist.all_gather(got, piece.contiguous())
        out.append(got[src])
    with torch.no_grad():
        nn.utils.vector_to_parameters(torch.cat(out), model.parameters())
    return max(steps)


def functional_gather(model, step):
    """Every rank's parameters through the functional all-gather."""
    import torch.distributed._functional_collectives as fc

    steps = [torch.zeros(1, dtype=torch.int64) for _ in range(dist.get_world_size())]
    dist.all_gather(steps, torch.tensor([step]))
    steps = [int(s) for s in steps]
    flat = nn.utils.parameters_to_vector(model.parameters()).detach().clone()
    models = fc.all_gather_tensor(flat, 0, dist.group.WORLD).view(len(steps), -1)
    with torch.no_grad():
        nn.utils.vector_to_parameters(models[steps.index(max(steps))].clone(), model.parameters())
    return max(steps)


def steps_as_tensor_objects(model, step):
    """The steps all-gathered as pickled tensors, the copy right."""
    steps = [None] * dist.get_world_size()
    dist.all_gather_object(steps, torch.tensor(step))
    steps = [int(s) for s in steps]
    flat = nn.utils.parameters_to_vector(model.parameters()).detach().clone()
    dist.broadcast(flat, src=steps.index(max(steps)))
    with torch.no_grad():
        nn.utils.vector_to_parameters(flat, model.parameters())
    return max(steps)


def halved(model, step):
    """The model turned to float16 first, to send half the bytes."""
    steps = [torch.zeros(1, dtype=torch.int64) for _ in range(dist.get_world_size())]
    dist.all_gather(steps, torch.tensor([step]))
    steps = [int(s) for s in steps]
    model.half()
    for p in model.parameters():
        dist.broadcast(p.data, src=steps.index(max(steps)))
    return max(steps)


RIGHT = (heal, per_parameter, sent_to_the_late, scattered)
WRONG = {
    from_rank_zero: "the copy's source must be a rank at the largest step",
    from_the_last_rank: "the copy's source must be a rank at the largest step",
    averaged: "the mean of every rank's parameters",
    first_past_zero: "they are step 1's",
    keeps_its_step: "returned step 0",
    never_copied_back: "still the ones it came back with",
    only_the_late: "the ranks ahead take part in the copy too",
    gathers_every_model: "the parameters went through them",
    every_rank_in_turn: "its parameters are stale, and nobody needs them",
    every_rank_sends: "every send needs a receive posted for it",
    chunked_gather: "the parameters went through them",
    functional_gather: "the parameters went through them",
    steps_as_tensor_objects: "more than the steps need",
    halved: "torch.float16",
}
