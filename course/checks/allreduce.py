"""Grade an all-reduce built from point-to-point calls: right sums, and the algorithm's pattern.

    report = check_p2p_allreduce(RING, ring_allreduce, (2, 3, 4), sums=True, pattern=True)

One grading path for every such exercise (the ring, recursive doubling); an :class:`Exercise`
says what differs: its name, how a recorded run is judged, the hint for a deadlock. The
student's function runs on fresh ranks (``course.ranks``) on many tensors per launch (sizes
divisible by N and not, smaller than N, a single element; float32, float64, int32, int64;
1-D to 3-D shapes). The verdict is computed here, in the caller, from the tensors the ranks
send back, against a float64 sum of the inputs made here: nothing the student's code or
kernel state can change. The pattern is judged from a recorded run on encoded inputs: under
grading, from the relay's own record of every message, on inputs whose encoding no rank
knows (``course.ring.relayed``); in a notebook, from the recorder on the ranks
(``course.ring.recorder``). Every launch has a deadline, so a deadlock or an endless loop
fails within seconds.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from course.checks.compare import fresh_seed
from course.checks.ring_cases import (
    DTYPES,
    Case,
    collectives_called,
    compare,
    pattern_cases,
    refuse_collectives,
    refuse_the_reference,
    relayed_case,
    running_case,
    sum_cases,
)
from course.checks.ring_cases import inputs as make_inputs
from course.checks.ring_hints import ring_hints
from course.checks.teaching import failure_message, need_function, world_sizes_of
from course.ranks import confined, relay
from course.ranks.wording import count, world_sizes_text
from course.ring.encoding import encoded_tensor
from course.ring.logs import log_path, open_log, read_trace
from course.ring.recorder import Recorder, scratch_dir
from course.ring.relayed import SecretEncoding
from course.ring.trace import Trace
from course.ring.verdict import Violation

__all__ = [
    "LAUNCH_TIMEOUT",
    "SHOWN",
    "Exercise",
    "Report",
    "check_p2p_allreduce",
    "trace_collectives",
]

LAUNCH_TIMEOUT = 10.0  # seconds per world size, start-up included: a gloo deadlock costs this
SHOWN = 4  # violations quoted in a failure message


@dataclass(frozen=True)
class Exercise:
    """What one point-to-point all-reduce exercise is graded against."""

    name: str  # the student's function, as the messages name it
    algorithm: str  # "a ring all-reduce": what the pattern must be
    pattern_noun: str  # "a ring pattern": what a passing report says it saw
    violations: Callable[[Trace], list[Violation]]  # how a recorded run departs from it
    plan: str  # the closing line of a pattern failure: the algorithm in one sentence
    deadlock_hint: str  # what to look at when every rank waited
    partial: Callable[[int, int, tuple[int, ...]], str] | None = None  # a sum of too few ranks


@dataclass(frozen=True)
class Report:
    """What a passing check covered; ``str()`` is a one-paragraph summary."""

    world_sizes: tuple[int, ...]
    sums_checked: int  # (world size, tensor) pairs whose sums matched on every rank
    patterns_checked: int  # recorded runs that had the algorithm's pattern
    dtypes: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    name: str = "ring_allreduce"
    pattern_noun: str = "a ring pattern"

    def __str__(self) -> str:
        sizes = world_sizes_text(self.world_sizes)
        parts = []
        if self.sums_checked:
            parts.append(
                f"correct in-place sums for {self.sums_checked} tensors on {sizes} "
                f"({', '.join(self.dtypes)}; shapes such as "
                f"{', '.join(str(s) for s in self.shapes[:4])})"
            )
        if self.patterns_checked:
            parts.append(f"{self.pattern_noun} in {self.patterns_checked} recorded runs on {sizes}")
        return f"{self.name} passed: " + "; ".join(parts) + "."


# --- the rank side ---------------------------------------------------------------------


def _run_cases(
    fn: Callable[[torch.Tensor], Any],
    cases: Sequence[Case],
    mine: Sequence[torch.Tensor | None],
    directory: str,
) -> list[tuple[torch.Tensor, str | None, list[str]]]:
    """On each rank: call ``fn`` on this rank's own tensor per case (``mine``); return
    (tensor, returned type, collectives it called)."""
    rank = dist.get_rank()
    refuse_the_reference()
    out = []
    with open_log(log_path(directory, rank, "progress")) as progress:
        for i, case in enumerate(cases):
            relay.mark(i)  # under grading: where case i starts, in the relay's record
            progress.write(json.dumps({"case": i}) + "\n")
            out.append(_run_case(fn, case, mine[i], directory, i, rank))
            progress.write(json.dumps({"done": i}) + "\n")
    return out


def _run_case(
    fn: Callable, case: Case, mine: Any, directory: str, i: int, rank: int
) -> tuple[torch.Tensor, str | None, list[str]]:
    if not case.recorded:
        tensor = mine.clone()
        with Recorder() as seen:  # the sums count only when no collective computed them
            returned = _call(fn, tensor)
        return tensor, returned, collectives_called(seen)
    if mine is not None:  # under grading: the relay records, the caller decodes
        tensor = mine.clone()
        return tensor, _call(fn, tensor), []
    tensor = encoded_tensor(rank, case.shape[0], dist.get_world_size())
    with Recorder(log_path(directory, rank, f"case{i}")):
        returned = _call(fn, tensor)
    return tensor, returned, []


def _call(fn: Callable, tensor: torch.Tensor) -> str | None:
    returned = fn(tensor)
    return None if returned is None else type(returned).__name__


# --- the caller side -------------------------------------------------------------------


def check_p2p_allreduce(
    exercise: Exercise,
    fn: Callable[[torch.Tensor], Any],
    world_sizes: Sequence[int],
    *,
    sums: bool,
    pattern: bool,
) -> Report:
    """Run ``fn`` on every world size; fail with a message that teaches, or say what passed."""
    need_function(exercise.name, fn)
    world_sizes = world_sizes_of(world_sizes)
    n_sums = n_patterns = 0
    shapes: dict[tuple[int, ...], None] = {}
    for world_size in world_sizes:
        cases = (sum_cases(world_size) if sums else []) + (
            pattern_cases(world_size) if pattern else []
        )
        relayed = confined.current() is not None  # graded: the relay carries every message
        secret = [SecretEncoding.draw(world_size) for _ in cases]
        inputs = [
            _recorded_inputs(secret[i], c, world_size, relayed)
            if c.recorded
            else make_inputs(c, world_size, seed=fresh_seed(None))
            for i, c in enumerate(cases)
        ]
        with scratch_dir() as directory:
            result = _launch(exercise, fn, world_size, cases, inputs, directory)
            for i, case in enumerate(cases):
                got = [r[i] for r in result.results]
                trace = (
                    relayed_case(exercise.name, result, world_size, case, secret[i], i)
                    if relayed
                    else None
                )
                if case.recorded:
                    trace = trace or read_trace(
                        directory, world_size, case.shape[0], 8, tag=f"case{i}"
                    )
                    _judge_pattern(exercise, world_size, case, trace)
                    n_patterns += 1
                else:
                    if trace:
                        refuse_collectives(exercise.name, [trace_collectives(trace)])
                    _judge_sums(exercise, world_size, case, inputs[i], got)
                    n_sums += 1
                    shapes[case.shape] = None
    dtypes = tuple(str(d).removeprefix("torch.") for d in DTYPES) if sums else ("float64",)
    return Report(
        world_sizes, n_sums, n_patterns, dtypes, tuple(shapes), exercise.name, exercise.pattern_noun
    )


def _launch(
    exercise: Exercise,
    fn: Callable,
    world_size: int,
    cases: list[Case],
    inputs: list,
    directory: str,
) -> Any:
    from course.ranks import PerRank, launch

    mine = PerRank(  # each rank is sent its own inputs only
        [None if inputs[i] is None else inputs[i][r] for i in range(len(cases))]
        for r in range(world_size)
    )
    result = launch(_run_cases, world_size, fn, cases, mine, directory, timeout=LAUNCH_TIMEOUT)
    if result.ok:
        return result
    raise AssertionError(_failure_message(exercise, world_size, cases, result, directory))


def _recorded_inputs(
    secret: SecretEncoding, case: Case, world_size: int, relayed: bool
) -> list[torch.Tensor] | None:
    """A recorded case's inputs: made here, each rank's own, when the relay records; else the
    ranks encode their own (the notebook's recorder decodes the fixed encoding)."""
    if not relayed:
        return None
    return [secret.tensor(r, case.shape[0]) for r in range(world_size)]


def _failure_message(
    exercise: Exercise, world_size: int, cases: list[Case], result: Any, directory: str
) -> str:
    """Which case was running, what each rank did, and the cause's own traceback."""
    failures, relayed = result.failures, result.relayed
    running = {r: running_case(directory, r, len(cases), relayed) for r in range(world_size)}
    case_index = min((i for i in running.values() if i is not None), default=None)
    doing = f" while summing {cases[case_index]}" if case_index is not None else ""
    return failure_message(exercise.name, world_size, failures, doing, exercise.deadlock_hint)


def trace_collectives(trace: Trace) -> list[str]:
    """The data-moving collectives any rank called in a traced case."""
    return sorted({name for _, name in trace.collectives} - {"barrier"})


def _judge_sums(
    exercise: Exercise, world_size: int, case: Case, inputs: list[torch.Tensor], got: list
) -> None:
    """Every rank's tensor equals the float64 sum of the inputs (exactly for integers), and
    no collective computed it."""
    name = exercise.name
    refuse_collectives(name, [r[2] for r in got])
    expected64 = torch.stack([t.to(torch.float64) for t in inputs]).sum(0)
    expected = expected64.to(case.dtype)
    tensors = [t for t, _, _ in got]
    for rank, (tensor, returned, _) in enumerate(got):
        problem = compare(tensor, expected, case)
        if problem is None:
            continue
        head = f"{name} gave a wrong result on {world_size} ranks for {case}, rank {rank}:"
        hints = ring_hints(tensors, inputs, expected, case, rank, returned, exercise.partial)
        raise AssertionError("\n".join([head, "  " + problem, *hints]))


def _judge_pattern(exercise: Exercise, world_size: int, case: Case, trace: Trace) -> None:
    """The recorded run has the exercise's pattern: its ``violations`` finds nothing."""
    found = exercise.violations(trace)
    if not found:
        return
    lines = [
        (
            f"{exercise.name} is not {exercise.algorithm} on {world_size} ranks "
            f"(tensor of {count(case.shape[0], 'element')}, recorded):"
        )
    ]
    lines += [f"  {v}" for v in found[:SHOWN]]
    if len(found) > SHOWN:
        lines.append(f"  ... and {len(found) - SHOWN} more")
    lines.append(exercise.plan)
    raise AssertionError("\n".join(lines))
