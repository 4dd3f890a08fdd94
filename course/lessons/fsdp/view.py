"""The FSDP figure: every trace the frames update, the legend and layout, and each step's frame.

Left (``xaxis``/``yaxis``), the grid of ranks x units; right (``xaxis2``/``yaxis2``), the memory
one rank holds over the step. The legend names every colour of the grid and every line.
"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from course.lessons.fsdp.schedule import Event, Schedule
from course.pictures.style import FULL, GATHERED, INK, NODE, OWN, SHARDED
from course.pictures.view import Frame
from course.ranks.wording import count

__all__ = ["DYNAMIC", "HEIGHT", "FsdpView", "describe", "fsdp_base"]

GRID, OUTLINE, OUTLINE_TEXT, PARAMS, TOTAL, WHOLE, PHASES, CURSOR, MARK = range(9)
DYNAMIC = (GRID, OUTLINE, OUTLINE_TEXT, CURSOR, MARK)
# The grid's values (EMPTY ... GRAD_SHARD below): not held, own shard, gathered, full grad,
# grad shard
COLOURS = (OWN, NODE, GATHERED, FULL, SHARDED)
LEGEND = (
    "empty slot (not held)",
    "params: own shard (always kept)",
    "params: gathered from another rank",
    "grads: full, before reduce-scatter",
    "grads: own shard of the mean (kept)",
)
HEIGHT = 700


def fsdp_base(view: FsdpView) -> go.Figure:
    """The figure before the step, with every trace in the order of the indices above."""
    fig = go.Figure(layout=layout(view))
    for trace in (_grid(view), *_outline(), *_memory(view), _cursor(view), _mark(), *_legend()):
        fig.add_trace(trace)
    return fig


def _grid(view: FsdpView) -> go.Heatmap:
    scale = []
    for value, colour in enumerate(COLOURS):
        scale += [(value / len(COLOURS), colour), ((value + 1) / len(COLOURS), colour)]
    return go.Heatmap(
        z=view.cells(0),
        x=list(range(view.width)),
        y=list(range(view.height)),
        zmin=-0.5,
        zmax=len(COLOURS) - 0.5,
        colorscale=scale,
        showscale=False,
        xgap=2,
        ygap=2,
        hovertemplate="%{text}<extra></extra>",
        text=[[""] * view.width] * view.height,
    )


def _outline() -> list[go.Scatter]:
    box = go.Scatter(
        x=[],
        y=[],
        mode="lines",
        line={"color": INK, "width": 3},
        hoverinfo="skip",
        showlegend=False,  # the legend's entry is a trace of its own: this one starts empty
    )
    text = go.Scatter(
        x=[],
        y=[],
        mode="text",
        textposition="bottom center",
        textfont={"size": 13, "color": INK},
        hoverinfo="skip",
        showlegend=False,
        cliponaxis=False,
    )
    return [box, text]


def _memory(view: FsdpView) -> list[go.Scatter]:
    steps = list(range(view.last + 1))
    params = [p for p, _ in view.memory]
    total = [p + g for p, g in view.memory]
    top = max(total) * 1.12
    common = {"xaxis": "x2", "yaxis": "y2", "mode": "lines", "line_shape": "hv"}
    lines = [
        go.Scatter(
            x=steps,
            y=params,
            name="memory: parameters",
            line={"color": NODE, "width": 3},
            hovertemplate="after event %{x}: parameters %{y:.3f} x model<extra></extra>",
            **common,
        ),
        go.Scatter(
            x=steps,
            y=total,
            name="memory: parameters + gradients",
            line={"color": FULL, "width": 2, "dash": "dash"},
            hovertemplate="after event %{x}: with gradients %{y:.3f} x model<extra></extra>",
            **common,
        ),
        go.Scatter(
            x=[0, view.last],
            y=[1, 1],
            name="the whole model (1 x)",
            line={"color": "#999999", "width": 1, "dash": "dot"},
            hoverinfo="skip",
            xaxis="x2",
            yaxis="y2",
            mode="lines",
        ),
    ]
    turn = next((k for k, e in enumerate(view.schedule.events) if e.phase == "backward"), view.last)
    line = turn + 0.5  # between the last forward frame and the first backward one
    phases = go.Scatter(
        x=[turn / 2, None, line, line, None, (line + view.last) / 2],
        y=[top, None, 0, top, None, top],
        text=["forward", "", "", "", "", "backward"],
        mode="lines+text",
        textposition="bottom center",
        line={"color": "#bbbbbb", "width": 1},
        xaxis="x2",
        yaxis="y2",
        hoverinfo="skip",
        showlegend=False,
        textfont={"size": 12, "color": "#777777"},
    )
    return [*lines, phases]


def _cursor(view: FsdpView) -> go.Scatter:
    top = max(p + g for p, g in view.memory) * 1.12
    return go.Scatter(
        x=[0, 0],
        y=[0, top],
        xaxis="x2",
        yaxis="y2",
        mode="lines",
        hoverinfo="skip",
        line={"color": INK, "width": 1.5},
        name="the current event",
    )


def _mark() -> go.Scatter:
    return go.Scatter(
        x=[],
        y=[],
        xaxis="x2",
        yaxis="y2",
        mode="markers",
        hoverinfo="skip",
        showlegend=False,
        marker={"size": 10, "color": [NODE, FULL], "line": {"color": INK, "width": 1}},
    )


def _legend() -> list[go.Scatter]:
    """The box, then one square per colour of the grid: a heatmap has no legend entries."""
    box = go.Scatter(
        x=[None],
        y=[None],
        mode="lines",
        name="the unit of the current event",
        line={"color": INK, "width": 3},
        hoverinfo="skip",
    )
    squares = [
        go.Scatter(
            x=[None],
            y=[None],
            mode="markers",
            name=name,
            hoverinfo="skip",
            marker={
                "symbol": "square",
                "size": 14,
                "color": colour,
                "line": {"color": "#999999", "width": 1},
            },
        )
        for name, colour in zip(LEGEND, COLOURS, strict=True)
    ]
    return [box, *squares]


def layout(view: FsdpView) -> go.Layout:
    """The grid left, the memory right, the legend under the memory."""
    n = view.n
    top = max(p + g for p, g in view.memory) * 1.12
    axis = {"showgrid": False, "zeroline": False}
    unit_ticks = [view.slot_x(u, 0) + (n - 1) / 2 for u in range(view.units)]
    rank_ticks = [t for r in range(n) for t in (3 * r, 3 * r + 1)]
    rank_text = [t for r in range(n) for t in (f"rank {r} params", "grads")]
    return go.Layout(
        height=HEIGHT,
        margin={"l": 110, "r": 20, "t": 80, "b": 130, "autoexpand": False},
        plot_bgcolor="white",
        title={"font": {"size": 15}, "x": 0.01, "xanchor": "left", "y": 0.98, "yanchor": "top"},
        legend={"x": 1.0, "xanchor": "right", "y": 0.45, "yanchor": "top", "font": {"size": 12}},
        xaxis={
            **axis,
            "domain": [0.0, 0.5],
            "side": "top",
            "tickvals": unit_ticks,
            "ticktext": [f"unit {u}" for u in range(view.units)],
            "range": [-0.5, view.width - 0.5],
            "title": {"text": "unit (one slot per rank's shard)", "standoff": 4},
        },
        yaxis={
            **axis,
            "domain": [0.0, 0.88],
            "tickvals": rank_ticks,
            "ticktext": rank_text,
            "autorange": False,
            "range": [view.height + 0.2, -0.5],
            "title": {"text": "rank"},
        },
        xaxis2={
            **axis,
            "domain": [0.65, 1.0],
            "anchor": "y2",
            "range": [-0.5, view.last + 0.5],
            "title": {"text": "event", "standoff": 2},
        },
        yaxis2={
            **axis,
            "domain": [0.56, 0.88],
            "anchor": "x2",
            "range": [0, top],
            "showgrid": True,
            "gridcolor": "#eeeeee",
            "title": {"text": "held by one rank<br>(x model size)"},
        },
    )


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
