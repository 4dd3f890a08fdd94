"""What each FSDP step must send: per unit two all-gathers and one reduce-scatter, nothing else.

The verdict is made here, in the caller, from each step's calls per rank: under grading the
relay's own record of the step (:func:`course.ring.relayed.relayed_calls` between the
rank's marks), in a notebook what the rank's recorder saw. Per step and unit of P managed
elements, on N ranks with shards of s = ceil(P / N): an all-gather that each rank puts s
elements into in the forward and again in the backward, and a reduce-scatter of the N*s
padded gradient; in ``param_dtype`` and ``reduce_dtype`` bytes under mixed precision.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from course.checks.teaching import read_record
from course.lessons.fsdp.model import Unit
from course.ranks.wording import count
from course.ring.relayed import relayed_calls

__all__ = ["Step", "expected_step", "rank_steps", "traffic_problem"]

Step = Counter  # (kind, elements, bytes per element) -> calls, one rank's step
KINDS = ("all_gather", "reduce_scatter", "all_reduce", "broadcast", "all_to_all", "barrier")
REDUCE_SCATTER_ONLY = (
    "after backward each unit's gradient is reduce-scattered (dist.reduce_scatter_single), "
    "once, so each rank gets its shard of the mean: nothing else moves in a step"
)


def kind_of(name: str) -> str:
    """The verdict's name for a recorded call (all_gather_into_tensor: all_gather)."""
    name = {"allgather": "all_gather", "allreduce": "all_reduce", "alltoall": "all_to_all"}.get(
        name, name
    )
    return next((k for k in KINDS if name.startswith(k)), name)


def expected_step(units: Sequence[Unit], n: int, gather: int, reduce: int) -> Step:
    """One rank's calls in one step: ``gather``/``reduce`` are bytes per element."""
    want: Step = Counter()
    for u in units:
        s = u.padded(n)
        want["all_gather", s, gather] += 2
        want["reduce_scatter", n * s, reduce] += 1
    return want


def rank_steps(
    relayed: Sequence[Any], replies: Sequence[Any], n: int, parts: Sequence[int]
) -> list[list[Step]]:
    """``[rank][step]`` calls: the relay's record when there is one, else the recorders'."""
    if relayed:
        out: list[list[Step]] = [[] for _ in range(n)]
        for p in parts:
            calls = read_record("the run", "step by step", relayed_calls, relayed, n, p)
            for rank in range(n):
                out[rank].append(_step_of(calls, rank))
        return out
    try:
        return [[_reported(step) for step in reply] for reply in replies]
    except (TypeError, ValueError):
        raise AssertionError("the ranks' record of their calls cannot be read: rerun") from None


def _step_of(calls: Sequence[Any], rank: int) -> Step:
    step: Step = Counter()
    for c in calls:
        if rank not in c.group:
            continue
        if c.kind == "send":
            if c.group[0] == rank:
                step["send", c.nbytes[0], 1] += 1
            continue
        size = max(c.itemsize, 1)
        step[kind_of(c.kind), c.nbytes[c.group.index(rank)] // size, size] += 1
    return step


def _reported(calls: Sequence[Any]) -> Step:
    step: Step = Counter()
    for name, put_in, itemsize in calls:
        step[kind_of(str(name)), int(put_in) // max(int(itemsize), 1), int(itemsize)] += 1
    return step


def _names(units: Sequence[Unit], n: int, elements: int) -> str:
    """Which units a gather or reduce-scatter of ``elements`` per rank belongs to."""
    gathers = [u.name for u in units if u.padded(n) == elements]
    scatters = [u.name for u in units if n * u.padded(n) == elements]
    named = gathers or scatters
    if named:
        return f" ({' or '.join(dict.fromkeys(named))})"
    total = sum(u.padded(n) for u in units)
    return " (the whole model at once)" if elements in (total, n * total) else ""


def traffic_problem(got: Step, want: Step, units: Sequence[Unit], n: int) -> str | None:
    """What is wrong with one rank's step, in words; None if it is what FSDP sends."""
    if got == want:
        return None
    said = []
    for key in sorted(set(got) | set(want)):
        kind, elements, itemsize = key
        if got[key] != want[key]:
            what = f"{kind} of {count(elements, 'element')} per rank in {itemsize}-byte elements"
            said.append(f"{what}{_names(units, n, elements)}: {got[key]}, expected {want[key]}")
    kinds = {k for k, *_ in got}
    if kinds - {"all_gather", "reduce_scatter"}:
        extra = ", ".join(sorted(kinds - {"all_gather", "reduce_scatter"}))
        hint = f"it called {extra}: {REDUCE_SCATTER_ONLY}"
    elif _per_unit(got, "all_gather", units, n) == 1:
        hint = (
            "one all-gather per unit: the forward's parameters were kept for the backward. "
            "Free them after the unit's forward, and gather again before its backward "
            "(register_full_backward_pre_hook)"
        )
    elif any(k == "all_gather" and s not in {u.padded(n) for u in units} for k, s, _ in got):
        hint = "gather each unit's own flat shard in that unit's forward, not more nor less"
    elif {i for k, _, i in got if k == "all_gather"} != {
        i for k, _, i in want if k == "all_gather"
    }:
        hint = "the all-gather moves param_dtype bytes: cast the shard before gathering"
    elif {i for k, _, i in got if k == "reduce_scatter"} != {
        i for k, _, i in want if k == "reduce_scatter"
    }:
        hint = "the reduce-scatter runs in reduce_dtype: cast the gradient to it first"
    else:
        hint = "per step and unit: 2 all-gathers (forward, backward) and 1 reduce-scatter"
    return "; ".join(said) + f". {hint}."


def _per_unit(got: Step, kind: str, units: Sequence[Unit], n: int) -> float:
    calls = sum(
        v for (k, s, _), v in got.items() if k == kind and s in {u.padded(n) for u in units}
    )
    return calls / max(len(units), 1)
