"""Grade a student's ``heal(model, step)``: ranks that come back catch up from a healthy peer.

    from course.lessons.fault_tolerance import check_heal
    print(check_heal(heal))   # raises AssertionError that teaches

torchft's way back for a replica whose process was started again: it asks for a quorum, finds
members steps ahead of it, and copies a live peer's state before it trains again (items 7 and
8 measure it). Here every rank calls ``heal(model, step)`` once, with the model it holds and
the number of steps that model has taken, and each case mixes ranks that came back (with a
fresh model, step 0, or from an older checkpoint) with ranks that kept training, at places in
the ranks' order that leave no fixed rank a right source: rank 0, rank 1 and the last rank
each come back in some case, and in one the first rank past step 0 is not ahead. The states
are one SGD trajectory, drawn here.

The verdict, computed in the caller: every rank's parameters after ``heal`` equal, bit for bit,
those of the ranks furthest ahead (a copy, not a mean: the ranks ahead must not move), every
rank returns that step, and the parameters travel only as a copy: no collective but a
broadcast or a scatter (one rank's data to the others) takes more than a few bytes (the
steps) from a rank. Under grading the traffic is the
relay's own record; in a notebook, the ranks' recorder's.
"""

from __future__ import annotations

import operator
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from course.checks.compare import fresh_seed
from course.checks.teaching import (
    failure_message,
    need_function,
    teaches,
    world_sizes_of,
)
from course.lessons.fault_tolerance.survive import BATCH, DEPTH, LR, WIDTH  # the same model
from course.models import toy_model
from course.ranks import confined
from course.ranks.wording import count, ranks_text
from course.ring.recorder import Recorder
from course.ring.relayed import NAMES as COLLECTIVE_KINDS

__all__ = ["CASES", "check_heal", "states", "try_heal"]

NAME = "heal"
CASES = {  # world size -> its cases: each rank's step as it calls heal
    3: ((0, 3, 3), (3, 1, 0)),
    4: ((1, 3, 3, 0),),
}
SMALL = 64  # bytes a rank may put into any other collective: the steps, not the parameters
LAUNCH_TIMEOUT = 30.0
PG_TIMEOUT = 3.0  # a rank waiting on a collective the others never call fails after this
COPIES = ("broadcast", "scatter")  # collectives that send one rank's data, the root's
RULE = (
    "After heal, every rank holds a copy of the parameters of a rank furthest ahead, bit for "
    "bit, and returns that rank's step."
)


@teaches
def check_heal(fn: Callable[..., Any], world_sizes: Sequence[int] = (3, 4)) -> str:
    """Check ``fn`` on the ``CASES`` of ``world_sizes`` (each rank's step as it comes in)."""
    need_function(NAME, fn)
    world_sizes = world_sizes_of(world_sizes)
    if not set(world_sizes) <= set(CASES):
        raise ValueError(f"world_sizes must be among {sorted(CASES)}, got {world_sizes}")
    seed = fresh_seed(None)
    cases = [steps for n in world_sizes for steps in CASES[n]]
    for i, steps in enumerate(cases):
        _check_case(fn, len(steps), steps, seed + i)
    return (
        f"{NAME} passed in {count(len(cases), 'case')}, {'; '.join(map(_case_text, cases))}: "
        "every rank ended with a copy of the parameters of a rank furthest ahead, and its step."
    )


def try_heal(fn: Callable[..., Any], world_size: int = 3) -> str:
    """Run ``fn`` on the first case of ``world_size`` ranks: each rank's step and first
    parameters before and after, as a table."""
    if world_size not in CASES:
        raise ValueError(f"world_size must be among {sorted(CASES)}, got {world_size}")
    steps = CASES[world_size][0]
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
    return f"{len(steps)} ranks ({_who(steps)})"


def _who(steps: Sequence[int]) -> str:
    """Which ranks came back, from where, and which are ahead."""
    ahead = max(steps)
    back = [
        f"rank {r} {'with a fresh model' if s == 0 else f'from a checkpoint of step {s}'}"
        for r, s in enumerate(steps)
        if s < ahead
    ]
    ahead_ranks = ranks_text(r for r, s in enumerate(steps) if s == ahead)
    return f"{', '.join(back)}; {ahead_ranks} at step {ahead}"


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
    doing = f" ({_who(steps)})"
    if not result.ok:
        said = " ".join(f.message for f in result.failures.values())
        hint = (
            "A rank waited on a message no rank sent, or sent one no rank received: every "
            "send needs a receive posted for it on its destination, and each rank behind "
            "receives one copy, from one rank ahead."
            if any(f"dist.{call}" in said for call in ("send", "recv", "isend", "irecv"))
            else "A rank waited on a collective other ranks never called. Every rank, behind "
            "or not, calls the same collectives in the same order: the ranks ahead take part "
            "in the copy too (as its source, or receiving what they already hold)."
        )
        raise AssertionError(failure_message(NAME, n, result.failures, doing, deadlock_hint=hint))
    head = f"{NAME} on {n} ranks{doing}:"
    want = trajectory[ahead]
    for rank in sorted(range(n), key=lambda r: steps[r] < ahead):  # the ranks ahead first
        params, returned, _calls = result.results[rank]
        if isinstance(params, torch.Tensor) and params.dtype != want.dtype:
            raise AssertionError(
                f"{head} rank {rank}'s parameters after heal are {params.dtype}, and the "
                f"model's are {want.dtype}: copy the values in, and leave the model's dtype "
                f"as it is. {RULE}"
            )
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
                "included (its next batch is that step's). Return that step."
            )
    relayed = confined.current() is not None
    seen = _relayed(result.relayed) if relayed else _reported(result.results)
    _judge_traffic(head, seen, steps, want.numel() * want.element_size())


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
            "a copy, and receiving into it leaves the model as it was (and a call made with "
            "async_op=True may not have filled its tensors until it is waited on)"
        )
    for s in sorted(set(steps)):
        if s < ahead and torch.equal(got, trajectory[s]):
            return (
                f": they are step {s}'s, the state of a rank that came back: the copy's source "
                f"must be a rank at the largest step, {ahead}, which you learn from the ranks' "
                "steps"
            )
    return ""


@dataclass
class Traffic:
    """What each rank put in, in bytes: ``sent`` its own data sent on (its sends, and the
    broadcasts and scatters it was the root of), ``mixed`` what went into the collectives
    that take every member's data (all-gathers, all-reduces, ...), ``stored`` what it wrote
    to the relay's storage."""

    sent: Counter = field(default_factory=Counter)
    mixed: Counter = field(default_factory=Counter)
    stored: Counter = field(default_factory=Counter)


def _relayed(events: list) -> Traffic:
    """The whole run's traffic as the relay recorded it (under grading: nothing a rank
    reported; the check itself makes no call)."""
    seen = Traffic()
    for e in events:
        if e.kind == "send":
            seen.sent[e.src] += sum(e.nbytes)
        elif e.kind == "put":
            seen.stored[e.src] += sum(e.nbytes)
        elif e.kind in COPIES and e.src in e.group:
            seen.sent[e.src] += e.nbytes[e.group.index(e.src)]
        elif e.kind in COLLECTIVE_KINDS and e.kind not in COPIES:
            for member, nbytes in zip(e.group, e.nbytes, strict=False):
                seen.mixed[member] += nbytes
    return seen


def _reported(results: list) -> Traffic:
    """The run's traffic as the ranks' recorders saw it (the notebook's path)."""
    seen = Traffic()
    for rank, (_params, _returned, (calls, sends)) in enumerate(results):
        seen.sent[rank] += sends
        for name, put_in, nbytes, root in calls:
            if name in COPIES:
                seen.sent[rank] += put_in if root == rank else 0
            else:
                seen.mixed[rank] += put_in if put_in >= 0 else nbytes
    return seen


def _judge_traffic(head: str, seen: Traffic, steps: Sequence[int], model: int) -> None:
    """The parameters travel as copies from ranks ahead: no rank puts more than the steps
    into collectives that take every member's data, and no rank behind sends its own."""
    if seen.stored:
        rank = min(seen.stored)
        raise AssertionError(
            f"{head} rank {rank} wrote {count(seen.stored[rank], 'byte')} to the relay's "
            f"storage: in heal every byte travels in torch.distributed calls. {RULE}"
        )
    for rank in range(len(steps)):
        if seen.mixed[rank] > SMALL:
            put_in = (
                f"{head} rank {rank} put {count(seen.mixed[rank], 'byte')} into collectives "
                "that take every rank's data (all-gathers, all-reduces, and the object calls "
                "built on them)"
            )
            if seen.mixed[rank] < model:
                raise AssertionError(
                    f"{put_in}: more than the steps need ({SMALL} bytes at most; a pickled "
                    "tensor alone is hundreds). Exchange the steps as Python ints, or in one "
                    f"small integer tensor. {RULE}"
                )
            raise AssertionError(
                f"{put_in}, and the model is {count(model, 'byte')}: the parameters went "
                "through them, the stale ones too. A rank that catches up needs a copy of one "
                "peer's parameters, sent by that peer alone (a broadcast, a scatter, or a "
                "send to each rank behind); only the steps, a few bytes, need to go to every "
                f"rank. {RULE}"
            )
        if steps[rank] < max(steps) and seen.sent[rank] > SMALL:
            raise AssertionError(
                f"{head} rank {rank}, back at step {steps[rank]}, sent "
                f"{count(seen.sent[rank], 'byte')} of its own (sends, or broadcasts and "
                "scatters it was the root of): its parameters are stale, and nobody needs "
                f"them. Only ranks at the largest step, {max(steps)}, send theirs. {RULE}"
            )


# --- the rank side ---------------------------------------------------------------------


def _heal(fn: Callable, mine: tuple[torch.Tensor, int]) -> tuple[torch.Tensor, Any, tuple]:
    """On each rank: the model set to this rank's state, ``fn(model, step)`` recorded; the
    parameters after, the step returned (an int, or what it was instead), and the calls (each
    collective's name, bytes put in, bytes of its tensors, root) with the bytes sent."""
    params, step = mine
    model = toy_model(0, WIDTH, DEPTH)
    nn.utils.vector_to_parameters(params, model.parameters())
    with Recorder() as seen:
        returned = fn(model, step)
    calls = [(c.name, c.contributed, c.nbytes, c.root) for c in seen.collectives]
    sends = sum(m.nbytes for m in seen.messages if m.op == "send")
    params = nn.utils.parameters_to_vector(model.parameters()).detach()
    return params, _step(returned), (calls, sends)


def _step(returned: Any) -> Any:
    """An int for what is one (a Python int, a one-element integer tensor); else what it is."""
    if isinstance(returned, bool):
        return "a bool"
    try:
        return operator.index(returned)
    except TypeError:
        return "None" if returned is None else f"a {type(returned).__name__}, not an int"
