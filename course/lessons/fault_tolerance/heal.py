"""Grade a student's ``heal(model, step)``: ranks that come back catch up from a healthy peer.

    from course.lessons.fault_tolerance import check_heal
    print(check_heal(heal))   # raises AssertionError that teaches

torchft's way back for a replica whose process was started again: it asks for a quorum, finds
members steps ahead of it, and copies a live peer's state before it trains again (items 7 and
8 measure it). Here every rank calls ``heal(model, step)`` once, with the model it holds and
the number of steps that model has taken, and each case mixes ranks that came back with ranks
that kept training: on 3 ranks, rank 0 came back with a fresh model (step 0) and ranks 1 and 2
are at step 3; on 4 ranks, rank 0 came back from a checkpoint of step 1, rank 2 with a fresh
model, and ranks 1 and 3 are at step 3. The states are one SGD trajectory, drawn here.

The verdict, computed in the caller: every rank's parameters after ``heal`` equal, bit for bit,
those of the ranks furthest ahead (a copy, not a mean: the ranks ahead must not move), every
rank returns that step, and the parameters travel only as a copy: no collective but a
broadcast moves more than a few bytes (the steps) per rank. Under grading the traffic is the
relay's own record; in a notebook, the ranks' recorder's.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from course.checks.compare import fresh_seed
from course.checks.teaching import (
    failure_message,
    need_function,
    read_record,
    teaches,
    world_sizes_of,
)
from course.models import toy_model
from course.ranks import confined, relay
from course.ranks.wording import count
from course.ring.hierarchy import Call
from course.ring.recorder import Recorder
from course.ring.relayed import relayed_calls

__all__ = ["CASES", "check_heal", "states", "try_heal"]

NAME = "heal"
WIDTH, DEPTH, BATCH = 8, 2, 4  # the model: 2 bias-free 8x8 layers, 128 parameters
LR = 0.1
CASES = {3: (0, 3, 3), 4: (1, 3, 0, 3)}  # world size -> each rank's step as it calls heal
SMALL = 64  # bytes a rank may put into any other collective: the steps, not the parameters
LAUNCH_TIMEOUT = 30.0
PG_TIMEOUT = 3.0  # a rank waiting on a collective the others never call fails after this
COPIES = ("broadcast", "send", "barrier")  # what may carry the parameters (a barrier: nothing)
RULE = (
    "After heal, every rank holds a copy of the parameters of a rank furthest ahead, bit for "
    "bit, and returns that rank's step."
)


@teaches
def check_heal(fn: Callable[..., Any], world_sizes: Sequence[int] = (3, 4)) -> str:
    """Check ``fn`` on ``world_sizes`` (of ``CASES``: each rank's step as it comes in)."""
    need_function(NAME, fn)
    world_sizes = world_sizes_of(world_sizes)
    if not set(world_sizes) <= set(CASES):
        raise ValueError(f"world_sizes must be among {sorted(CASES)}, got {world_sizes}")
    seed = fresh_seed(None)
    for n in world_sizes:
        _check_case(fn, n, CASES[n], seed + n)
    return (
        f"{NAME} passed on {' and '.join(_case_text(CASES[n]) for n in world_sizes)}: every "
        "rank ended with a copy of the parameters of the ranks furthest ahead, and their step."
    )


def try_heal(fn: Callable[..., Any], world_size: int = 3) -> str:
    """Run ``fn`` on the case of ``world_size`` ranks: each rank's step and first parameters
    before and after, as a table."""
    if world_size not in CASES:
        raise ValueError(f"world_size must be among {sorted(CASES)}, got {world_size}")
    steps = CASES[world_size]
    trajectory = states(max(steps), fresh_seed(None))
    result = _launch(fn, steps, trajectory)
    lines = [_case_text(steps)]
    lines.append("rank  step  returned  first parameters before  first parameters after")
    for rank, step in enumerate(steps):
        before = _first(trajectory[step])
        if rank in result.failures:
            lines.append(f"{rank:>4}  {step:>4}  {result.failures[rank]}")
            continue
        params, returned, _calls = result.results[rank]
        lines.append(f"{rank:>4}  {step:>4}  {returned!s:>8}  {before:>23}  {_first(params)}")
    return "\n".join(lines)


def states(steps: int, seed: int) -> list[torch.Tensor]:
    """One training run's parameters after 0, 1, ..., ``steps`` SGD steps (a fresh model
    first), on batches drawn from ``seed``."""
    g = torch.Generator().manual_seed(seed)
    model = toy_model(0, WIDTH, DEPTH)
    out = [nn.utils.parameters_to_vector(model.parameters()).detach().clone()]
    for _ in range(steps):
        x, y = torch.randn(BATCH, WIDTH, generator=g), torch.randn(BATCH, WIDTH, generator=g)
        model.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        with torch.no_grad():
            for param in model.parameters():
                param.sub_(LR * param.grad)
        out.append(nn.utils.parameters_to_vector(model.parameters()).detach().clone())
    return out


def _case_text(steps: Sequence[int]) -> str:
    ahead = max(steps)
    back = [
        f"rank {r} {'with a fresh model' if s == 0 else f'from a checkpoint of step {s}'}"
        for r, s in enumerate(steps)
        if s < ahead
    ]
    return f"{len(steps)} ranks ({', '.join(back)}; the others at step {ahead})"


def _first(params: Any) -> str:
    if not isinstance(params, torch.Tensor):
        return "no tensor"
    return ", ".join(f"{v:+.4f}" for v in params[:2].tolist())


def _launch(fn: Callable, steps: Sequence[int], trajectory: list[torch.Tensor]) -> Any:
    from course.ranks import PerRank, launch

    mine = PerRank([(trajectory[s], s) for s in steps])
    return launch(_heal, len(steps), fn, mine, timeout=LAUNCH_TIMEOUT, pg_timeout=PG_TIMEOUT)


def _check_case(fn: Callable, n: int, steps: Sequence[int], seed: int) -> None:
    ahead = max(steps)
    trajectory = states(ahead, seed)
    result = _launch(fn, steps, trajectory)
    doing = f" ({_case_text(steps)[len(f'{n} ranks (') : -1]})"
    if not result.ok:
        hint = (
            "A rank waited on a collective other ranks never called. Every rank, behind or "
            "not, calls the same collectives in the same order: the ranks ahead take part in "
            "the copy too (as its source, or receiving what they already hold)."
        )
        raise AssertionError(failure_message(NAME, n, result.failures, doing, deadlock_hint=hint))
    head = f"{NAME} on {n} ranks{doing}:"
    want = trajectory[ahead]
    for rank in sorted(range(n), key=lambda r: steps[r] < ahead):  # the ranks ahead first
        params, returned, _calls = result.results[rank]
        if not (isinstance(params, torch.Tensor) and torch.equal(params, want)):
            raise AssertionError(
                f"{head} rank {rank}'s parameters after heal are wrong"
                f"{_hint(params, rank, steps, trajectory)}. {RULE}"
            )
        if returned != ahead:
            said = f"step {returned}" if isinstance(returned, int) else returned
            raise AssertionError(
                f"{head} rank {rank} returned {said}, and the ranks furthest ahead are at step "
                f"{ahead}: a rank that caught up has taken on its peer's state, its step "
                "included (its next batch is that step's). Return the step, as an int."
            )
    relayed = confined.current() is not None
    calls = _record(result, n) if relayed else _reported(result.results)
    _judge_traffic(head, calls, want.numel() * want.element_size())


def _hint(got: Any, rank: int, steps: Sequence[int], trajectory: list[torch.Tensor]) -> str:
    """What wrong parameters are instead, where it is a usual mistake."""
    if not isinstance(got, torch.Tensor) or got.shape != trajectory[0].shape:
        return ": they are no longer the model's parameters"
    ahead = max(steps)
    mean = torch.stack([trajectory[s] for s in steps]).mean(0)
    if torch.allclose(got, mean, rtol=1e-5, atol=1e-7):
        return (
            ": they are the mean of every rank's parameters. An average mixes the stale models "
            "in; a rank that comes back needs a copy of a peer's"
        )
    if torch.equal(got, trajectory[steps[rank]]) and steps[rank] < ahead:
        return (
            f": they are still the ones it came back with, step {steps[rank]}'s. Copy them into "
            "the model: a tensor made from the parameters (torch.cat, parameters_to_vector) is "
            "a copy, and receiving into it leaves the model as it was"
        )
    for s in sorted(set(steps)):
        if s < ahead and torch.equal(got, trajectory[s]):
            return (
                f": they are step {s}'s, the state of a rank that came back: the copy's source "
                f"must be a rank at the largest step, {ahead}, which you learn from the ranks' "
                "steps"
            )
    return ""


def _record(result: Any, n: int) -> list[Call]:
    """heal's call as the relay recorded it (under grading: nothing a rank reported)."""
    return read_record(f"{NAME}'s run on {n} ranks", "", relayed_calls, result.relayed, n, 0)


def _reported(results: list) -> list[Call]:
    """heal's call as the ranks' recorders saw it (the notebook's path)."""
    out = []
    for rank, (_params, _returned, calls) in enumerate(results):
        out += [
            Call(name, tuple(group) or (rank,), (max(put_in, 0),)) for name, group, put_in in calls
        ]
    return out


def _judge_traffic(head: str, calls: list[Call], model: int) -> None:
    """The parameters travel as a copy: every collective but a broadcast carries the steps
    only, a few bytes per rank."""
    for call in calls:
        if call.kind in COPIES or max(call.nbytes, default=0) <= SMALL:
            continue
        raise AssertionError(
            f"{head} one {call.kind} took {count(max(call.nbytes), 'byte')} from each rank, and "
            f"the model is {count(model, 'byte')}: the parameters went through it. A "
            "rank that catches up needs one copy of a peer's parameters, from one rank "
            "(a broadcast, or a send to each rank behind); a collective that moves every "
            "rank's parameters moves the stale ones as well. Only the steps, a few bytes, "
            f"need to go to every rank. {RULE}"
        )


# --- the rank side ---------------------------------------------------------------------


def _heal(fn: Callable, mine: tuple[torch.Tensor, int]) -> tuple[torch.Tensor, Any, list]:
    """On each rank: the model set to this rank's state, ``fn(model, step)`` recorded; the
    parameters after, the step returned (an int, or what it was instead) and the calls."""
    params, step = mine
    model = toy_model(0, WIDTH, DEPTH)
    nn.utils.vector_to_parameters(params, model.parameters())
    relay.mark(0)  # under grading: where heal starts, in the relay's record
    with Recorder() as seen:
        returned = fn(model, step)
    relay.mark(1)
    calls = [(c.name, c.group, c.contributed) for c in seen.collectives]
    return nn.utils.parameters_to_vector(model.parameters()).detach(), _step(returned), calls


def _step(returned: Any) -> Any:
    """An int for what is one (a Python int, a one-element integer tensor); else what it is."""
    if isinstance(returned, bool):
        return "a bool"
    try:
        return operator.index(returned)
    except TypeError:
        return "None" if returned is None else f"a {type(returned).__name__}, not an int"
