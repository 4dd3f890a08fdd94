"""The ring, drawn: one plotly figure per trace, with one frame per ring step.

Left, the ring: ranks on a circle and the messages of the current step as arrows labelled
with the chunk they carry. Right, the chunks: one row per rank, one cell per chunk, coloured
by how many ranks' contributions the cell holds (fully reduced in its own colour). Below, the
bytes each rank has sent so far against the ring's ``2(N-1)/N x size``.

:class:`RingView` turns a :class:`~course.ring.trace.Trace` into per-step trace updates; it is the
only drawing code. :func:`ring_figure` plays them as plotly frames (animates in exported HTML,
no kernel needed) and ``course.pictures.widgets`` applies them to a live ``FigureWidget``.
Schedule after Patarasuk & Yuan, "Bandwidth optimal all-reduce algorithms for clusters of
workstations" (2009), as in https://pytorch.org/docs/stable/distributed.html (all_reduce).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import plotly.graph_objects as go

from course.ring.schedule import chunk_bounds, num_steps, phase, ring_bytes_formula
from course.ring.trace import Message, Trace, bytes_sent, chunk_states, full_mask, ranks_in
from course.ring.verdict import Violation, ring_violations

__all__ = ["Frame", "RingView", "colorscale", "phase_name", "ring_figure"]

# Trace indices in the figure; the dynamic ones change from step to step.
RING, ARROWS, BAD_ARROWS, LABELS, RANKS, GRID, RECEIVED, BYTES, FORMULA = range(9)
DYNAMIC = (ARROWS, BAD_ARROWS, LABELS, RANKS, GRID, RECEIVED, BYTES)

OWN, FULL, BAD, INK, NODE = "#e6e6e6", "#f28e2b", "#d62728", "#333333", "#4c72b0"
PARTIAL_LIGHT, PARTIAL_DARK = (198, 219, 239), (33, 113, 181)


def phase_name(step: int, world_size: int) -> str:
    """What the frame after ``step`` ring steps shows (0 is the start, before any message)."""
    if step == 0:
        return "start: each rank holds only its own contribution"
    if step <= num_steps(world_size):
        return phase(step - 1, world_size)
    return "extra steps (a ring needs only 2(N-1))"


@functools.lru_cache(maxsize=4096)
def _ranks_text(mask: int) -> str:
    """``0-3, 5`` for a mask holding ranks 0, 1, 2, 3 and 5."""
    runs: list[list[int]] = []
    for r in ranks_in(mask):
        if runs and runs[-1][1] == r - 1:
            runs[-1][1] = r
        else:
            runs.append([r, r])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs) or "none"


def _partial(count: int, world_size: int) -> str:
    """Colour of a chunk holding ``count`` of ``world_size`` contributions (2 <= count < N)."""
    t = (count - 2) / max(world_size - 3, 1)
    rgb = (round(a + (b - a) * t) for a, b in zip(PARTIAL_LIGHT, PARTIAL_DARK, strict=True))
    return "rgb({},{},{})".format(*rgb)


def colorscale(world_size: int) -> list[tuple[float, str]]:
    """Stepped colour scale for ``z`` = contribution count 1..N over ``[0.5, N + 0.5]``."""
    scale = []
    for count in range(1, world_size + 1):
        colour = OWN if count == 1 else FULL if count == world_size else _partial(count, world_size)
        scale += [((count - 1) / world_size, colour), (count / world_size, colour)]
    return scale


def _overlapping(m: Message, bounds: list[tuple[int, int]]) -> list[int]:
    """Chunks a payload overlaps (empty if its offset could not be read)."""
    if m.offset is None:
        return []
    lo, hi = m.offset, m.offset + max(m.numel, 1)
    return [c for c, (a, b) in enumerate(bounds) if a < b and a < hi and lo < b]


@dataclass(frozen=True, slots=True)
class Frame:
    """Everything that changes from one step to the next: trace updates, title, notes.

    ``data`` maps a trace's index to the properties that change, with plotly's flat names
    (``marker_color``, not ``{"marker": {...}}``): a live ``FigureWidget`` then restyles only
    that leaf, where a nested dict would replace the whole marker in the browser.
    """

    step: int
    data: dict[int, dict]
    title: str
    notes: list[str]


class RingView:
    """Per-step drawing data for one trace; shared by the static figure and the widget."""

    def __init__(self, trace: Trace, label: str = "reference ring") -> None:
        self.trace, self.label = trace, label
        self.n = trace.world_size
        self.bounds = chunk_bounds(trace.numel, self.n)
        self.states = chunk_states(trace)
        self.last = len(self.states) - 1
        self.ideal = num_steps(self.n)
        self.formula = ring_bytes_formula(trace.nbytes, self.n)
        angle = [math.pi / 2 - 2 * math.pi * r / self.n for r in range(self.n)]
        self.pos = [(math.cos(a), math.sin(a)) for a in angle]
        chord = 2 * math.sin(math.pi / self.n) if self.n > 1 else 1.0
        self.radius = min(0.16, 0.32 * chord)  # gap between a node's centre and an arrow end
        self.empty = [lo >= hi for lo, hi in self.bounds]
        self._cache: dict[int, Frame] = {}
        self._texts: dict[tuple[int, int, int], str] = {}

    @cached_property
    def deviations(self) -> list[Violation]:
        """Where the run departs from a ring (``course.ring.verdict.ring_violations``); the
        reference ring has none."""
        return ring_violations(self.trace)

    def at(self, step: int) -> list[Violation]:
        """The deviations the frame after ``step`` steps shows: those of the step just played,
        and at the last frame those of the whole run (counts, volume, who never finished)."""
        return [
            v
            for v in self.deviations
            if (v.step is not None and v.step + 1 == step) or (v.step is None and step == self.last)
        ]

    def bad_ranks(self, step: int) -> set[int]:
        """Ranks to highlight at ``step``: those named by :meth:`at`."""
        return {v.rank for v in self.at(step) if v.rank is not None}

    def frame(self, step: int) -> Frame:
        """The picture after ``step`` ring steps (0 = start, ``self.last`` = end of the trace)."""
        if not 0 <= step <= self.last:
            raise ValueError(f"step must be between 0 and {self.last}, got {step}")
        if step not in self._cache:
            bad = self.bad_ranks(step)
            data = {GRID: self._grid(step), BYTES: self._bytes(step), RANKS: self._ranks(bad)}
            data |= self._messages(step, bad)
            self._cache[step] = Frame(step, data, self._title(step), self._notes(step))
        return self._cache[step]

    def _title(self, step: int) -> str:
        t = self.trace
        head = f"Ring all-reduce, {self.label}: N = {self.n}, {t.numel} elements x {t.itemsize} B"
        return f"{head}<br><b>{self.counter(step)}</b>"

    def counter(self, step: int) -> str:
        """``steps done: 3 / 6 - arrows: step 2, reduce-scatter`` (steps named 0-based, as in
        ``course.ring.schedule`` and the deviation texts)."""
        done = f"steps done: {step} / {self.ideal}"
        if step == 0:
            return f"{done} - {phase_name(0, self.n)}"
        return f"{done} - arrows: step {step - 1}, {phase_name(step, self.n)}"

    def _notes(self, step: int) -> list[str]:
        return [v.text for v in self.at(step)]

    def _grid(self, step: int) -> dict:
        """Contribution counts (NaN: an empty chunk) and hover texts, as numpy arrays: plotly
        checks those in one pass, where nested lists cost it a call per cell."""
        masks = self.states[step]
        z = np.array([[m.bit_count() for m in row] for row in masks], dtype=float)
        z[:, self.empty] = np.nan
        text = np.empty((self.n, self.n), dtype=object)
        for r, row in enumerate(masks):
            text[r] = [self._cell_text(r, c, m) for c, m in enumerate(row)]
        return {"z": z, "text": text}

    def _cell_text(self, rank: int, chunk: int, mask: int) -> str:
        key = (rank, chunk, mask)
        if key not in self._texts:
            self._texts[key] = self._describe_cell(rank, chunk, mask)
        return self._texts[key]

    def _describe_cell(self, rank: int, chunk: int, mask: int) -> str:
        lo, hi = self.bounds[chunk]
        where = f"rank {rank}, chunk {chunk} (elements {lo}-{hi - 1})" if lo < hi else ""
        if not where:
            return f"rank {rank}, chunk {chunk}: empty (fewer elements than ranks)"
        tag = " - fully reduced" if mask == full_mask(self.n) else ""
        return f"{where}<br>holds {mask.bit_count()}/{self.n}: ranks {_ranks_text(mask)}{tag}"

    def _bytes(self, step: int) -> dict:
        sent = bytes_sent(self.trace, upto_step=step)
        slack = self.ideal * self.trace.itemsize  # uneven chunks: one element per step
        colour = [BAD if b > self.formula + slack else NODE for b in sent]
        text = [f"rank {r} has sent {b:,} B" for r, b in enumerate(sent)]
        return {"y": sent, "marker_color": colour, "hovertext": text}

    def _ranks(self, bad: set[int]) -> dict:
        colour = [BAD if r in bad else NODE for r in range(self.n)]
        text = [self._rank_text(r) for r in range(self.n)]
        return {"marker_color": colour, "hovertext": text}

    def _rank_text(self, rank: int) -> str:
        if rank in self.trace.unfinished:
            return (
                f"rank {rank} never finished: {self.trace.blocked.get(rank, 'it did not return')}"
            )
        return f"rank {rank}"

    def _messages(self, step: int, bad: set[int]) -> dict[int, dict]:
        """Arrows (good and flagged), their chunk labels and the cells they land in."""
        sends = [m for m in self.trace.messages if m.op == "send" and m.order == step - 1]
        arrows: dict[bool, tuple[list, list, list, list]] = {ok: ([], [], [], []) for ok in (1, 0)}
        lx, ly, lt = [], [], []
        for m in sends:
            chunks = _overlapping(m, self.bounds)
            name = "chunk " + (", ".join(map(str, chunks)) if chunks else "?")
            holds = (
                "empty (0 elements)"
                if m.numel == 0
                else "unreadable payload"
                if m.holds is None
                else f"holds ranks {_ranks_text(m.holds)}"
            )
            hover = f"rank {m.rank} -> rank {m.peer}: {name}, {m.nbytes:,} B, {holds}"
            if not 0 <= m.peer < self.n or m.peer == m.rank:
                continue  # the deviation text says so; there is no arrow to draw
            (x0, y0), (x1, y1), (mx, my) = self._arrow(m.rank, m.peer)
            xs, ys, sizes, hovers = arrows[m.rank not in bad]
            xs += [x0, x1, None]
            ys += [y0, y1, None]
            sizes += [0, self._head, 0]
            hovers += [hover, hover, ""]
            lx.append(mx)
            ly.append(my)
            lt.append(
                "c" + ",".join(map(str, chunks)) if chunks else "0 el" if m.numel == 0 else "?"
            )
        out = {
            key: {"x": xs, "y": ys, "marker_size": sizes, "hovertext": hv}
            for key, (xs, ys, sizes, hv) in ((ARROWS, arrows[1]), (BAD_ARROWS, arrows[0]))
        }
        out[LABELS] = {"x": lx, "y": ly, "text": lt if self.n <= 16 else [""] * len(lt)}
        out[RECEIVED] = self._received(step)
        return out

    @property
    def _head(self) -> int:
        return 13 if self.n <= 8 else 10 if self.n <= 16 else 7

    def _arrow(self, src: int, dst: int) -> tuple[tuple[float, float], ...]:
        """Start, end and label point of an arrow from ``src`` to ``dst``, offset to its right
        so that opposite messages on the same pair of ranks stay apart."""
        (px, py), (qx, qy) = self.pos[src], self.pos[dst]
        length = math.hypot(qx - px, qy - py)
        ux, uy = (qx - px) / length, (qy - py) / length
        nx, ny = uy, -ux
        gap, side = self.radius, 0.3 * self.radius
        start = (px + ux * gap + nx * side, py + uy * gap + ny * side)
        end = (qx - ux * gap + nx * side, qy - uy * gap + ny * side)
        mid = ((px + qx) / 2 - nx * 2.2 * side, (py + qy) / 2 - ny * 2.2 * side)
        return start, end, mid

    def _received(self, step: int) -> dict:
        """Outlines round each cell a payload landed in at this step."""
        xs: list[float | None] = []
        ys: list[float | None] = []
        for m in self.trace.messages:
            if m.op != "recv" or m.order != step - 1:
                continue
            for c in _overlapping(m, self.bounds):
                xs += [c - 0.45, c + 0.45, c + 0.45, c - 0.45, c - 0.45, None]
                ys += [
                    m.rank - 0.45,
                    m.rank - 0.45,
                    m.rank + 0.45,
                    m.rank + 0.45,
                    m.rank - 0.45,
                    None,
                ]
        return {"x": xs, "y": ys}

    def apply(self, fig: go.Figure, frame: Frame) -> None:
        """Draw ``frame`` into a figure made by :meth:`base` (a ``FigureWidget`` too), in one
        batch: only the changing properties are sent."""
        with fig.batch_update():
            for index, props in frame.data.items():
                fig.data[index].update(props)
            fig.layout.title.text = frame.title

    def base(self) -> go.Figure:
        """The figure at step 0, with every trace the frames update."""
        fig = go.Figure(layout=self._layout())
        n = self.n
        ring_x = [p[0] for p in self.pos] + [self.pos[0][0]]
        ring_y = [p[1] for p in self.pos] + [self.pos[0][1]]
        fig.add_trace(
            go.Scatter(
                x=ring_x,
                y=ring_y,
                mode="lines",
                line={"color": "#d0d0d0", "width": 1},
                hoverinfo="skip",
                showlegend=False,
            )
        )
        for name, colour in (
            ("message this step (cK: carries chunk K)", INK),
            ("message that departs from the ring", BAD),
        ):
            fig.add_trace(
                go.Scatter(
                    x=[],
                    y=[],
                    mode="lines+markers",
                    name=name,
                    line={"color": colour, "width": 2 if n <= 16 else 1.5},
                    marker={"symbol": "arrow", "angleref": "previous", "color": colour},
                    hoverinfo="text",
                )
            )
        fig.add_trace(
            go.Scatter(
                x=[],
                y=[],
                mode="text",
                textfont={"size": 12 if n <= 8 else 10, "color": INK},
                hoverinfo="skip",
                showlegend=False,
            )
        )
        size = 34 if n <= 8 else 24 if n <= 16 else 16
        fig.add_trace(
            go.Scatter(
                x=[p[0] for p in self.pos],
                y=[p[1] for p in self.pos],
                mode="markers+text",
                text=[str(r) for r in range(n)],
                textfont={"color": "white", "size": 13 if n <= 8 else 10 if n <= 16 else 8},
                marker={"size": size, "color": NODE, "line": {"width": 1, "color": "white"}},
                hoverinfo="text",
                showlegend=False,
            )
        )
        ticks = list(range(1, n + 1)) if n <= 8 else sorted({1, n // 4, n // 2, 3 * n // 4, n})
        names = {1: "own only", n: f"all {n}: fully reduced"}
        fig.add_trace(
            go.Heatmap(
                z=[[None] * n] * n,
                x=list(range(n)),
                y=list(range(n)),
                xaxis="x2",
                yaxis="y2",
                zmin=0.5,
                zmax=n + 0.5,
                colorscale=colorscale(n),
                xgap=1 if n > 16 else 2,
                ygap=1 if n > 16 else 2,
                hovertemplate="%{text}<extra></extra>",
                colorbar={
                    "title": {"text": "ranks in<br>the chunk", "side": "top"},
                    "tickvals": ticks,
                    "ticktext": [names.get(t, str(t)) for t in ticks],
                    "len": 0.62,
                    "x": 0.8,
                    "y": 1.0,
                    "yanchor": "top",
                    "thickness": 14,
                },
            )
        )
        fig.add_trace(
            go.Scatter(
                x=[],
                y=[],
                xaxis="x2",
                yaxis="y2",
                mode="lines",
                name="chunk received this step",
                line={"color": INK, "width": 2.5 if n <= 16 else 1.5},
                hoverinfo="skip",
            )
        )
        fig.add_trace(
            go.Bar(
                x=list(range(n)),
                y=[0] * n,
                xaxis="x3",
                yaxis="y3",
                marker={"color": NODE},
                hoverinfo="text",
                showlegend=False,
            )
        )
        label = f"2(N-1)/N x size = {self.formula:,.0f} B"
        fig.add_trace(
            go.Scatter(
                x=[-0.5, n - 0.5],
                y=[self.formula] * 2,
                xaxis="x3",
                yaxis="y3",
                mode="lines",
                name=label,
                line={"color": FULL, "dash": "dash", "width": 2},
                hoverinfo="name",
            )
        )
        return fig

    def _layout(self) -> go.Layout:
        n = self.n
        top = max(self.formula, *bytes_sent(self.trace), 1) * 1.15
        tick = max(1, n // 8)
        axis = {"showgrid": False, "zeroline": False}
        return go.Layout(
            height=640,
            margin={"l": 20, "r": 20, "t": 80, "b": 150, "autoexpand": False},
            plot_bgcolor="white",
            legend={"x": 0, "y": 0.13, "yanchor": "top", "font": {"size": 11}},
            title={"font": {"size": 15}, "x": 0.01, "xanchor": "left", "y": 0.98, "yanchor": "top"},
            xaxis={**axis, "domain": [0, 0.4], "visible": False, "range": [-1.25, 1.25]},
            yaxis={
                **axis,
                "domain": [0.15, 0.95],
                "visible": False,
                "range": [-1.25, 1.25],
                "scaleanchor": "x",
            },
            xaxis2={
                **axis,
                "domain": [0.46, 0.78],
                "anchor": "y2",
                "title": {"text": "chunk", "standoff": 2},
                "dtick": tick,
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
            xaxis3={
                **axis,
                "domain": [0.46, 0.78],
                "anchor": "y3",
                "title": {"text": "rank", "standoff": 2},
                "dtick": tick,
            },
            yaxis3={
                **axis,
                "domain": [0, 0.24],
                "anchor": "x3",
                "title": {"text": "bytes sent so far"},
                "range": [0, top],
                "showgrid": True,
                "gridcolor": "#eeeeee",
            },
        )


def _notes_annotation(notes: list[str]) -> dict:
    """The text panel under the figure: this step's deviations, or nothing."""
    text = "<br>".join(f"! {t}" for t in notes[:6]) + ("<br>..." if len(notes) > 6 else "")
    return {
        "text": text,
        "x": 0,
        "y": -0.2,
        "xref": "paper",
        "yref": "paper",
        "xanchor": "left",
        "yanchor": "top",
        "align": "left",
        "showarrow": False,
        "font": {"color": BAD, "size": 12},
    }


def ring_figure(trace: Trace, label: str = "reference ring", duration_ms: int = 900) -> go.Figure:
    """A self-contained animation of ``trace``: frames, a play button and a step slider."""
    view = RingView(trace, label)
    fig = view.base()
    frames = [view.frame(k) for k in range(view.last + 1)]
    fig.frames = [
        go.Frame(
            name=str(f.step),
            traces=list(f.data),
            data=[_as_trace(fig.data[i], props) for i, props in f.data.items()],
            layout={"title": {"text": f.title}, "annotations": [_notes_annotation(f.notes)]},
        )
        for f in frames
    ]
    view.apply(fig, frames[0])
    fig.update_layout(annotations=[_notes_annotation(frames[0].notes)])
    fig.update_layout(
        updatemenus=[_play_buttons(duration_ms)], sliders=[_slider(view, duration_ms)]
    )
    return fig


def _as_trace(template: go.BaseTraceType, props: dict) -> go.BaseTraceType:
    """A frame's partial trace of the same type as the base trace it updates."""
    return type(template)(**props)


def _play_buttons(duration_ms: int) -> dict:
    play = {
        "frame": {"duration": duration_ms, "redraw": True},
        "fromcurrent": True,
        "transition": {"duration": 0},
    }
    pause = {"frame": {"duration": 0, "redraw": False}, "mode": "immediate"}
    return {
        "type": "buttons",
        "direction": "left",
        "x": 0,
        "y": -0.07,
        "xanchor": "left",
        "yanchor": "top",
        "pad": {"t": 0},
        "buttons": [
            {"label": "Play", "method": "animate", "args": [None, play]},
            {"label": "Pause", "method": "animate", "args": [[None], pause]},
        ],
    }


def _slider(view: RingView, duration_ms: int) -> dict:  # noqa: ARG001 - the play button's duration, kept beside the slider's
    every = 1 if view.last <= 16 else 2 if view.last <= 32 else 4
    jump = {
        "frame": {"duration": 0, "redraw": True},
        "mode": "immediate",
        "transition": {"duration": 0},
    }
    return {
        "active": 0,
        "x": 0.14,
        "y": -0.05,
        "len": 0.66,
        "xanchor": "left",
        "yanchor": "top",
        "pad": {"t": 4},
        "currentvalue": {"visible": False},
        "font": {"size": 10},
        "steps": [
            {
                "label": str(k) if k % every == 0 else "",
                "method": "animate",
                "args": [[str(k)], jump],
            }
            for k in range(view.last + 1)
        ],
    }
