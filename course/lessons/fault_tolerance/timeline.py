"""A day of a checkpointed job, drawn, and its goodput against the checkpoint interval.

    from course.lessons.fault_tolerance.failures import Job
    from course.lessons.fault_tolerance.timeline import timeline_figure
    timeline_figure(Job(ranks=8, mtbf_h=100), hours=24, seed=0)

Above, the timeline (``failures.checkpoint_run``): a row per rank up to ``MAX_ROWS`` ranks (a
synchronous job: when one fails, every rank loses the same work and waits the same restart),
one row for the whole job beyond; training in green, each checkpoint written a blue tick, the
training a failure threw away in red, the restart in grey, each failure a cross on its rank.
Below, the share of time that trains against the interval between checkpoints (log scale):
Daly's exact expectation as a line, runs drawn with the same seed as dots, Young's optimum,
this job's interval, and what a per-step quorum keeps (``failures.quorum_run``).

:func:`figure_data` computes every trace's data and :func:`apply` sets it, so the widget
(``course.lessons.fault_tolerance.widget``) redraws a ``FigureWidget`` in place.
"""

from __future__ import annotations

import math
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from course.lessons.fault_tolerance.failures import (
    HOUR,
    Job,
    checkpoint_run,
    expected_goodput,
    goodput_curve,
    quorum_run,
    young_interval,
)
from course.pictures.style import BAD, INK, NODE

__all__ = ["MAX_ROWS", "TRACES", "apply", "figure_data", "timeline_figure"]

MAX_ROWS = 8  # ranks drawn one row each; beyond, one row for the job
WORK, RESTART, QUORUM = "#59a14f", "#9d9d9d", "#b07aa1"
TRACES = (  # the figure's traces, in order: the widget updates them by index
    "work",
    "checkpoint",
    "lost",
    "restart",
    "failure",
    "expected",
    "simulated",
    "young",
    "this job",
    "quorum",
)
BAR = 16  # px: the timeline's bars
CURVE_POINTS, SIMULATED_POINTS, SIMULATED_FAILURES = 60, 12, 400
DRAWN_FAILURES = 300  # at most about this many failures drawn on the timeline (a short window)


def _rows(job: Job) -> list[str]:
    """The timeline's row names, top to bottom."""
    if job.ranks <= MAX_ROWS:
        return [f"rank {r}" for r in range(job.ranks)]
    return [f"{job.ranks:,} ranks"]


def _segments(spans: list[tuple[str, int, float, float]], kind: str, rows: list[str]) -> dict:
    """One line trace's data for every span of ``kind``, on every row (None breaks the line)."""
    x: list[float | None] = []
    y: list[str | None] = []
    for what, _row, start, end in spans:
        if what == kind:
            for name in rows:
                x += [start / HOUR, end / HOUR, None]
                y += [name, name, None]
    return {"x": x, "y": y}


def _intervals(job: Job) -> list[float]:
    """Intervals (s) the curve spans: a factor of ten either side of Young's optimum (a step at
    least), widened to hold this job's own interval."""
    young = young_interval(job.checkpoint_s, job.job_mtbf_s)
    low = max(job.step_s, min(young / 10, job.interval_s / 1.5))
    high = max(young * 10, job.interval_s * 1.5, low * 10)
    ratio = (high / low) ** (1 / (CURVE_POINTS - 1))
    return [low * ratio**i for i in range(CURVE_POINTS)]


def _timeline(job: Job, hours: float, seed: int) -> tuple[dict, dict[str, Any]]:
    """The timeline's traces' data, and the drawn day's totals (for a status line)."""
    rows, run = _rows(job), checkpoint_run(job, hours, seed)
    marks = [end / HOUR for kind, _, _, end in run.spans if kind == "checkpoint"]
    one = len(rows) == 1
    data = {kind: _segments(run.spans, kind, rows) for kind in ("work", "lost", "restart")}
    data["checkpoint"] = {"x": marks * len(rows), "y": [r for r in rows for _ in marks]}
    data["failure"] = {
        "x": [t / HOUR for t, _ in run.failures],
        "y": [rows[0] if one else rows[rank] for _, rank in run.failures],
        "text": [f"rank {rank} fails at {t / HOUR:.2f} h" for t, rank in run.failures],
    }
    totals = {"failures": len(run.failures), "goodput": run.goodput, "lost_h": run.lost_s / HOUR}
    totals["restart_h"], totals["checkpoint_h"] = run.restart_s / HOUR, run.checkpoint_s / HOUR
    return data, totals


def _curve(job: Job, seed: int) -> tuple[dict, dict[str, Any]]:
    """The goodput panel's traces' data (percent against minutes), and its figures."""
    m, c, r = job.job_mtbf_s, job.checkpoint_s, job.restart_s
    grid = _intervals(job)
    expected = [100 * expected_goodput(t, c, r, m) for t in grid]
    sampled = grid[:: max(1, len(grid) // SIMULATED_POINTS)]
    hours = SIMULATED_FAILURES * m / HOUR  # long enough for about 400 failures per point
    drawn = goodput_curve(job, sampled, hours, seed)
    young = young_interval(c, m)
    quorum = quorum_run(job.ranks, job.mtbf_h, job.step_s, r, hours, seed, record=False).goodput
    top = max(expected)
    this = expected_goodput(job.interval_s, c, r, m)
    data = {
        "expected": {"x": [t / 60 for t in grid], "y": expected},
        "simulated": {"x": [t / 60 for t, _, _ in drawn], "y": [100 * g for _, g, _ in drawn]},
        "young": {"x": [young / 60] * 2, "y": [0, 100]},
        "this job": {"x": [job.interval_s / 60], "y": [100 * this]},
        "quorum": {"x": [grid[0] / 60, grid[-1] / 60], "y": [100 * quorum] * 2},
    }
    figures = {"young_s": young, "expected": this, "best": top / 100, "quorum": quorum}
    figures["range"] = [math.log10(grid[0] / 60), math.log10(grid[-1] / 60)]
    return data, figures


def figure_data(job: Job, hours: float = 24.0, seed: int = 0) -> dict[str, Any]:
    """Every trace's data (``traces``), the legend's names, the axes' ranges and the figures a
    status line quotes (``totals``), for ``job`` over ``hours`` drawn with ``seed`` (fewer
    hours where they would hold more than about ``DRAWN_FAILURES`` failures)."""
    hours = min(hours, DRAWN_FAILURES * job.job_mtbf_s / HOUR)
    timeline, totals = _timeline(job, hours, seed)
    curve, figures = _curve(job, seed)
    totals.update(figures)
    names = {
        "young": f"Young's optimum: {figures['young_s'] / 60:.3g} min",
        "this job": f"every {job.interval_steps} steps: {job.interval_s / 60:.3g} min",
        "quorum": f"per-step quorum (steps of {job.step_s:g} s)",
    }
    low = min(*curve["expected"]["y"], 100 * figures["quorum"], *curve["simulated"]["y"])
    return {
        "traces": {**timeline, **curve},
        "names": names,
        "rows": _rows(job)[::-1],
        "hours": hours,
        "goodput_range": [max(0.0, low - 3), 101.0],
        "interval_range": figures["range"],
        "totals": {**totals, "hours": hours},
    }


def _empty_figure() -> go.Figure:
    """The two panels and their traces, without data (``apply`` fills them)."""
    fig = make_subplots(
        rows=2,
        cols=1,
        row_heights=[0.42, 0.58],
        vertical_spacing=0.16,
        subplot_titles=("one drawn run", "goodput against the checkpoint interval"),
    )
    line = {"mode": "lines", "hoverinfo": "skip"}
    for name, colour in (("work", WORK), ("checkpoint", NODE), ("lost", BAD), ("restart", RESTART)):
        if name == "checkpoint":
            marker = {"symbol": "line-ns", "size": BAR, "line": {"width": 2, "color": colour}}
            fig.add_scatter(name="checkpoint written", mode="markers", marker=marker, row=1, col=1)
        else:
            label = {"work": "training", "lost": "training lost", "restart": "restart"}[name]
            style = {"width": BAR, "color": colour}
            fig.add_scatter(name=label, line=style, **line, row=1, col=1)
    cross = {"symbol": "x", "size": 12, "color": BAD, "line": {"width": 1, "color": INK}}
    fig.add_scatter(name="failure", mode="markers", marker=cross, hoverinfo="text", row=1, col=1)
    fig.add_scatter(name="expected (Daly)", mode="lines", line={"color": INK}, row=2, col=1)
    fig.add_scatter(
        name="drawn runs", mode="markers", marker={"color": NODE, "size": 7}, row=2, col=1
    )
    fig.add_scatter(mode="lines", line={"color": WORK, "dash": "dash", "width": 2}, row=2, col=1)
    fig.add_scatter(
        mode="markers", marker={"color": BAD, "size": 13, "symbol": "diamond"}, row=2, col=1
    )
    fig.add_scatter(mode="lines", line={"color": QUORUM, "dash": "dot", "width": 2}, row=2, col=1)
    _axes(fig)
    return fig


def _axes(fig: go.Figure) -> None:
    """Titles, log interval axis, legend beside the panels, and a size legible at 1280 px."""
    fig.update_xaxes(title_text="hours", row=1, col=1)
    fig.update_yaxes(type="category", row=1, col=1)
    fig.update_xaxes(type="log", title_text="minutes of training between checkpoints", row=2, col=1)
    fig.update_yaxes(title_text="goodput (%)", row=2, col=1)
    fig.update_layout(
        height=620,
        margin={"l": 90, "r": 20, "t": 40, "b": 50},
        template="plotly_white",
        legend={"x": 1.02, "y": 1, "font": {"size": 12}},
        font={"size": 13},
    )


def apply(fig: go.Figure, data: dict[str, Any]) -> None:
    """Set ``data`` (from :func:`figure_data`) on ``fig``'s traces and axes, in place."""
    for trace, name in zip(fig.data, TRACES, strict=True):
        trace.update(**data["traces"][name])
        if name in data["names"]:
            trace.name = data["names"][name]
    fig.layout.yaxis.update(categoryorder="array", categoryarray=data["rows"])
    fig.layout.yaxis.range = [-0.6, len(data["rows"]) - 0.4]
    fig.layout.xaxis.range = [0, data["hours"]]
    fig.layout.yaxis2.range = data["goodput_range"]
    fig.layout.xaxis2.range = data["interval_range"]


def timeline_figure(job: Job | None = None, hours: float = 24.0, seed: int = 0) -> go.Figure:
    """A drawn run of ``job`` over ``hours`` and its goodput curve: a plain figure, no kernel."""
    fig = _empty_figure()
    apply(fig, figure_data(job or Job(), hours, seed))
    return fig
