"""Grade a student's ``diloco_outer_step(params, global_params, momentum, outer_lr, mu)``.

    from course.lessons.fault_tolerance import check_diloco_outer_step
    print(check_diloco_outer_step(diloco_outer_step))   # raises AssertionError that teaches

DiLoCo (Douillard et al. 2023, "DiLoCo: Distributed Low-Communication Training of Language
Models", arXiv:2311.08105) lets each worker take H inner steps alone, then takes one outer
step: the pseudo-gradient of worker r is ``global - params_r``, its mean over the workers is
all-reduced, and an outer SGD with Nesterov momentum (``torch.optim.SGD(nesterov=True)``'s
rule: ``m = mu m + delta``, ``global -= outer_lr (delta + mu m)``) moves the global
parameters, which every worker then starts its next round from (``params`` set to them).

Each case draws, here, the global parameters (the same on every rank), each worker's
parameters after its inner steps and the momentum, and runs two rounds, the second on the
momentum and global parameters the first left. The verdict, computed in the caller: every
rank's ``params``, ``global_params`` and ``momentum`` against a float64 oracle, and the
round's traffic: all-reduces only, one model's worth of elements per rank, no more. Under
grading the traffic is the relay's own record; in a notebook, the ranks' recorder's.
torch's SGD (its ``step``, and the function it calls) is refused on graded ranks: the
Nesterov step is the exercise.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from course.checks.compare import fresh_seed
from course.checks.refusals import Refusal, refusing
from course.checks.teaching import (
    failure_message,
    need_function,
    read_record,
    teaches,
    world_sizes_of,
)
from course.ranks import confined, relay
from course.ranks.wording import count, world_sizes_text
from course.ring.hierarchy import Call
from course.ring.recorder import Recorder
from course.ring.relayed import relayed_calls

__all__ = ["OUTER_SGD", "check_diloco_outer_step", "oracle"]

NAME = "diloco_outer_step"
WORLD_SIZES = (2, 3)
SHAPES = ((7,), (3, 5), (1,))  # one model: a vector, a matrix, a scalar bias
ROUNDS = 2  # the second round starts from the momentum the first left
LAUNCH_TIMEOUT = 30.0
OUTER_SGD = Refusal(
    ("torch.optim:SGD.step", "torch.optim.sgd:sgd"),
    "this steps torch's SGD: the exercise is to write the outer Nesterov step yourself "
    "(m = mu m + delta; global -= outer_lr (delta + mu m)), so it earns none of its points",
)
RULE = (
    "The outer step: delta = global_params - params (this worker's pseudo-gradient); "
    "all-reduce delta and divide by the world size; momentum = mu * momentum + delta; "
    "global_params -= outer_lr * (delta + mu * momentum); then copy global_params into params."
)


@dataclass(frozen=True)
class Case:
    """One model's outer steps: its learning rate and momentum."""

    outer_lr: float
    mu: float

    def __str__(self) -> str:
        return f"outer_lr={self.outer_lr}, mu={self.mu}"


def oracle(
    params: Sequence[Sequence[torch.Tensor]],
    global_params: Sequence[torch.Tensor],
    momentum: Sequence[torch.Tensor],
    case: Case,
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """One outer step in float64 from every worker's ``params``: (global, momentum) after it."""
    new_global, new_momentum = [], []
    for i, (g, m) in enumerate(zip(global_params, momentum, strict=True)):
        g64, m64 = g.double(), m.double()
        delta = torch.stack([g64 - p[i].double() for p in params]).mean(0)
        m64 = case.mu * m64 + delta
        new_global.append(g64 - case.outer_lr * (delta + case.mu * m64))
        new_momentum.append(m64)
    return new_global, new_momentum


@teaches
def check_diloco_outer_step(
    fn: Callable[..., Any], world_sizes: Sequence[int] = WORLD_SIZES
) -> str:
    """Check ``fn``'s outer steps on ``world_sizes``: values on every rank, and its traffic."""
    need_function(NAME, fn)
    world_sizes = world_sizes_of(world_sizes)
    seed = fresh_seed(None)
    for n in world_sizes:
        _check_world_size(fn, n, Case(0.7, 0.9), seed + n)
    return (
        f"{NAME} passed: {ROUNDS} outer steps on {world_sizes_text(world_sizes)}, the right "
        "global parameters, momentum and parameters on every rank, and one all-reduce of the "
        "model's size per step."
    )


def _draw(n: int, seed: int) -> tuple[list[torch.Tensor], list[list[list[torch.Tensor]]]]:
    """The global parameters, and each round's parameters of each worker after its inner
    steps (the global ones of the round, moved by a worker's own noise)."""
    g = torch.Generator().manual_seed(seed)
    global_params = [torch.randn(s, generator=g) for s in SHAPES]
    drift = [[[0.1 * torch.randn(s, generator=g) for s in SHAPES] for _ in range(n)]]
    drift += [[[0.1 * torch.randn(s, generator=g) for s in SHAPES] for _ in range(n)]]
    return global_params, drift


def _check_world_size(fn: Callable, n: int, case: Case, seed: int) -> None:
    from course.ranks import PerRank, launch

    start, drift = _draw(n, seed)
    mine = PerRank([[d[r] for d in drift] for r in range(n)])
    result = launch(
        _rounds, n, fn, start, mine, case, timeout=LAUNCH_TIMEOUT, before=refusing(OUTER_SGD)
    )
    if not result.ok:
        raise AssertionError(failure_message(NAME, n, result.failures, f" ({case})"))
    global_params = [t.clone() for t in start]
    momentum = [torch.zeros_like(t) for t in start]
    relayed = confined.current() is not None
    for i in range(ROUNDS):
        params = [
            [gp + d for gp, d in zip(global_params, drift[i][r], strict=True)] for r in range(n)
        ]
        want_global, want_momentum = oracle(params, global_params, momentum, case)
        got = [r[i] for r in result.results]
        head = f"{NAME} on {n} ranks ({case}), outer step {i + 1} of {ROUNDS}:"
        _judge_values(
            head, got, params, global_params, momentum, (want_global, want_momentum), case
        )
        calls = _record(result, n, i) if relayed else _reported(got)
        _judge_traffic(head, calls, n)
        global_params = [t.float() for t in want_global]
        momentum = [t.float() for t in want_momentum]


# --- the rank side ---------------------------------------------------------------------


def _rounds(fn: Callable, start: list, drift: list, case: Case) -> list[tuple]:
    """On each rank: ``ROUNDS`` outer steps, each from the parameters the last one left plus
    this rank's drift; return each step's tensors and what the recorder saw."""
    global_params = [t.clone() for t in start]
    momentum = [torch.zeros_like(t) for t in start]
    out = []
    for i, mine in enumerate(drift):
        relay.mark(i)  # under grading: where step i starts, in the relay's record
        params = [g + d for g, d in zip(global_params, mine, strict=True)]
        with Recorder() as seen:
            fn(params, global_params, momentum, case.outer_lr, case.mu)
        calls = [(c.name, c.group, c.contributed) for c in seen.collectives]
        sends = len([m for m in seen.messages if m.op == "send"])
        out.append(([p.clone() for p in params], [g.clone() for g in global_params],
                    [m.clone() for m in momentum], calls, sends))  # fmt: skip
        global_params = [g.clone() for g in global_params]
        momentum = [m.clone() for m in momentum]
    relay.mark(len(drift))  # the closing barrier is no step's
    dist.barrier()
    return out


# --- the caller side -------------------------------------------------------------------


def _close(got: Any, want: torch.Tensor) -> bool:
    return (
        isinstance(got, torch.Tensor)
        and got.shape == want.shape
        and torch.allclose(got.double(), want, rtol=1e-5, atol=1e-6)
    )


def _judge_values(
    head: str, got: list, params: list, global_params: list, momentum: list, want: tuple, case: Case
) -> None:
    want_global, want_momentum = want
    for rank, (p, g, m, _calls, _sends) in enumerate(got):
        for name, tensors, expected in (
            ("global_params", g, want_global),
            ("momentum", m, want_momentum),
            ("params", p, want_global),
        ):
            for k, (t, w) in enumerate(zip(tensors, expected, strict=True)):
                if _close(t, w):
                    continue
                hint = _hint(name, t, k, rank, params, global_params, momentum, case)
                shown = t.flatten()[:3].tolist() if isinstance(t, torch.Tensor) else repr(t)[:60]
                raise AssertionError(
                    f"{head} rank {rank}'s {name}[{k}] is wrong{hint}. First values: expected "
                    f"{w.flatten()[:3].tolist()}, got {shown}. {RULE}"
                )


def _hint(
    name: str, t: Any, k: int, rank: int, params: list, global_params: list, momentum: list,
    case: Case,
) -> str:  # fmt: skip
    """What a wrong tensor is instead, where it is a usual mistake."""
    if not isinstance(t, torch.Tensor):
        return ": it is no longer a tensor (update the lists' tensors in place)"
    g, m = global_params[k].double(), momentum[k].double()
    deltas = torch.stack([g - p[k].double() for p in params])
    mean, lr, mu = deltas.mean(0), case.outer_lr, case.mu
    if name == "params":
        if _close(t, params[rank][k].double()):
            return ": it is still this worker's own, unchanged (copy the new global parameters in)"
        return ""
    if _close(t, m if name == "momentum" else g):
        return ": it is unchanged (update the tensors in the lists in place: t.copy_(...), t.mul_)"
    mistakes = {
        "momentum": {
            "the sum of the pseudo-gradients, not their mean (divide by the world size)": mu * m
            + deltas.sum(0),
            "this worker's own pseudo-gradient, not the mean over workers (all-reduce it)": mu * m
            + deltas[rank],
            "the pseudo-gradient with its sign flipped (delta = global_params - params)": mu * m
            - mean,
        },
        "global_params": {
            "a step along -momentum: plain momentum, not Nesterov's delta + mu * momentum": g
            - lr * (mu * m + mean),
            "a step on the sum of the pseudo-gradients, not their mean": g
            - lr * (deltas.sum(0) + mu * (mu * m + deltas.sum(0))),
            "a step that moves away from the workers (delta's sign flipped)": g
            + lr * (mean + mu * (mu * m + mean)),
            "a step on this worker's own pseudo-gradient only (all-reduce it)": g
            - lr * (deltas[rank] + mu * (mu * m + deltas[rank])),
            "the workers' mean parameters: plain averaging, without the outer step": g - mean,
        },
    }
    for why, value in mistakes.get(name, {}).items():
        if _close(t, value):
            return f": it is {why}"
    return ""


def _record(result: Any, n: int, i: int) -> list[Call]:
    """Step ``i`` as the relay recorded it (under grading: nothing a rank reported)."""
    run = f"{NAME}'s run on {n} ranks"
    return read_record(run, "step by step", relayed_calls, result.relayed, n, i)


def _reported(got: list) -> list[Call]:
    """Step ``i`` as the ranks' recorders saw it (the notebook's path)."""
    out = []
    for rank, (_p, _g, _m, calls, sends) in enumerate(got):
        out += [
            Call(name, tuple(group) or (rank,), (max(put_in, 0),)) for name, group, put_in in calls
        ]
        out += [Call("send", (rank, -1), (0,)) for _ in range(sends)]
    return out


def _judge_traffic(head: str, calls: list[Call], n: int) -> None:
    """All-reduces only, each rank putting in one model's worth of float32, no more."""
    model = sum(torch.Size(s).numel() for s in SHAPES) * 4
    kinds = sorted({c.kind for c in calls} - {"allreduce", "all_reduce"})
    if kinds:
        raise AssertionError(
            f"{head} it called {', '.join(kinds)}: an outer step moves the pseudo-gradients "
            "in one all-reduce (every rank already holds the same global parameters and "
            f"momentum, so nothing else needs to travel). {RULE}"
        )
    sent = sum(sum(c.nbytes) for c in calls) / n if calls else 0
    if sent != model:
        said = count(int(sent), "byte")
        raise AssertionError(
            f"{head} each rank all-reduced {said}, and the model is {count(model, 'byte')}: "
            + (
                "all-reduce every parameter's pseudo-gradient once, and nothing else (the "
                "momentum and the global parameters are the same on every rank already)."
                if sent > model
                else "every parameter's pseudo-gradient must be all-reduced."
            )
        )
