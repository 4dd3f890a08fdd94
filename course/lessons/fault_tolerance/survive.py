"""Grade a student's ``fault_tolerant_step(model, x, y, lr, group, lighthouse)``.

    from course.lessons.fault_tolerance import check_fault_tolerant_step
    print(check_fault_tolerant_step(fault_tolerant_step))   # raises AssertionError that teaches

Each case trains a small model for ``STEPS`` synchronous SGD steps on N ranks, each rank on
batches of its own, and one rank dies inside the all-reduce of one step. The step must go on
without it: the survivors catch the failed all-reduce, ask the :class:`Lighthouse` who is left,
make a group of those ranks, all-reduce again the gradients they computed, and divide by how
many they are; every later step runs in that group. The verdict, computed in the caller: the
survivors' parameters after each step against one process taking the same SGD steps on the
mean gradient of the ranks of each step (all N before the failure, the survivors from it on),
the size of the group each step returned, and the run's failures (the planned rank's death,
and no other).

Where the rank dies: in its first all-reduce of every live rank in that step, once the others
are in theirs (an all-reduce of fewer ranks is not the step's). Under grading the relay's fault
plan (:mod:`course.ranks.faults`) kills it, told to no rank, and each survivor's all-reduce
fails at once with its buffer partly summed, as gloo's ring leaves it. In a notebook (gloo),
the rank's own harness ends its process there (it wraps ``dist.all_reduce`` and
``dist.all_reduce_coalesced`` for that step), and the others' gloo all-reduce fails: measured,
two of three survivors' buffers partly summed.

The Lighthouse. torchft's forms a quorum from the replicas whose heartbeats it hears; here
``quorum()`` answers each round once every rank still alive has asked, with those ranks. Under
grading the relay keeps it and knows who died; in a notebook it is kept in the run's store, and
the dying rank's harness marks it gone before it ends (where torchft waits for a heartbeat to
time out), so every run forms the same quorum.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from course.checks.compare import fresh_seed
from course.checks.teaching import failure_message, need_function, teaches, world_sizes_of
from course.models import toy_model
from course.ranks import confined, relay
from course.ranks.failures import RankFailure
from course.ranks.faults import Fault

__all__ = ["STEPS", "Lighthouse", "check_fault_tolerant_step", "oracle", "try_steps"]

NAME = "fault_tolerant_step"
WIDTH, DEPTH, BATCH = 8, 2, 4  # the model: 2 bias-free 8x8 layers, 128 parameters
STEPS = 3
LR = 0.1
CASES = {3: Fault(rank=1, step=1), 4: Fault(rank=0, step=2)}  # world size -> who dies, when
PG_TIMEOUT = 3.0  # gloo's wait for a peer, in a notebook: some survivors wait this long
LAUNCH_TIMEOUT = 60.0
QUORUM_POLL = 0.01
RULE = (
    "Each step moves the parameters by -lr times the mean gradient of the ranks in it: every "
    "rank before the death, the ranks left from the step it happened in on."
)


class Lighthouse:
    """Who is left after a failure: ``quorum()`` returns the ranks still alive (sorted), once
    every one of them has asked; a rank's n-th call is its round n."""

    def __init__(self, timeout: float = PG_TIMEOUT * 4) -> None:
        self.timeout, self._round = timeout, 0

    def quorum(self) -> list[int]:
        """The ranks alive now, once every one of them has asked for this round."""
        if relay.relayed():
            return relay.quorum()
        self._round += 1
        store, rank, world = _store(), dist.get_rank(), dist.get_world_size()
        store.set(f"round{self._round}/{rank}", "asked")
        end = time.monotonic() + self.timeout
        while True:
            asked = {r for r in range(world) if store.check([f"round{self._round}/{r}"])}
            gone = {r for r in range(world) if store.check([f"gone/{r}"])}
            if asked | gone == set(range(world)):
                return sorted(asked - gone)
            if time.monotonic() > end:
                absent = ", ".join(str(r) for r in range(world) if r not in asked | gone)
                raise RuntimeError(
                    f"quorum() timed out after {self.timeout:g} s: rank(s) {absent}, alive, "
                    "never asked for it (every rank left must call quorum() the same number "
                    "of times)"
                )
            time.sleep(QUORUM_POLL)

    def mark_gone(self) -> None:
        """Tell the others this rank is gone (the notebook's harness, as it dies)."""
        _store().set(f"gone/{dist.get_rank()}", "gone")


def _store() -> Any:
    return dist.PrefixStore("lighthouse/", dist.distributed_c10d._get_default_store())  # noqa: SLF001 - the run's own store


@teaches
def check_fault_tolerant_step(fn: Callable[..., Any], world_sizes: Sequence[int] = (3, 4)) -> str:
    """Check ``fn`` on ``world_sizes`` (of ``CASES``: each names the rank that dies, and the
    step it dies in)."""
    need_function(NAME, fn)
    world_sizes = world_sizes_of(world_sizes)
    if not set(world_sizes) <= set(CASES):
        raise ValueError(f"world_sizes must be among {sorted(CASES)}, got {world_sizes}")
    seed = fresh_seed(None)
    for n in world_sizes:
        _check_case(fn, n, CASES[n], seed + n)
    done = " and ".join(
        f"{n} ranks, rank {CASES[n].rank} dying in step {CASES[n].step}" for n in world_sizes
    )
    return (
        f"{NAME} passed: {STEPS} steps on {done}; every survivor finished each step with "
        "the mean gradient of the ranks left, and went on in their group."
    )


def try_steps(fn: Callable[..., Any], world_size: int = 3, dies: int = 1, step: int = 1) -> str:
    """Run ``fn`` for ``STEPS`` steps on ``world_size`` ranks, rank ``dies`` ending its
    process in step ``step``'s all-reduce: what each rank returned, as a table."""
    result = _launch(fn, world_size, Fault(dies, step), _draw(world_size, fresh_seed(None)))
    lines = [f"{world_size} ranks, rank {dies} dies in step {step}'s all-reduce"]
    lines.append("rank  step  size of the group returned  first parameters after the step")
    for rank in range(world_size):
        if rank in result.failures:
            said = "died, as planned" if rank == dies else str(result.failures[rank])
            lines.append(f"{rank:>4}  {said}")
            continue
        for i, (params, size) in enumerate(result.results[rank]):
            first = ", ".join(f"{v:+.4f}" for v in params[:3].tolist())
            lines.append(f"{rank:>4}  {i:>4}  {size:>26}  {first}")
    return "\n".join(lines)


def oracle(start: torch.Tensor, batches: list, fault: Fault) -> list[torch.Tensor]:
    """Each step's parameters in one process: SGD on the mean gradient of the ranks of that
    step (every rank before ``fault.step``, the others from it on)."""
    n = len(batches)
    params, out = start.clone(), []
    for step in range(STEPS):
        ranks = _ranks_of(step, n, fault)
        grads = [_grad(params, *batches[r][step]) for r in ranks]
        params = params - LR * torch.stack(grads).sum(0) / len(ranks)
        out.append(params)
    return out


def _ranks_of(step: int, n: int, fault: Fault) -> list[int]:
    """The ranks whose gradients step ``step`` averages: all before the death, then the rest."""
    return [r for r in range(n) if step < fault.step or r != fault.rank]


def _grad(params: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    model = toy_model(0, WIDTH, DEPTH)
    nn.utils.vector_to_parameters(params, model.parameters())
    nn.functional.mse_loss(model(x), y).backward()
    return nn.utils.parameters_to_vector(p.grad for p in model.parameters())


def _draw(n: int, seed: int) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    g = torch.Generator().manual_seed(seed)
    return [
        [(torch.randn(BATCH, WIDTH, generator=g), torch.randn(BATCH, WIDTH, generator=g))
         for _ in range(STEPS)]
        for _ in range(n)
    ]  # fmt: skip


def _launch(fn: Callable, n: int, fault: Fault, batches: list) -> Any:
    """``STEPS`` steps of ``fn`` on ``n`` ranks, rank ``fault.rank`` dying in step
    ``fault.step``: under grading the relay's plan kills it, told to no rank (and the relay
    keeps the launcher's timeout: it fails the dead rank's peers at once); in a notebook the
    rank's own harness ends its process, and gloo's timeout is ``PG_TIMEOUT``."""
    from course.ranks import PerRank, launch

    graded = confined.current() is not None
    return launch(
        _train, n, fn, PerRank(batches), None if graded else fault,
        timeout=LAUNCH_TIMEOUT, pg_timeout=None if graded else PG_TIMEOUT, grace=LAUNCH_TIMEOUT,
        fault=fault if graded else None,
    )  # fmt: skip


def _check_case(fn: Callable, n: int, fault: Fault, seed: int) -> None:
    batches = _draw(n, seed)
    result = _launch(fn, n, fault, batches)
    doing = f" (rank {fault.rank} dying in step {fault.step})"
    planned = result.failures.get(fault.rank)
    died = planned is not None and planned.kind in ("killed", "exited")
    others = {r: f for r, f in result.failures.items() if r != fault.rank or not died}
    if others:
        hint = (
            f"Rank {fault.rank} died in step {fault.step}'s all-reduce, as the check planned, so "
            "the others' all-reduce raised: catch that error (a RuntimeError) and finish the "
            "step over the ranks left; any later call on a group that holds the dead rank "
            "fails too."
        )
        others = {r: _raised(f) for r, f in others.items()}
        raise AssertionError(failure_message(NAME, n, others, doing, deadlock_hint=hint))
    if not died:
        raise AssertionError(
            f"{NAME} on {n} ranks: rank {fault.rank} was to die in step {fault.step}'s "
            "all-reduce of every rank, and it made none: each step all-reduces the gradients "
            f"of every rank in `group` (dist.all_reduce). {RULE}"
        )
    start = nn.utils.parameters_to_vector(toy_model(0, WIDTH, DEPTH).parameters()).detach()
    want = oracle(start, batches, fault)
    for rank in range(n):
        if rank == fault.rank:
            continue
        got = [params for params, _size in result.results[rank]]
        for step in range(STEPS):
            if _close(got[step], want[step]):
                continue
            before = start if step == 0 else want[step - 1]
            hint = _hint(got[step], before, batches, fault, step, rank, n)
            raise AssertionError(
                f"{NAME} on {n} ranks{doing}: rank {rank}'s parameters after step {step} are "
                f"wrong{hint}. {RULE}"
            )
        _judge_groups(result.results[rank], rank, n, fault, doing)


def _judge_groups(steps: list, rank: int, n: int, fault: Fault, doing: str) -> None:
    """Each step returns the group of the ranks in the next: all, then the ranks left."""
    for step, (_params, size) in enumerate(steps):
        want = len(_ranks_of(step, n, fault))
        if size != want:
            said = "no process group" if size == -1 else f"a group of {size} ranks"
            raise AssertionError(
                f"{NAME} on {n} ranks{doing}: rank {rank}'s step {step} returned {said}, and "
                f"{want} ranks were left: return the group the next step all-reduces in (after "
                "the death, the ranks left; an all-reduce in the old group fails again, every "
                "step, and on gloo may wait out its timeout first)."
            )


def _raised(failure: RankFailure) -> RankFailure:
    """A survivor that raised because the planned rank died, said as such (the launcher calls
    a rank that failed after another "blocked")."""
    said = failure.traceback.strip().splitlines()[-1:] or [""]
    error = said[0].split(": ", 1)[-1]
    if failure.kind != "blocked" or not error:
        return failure
    error = error if len(error) <= 120 else error[:117] + "..."
    where = f" in {failure.where}" if failure.where else ""
    return replace(failure, message=f"raised{where}: {error}")


def _close(got: Any, want: torch.Tensor) -> bool:
    return (
        isinstance(got, torch.Tensor)
        and got.shape == want.shape
        and torch.allclose(got, want, rtol=1e-5, atol=1e-6)
    )


def _hint(
    got: Any, before: torch.Tensor, batches: list, fault: Fault, step: int, rank: int, n: int
) -> str:
    """What a wrong step is instead, where it is a usual mistake."""
    if not isinstance(got, torch.Tensor):
        return ""
    ranks = _ranks_of(step, n, fault)
    grads = torch.stack([_grad(before, *batches[r][step]) for r in ranks]).sum(0)
    mistakes = {
        "unchanged: the step was skipped, not finished over the ranks left": before,
        f"a step on the survivors' gradients divided by {n}, the world size the job started "
        f"with, not by the {len(ranks)} ranks left": before - LR * grads / n,
        "a step on this rank's own gradient only (all-reduce it)": before
        - LR * _grad(before, *batches[rank][step]),
        "a step on the survivors' gradients summed, not averaged": before - LR * grads,
    }
    for why, value in mistakes.items():
        if _close(got, value):
            return f": it is {why}"
    if step == fault.step:
        return (
            ": it is not the mean gradient of the ranks left. A failed all-reduce leaves its "
            "buffer partly summed: all-reduce again the copy you kept, not that buffer"
        )
    return ""


# --- the rank side ---------------------------------------------------------------------


def _train(fn: Callable, batches: list, fault: Fault | None) -> list[tuple[torch.Tensor, int]]:
    """On each rank: ``STEPS`` steps of ``fn``; the parameters after each, and the size of the
    group it returned (-1 for what is no group). ``fault``: in a notebook only, the rank that
    ends its process in its first all-reduce of every rank in that step (as the relay's plan
    kills it under grading)."""
    model = toy_model(0, WIDTH, DEPTH)
    group: Any = dist.group.WORLD
    lighthouse = Lighthouse()
    out = []
    for step, (x, y) in enumerate(batches):
        relay.mark(step)
        dying = fault is not None and step == fault.step
        with _the_step_all_reduce(fault.rank, lighthouse) if dying else contextlib.nullcontext():  # type: ignore[union-attr]
            group = fn(model, x, y, LR, group, lighthouse)
        is_group = group is None or isinstance(group, dist.ProcessGroup)
        size = dist.get_world_size(group) if is_group else -1
        out.append((nn.utils.parameters_to_vector(model.parameters()).detach(), size))
    return out


@contextlib.contextmanager
def _the_step_all_reduce(dies: int, lighthouse: Lighthouse) -> Iterator[None]:
    """The notebook's fault: in this step's first all-reduce of every rank
    (``dist.all_reduce`` or ``dist.all_reduce_coalesced``), each rank counts itself in, in the
    store, and rank ``dies`` ends its process once the others are in theirs."""
    real = {name: getattr(dist, name) for name in ("all_reduce", "all_reduce_coalesced")}
    rank, world = dist.get_rank(), dist.get_world_size()

    def entering(name: str) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            group = kwargs.get("group", args[2] if len(args) > 2 else None)
            if dist.get_world_size(group) == world:
                for n, f in real.items():
                    setattr(dist, n, f)
                if rank == dies:
                    _die(lighthouse, world - 1)
                _store().add("entered", 1)
            return real[name](*args, **kwargs)

        return call

    for name in real:
        setattr(dist, name, entering(name))
    try:
        yield
    finally:
        for name, f in real.items():
            setattr(dist, name, f)


def _die(lighthouse: Lighthouse, others: int) -> None:
    """End this process once the others are in their all-reduce (or after a while)."""
    end = time.monotonic() + PG_TIMEOUT
    while _store().add("entered", 0) < others and time.monotonic() < end:
        time.sleep(QUORUM_POLL)
    time.sleep(0.1)  # in the C++ call by now: their ring has begun
    lighthouse.mark_gone()
    os._exit(1)
