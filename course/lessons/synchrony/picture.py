"""The cost of synchrony, drawn: the alpha-beta fit, the tree/ring crossover, a straggler's
timeline and the batch-size sweep's loss curves.

Each function takes the plain data an experiment returns (``course.lessons.synchrony.latency``,
``stragglers``, ``batch_size``) and builds one plotly figure; nothing is measured here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from course.pictures.style import BAD, FULL, INK, NODE
from course.ring.cost import crossover_size, recursive_doubling, ring

__all__ = ["alpha_beta_figure", "crossover_figure", "loss_curves_figure", "timeline_figure"]

_N_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd")
_LOG_BYTES = {"type": "log", "exponentformat": "SI", "ticksuffix": "B"}
_LOG_SECONDS = {"type": "log", "exponentformat": "SI", "ticksuffix": "s"}


def alpha_beta_figure(times: Mapping[int, float], alpha: float, beta: float) -> go.Figure:
    """Measured one-way times per message size (log-log) under the fitted ``alpha + m beta``."""
    sizes = sorted(times)
    fig = go.Figure()
    fig.add_scatter(
        x=sizes, y=[times[s] for s in sizes], mode="markers", name="measured", marker={"color": INK}
    )
    grid = [sizes[0] * (sizes[-1] / sizes[0]) ** (i / 60) for i in range(61)]
    fig.add_scatter(
        x=grid,
        y=[alpha + s * beta for s in grid],
        mode="lines",
        name="alpha + m beta",
        line={"color": NODE},
    )
    fig.update_xaxes(title_text="message size m", **_LOG_BYTES)
    fig.update_yaxes(title_text="one-way time", **_LOG_SECONDS)
    fig.update_layout(
        title=f"alpha = {alpha * 1e6:.3g} μs, 1/beta = {1 / beta / 1e9:.3g} GB/s", hovermode="x"
    )
    return fig


def crossover_figure(
    measured: Mapping[str, Mapping[int, float]], alpha: float, beta: float, world_size: int = 4
) -> go.Figure:
    """Measured all-reduce times per tensor size in bytes (``{"ring": {...}, "tree": {...}}``)
    beside the alpha-beta model's lines for the ring and recursive doubling, log-log, with
    the predicted crossover marked."""
    model = {"ring": ring, "tree": recursive_doubling}
    colours = {"ring": NODE, "tree": BAD}
    sizes = sorted({s for times in measured.values() for s in times})
    grid = [sizes[0] * (sizes[-1] / sizes[0]) ** (i / 60) for i in range(61)]
    fig = go.Figure()
    for name, times in measured.items():
        colour = colours.get(name, INK)
        xs = sorted(times)
        fig.add_scatter(
            x=xs,
            y=[times[s] for s in xs],
            mode="markers",
            name=f"{name}, measured",
            legendgroup=name,
            marker={"color": colour, "size": 9},
        )
        if name in model:
            predicted = [model[name](s, world_size, alpha, beta).seconds for s in grid]
            fig.add_scatter(
                x=grid,
                y=predicted,
                mode="lines",
                name=f"{name}, alpha-beta model",
                legendgroup=name,
                line={"color": colour, "dash": "dash"},
            )
    fig.add_vline(x=crossover_size(alpha, beta, world_size), line={"dash": "dot", "color": FULL})
    fig.update_xaxes(title_text="tensor size", **_LOG_BYTES)
    fig.update_yaxes(title_text="all-reduce time", **_LOG_SECONDS)
    fig.update_layout(title=f"tree against ring on {world_size} ranks", hovermode="x")
    return fig


def timeline_figure(spans: Sequence[Sequence[Mapping[str, float]]]) -> go.Figure:
    """Each rank's steps on one time axis: compute (the forward) and waiting (the backward,
    which ends with the all-reduce), from ``course.lessons.synchrony.stragglers.straggler_run``."""
    fig = go.Figure()
    kinds = {
        "compute": ("start", "forward_end", NODE),
        "waiting in all-reduce": ("forward_end", "backward_end", FULL),
    }
    for kind, (begin, end, colour) in kinds.items():
        ys, bases, widths = [], [], []
        for rank, steps in enumerate(spans):
            for s in steps:
                ys.append(f"rank {rank}")
                bases.append(s[begin] * 1e3)
                widths.append((s[end] - s[begin]) * 1e3)
        fig.add_bar(
            y=ys,
            x=widths,
            base=bases,
            orientation="h",
            name=kind,
            marker={"color": colour},
            hovertemplate="%{y}: %{x:.1f} ms from %{base:.1f} ms<extra>" + kind + "</extra>",
        )
    fig.update_layout(barmode="overlay", title="one step after another, per rank")
    fig.update_xaxes(title_text="time (ms)")
    fig.update_yaxes(autorange="reversed")
    return fig


def loss_curves_figure(curves: Mapping[tuple[int, str], Sequence[float]]) -> go.Figure:
    """The loss after each epoch, one panel per learning-rate rule, one line per world size
    (from ``course.lessons.synchrony.batch_size.sweep``), on a log axis."""
    rules = list(dict.fromkeys(rule for _, rule in curves))
    sizes = sorted({n for n, _ in curves})
    fig = make_subplots(rows=1, cols=len(rules), subplot_titles=rules, shared_yaxes=True)
    for col, rule in enumerate(rules, start=1):
        for i, n in enumerate(sizes):
            if (n, rule) not in curves:
                continue
            fig.add_scatter(
                y=list(curves[n, rule]),
                mode="lines+markers",
                name=f"N = {n}",
                legendgroup=str(n),
                showlegend=col == 1,
                row=1,
                col=col,
                line={"color": _N_COLOURS[i % len(_N_COLOURS)]},
            )
    fig.update_xaxes(title_text="epoch")
    fig.update_yaxes(type="log", title_text="loss", row=1, col=1)
    fig.update_yaxes(type="log")
    fig.update_layout(title="fixed batch per rank: the global batch grows with N")
    return fig
