"""Grade a student's ``step_with_backups(grad, backups)``: a synchronous step with backup workers.

    from course.checks import check_step_with_backups
    print(check_step_with_backups(step_with_backups))    # raises AssertionError that teaches

Backup workers (Chen et al. 2016, "Revisiting Distributed Synchronous SGD") make a step wait
for the first N - b gradients only and drop the b that come last. The contract: every rank
calls ``fn(grad, backups)`` with its own gradient; rank 0 coordinates (it is never the
straggler here); ``fn`` leaves in ``grad``, on every rank, the straggler's too, the mean of
the gradients it kept, and returns the sorted list of the ranks kept, the same on every rank.

Each case draws every rank's gradient here and a straggler among ranks 1..N-1. The verdict,
computed in the caller: the ranks agree on N - b kept ranks, rank 0 among them and the
straggler not; every rank's gradient is the mean of the kept ones; and no other rank waited
for the straggler. In a notebook the straggler sleeps :data:`STRAGGLE` seconds before its
step, and the ranks' own clocks say whose step ended after it woke. Under grading no rank is
told who the straggler is: the relay makes it (:mod:`course.ranks.holds`), holding its
requests until every other rank has ended its step or is blocked waiting, and a rank whose
step ends only after the straggler was let through waited for it (a blocking receive from it,
a collective it must join, a blocking send to it, as on gloo), whatever the machine's load.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.distributed as dist

from course.checks.compare import fresh_seed
from course.checks.teaching import failure_message, need_function, teaches, world_sizes_of
from course.ranks import confined
from course.ranks.frames import Event
from course.ranks.holds import Hold
from course.ranks.wording import world_sizes_text

__all__ = ["BackupsReport", "check_step_with_backups"]

WORLD_SIZES = (3, 4)
STRAGGLE = 1.0  # seconds the straggler starts late: far above a step's own time, loaded
LAUNCH_TIMEOUT = 20.0
WAITED = (
    "Receive the first N - backups - 1 gradients from any rank (dist.recv(buffer, tag=step) "
    "with no src returns the sender), then send the result to every rank with dist.isend, "
    "keeping the requests: nothing may wait for the straggler."
)


@dataclass(frozen=True)
class Case:
    """One step: a gradient size and dtype, how many to drop, who is late (None: nobody)."""

    numel: int
    dtype: torch.dtype
    backups: int
    straggler: int | None

    def __str__(self) -> str:
        late = f", rank {self.straggler} late" if self.straggler is not None else ""
        dtype = str(self.dtype).removeprefix("torch.")
        return f"backups={self.backups}, a {dtype} gradient of {self.numel}{late}"


def cases(world_size: int, rng: random.Random) -> list[Case]:
    """A step with no backup, then one and (on 4 ranks) two backups, a straggler drawn."""
    late = [rng.randrange(1, world_size) for _ in range(2)]
    found = [Case(7, torch.float32, 0, None)] if world_size > 3 else []
    found.append(Case(5 * world_size + 1, torch.float64, 1, late[0]))
    if world_size > 3:
        found.append(Case(3, torch.float32, 2, late[1]))
    return found


@dataclass(frozen=True)
class BackupsReport:
    """What a passing check covered."""

    world_sizes: tuple[int, ...]
    steps: int

    def __str__(self) -> str:
        return (
            f"step_with_backups passed: {self.steps} steps on {world_sizes_text(self.world_sizes)}"
            ", the kept ranks agreed, the right mean on every rank, and no rank waited for the "
            "straggler."
        )


@teaches
def check_step_with_backups(
    fn: Callable[[torch.Tensor, int], Any], world_sizes: Sequence[int] = WORLD_SIZES
) -> BackupsReport:
    """Check ``fn``'s kept ranks, means and waiting on ``world_sizes``, stragglers drawn here."""
    need_function("step_with_backups", fn)
    world_sizes = world_sizes_of(world_sizes)
    rng = random.Random(fresh_seed(None))  # noqa: S311 - test data, not a secret
    steps = sum(_check_world_size(fn, n, rng) for n in world_sizes)
    return BackupsReport(world_sizes, steps)


def _check_world_size(fn: Callable, n: int, rng: random.Random) -> int:
    """Run and judge the cases of one world size; return how many were judged."""
    from course.ranks import PerRank, launch

    todo = cases(n, rng)
    g = torch.Generator().manual_seed(rng.randrange(2**31))
    grads = [[torch.randn(c.numel, generator=g).to(c.dtype) for _ in range(n)] for c in todo]
    mine = PerRank([grads[i][r] for i in range(len(todo))] for r in range(n))
    relayed = confined.current() is not None
    told, holds = _stragglers(todo, relayed)
    result = launch(_steps, n, fn, told, mine, timeout=LAUNCH_TIMEOUT, holds=holds)
    if not result.ok:
        raise AssertionError(failure_message("step_with_backups", n, result.failures, "", WAITED))
    for i, case in enumerate(todo):
        got = [r[i] for r in result.results]
        late = _late_ranks(result.relayed, n, case, (i, len(todo)), got, relayed)
        _judge(n, case, grads[i], got, late, relayed)
    return len(todo)


def _stragglers(todo: list[Case], relayed: bool) -> tuple[list[Case], list[Hold]]:
    """The cases the ranks are told, and the stragglers the relay makes: graded, the relay
    makes every straggler and no rank is told; in a notebook, each straggler sleeps."""
    if not relayed:
        return todo, []
    holds = [Hold(i, c.straggler) for i, c in enumerate(todo) if c.straggler is not None]
    return [replace(c, straggler=None) for c in todo], holds


# --- the rank side ---------------------------------------------------------------------


def _steps(fn: Callable, todo: list[Case], mine: list[torch.Tensor]) -> list[tuple]:
    """Each case: start together, the straggler late; return (grad, kept, woke, ended)."""
    rank, out = dist.get_rank(), []
    for i, case in enumerate(todo):
        dist.barrier()  # every rank starts the step together: under grading, the case's start
        if rank == case.straggler:
            time.sleep(STRAGGLE)
        woke = time.monotonic()
        grad = mine[i].clone()
        kept = fn(grad, case.backups)
        ended = time.monotonic()
        plain = [int(k) for k in kept] if isinstance(kept, (list, tuple)) else repr(kept)[:80]
        out.append((grad, plain, woke, ended))
    dist.barrier()
    return out


# --- the caller side -------------------------------------------------------------------


def _late_ranks(
    events: Sequence[Event], n: int, case: Case, at: tuple[int, int], got: list, relayed: bool
) -> list[tuple[int, float]]:
    """(rank, how late) for each rank but the straggler whose step ended after the straggler
    woke (in a notebook, by the ranks' clocks) or was let through (graded, by the relay's);
    ``at`` is (this case, how many cases)."""
    s = case.straggler
    if s is None:
        return []
    if not relayed:  # the ranks' own clocks: in a notebook, the ranks are the student's
        woke = got[s][2]
        return [(r, got[r][3] - woke) for r in range(n) if r != s and got[r][3] > woke]
    i, cases = at
    released = [e.time for e in events if e.kind == "release" and e.tag == i]
    ended = _barriers(events, n, cases)[i + 1]  # the barrier that closes the case
    if not released:
        raise AssertionError("step_with_backups's run cannot be judged: its straggler never went")
    arrived = dict(zip(ended.group, ended.arrived, strict=True))
    late = [(r, arrived[r] - released[0]) for r in range(n) if r != s]
    return [(r, wait) for r, wait in late if wait > 0]


def _barriers(events: Sequence[Event], n: int, cases: int) -> list[Event]:
    """The check's barriers of the whole world, one before each case and one after the last,
    as the relay recorded them. A rank cannot move these marks: a barrier of its own would
    wait for the straggler, and is refused."""
    world = tuple(range(n))
    barriers = [e for e in events if e.kind == "barrier" and tuple(e.group) == world]
    if len(barriers) != cases + 1:
        raise AssertionError(
            "step_with_backups's run cannot be read step by step: it called dist.barrier "
            "over all ranks itself, which waits for every rank, the straggler too"
        )
    return barriers


def _judge(
    n: int, case: Case, grads: list, got: list, late: list[tuple[int, float]], relayed: bool
) -> None:
    head = f"step_with_backups on {n} ranks ({case}):"
    kept_lists = [g[1] for g in got]
    if any(k != kept_lists[0] for k in kept_lists):
        said = "; ".join(f"rank {r} kept {k}" for r, k in enumerate(kept_lists))
        raise AssertionError(
            f"{head} the ranks disagree on whom they kept ({said}). Every rank steps with the "
            "same mean, so one rank (rank 0) must decide and tell the others whom it kept."
        )
    kept = kept_lists[0]
    want = n - case.backups
    if not isinstance(kept, list) or sorted(set(kept)) != kept or len(kept) != want:
        raise AssertionError(
            f"{head} returned {kept}: return the sorted list of the {want} ranks kept "
            f"(N - backups = {n} - {case.backups}), each once."
        )
    if 0 not in kept or not all(0 <= k < n for k in kept):
        raise AssertionError(f"{head} kept {kept}: rank 0 coordinates, so its gradient is kept.")
    if case.straggler in kept:
        raise AssertionError(
            f"{head} kept rank {case.straggler}, the straggler, whose gradient came last: it "
            f"is among the first {want} only if the step waited for it. {WAITED}"
        )
    for r, wait in late:
        when = (
            "ended only once the straggler's messages were let through"
            if relayed
            else f"went on {wait * 1000:.0f} ms after the straggler started, {STRAGGLE:g} s late"
        )
        raise AssertionError(
            f"{head} rank {r}'s step {when} (rank {case.straggler} was the straggler): it "
            f"waited for the straggler. {WAITED}"
        )
    expected = torch.stack([grads[k].to(torch.float64) for k in kept]).mean(0).to(case.dtype)
    for r, (grad, *_rest) in enumerate(got):
        _judge_mean(head, r, grad, expected, grads, kept)


def _judge_mean(
    head: str, r: int, grad: Any, expected: torch.Tensor, grads: list, kept: list
) -> None:
    if not isinstance(grad, torch.Tensor) or grad.shape != expected.shape:
        raise AssertionError(f"{head} rank {r}'s gradient changed shape or type: keep it in place")
    if grad.dtype == expected.dtype and torch.allclose(grad, expected, rtol=1e-5, atol=1e-6):
        return
    stacked = torch.stack([g.to(torch.float64) for g in grads])
    hints = {
        "the mean over all ranks, the dropped ones too": stacked.mean(0),
        f"the sum of the kept gradients, not divided by {len(kept)}": stacked[kept].sum(0),
        "divided by N, not by the number kept": stacked[kept].sum(0) / len(grads),
        "this rank's own gradient, unchanged": stacked[r],
    }
    why = next(
        (w for w, t in hints.items() if torch.allclose(grad.double(), t, rtol=1e-5, atol=1e-6)), ""
    )
    raise AssertionError(
        f"{head} rank {r}'s gradient is not the mean of the kept ranks' {kept}"
        + (f": it is {why}." if why else ".")
        + f" First values: expected {expected[:3].tolist()}, got {grad[:3].tolist()}."
    )
