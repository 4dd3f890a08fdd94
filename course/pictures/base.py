"""The ring figure at step 0: every trace the frames update, and the layout.

Left, the ring: ranks on a circle and the messages of the current step as arrows labelled
with the chunk they carry (a dashed red arrow: a send or receive that never completed). Right, the
chunks: one row per rank, one cell per chunk, coloured by how many ranks' contributions the
cell holds (fully reduced in its own colour). Below, the bytes each rank has sent so far
against the ring's closed form (``course.ring.schedule.ring_bytes_formula``).
"""

from __future__ import annotations

from typing import Protocol

import plotly.graph_objects as go

from course.pictures.style import BAD, FULL, INK, NODE, Sizes, colorscale

__all__ = ["DYNAMIC", "RingLike", "base_figure"]

# Trace indices in the figure; the dynamic ones change from step to step.
RING, ARROWS, BAD_ARROWS, WAITING, LABELS, RANKS, GRID, RECEIVED, BYTES, FORMULA = range(10)
DYNAMIC = (ARROWS, BAD_ARROWS, WAITING, LABELS, RANKS, GRID, RECEIVED, BYTES)


class RingLike(Protocol):
    """What the figure reads of a view (``course.pictures.view.RingView`` and its halves)."""

    n: int  # ranks
    pos: list[tuple[float, float]]  # each rank's place on the circle
    size: Sizes  # marker and font sizes for N ranks
    formula: float  # the closed form's bytes per rank
    formulas: bool  # whether the picture may show closed forms
    last: int  # the last step

    def sent(self, step: int) -> list[int]:
        """Bytes each rank has sent after ``step`` steps."""
        ...


def base_figure(view: RingLike) -> go.Figure:
    """The figure at step 0, with every trace (in the order of the indices above)."""
    fig = go.Figure(layout=layout(view))
    for trace in (
        _ring(view),
        *_arrows(view),
        _labels(view),
        _ranks(view),
        _grid(view),
        _received(view),
        *_bytes(view),
    ):
        fig.add_trace(trace)
    return fig


def _ring(view: RingLike) -> go.Scatter:
    xs, ys = zip(*view.pos, view.pos[0], strict=False)
    line = {"color": "#d0d0d0", "width": 1}
    return go.Scatter(x=xs, y=ys, mode="lines", line=line, hoverinfo="skip", showlegend=False)


def _arrows(view: RingLike) -> list[go.Scatter]:
    """This step's messages, those that depart from the ring, and blocked receives."""
    kinds = (
        ("message of this step (cK: carries chunk K)", INK, "solid"),
        ("message that departs from the ring", BAD, "solid"),
        ("message that never completed (blocked)", BAD, "dot"),
    )
    return [
        go.Scatter(
            x=[],
            y=[],
            mode="lines+markers",
            name=name,
            line={"color": colour, "width": view.size.line, "dash": dash},
            marker={"symbol": "arrow", "angleref": "previous", "color": colour},
            hoverinfo="text",
        )
        for name, colour, dash in kinds
    ]


def _labels(view: RingLike) -> go.Scatter:
    font = {"size": view.size.label_font, "color": INK}
    return go.Scatter(
        x=[], y=[], mode="text", textfont=font, hoverinfo="skip", showlegend=False
    )  # fmt: skip


def _ranks(view: RingLike) -> go.Scatter:
    xs, ys = zip(*view.pos, strict=True)
    return go.Scatter(
        x=xs,
        y=ys,
        mode="markers+text",
        text=[str(r) for r in range(view.n)],
        textfont={"color": "white", "size": view.size.node_font},
        marker={"size": view.size.node, "color": NODE, "line": {"width": 1, "color": "white"}},
        hoverinfo="text",
        showlegend=False,
    )


def _grid(view: RingLike) -> go.Heatmap:
    n = view.n
    ticks = list(range(1, n + 1)) if n <= 8 else sorted({1, n // 4, n // 2, 3 * n // 4, n})
    names = {1: "own only", n: f"all {n}: fully reduced"}
    colorbar = {
        "title": {"text": "ranks in<br>the chunk", "side": "top"},
        "tickvals": ticks,
        "ticktext": [names.get(t, str(t)) for t in ticks],
        "len": 0.62,
        "x": 0.8,
        "y": 1.0,
        "yanchor": "top",
        "thickness": 14,
    }
    return go.Heatmap(
        z=[[None] * n] * n,
        x=list(range(n)),
        y=list(range(n)),
        xaxis="x2",
        yaxis="y2",
        zmin=0.5,
        zmax=n + 0.5,
        colorscale=colorscale(n),
        xgap=view.size.gap,
        ygap=view.size.gap,
        hovertemplate="%{text}<extra></extra>",
        colorbar=colorbar,
    )


def _received(view: RingLike) -> go.Scatter:
    return go.Scatter(
        x=[],
        y=[],
        xaxis="x2",
        yaxis="y2",
        mode="lines",
        name="chunk received this step",
        line={"color": INK, "width": 2.5 if view.n <= 16 else 1.5},
        hoverinfo="skip",
    )


def _bytes(view: RingLike) -> list[go.BaseTraceType]:
    n = view.n
    bars = go.Bar(
        x=list(range(n)),
        y=[0] * n,
        xaxis="x3",
        yaxis="y3",
        marker={"color": NODE},
        hoverinfo="text",
        showlegend=False,
    )
    formula = go.Scatter(
        x=[-0.5, n - 0.5],
        y=[view.formula] * 2,
        xaxis="x3",
        yaxis="y3",
        mode="lines",
        # Before the questions (formulas off) the hidden line keeps no closed form in its name:
        # a saved notebook's widget state holds every trace, shown or not.
        name=f"2(N-1)/N x size = {view.formula:,.0f} B" if view.formulas else "",
        line={"color": FULL, "dash": "dash", "width": 2},
        hoverinfo="name",
        visible=view.formulas,
    )
    return [bars, formula]


def layout(view: RingLike) -> go.Layout:
    """Three panels: the ring (left), the chunks (top right), the bytes (bottom right)."""
    n, tick = view.n, view.size.tick
    # Before the questions the bytes axis follows the bars step by step: a range fixed at the
    # end's total would show, at step 0, how much a rank sends in the whole all-reduce.
    top = max(view.formula, *view.sent(view.last), 1) * 1.15
    scale = {"range": [0, top]} if view.formulas else {"autorange": True, "rangemode": "tozero"}
    axis = {"showgrid": False, "zeroline": False}
    hidden = {**axis, "visible": False, "range": [-1.25, 1.25]}
    right = {**axis, "domain": [0.46, 0.78], "dtick": tick}
    return go.Layout(
        height=640,
        margin={"l": 20, "r": 20, "t": 80, "b": 150, "autoexpand": False},
        plot_bgcolor="white",
        legend={"x": 0, "y": 0.13, "yanchor": "top", "font": {"size": 11}},
        title={"font": {"size": 15}, "x": 0.01, "xanchor": "left", "y": 0.98, "yanchor": "top"},
        xaxis={**hidden, "domain": [0, 0.4]},
        yaxis={**hidden, "domain": [0.15, 0.95], "scaleanchor": "x"},
        xaxis2={
            **right,
            "anchor": "y2",
            "title": {"text": "chunk", "standoff": 2},
            "side": "top",
            "range": [-0.5, n - 0.5],
        },
        yaxis2={
            **axis,
            "domain": [0.36, 0.88],
            "anchor": "x2",
            "title": {"text": "rank", "standoff": 2},
            "dtick": tick,
            "autorange": False,
            "range": [n - 0.5, -0.5],
        },
        xaxis3={**right, "anchor": "y3", "title": {"text": "rank", "standoff": 2}},
        yaxis3={
            **axis,
            "domain": [0, 0.24],
            "anchor": "x3",
            "title": {"text": "bytes sent so far"},
            **scale,
            "showgrid": True,
            "gridcolor": "#eeeeee",
        },
    )
