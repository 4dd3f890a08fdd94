"""Grade a student's ``fully_shard(module, *, param_dtype=None, reduce_dtype=None)``.

    from course.checks import check_fully_shard, check_fsdp_traffic
    print(check_fully_shard(fully_shard))        # raises AssertionError that teaches

Ranks build the check's model (``course.lessons.fsdp.model.tiny_lm``), apply the
student's ``fully_shard`` to each block then the root, train STEPS steps with SGD, then a
fresh model with Adam, on batches made here from a fresh seed (each rank is sent its own),
and send back each unit's ``flat_shard`` (:mod:`course.lessons.fsdp.rank`). Here, in the
caller: each shard's size (ceil(P/N), float32), the shards reassembled in rank order, the
padding stripped, against the single-process oracle trained here on the same batches with
the mean of the per-rank gradients; the frozen table unchanged; no original parameter left
registered. The traffic verdict reads each step's collectives from the relay's own record
under grading (:mod:`course.lessons.fsdp.traffic`), from the ranks' recorders in a notebook,
and judges the backward's all-gathers by their use: in its run, in one step drawn here, each
backward all-gather's result is scaled, element by element, by factors drawn here too and
told to no rank (:mod:`course.ranks.rescale`), and the shards right after that step must be
the oracle's whose backward computes with those values (:func:`judge_use`). A backward that
computes with parameters kept from the forward gives the unscaled oracle's shards instead,
whether or not it also made an all-gather; the mixed-precision check scales the same way.
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Callable, Sequence
from typing import Any

import torch

from course.checks.compare import MODEL_SEED, fresh_seed, rank_generators
from course.checks.teaching import CheckFailed, failure_message, need_function, teaches
from course.lessons.fsdp.model import (
    STEPS,
    Backwards,
    Unit,
    make_batches,
    oracle,
    tiny_lm,
    unit_flats,
    units,
)
from course.lessons.fsdp.rank import part, train_sharded
from course.lessons.fsdp.replies import readback_problem, shard_problem, unit_error, valid_reply
from course.lessons.fsdp.traffic import expected_step, rank_steps, traffic_problem
from course.ranks import PerRank, confined
from course.ranks.rescale import Rescale, factors
from course.ranks.wording import world_sizes_text

__all__ = [
    "KEPT",
    "LAUNCH_TIMEOUT",
    "RTOL",
    "backward_rescale",
    "backward_values",
    "check_fsdp_traffic",
    "check_fully_shard",
    "run_fully_shard",
    "value_problem",
    "worst_error",
]

RTOL = 1e-4  # of the largest parameter: fp32 sums in another order (measured: below 1e-7)
GENERIC = (
    "check the order of the managed parameters (first appearance in named_parameters), "
    "the views' offsets in the gathered tensor, and that the reduce-scattered gradient "
    "is the mean over ranks"
)
LAUNCH_TIMEOUT = 30.0
NAME = "fully_shard"
FSDP_DEADLOCK = (
    "Every rank was waiting and none could go on: a deadlock. Every rank must make the same "
    "collectives in the same order: an all-gather before each unit's forward and again "
    "before its backward, one reduce-scatter after its backward, on every rank."
)


def run_fully_shard(
    fn: Any, n: int, specs: list[dict], seed: int, timeout: float = LAUNCH_TIMEOUT,
    steps: int = STEPS, rescale: Rescale | None = None,
) -> tuple[list, list, tuple]:  # fmt: skip
    """Every rank's batches (made here, ``steps`` each), their validated replies, and the
    relay's record; ``rescale``: the all-gathers scaled (graded, by the relay, the seed told to
    no rank; in a notebook, by the check's rank code)."""
    from course.ranks import launch

    size = specs[0].get("size", {})
    batches = [make_batches(steps, g, **size) for g in rank_generators(seed, n)]
    graded = confined.current() is not None
    told = None
    if rescale is not None and not graded:
        told = {"seed": rescale.seed, "parts": sorted(rescale.parts), "skip": rescale.skip}
    try:
        measured = any(spec.get("memory") for spec in specs)  # on the relay, from the start
        args = (fn, specs, PerRank(batches), told)
        kw = {"rescale": rescale} if graded else {}
        result = launch(train_sharded, n, *args, timeout=timeout, measured=measured, **kw)
    except TypeError as err:  # the launcher could not pickle the student's code
        raise CheckFailed(f"{NAME} could not be sent to the ranks: {err}") from None
    if result.failures:
        doing = f" (seed {seed})"
        raise CheckFailed(failure_message(NAME, n, result.failures, doing, FSDP_DEADLOCK))
    replies = [valid_reply(r, len(specs), rank, n) for rank, r in enumerate(result.results)]
    return batches, replies, result.relayed


Hints = dict[str, Callable[[], list[torch.Tensor]]]  # what a mistake gives, made if asked


@functools.cache
def _unit_names() -> tuple[str, ...]:
    return tuple(u.name for u in units(tiny_lm(MODEL_SEED)))


def value_problem(
    run: dict, rank: int, n: int, want: list[torch.Tensor], hints: Hints, rtol: float = RTOL,
    start: list[torch.Tensor] | None = None,
) -> tuple[float, str | None]:  # fmt: skip
    """(error relative to the largest parameter, or with ``start`` (the units before training)
    to the largest change training made; what is wrong in words or None); each hint's values,
    what a known mistake would give, are made only for shards that miss ``want``."""
    problem = readback_problem(run, n, want, list(_unit_names()))
    if problem:
        return math.inf, problem
    shards = run["shards"]
    if start is None:
        scale = max(t.abs().max().item() for t in want)
    else:
        scale = max((w - s).abs().max().item() for w, s in zip(want, start, strict=True))
    err = max(unit_error(shards, i, rank, n, w) for i, w in enumerate(want)) / scale
    if err <= rtol:
        return err, None
    for why, made in hints.items():
        if max(unit_error(shards, i, rank, n, w) for i, w in enumerate(made())) / scale <= rtol:
            return err, why
    return err, ""


def worst_error(
    runs: list[dict], n: int, model: Any, want: list[torch.Tensor], hints: Hints,
    where: Callable[[int], str], rtol: float = RTOL, start: list[torch.Tensor] | None = None,
    generic: str = GENERIC,
) -> float:  # fmt: skip
    """The largest error of the ranks' shards from ``want`` (relative as in
    :func:`value_problem`); at the first rank whose shards' sizes or values are wrong, fail
    with ``where(rank)`` and what is wrong (``generic``: when no hint fits)."""
    layout, worst = units(model), 0.0
    for rank, run in enumerate(runs):
        problem = shard_problem(run, n, layout, model)
        if problem:
            raise AssertionError(f"{where(rank)}: {problem}.")
        err, why = value_problem(run, rank, n, want, hints, rtol, start)
        if why is not None:
            of = "of the largest parameter" if start is None else "of the largest update"
            raise AssertionError(differs(where(rank), err, why or generic, rtol, of))
        worst = max(worst, err)
    return worst


def _gathered(replies_by_rank: list[list[dict]], k: int) -> list[dict]:
    return [reply[k] for reply in replies_by_rank]


SPECS = [{"optimizer": "sgd"}, {"optimizer": "adam"}]


@teaches
def check_fully_shard(
    fully_shard: Any, world_sizes: Sequence[int] = (2, 3, 4), repeats: int = 2,
    seed: int | None = None, timeout: float = LAUNCH_TIMEOUT,
) -> str:  # fmt: skip
    """After STEPS steps of SGD, and of Adam, every unit's shards match the oracle's."""
    need_function(NAME, fully_shard)
    model = tiny_lm(MODEL_SEED)
    worst = 0.0
    for n in world_sizes:
        for _ in range(repeats):  # twice: a race shows on one run of two
            case = fresh_seed(seed)
            batches, replies, _ = run_fully_shard(fully_shard, n, SPECS, case, timeout)
            for k, spec in enumerate(SPECS):
                kind = spec["optimizer"]
                want = oracle(batches, kind)[-1]
                hints: Hints = {}
                if kind == "sgd":
                    hints[SUMMED] = lambda b=batches, n=n: oracle(b, "sgd", scale=n)[-1]

                def where(rank: int, n: int = n, kind: str = kind, case: int = case) -> str:
                    return f"{NAME} on rank {rank} of {n} ({kind.upper()}, seed {case})"

                runs = _gathered(replies, k)
                worst = max(worst, worst_error(runs, n, model, want, hints, where))
    return (
        f"{NAME} trains like one process on the mean gradient: SGD and Adam, {STEPS} steps, "
        f"{world_sizes_text(world_sizes)}, {repeats} runs each (largest difference "
        f"{worst:.1e} of the largest parameter, tolerance {RTOL:g})."
    )


SUMMED = "the gradients are summed, not averaged: divide by world_size"


def differs(
    where: str, err: float, why: str, rtol: float = RTOL, of: str = "of the largest parameter"
) -> str:
    """The failure message of a value verdict (``err`` is relative: ``of`` says to what)."""
    if err == math.inf:
        return f"{where}: {why}."
    return (
        f"{where}: the shards differ from the single-process oracle's after {STEPS} steps by "
        f"{err:.2e} {of} (tolerance {rtol:g}): {why or GENERIC}."
    )


@teaches
def check_fsdp_traffic(
    fully_shard: Any, world_sizes: Sequence[int] = (2, 3), seed: int | None = None,
    timeout: float = LAUNCH_TIMEOUT,
) -> str:  # fmt: skip
    """Per step and unit: 2 all-gathers of the shard, 1 reduce-scatter, nothing else; and the
    backward computes with what its all-gathers bring (scaled by the judge: module doc)."""
    need_function(NAME, fully_shard)
    layout = units(tiny_lm(MODEL_SEED))
    for n in world_sizes:
        case, chosen = fresh_seed(seed), backward_rescale(layout)
        batches, replies, relayed = run_fully_shard(
            fully_shard, n, SPECS[:1], case, timeout, rescale=chosen
        )
        judge_traffic(replies, relayed, n, layout, 0, (4, 4))
        judge_use([r[0] for r in replies], batches, n, chosen, case)
    return (
        f"{NAME}'s traffic on {world_sizes_text(world_sizes)}: per step and unit 2 all-gathers "
        "of the shard and 1 reduce-scatter of the padded unit, nothing else (recorded), and "
        "the backward computes with what its all-gathers bring."
    )


KEPT = (
    "the backward used parameters gathered in the forward: free them after the forward and "
    "gather again before the backward, and compute the backward with what that all-gather "
    "brings (the check changes what each backward all-gather returns, in a way no rank is "
    "told, and the gradients must follow)"
)
NOT_USED = (
    "the shards are not what a backward computing with the parameters its all-gathers "
    "bring gives (the check changes what each backward all-gather returns, in a "
    "way no rank is told): compute the backward with the gathered views, and if "
    f"check_{NAME} fails too, fix what it says first"
)


# The steps whose backward may be scaled, one drawn per run, and the tolerance of the shards
# right after it. Measured (30 runs on 2 and 3 ranks, SGD, relative to the largest change the
# scaled step made): the model solution within 1e-5, a backward that kept the forward's
# parameters at least 0.5 away; scaling every step made training diverge, and so does the
# summed gradient on 3 ranks from step 3 on, where its hint would be lost.
SCALED_STEPS = range(3)
USE_RTOL = 1e-3  # of the largest change the scaled step made to a parameter


def backward_rescale(
    layout: Sequence[Unit], run: int = 0, steps: Sequence[int] = SCALED_STEPS
) -> Rescale:
    """The judge's secret choice: in one step of run ``run``, drawn from ``steps``, every
    all-gather after the forward's (one per unit) is scaled (:mod:`course.ranks.rescale`)."""
    step = random.SystemRandom().choice(steps)
    return Rescale.draw(frozenset({part(run, step)}), len(layout))


def backward_values(chosen: Rescale, n: int, run: int = 0) -> Backwards:
    """Step by step of run ``run`` on ``n`` ranks, what a unit of P elements is multiplied by
    in the backward (the first P factors of its padded gather's), or None: not scaled."""

    def scaled(numel: int) -> torch.Tensor:
        return factors(chosen.seed, n * -(-numel // n))[:numel]

    return [scaled if part(run, j) in chosen.parts else None for j in range(STEPS)]


def judge_use(runs: list[dict], batches: list, n: int, chosen: Rescale, case: int) -> None:
    """Fail unless every rank's shards after the scaled step are the oracle's whose backward
    computed with the scaled gathers (or that oracle's with the gradients summed, a mistake
    of values the values check fails); say so if they are the unscaled oracle's. Judged right
    after that step, against what it changed (USE_RTOL): later steps would only blur it."""
    back = backward_values(chosen, n)
    step = next(j for j, scaled in enumerate(back) if scaled is not None)
    trained = oracle(batches, "sgd", backward=back)
    before = trained[step - 1] if step else unit_flats(tiny_lm(MODEL_SEED))
    hints: Hints = {
        SUMMED: lambda: oracle(batches, "sgd", scale=n, backward=back)[step],
        KEPT: lambda: oracle(batches, "sgd")[step],
        f"{KEPT}; {SUMMED}": lambda: oracle(batches, "sgd", scale=n)[step],
    }
    for rank, run in enumerate(runs):
        after, start = run.get("after"), run.get("start")
        if not isinstance(after, list) or len(after) != STEPS:
            raise AssertionError(f"rank {rank} of {n} sent back no shards after each step: rerun")
        usable = {"shards": after[step], "frozen": start, "start": start}  # frozen: the values'
        err, why = value_problem(usable, rank, n, trained[step], hints, USE_RTOL, before)
        if why not in (None, SUMMED):
            where = f"{NAME}'s backward on rank {rank} of {n} (SGD, seed {case})"
            raise AssertionError(used(where, step, err, why or NOT_USED))


def used(where: str, step: int, err: float, why: str) -> str:
    """The failure message of the use verdict (``err``: of the largest change step made)."""
    if err == math.inf:
        return f"{where}: {why}."
    return (
        f"{where}: after step {step} the shards differ from the single-process oracle's by "
        f"{err:.2e} of the largest change that step made (tolerance {USE_RTOL:g}): {why}."
    )


def judge_traffic(
    replies: list, relayed: tuple, n: int, layout: list[Unit], k: int, sizes: tuple[int, int]
) -> None:
    """Fail, with the step and rank, where run ``k``'s steps sent anything but FSDP's calls."""
    runs, model = _gathered(replies, k), tiny_lm(MODEL_SEED)
    for rank, run in enumerate(runs):
        problem = shard_problem(run, n, layout, model)
        if problem:
            raise AssertionError(f"{NAME} on rank {rank} of {n}: {problem}.")
    steps = rank_steps(relayed, [r["steps"] for r in runs], n, [part(k, j) for j in range(STEPS)])
    want = expected_step(layout, n, *sizes)
    for rank, mine in enumerate(steps):
        if len(mine) != STEPS:
            raise AssertionError(f"{NAME}: rank {rank} of {n} did not make {STEPS} steps")
        for j, got in enumerate(mine):
            problem = traffic_problem(got, want, layout, n)
            if problem:
                raise AssertionError(
                    f"{NAME}'s step {j} on rank {rank} of {n} ({len(layout)} units) "
                    f"(recorded): {problem}"
                )
