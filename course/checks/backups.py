"""Grade a student's ``step_with_backups(grad, backups) -> kept``: synchronous SGD with backup
workers (Chen et al., 2016), which goes on with the first N - b gradients and drops the rest.

    from course.checks import check_step_with_backups
    print(check_step_with_backups(step_with_backups))   # raises AssertionError that teaches

On every rank ``grad`` is that rank's gradient; the step must leave in it, on every rank, the
average of the gradients of the ranks it kept, and return those ranks, sorted, the same list
on every rank: N - b of them. The check makes each rank's gradient here, in the caller, and
injects stragglers: ``b`` ranks (never rank 0, which may collect) hand in their gradient
``DELAY`` seconds late. The kept ranks must then be the others; the average is checked
against the one made here; and every other rank must finish its step before any straggler
has even started: a step that waited for the stragglers and dropped them after is no backup.
When that is timed: under grading by the relay's clock, at the marks the check's own rank-side
code makes around the call (``course.ranks.relay.mark``); in a notebook by each rank's
monotonic clock, which every process on one machine shares.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from course.checks.compare import fresh_seed
from course.checks.ring_cases import Case, compare, inputs
from course.checks.teaching import failure_message, teaches
from course.ranks import confined, relay
from course.ranks.wording import count, listed, ranks_text

__all__ = ["check_step_with_backups"]

NAME = "step_with_backups"
CASES = ((4, 1), (5, 2))  # (world size, backups)
DELAY = 1.0  # seconds a straggler waits before it hands in its gradient
SHAPE = (3, 5)
BACKUP_DEADLOCK = (
    "Every rank was waiting and none could go on: a deadlock. A straggler's gradient arrives "
    "after the others have moved on: post its receive with dist.irecv and do not wait on it "
    "for the step; send the decision (which ranks were kept, and the average) to every rank, "
    "the stragglers included, with dist.isend, so no rank blocks on one that is late."
)


@teaches
def check_step_with_backups(
    fn: Callable[[torch.Tensor, int], Any], cases: Sequence[tuple[int, int]] = CASES
) -> str:
    """Check that ``fn(grad, backups)`` averages over the first N - b gradients, drops the
    stragglers', returns the same sorted kept ranks everywhere, and does not wait for them."""
    if not callable(fn):
        raise AssertionError(  # noqa: TRY004 - every failed check is an AssertionError
            f"expected your {NAME} function, got {type(fn).__name__}: run its cell first"
        )
    cases = tuple(tuple(c) for c in cases)  # type: ignore[misc]
    if not cases or any(
        len(c) != 2 or any(type(v) is not int for v in c) or not 1 <= c[1] <= c[0] - 2
        for c in cases
    ):
        raise ValueError(
            f"cases must be (world size, backups) pairs with 1 <= backups <= world size - 2, "
            f"got {cases}"
        )
    for world_size, backups in cases:
        _one(fn, world_size, backups)
    said = listed(f"{n} ranks with {count(b, 'backup')}" for n, b in cases)
    return (
        f"{NAME} passed: on {said}, every rank kept the same ranks, the first N - b to hand "
        "in their gradient, averaged them, and finished before the stragglers had started."
    )


# --- the rank side ---------------------------------------------------------------------


def _rank_step(fn: Callable, grad: torch.Tensor, backups: int, delay: float) -> tuple:
    """On each rank: wait ``delay`` (a straggler's), then one step; the marks time it."""
    if delay:
        time.sleep(delay)
    relay.mark(0)  # under grading: the relay's clock reads when this rank started
    started = time.monotonic()
    kept = fn(grad, backups)
    finished = time.monotonic()
    relay.mark(1)
    dist.barrier()  # no rank leaves while another may still receive what it sent
    if isinstance(kept, list | tuple) and all(type(k) is int for k in kept):
        kept = list(kept)
    elif isinstance(kept, torch.Tensor) and not kept.is_floating_point() and kept.dim() == 1:
        kept = [int(k) for k in kept.tolist()]
    else:
        kept = type(kept).__name__
    return grad, kept, started, finished


# --- the caller side -------------------------------------------------------------------


def _one(fn: Callable, world_size: int, backups: int) -> None:
    from course.ranks import PerRank, launch

    case = Case(SHAPE, torch.float64)
    grads = inputs(case, world_size, seed=fresh_seed(None))
    stragglers = sorted(random.SystemRandom().sample(range(1, world_size), backups))
    delays = PerRank(DELAY if r in stragglers else 0.0 for r in range(world_size))
    result = launch(
        _rank_step, world_size, fn, PerRank(grads), backups, delays, timeout=DELAY + 10.0
    )
    where = f"on {world_size} ranks with {count(backups, 'backup')} ({_late(stragglers)})"
    if not result.ok:
        raise AssertionError(
            failure_message(NAME, world_size, result.failures, f" {where}", BACKUP_DEADLOCK)
        )
    got = result.results
    times = _times(result, world_size) if confined.current() is not None else None
    _judge(world_size, backups, stragglers, grads, got, times, where)


def _late(stragglers: list[int]) -> str:
    return f"{ranks_text(stragglers)} {DELAY:g} s late"


def _times(result: Any, world_size: int) -> list[tuple[float, float]]:
    """Each rank's (start, finish) by the relay's clock, from its marks 0 and 1."""
    marks: dict[int, list] = {r: [] for r in range(world_size)}
    for e in result.relayed:
        if e.kind == "mark" and e.src in marks:
            marks[e.src].append(e)
    out = []
    for rank in range(world_size):
        tags = [e.tag for e in sorted(marks[rank], key=lambda e: e.seq)]
        if tags != [0, 1]:
            raise AssertionError(
                f"{NAME}'s run cannot be timed: rank {rank} marked {tags}, not the check's "
                "[0, 1] around its step (code that calls course.ranks.relay.mark itself?)"
            )
        start, finish = sorted(marks[rank], key=lambda e: e.seq)
        out.append((start.time, finish.time))
    return out


def _judge(
    world_size: int,
    backups: int,
    stragglers: list[int],
    grads: list[torch.Tensor],
    got: list,
    times: list[tuple[float, float]] | None,
    where: str,
) -> None:
    """The kept ranks, then the average, then the timing: the first that is wrong fails."""
    kept = _judge_kept(world_size, backups, stragglers, [k for _, k, _, _ in got], where)
    _judge_average(kept, grads, [g for g, _, _, _ in got], where)
    if times is None:
        times = [(start, finish) for _, _, start, finish in got]
    first_late = min(times[s][0] for s in stragglers)
    for rank in kept:
        finish = times[rank][1]
        if finish >= first_late:
            raise AssertionError(
                f"{NAME} on rank {rank} finished its step {finish - first_late:.2f} s after "
                f"the first straggler handed in its gradient {where}: it waited for the "
                "stragglers. Backup "
                "workers go on as soon as N - b gradients are in; the late ones are received "
                "and dropped without waiting for them."
            )


def _judge_kept(
    world_size: int, backups: int, stragglers: list[int], lists: list, where: str
) -> list[int]:
    """Every rank returned the same sorted list: the N - b ranks that were not late."""
    for rank, kept in enumerate(lists):
        if isinstance(kept, str):
            raise AssertionError(  # noqa: TRY004 - every failed check is an AssertionError
                f"{NAME} returned a {kept} on rank {rank} {where}: it must return the ranks "
                "whose gradients it kept, as a sorted list of ints"
            )
    if any(k != lists[0] for k in lists):
        said = "; ".join(f"rank {r}: {k}" for r, k in enumerate(lists))
        raise AssertionError(
            f"{NAME}'s ranks disagree on which gradients were kept {where} ({said}): every "
            "rank must use the same ones; let one rank decide and send its decision to all"
        )
    kept = lists[0]
    if kept != sorted(set(kept)) or any(not 0 <= k < world_size for k in kept):
        raise AssertionError(
            f"{NAME} returned {kept} {where}: the kept ranks, sorted, each once, "
            f"in 0..{world_size - 1}"
        )
    if len(kept) != world_size - backups:
        raise AssertionError(
            f"{NAME} kept {count(len(kept), 'rank')} {where}; with b = {backups} it keeps the "
            f"first N - b = {world_size - backups} to hand in their gradient and drops the rest"
        )
    want = sorted(set(range(world_size)) - set(stragglers))
    if kept != want:
        late = [r for r in kept if r in stragglers]
        raise AssertionError(
            f"{NAME} kept {kept} {where}: it kept {ranks_text(late)}, which handed in "
            f"{'its' if len(late) == 1 else 'their'} gradient {DELAY:g} s after the others; the "
            f"first N - b to arrive were {want}"
        )
    return kept


def _judge_average(kept: list[int], grads: list[torch.Tensor], got: list, where: str) -> None:
    """Every rank's gradient is the average, made here, of the kept ranks' gradients."""
    expected = torch.stack([grads[r] for r in kept]).mean(0)
    case = Case(SHAPE, torch.float64)
    for rank, grad in enumerate(got):
        problem = compare(grad, expected, case)
        if problem is None:
            continue
        hints = []
        if isinstance(grad, torch.Tensor) and grad.shape == expected.shape:
            if torch.allclose(grad, torch.stack(grads).mean(0)):
                hints.append("  that is the average over every rank, the stragglers included")
            elif torch.allclose(grad, expected * len(kept)):
                hints.append(f"  that is the sum over the kept ranks: divide by {len(kept)}")
        head = f"{NAME} left a wrong gradient on rank {rank} {where}:"
        raise AssertionError("\n".join([head, "  " + problem, *hints]))
