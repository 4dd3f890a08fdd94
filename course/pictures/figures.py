"""The ring, drawn: one plotly figure per trace, with one frame per ring step.

:class:`~course.pictures.view.RingView` turns a :class:`~course.ring.trace.Trace` into per-step
trace updates (``view``) on a figure laid out once (``base``), in the colours and sizes of
``style``; it is the only drawing code. :func:`ring_figure` plays them as plotly frames
(animates in exported HTML, no kernel needed) and ``course.pictures.widgets`` applies them to
a live ``FigureWidget``. Schedule after Patarasuk & Yuan, "Bandwidth optimal all-reduce
algorithms for clusters of workstations" (2009), as in
https://pytorch.org/docs/stable/distributed.html (all_reduce).
"""

from __future__ import annotations

import plotly.graph_objects as go

from course.pictures.base import (
    ARROWS,
    BAD_ARROWS,
    BYTES,
    DYNAMIC,
    FORMULA,
    GRID,
    LABELS,
    RANKS,
    RECEIVED,
    RING,
    WAITING,
)
from course.pictures.style import BAD, FULL, INK, NODE, OWN, colorscale, phase_name
from course.pictures.view import Frame, RingView
from course.ring.trace import Trace

__all__ = [
    "ARROWS",
    "BAD",
    "BAD_ARROWS",
    "BYTES",
    "DYNAMIC",
    "FORMULA",
    "FULL",
    "GRID",
    "INK",
    "LABELS",
    "NODE",
    "OWN",
    "RANKS",
    "RECEIVED",
    "RING",
    "WAITING",
    "Frame",
    "RingView",
    "animation",
    "colorscale",
    "phase_name",
    "ring_figure",
]

SHOWN_NOTES = 6  # deviation lines under the static figure


def ring_figure(trace: Trace, label: str = "reference ring", duration_ms: int = 900) -> go.Figure:
    """A self-contained animation of ``trace``: frames, a play button and a step slider."""
    return animation(RingView(trace, label), duration_ms)


def animation(view: RingView, duration_ms: int = 900) -> go.Figure:
    """Any view (a whole ring, one half) as plotly frames with a play button and a slider."""
    fig = view.base()
    frames = [view.frame(k) for k in range(view.last + 1)]
    fig.frames = [
        go.Frame(
            name=str(f.step),
            traces=list(f.data),
            data=[type(fig.data[i])(**props) for i, props in f.data.items()],
            layout={"title": {"text": f.title}, "annotations": [_notes_annotation(f.notes)]},
        )
        for f in frames
    ]
    view.apply(fig, frames[0])
    fig.update_layout(annotations=[_notes_annotation(frames[0].notes)])
    fig.update_layout(updatemenus=[_play_buttons(duration_ms)], sliders=[_slider(view)])
    return fig


def _notes_annotation(notes: list[str]) -> dict:
    """The text panel under the figure: this step's deviations, or nothing."""
    shown = notes[:SHOWN_NOTES]
    text = "<br>".join(f"! {t}" for t in shown) + ("<br>..." if len(notes) > len(shown) else "")
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


def _slider(view: RingView) -> dict:
    """One slider step per frame, labelled with its 1-based step (0: the start)."""
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
