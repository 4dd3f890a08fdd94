"""The cases a ring (or half of one) is graded on, and how a rank's answer is compared.

Each rank's input is made by the checker from a fresh random seed, never by the ranks, and
each rank is sent its own only, so the oracle the verdict compares with cannot be touched or
predicted by the code under test.
"""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass
from typing import Any

import torch

from course.checks.teaching import read_record
from course.ranks.confined import read_rank_file
from course.ranks.wording import count
from course.ring.logs import log_path
from course.ring.relayed import SecretEncoding, relayed_trace
from course.ring.trace import Trace

__all__ = [
    "DTYPES",
    "Case",
    "collectives_called",
    "compare",
    "inputs",
    "pattern_cases",
    "refuse_collectives",
    "refuse_the_reference",
    "relayed_case",
    "running_case",
    "sum_cases",
]

DTYPES = (torch.float32, torch.float64, torch.int32, torch.int64)
# The course's own ring, the instructor's (left out of the student install), refused by name.
REFERENCE = "course.instructor.reference"


@dataclass(frozen=True)
class Case:
    """One call of the student's function: a tensor shape and dtype, or a recorded run."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    recorded: bool = False

    def __str__(self) -> str:
        dtype = str(self.dtype).removeprefix("torch.")
        kind = " (recorded, encoded inputs)" if self.recorded else ""
        return f"a {dtype} tensor of shape {tuple(self.shape)}{kind}"


def sum_cases(world_size: int) -> list[Case]:
    """Tensors for one world size: each shape in two dtypes, every dtype in several shapes."""
    n = world_size
    shapes = [(1,), (n - 1 or 1,), (4 * n,), (4 * n + 3,), (3, n + 1), (2, 3, 5), (5, 1, 7)]
    return [
        Case(shape, DTYPES[(i + k) % len(DTYPES)]) for i, shape in enumerate(shapes) for k in (0, 1)
    ]


def pattern_cases(world_size: int) -> list[Case]:
    """Recorded runs: uneven, fewer elements than ranks, even."""
    n = world_size
    return [Case((numel,), torch.float64, True) for numel in (3 * n + 1, n - 1 or 1, 4 * n)]


def inputs(case: Case, world_size: int, seed: int) -> list[torch.Tensor]:
    """Each rank's input for a sums case, made here so the ranks cannot change the oracle."""
    g = torch.Generator().manual_seed(seed)
    if case.dtype.is_floating_point:
        return [torch.randn(case.shape, generator=g).to(case.dtype) for _ in range(world_size)]
    return [
        torch.randint(-99, 100, case.shape, generator=g, dtype=case.dtype)
        for _ in range(world_size)
    ]


def compare(tensor: Any, expected: torch.Tensor, case: Case) -> str | None:
    """What is wrong with a rank's tensor against the expected one (None: nothing)."""
    if not isinstance(tensor, torch.Tensor):
        return f"the tensor came back as a {type(tensor).__name__}"
    if tensor.shape != expected.shape or tensor.dtype != expected.dtype:
        return (
            f"the tensor changed to shape {tuple(tensor.shape)}, dtype {tensor.dtype}; "
            f"it must keep shape {tuple(expected.shape)}, dtype {expected.dtype}"
        )
    if case.dtype.is_floating_point:
        rtol = 1e-5 if case.dtype == torch.float32 else 1e-12
        wrong = ~torch.isclose(tensor, expected, rtol=rtol, atol=rtol * 10)
    else:
        wrong = tensor != expected
    wrongs = int(wrong.sum())
    if not wrongs:
        return None
    flat = int(wrong.reshape(-1).nonzero()[0])
    index = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), tuple(tensor.shape)))
    return (
        f"{wrongs} of {count(tensor.numel(), 'element')} wrong; the first at index {list(index)}: "
        f"expected {expected.reshape(-1)[flat].item()}, got {tensor.reshape(-1)[flat].item()}"
    )


def collectives_called(recorder: Any) -> list[str]:
    """The collectives a recorded call made (``barrier`` aside: it moves no data)."""
    return sorted({c.name for c in recorder.collectives} - {"barrier"})


def relayed_case(
    name: str, result: Any, world_size: int, case: Case, secret: SecretEncoding, i: int
) -> Trace:
    """Case ``i`` of a run as the relay saw it (under grading); a record that cannot be split
    into cases fails the check."""
    run = f"{name}'s run on {world_size} ranks"
    args = (result.relayed, world_size, case.shape[0], secret, i)
    return read_record(run, "case by case", relayed_trace, *args)


def refuse_collectives(name: str, called: list[list[str]]) -> None:
    """Fail, earning nothing, when any rank computed with a collective."""
    names = sorted({n for rank in called for n in rank})
    if names:
        raise AssertionError(
            f"{name} called {', '.join(f'dist.{n}' for n in names)}, a collective: this "
            "exercise is to build it from point-to-point calls only (dist.send, recv, isend, "
            "irecv), so a result a collective computed earns none of its points."
        )


def refuse_the_reference() -> None:
    """On a rank, make the course's own ring fail where it exists: the student's ring is checked.

    Only the instructor's install has it, and graded ranks see it blank
    (``course.grading.rankbox.HIDDEN``).
    """
    try:
        reference = importlib.import_module(REFERENCE)
    except ImportError:
        return

    def refuse(*_args: Any) -> None:
        raise AssertionError(
            "this calls the course's reference course.instructor.reference.ring_allreduce: "
            "the exercise is to write the ring yourself, with dist.isend/irecv/send/recv"
        )

    reference._ring = refuse  # noqa: SLF001 - the reference's one entry point, refused while grading


def running_case(directory: str, rank: int, count: int, relayed: tuple = ()) -> int | None:
    """The case (of ``count``) a rank had started but not finished, from its progress log;
    under grading (``relayed``: the relay's record), the last case it marked, as the
    progress log is then the rank's own (``course.ranks.isolation``)."""
    current = None
    if relayed:
        mine = [e for e in relayed if e.kind == "mark" and e.src == rank]
        current = max(mine, key=lambda e: e.seq).tag if mine else None
    else:
        try:
            for line in read_rank_file(str(log_path(directory, rank, "progress"))).splitlines():
                entry = json.loads(line)
                current = entry.get("case", current if "done" not in entry else None)
        except (FileNotFoundError, ValueError, AttributeError, RecursionError):
            pass
    ok = isinstance(current, int) and not isinstance(current, bool) and 0 <= current < count
    return current if ok else None
