"""One FSDP training step as plain data: the events in order and what each rank holds after each.

    from course.lessons.fsdp.schedule import fsdp_schedule
    s = fsdp_schedule(units=3, world_size=4, reshard_after_forward=True, prefetch=False)
    s.events[0]        # Event("all-gather", 0, "forward")
    s.peak()           # the most parameter memory a rank holds, as a fraction of the model

Forward: for each unit, all-gather its parameters (every rank's shard goes to every rank),
compute, free them (unless ``reshard_after_forward=False``). Backward, units in reverse:
all-gather again (if freed), compute the gradient, reduce-scatter it (each rank keeps its shard
of the mean over ranks), free the full parameters and the full gradient. With ``prefetch`` the
next unit's all-gather is issued before the current unit computes. As in PyTorch's FSDP
(https://pytorch.org/docs/stable/distributed.fsdp.fully_shard.html) and Zhao et al.,
"PyTorch FSDP: Experiences on Scaling Fully Sharded Data Parallel" (VLDB 2023). Memory counts
parameters and gradients only (no activations, no optimizer state), in units of the model size:
the kept shard is a buffer of its own, so a gathered unit adds its whole size.

:func:`schedule_from_trace` builds the same picture from the order of collectives a real run
made (``course.ring.recorder``'s ``Collective`` records, or ``(op, size)`` pairs). Pure: no
torch, no plotly.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

__all__ = [
    "Event",
    "Schedule",
    "UnitState",
    "calls_from_trace",
    "fsdp_schedule",
    "map_calls",
    "schedule_from_calls",
    "schedule_from_trace",
    "unit_sizes",
]

Kind = Literal["all-gather", "compute", "reduce-scatter", "free"]
Phase = Literal["forward", "backward"]


@dataclass(frozen=True, slots=True)
class Event:
    """One thing that happens to one unit: a collective, its compute, or freeing its buffers."""

    kind: Kind
    unit: int
    phase: Phase
    prefetch: bool = False  # an all-gather issued early, while the unit before it computes


@dataclass(frozen=True, slots=True)
class UnitState:
    """What every rank holds of one unit (ranks are alike): parameters and gradient."""

    params: Literal["shard", "full"] = "shard"  # the own shard always; "full": gathered too
    grad: Literal["none", "full", "shard"] = "none"  # "shard": its shard of the mean


@dataclass(frozen=True)
class Schedule:
    """One step's events, and after each what is resident (index 0: before the step)."""

    world_size: int
    sizes: tuple[float, ...]  # each unit's share of the model (they sum to 1)
    events: tuple[Event, ...]
    reshard_after_forward: bool = True
    prefetch: bool = False
    notes: tuple[str, ...] = ()  # calls of a recorded run that map onto no unit
    states: tuple[tuple[UnitState, ...], ...] = field(init=False)

    def __post_init__(self) -> None:
        now = tuple(UnitState() for _ in self.sizes)
        states = [now]
        for e in self.events:
            now = (*now[: e.unit], _after(now[e.unit], e), *now[e.unit + 1 :])
            states.append(now)
        object.__setattr__(self, "states", tuple(states))

    @property
    def units(self) -> int:
        """How many units the model is cut into."""
        return len(self.sizes)

    def memory(self, frame: int) -> tuple[float, float]:
        """Parameters and gradients one rank holds after ``frame`` events (x model size)."""
        n, params, grads = self.world_size, 0.0, 0.0
        for size, state in zip(self.sizes, self.states[frame], strict=True):
            params += size / n + (size if state.params == "full" else 0.0)
            grads += {"none": 0.0, "full": size, "shard": size / n}[state.grad]
        return params, grads

    def peak(self, with_grads: bool = False) -> float:
        """The most memory one rank holds during the step (x model size)."""
        return max(
            p + (g if with_grads else 0.0) for p, g in map(self.memory, range(len(self.states)))
        )

    def gathers(self, unit: int) -> int:
        """How many times ``unit`` is all-gathered in the step."""
        return sum(e.kind == "all-gather" and e.unit == unit for e in self.events)


def _after(state: UnitState, e: Event) -> UnitState:
    if e.kind == "all-gather":
        return replace(state, params="full")
    if e.kind == "compute" and e.phase == "backward":
        return replace(state, grad="full")
    if e.kind == "reduce-scatter":
        return replace(state, grad="shard")
    if e.kind == "free":
        return replace(state, params="shard")
    return state


def unit_sizes(units: int | Sequence[float]) -> tuple[float, ...]:
    """Each unit's share of the model: ``units`` equal ones, or shares of the sizes given."""
    sizes = [1.0] * units if isinstance(units, int) else [float(s) for s in units]
    if not sizes or any(s <= 0 for s in sizes):
        raise ValueError(f"units: a positive count or positive sizes, got {units!r}")
    total = sum(sizes)
    return tuple(s / total for s in sizes)


def fsdp_schedule(
    units: int | Sequence[float] = 3,
    world_size: int = 4,
    reshard_after_forward: bool = True,
    prefetch: bool = False,
) -> Schedule:
    """The events of one FSDP step for ``units`` units (a count, or their sizes) on N ranks."""
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")
    sizes = unit_sizes(units)
    events = _forward(len(sizes), reshard_after_forward, prefetch)
    events += _backward(len(sizes), reshard_after_forward, prefetch)
    return Schedule(world_size, sizes, tuple(events), reshard_after_forward, prefetch)


def _forward(units: int, reshard: bool, prefetch: bool) -> list[Event]:
    """Gather, compute, free each unit in turn; a prefetched gather comes one unit early."""
    events = [Event("all-gather", 0, "forward")]
    for k in range(units):
        if k + 1 < units and prefetch:
            events.append(Event("all-gather", k + 1, "forward", prefetch=True))
        events.append(Event("compute", k, "forward"))
        if reshard:
            events.append(Event("free", k, "forward"))
        if k + 1 < units and not prefetch:
            events.append(Event("all-gather", k + 1, "forward"))
    return events


def _backward(units: int, reshard: bool, prefetch: bool) -> list[Event]:
    """Last unit first: gather again (if freed), compute the gradient, reduce-scatter, free."""
    events = [Event("all-gather", units - 1, "backward")] if reshard else []
    for k in reversed(range(units)):
        if k > 0 and reshard and prefetch:
            events.append(Event("all-gather", k - 1, "backward", prefetch=True))
        events += [Event(kind, k, "backward") for kind in ("compute", "reduce-scatter", "free")]
        if k > 0 and reshard and not prefetch:
            events.append(Event("all-gather", k - 1, "backward"))
    return events


# --- a recorded run: its collectives, mapped onto the units by size -----------------------

Call = tuple[str, int]  # ("all-gather" or "reduce-scatter", elements of the whole unit)


def _op(name: str) -> str | None:
    if name.replace("-", "_").startswith("all_gather"):
        return "all-gather"
    if name.replace("-", "_").startswith("reduce_scatter"):
        return "reduce-scatter"
    return None


def calls_from_trace(collectives: Iterable[object], world_size: int) -> list[Call]:
    """One rank's all-gathers and reduce-scatters as ``(op, elements of the whole unit)``.

    Takes the recorder's ``Collective`` records (``name``, ``numel``: every tensor passed,
    inputs and outputs, so (N+1) x shard for both collectives) or ``(op, numel)`` pairs that
    already give the whole unit's elements. Other collectives (a barrier) are left out.
    """
    calls = []
    for c in collectives:
        if isinstance(c, tuple):
            name, numel = c
        else:
            name, numel = c.name, c.numel * world_size // (world_size + 1)  # type: ignore[attr-defined]
        op = _op(str(name))
        if op is not None:
            calls.append((op, int(numel)))
    return calls


def map_calls(
    calls: Sequence[Call], unit_numels: Sequence[int], world_size: int
) -> tuple[list[tuple[str, int, Phase]], list[str]]:
    """Each call's unit and phase, by its size (padded to N x shard or not) and the step's
    order: forward gathers go first to last, backward gathers and reduce-scatters last to
    first; units of equal size are told apart by that order alone. Returns the mapped calls
    and one note for each call that fits no unit."""
    padded = [world_size * math.ceil(p / world_size) for p in unit_numels]
    forward, backward, reduced = set(), set(), set()
    mapped: list[tuple[str, int, Phase]] = []
    notes = []
    for i, (op, numel) in enumerate(calls):
        fits = [u for u, p in enumerate(unit_numels) if numel in (p, padded[u])]
        if op == "all-gather":
            fresh = [u for u in fits if u not in forward]
            again = [u for u in fits if u not in backward and u not in reduced]
            pick = (min(fresh), "forward") if fresh else (max(again), "backward") if again else None
        else:
            left = [u for u in fits if u not in reduced]
            ready = [u for u in left if u in backward] or left
            pick = (max(ready), "backward") if ready else None
        if pick is None:
            done = (
                "gathered for its forward and its backward"
                if op == "all-gather"
                else ("reduce-scattered")
            )
            why = "no unit has that size" if not fits else f"every unit of that size was {done}"
            notes.append(f"call {i + 1}: {op} of {numel:,} elements: {why}")
            continue
        unit, phase = pick
        (reduced if op == "reduce-scatter" else forward if phase == "forward" else backward).add(
            unit
        )
        mapped.append((op, unit, phase))
    return mapped, notes


def schedule_from_calls(
    mapped: Sequence[tuple[str, int, Phase]],
    sizes: Sequence[float],
    world_size: int,
    notes: Sequence[str] = (),
) -> Schedule:
    """The step a run's mapped collectives imply: a unit computes right after its forward
    gather and is freed then if it is gathered again later; a backward compute comes just
    before its reduce-scatter, and the unit is freed right after. A unit that wraps others
    (the root: its backward gather and its reduce-scatter bracket theirs) stays gathered
    until the forward ends. (Prefetching cannot be told from the order of calls alone: it is
    drawn as if every gather waited for its compute.)"""
    regathered = {u for op, u, phase in mapped if op == "all-gather" and phase == "backward"}
    outer = _wrapping(mapped)
    events: list[Event] = []
    for op, unit, phase in mapped:
        if phase == "backward" and outer:  # the forward has ended: the wrapping units too
            events += [Event("free", u, "forward") for u in sorted(outer) if u in regathered]
            outer = set()
        if op == "all-gather":
            events.append(Event("all-gather", unit, phase))
            if phase == "forward":
                events.append(Event("compute", unit, "forward"))
                if unit in regathered and unit not in outer:
                    events.append(Event("free", unit, "forward"))
        else:
            events += [Event(k, unit, "backward") for k in ("compute", "reduce-scatter", "free")]
    reshard = bool(regathered)
    return Schedule(world_size, unit_sizes(sizes), tuple(events), reshard, False, tuple(notes))


def _wrapping(mapped: Sequence[tuple[str, int, Phase]]) -> set[int]:
    """Units whose backward gather comes before another unit's and whose reduce-scatter
    comes after that unit's: they wrap it (as the root wraps the blocks)."""
    gathered = {
        u: i for i, (op, u, ph) in enumerate(mapped) if op == "all-gather" and ph == "backward"
    }
    reduced = {u: i for i, (op, u, _) in enumerate(mapped) if op == "reduce-scatter"}
    both = [u for u in gathered if u in reduced]
    return {
        u for u in both
        if any(gathered[u] < gathered[v] and reduced[v] < reduced[u] for v in both if v != u)
    }  # fmt: skip


def schedule_from_trace(
    collectives: Iterable[object], unit_numels: Sequence[int], world_size: int
) -> Schedule:
    """The step of a recorded run (one rank's collectives), mapped onto units of these sizes."""
    calls = calls_from_trace(collectives, world_size)
    mapped, notes = map_calls(calls, unit_numels, world_size)
    return schedule_from_calls(mapped, unit_numels, world_size, notes)
