"""The FSDP figure before the step: every trace the frames update, the legend, the layout.

Left (``xaxis``/``yaxis``), the grid of ranks x units; right (``xaxis2``/``yaxis2``), the memory
one rank holds over the step. The legend names every colour of the grid and every line.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import plotly.graph_objects as go

from course.pictures.style import FULL, GATHERED, INK, NODE, OWN, SHARDED

if TYPE_CHECKING:
    from course.pictures.fsdp import FsdpView

__all__ = ["CURSOR", "DYNAMIC", "GRID", "MARK", "OUTLINE", "OUTLINE_TEXT", "fsdp_base"]

GRID, OUTLINE, OUTLINE_TEXT, PARAMS, TOTAL, WHOLE, PHASES, CURSOR, MARK = range(9)
DYNAMIC = (GRID, OUTLINE, OUTLINE_TEXT, CURSOR, MARK)
# The grid's values (course.pictures.fsdp): not held, own shard, gathered, full grad, grad shard
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
