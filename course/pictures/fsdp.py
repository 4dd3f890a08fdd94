"""One FSDP step, drawn: what each rank holds of each unit after each event, and its memory.

    from course.pictures.fsdp import fsdp_figure, fsdp_widget
    fsdp_figure(units=3, world_size=4)                   # plotly frames: animates without a kernel
    fsdp_widget(reshard_after_forward=False)             # the same picture with live controls
    fsdp_widget(trace=recorder.collectives, unit_numels=[...], world_size=4)   # your own run

Left, the grid: a band per rank (its parameters above, its gradients below), a column of N
slots per unit, slot k standing for rank k's shard. Right, the parameters and gradients one
rank holds over the step (ranks are alike), the current event marked. :class:`FsdpView` turns a
:class:`~course.pictures.fsdp_schedule.Schedule` into frames with the interface of
``course.pictures.view.RingView`` (``base``, ``frame``, ``apply``, ``last``), so the ring's
``figures.animation`` plays it and ``course.pictures.fsdp_widget`` drives it live.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import numpy as np
import plotly.graph_objects as go

from course.pictures.figures import animation
from course.pictures.fsdp_layout import CURSOR, GRID, MARK, OUTLINE, OUTLINE_TEXT, fsdp_base
from course.pictures.fsdp_schedule import Event, Schedule, fsdp_schedule, schedule_from_trace
from course.pictures.view import Frame
from course.ranks.wording import count

if TYPE_CHECKING:
    from course.pictures.fsdp_widget import FsdpWidget

__all__ = ["FsdpView", "fsdp_figure", "fsdp_widget", "run_figure", "schedule_figure"]

EMPTY, OWN_SHARD, GATHERED, FULL_GRAD, GRAD_SHARD = range(5)
HOLDS = {
    EMPTY: "not held",
    OWN_SHARD: "its own parameter shard (always kept)",
    GATHERED: "gathered from that rank (freed after use)",
    FULL_GRAD: "full gradient (this rank's, not yet reduced)",
    GRAD_SHARD: "its shard of the mean gradient (kept)",
}


class FsdpView:
    """Per-event drawing data for one FSDP step; shared by the static figure and the widget."""

    def __init__(self, schedule: Schedule, label: str = "reference") -> None:
        self.schedule, self.label = schedule, label
        self.n, self.units = schedule.world_size, schedule.units
        self.last = len(schedule.events)
        self.memory = [schedule.memory(k) for k in range(self.last + 1)]
        self.formulas = True
        self._cache: dict[int, Frame] = {}

    # --- the grid's geometry: slot k of unit u at x = u (N + 1) + k; rank r's rows 3r, 3r+1

    def slot_x(self, unit: int, slot: int) -> int:
        """The x of rank ``slot``'s shard of ``unit`` (a blank column between units)."""
        return unit * (self.n + 1) + slot

    @property
    def width(self) -> int:
        """Columns of the grid, blank ones included."""
        return self.units * (self.n + 1) - 1

    @property
    def height(self) -> int:
        """Rows of the grid: parameters and gradients per rank, a blank row between ranks."""
        return 3 * self.n - 1

    @property
    def heading(self) -> str:
        """What is drawn: whose step, on how many ranks, with which settings."""
        s = self.schedule
        how = (
            f"reshard_after_forward={s.reshard_after_forward}, prefetch={s.prefetch}"
            if self.label == "reference"
            else "collectives in the order the run made them"
        )
        return f"One FSDP step, {self.label}: N = {self.n}, {count(self.units, 'unit')}, {how}"

    def counter(self, step: int) -> str:
        """``event 4 / 21 - forward: all-gather unit 1 (...)``; event 0 is the start."""
        if step == 0:
            return f"event 0 / {self.last} - start: each rank holds only its own shard of each unit"
        return f"event {step} / {self.last} - {describe(self.schedule.events[step - 1])}"

    def frame(self, step: int) -> Frame:
        """The picture after ``step`` events (0 = before the step)."""
        if not 0 <= step <= self.last:
            raise ValueError(f"step must be between 0 and {self.last}, got {step}")
        if step not in self._cache:
            data = {GRID: self._grid(step), CURSOR: self._cursor(step), MARK: self._mark(step)}
            data |= self._outline(step)
            title = f"{self.heading}<br><b>{self.counter(step)}</b>"
            self._cache[step] = Frame(step, data, title, list(self.schedule.notes))
        return self._cache[step]

    def base(self) -> go.Figure:
        """The figure before the step, with every trace the frames update."""
        return fsdp_base(self)

    def apply(self, fig: go.Figure, frame: Frame) -> None:
        """Draw ``frame`` into a figure made by :meth:`base`, in one batch."""
        with fig.batch_update():
            for index, props in frame.data.items():
                fig.data[index].update(props)
            fig.layout.title.text = frame.title

    def cells(self, step: int) -> np.ndarray:
        """What each grid cell holds after ``step`` events (None: the blank gaps)."""
        z = np.full((self.height, self.width), None, dtype=object)
        for u, state in enumerate(self.schedule.states[step]):
            for r in range(self.n):
                for k in range(self.n):
                    x = self.slot_x(u, k)
                    gathered = GATHERED if state.params == "full" else EMPTY
                    z[3 * r, x] = OWN_SHARD if k == r else gathered
                    shard = GRAD_SHARD if state.grad == "shard" and k == r else EMPTY
                    z[3 * r + 1, x] = FULL_GRAD if state.grad == "full" else shard
        return z

    def _grid(self, step: int) -> dict:
        z = self.cells(step)
        text = np.full(z.shape, "", dtype=object)
        for r in range(self.n):
            for u in range(self.units):
                for k in range(self.n):
                    x = self.slot_x(u, k)
                    where = f"rank {r}, unit {u}, slot of rank {k}'s shard"
                    text[3 * r, x] = f"{where}<br>parameters: {HOLDS[z[3 * r, x]]}"
                    text[3 * r + 1, x] = f"{where}<br>gradient: {HOLDS[z[3 * r + 1, x]]}"
        return {"z": z, "text": text}

    def _outline(self, step: int) -> dict[int, dict]:
        """A box round the column of the unit the current event acts on, and its name."""
        if step == 0:
            return {OUTLINE: {"x": [], "y": []}, OUTLINE_TEXT: {"x": [], "y": [], "text": []}}
        e = self.schedule.events[step - 1]
        lo, hi = self.slot_x(e.unit, 0) - 0.5, self.slot_x(e.unit, self.n - 1) + 0.5
        top, bottom = -0.5, self.height - 0.5
        box = {"x": [lo, hi, hi, lo, lo], "y": [top, top, bottom, bottom, top]}
        label = {"x": [(lo + hi) / 2], "y": [bottom + 0.2], "text": [f"<b>{e.kind}</b>"]}
        return {OUTLINE: box, OUTLINE_TEXT: label}

    def _cursor(self, step: int) -> dict:
        return {"x": [step, step]}

    def _mark(self, step: int) -> dict:
        params, grads = self.memory[step]
        return {"x": [step, step], "y": [params, params + grads]}


def describe(e: Event) -> str:
    """One event in words: ``forward: all-gather unit 1 (every rank's shard to every rank)``."""
    u = f"unit {e.unit}"
    words = {
        ("all-gather", "forward"): f"all-gather {u}: every rank's shard goes to every rank",
        ("all-gather", "backward"): f"all-gather {u} again (it was freed after its forward)",
        ("compute", "forward"): f"compute {u}'s forward with its full parameters",
        ("compute", "backward"): f"compute {u}'s gradient with its full parameters",
        ("reduce-scatter", "backward"): (
            f"reduce-scatter {u}'s gradient: each rank keeps its shard of the mean"
        ),
        ("free", "forward"): f"free {u}'s gathered parameters (reshard after forward)",
        ("free", "backward"): f"free {u}'s full parameters and full gradient",
    }
    text = words.get((e.kind, e.phase), f"{e.kind} {u}")
    if e.prefetch:
        before = e.unit - 1 if e.phase == "forward" else e.unit + 1
        text = f"all-gather {u} early (prefetch: issued before unit {before} computes)"
    return f"{e.phase}: {text}"


def schedule_figure(
    schedule: Schedule, label: str = "reference", duration_ms: int = 900
) -> go.Figure:
    """Any schedule (the reference's, a recorded run's) as frames with a play button."""
    return animation(FsdpView(schedule, label), duration_ms)  # type: ignore[arg-type]


def fsdp_figure(
    units: int | Sequence[float] = 3,
    world_size: int = 4,
    reshard_after_forward: bool = True,
    prefetch: bool = False,
) -> go.Figure:
    """A self-contained animation of one FSDP step (frames, play button, slider): no kernel."""
    return schedule_figure(fsdp_schedule(units, world_size, reshard_after_forward, prefetch))


def run_figure(
    trace: Iterable[object], unit_numels: Sequence[int], world_size: int, label: str = "your run"
) -> go.Figure:
    """The step a recorded run made (one rank's collectives), mapped onto its units by size."""
    return schedule_figure(schedule_from_trace(trace, unit_numels, world_size), label)


def fsdp_widget(
    units: int = 3,
    world_size: int = 4,
    reshard_after_forward: bool = True,
    prefetch: bool = False,
    trace: Iterable[object] | None = None,
    unit_numels: Sequence[int] | None = None,
    prefetch_control: bool = True,
) -> FsdpWidget:
    """The FSDP step with play/step controls (``course.pictures.fsdp_widget``; a prefetch
    switch unless ``prefetch_control`` is off); with a ``trace`` (one rank's collectives) and
    its ``unit_numels``, the step of your own run."""
    from course.pictures.fsdp_widget import FsdpWidget

    if trace is not None:
        if unit_numels is None:
            raise ValueError("a trace needs unit_numels: the elements of each unit, in order")
        schedule = schedule_from_trace(trace, unit_numels, world_size)
        return FsdpWidget(schedule, "your run")
    schedule = fsdp_schedule(units, world_size, reshard_after_forward, prefetch)
    return FsdpWidget(schedule, "reference", simulate=True, prefetch_control=prefetch_control)
