"""The failures widget: a drawn day of a checkpointed job, and its goodput, under live settings.

    from course.lessons.fault_tolerance.widget import failures_widget
    failures_widget(ranks=4096, mtbf_h=50_000, checkpoint_s=60, interval_steps=60)

Sliders for the ranks N, each rank's MTBF, the checkpoint's cost, the steps between
checkpoints and the restart's time, and a seed: each change draws the run again and redraws
``course.lessons.fault_tolerance.timeline``'s figure in place (a plotly ``FigureWidget``, one
batch of property updates). ipywidgets comes from ``course.pictures.widgets``, the one module
of the package that imports it.
"""

from __future__ import annotations

import html
from dataclasses import replace
from typing import Any

import plotly.graph_objects as go

from course.lessons.fault_tolerance.failures import Job
from course.lessons.fault_tolerance.timeline import apply, figure_data, timeline_figure
from course.pictures.widgets import widgets
from course.ranks.wording import count

__all__ = ["FailuresWidget", "failures_widget"]

RANKS = [2**k for k in range(15)]  # 1 to 16,384
STEPS = sorted({round(10 ** (i / 8)) for i in range(33)})  # 1 to 10,000, evenly on a log scale


class FailuresWidget(widgets.VBox):
    """The settings, a status line of what the drawn run lost, and the figure, redrawn live."""

    def __init__(self, job: Job, hours: float = 24.0, seed: int = 0) -> None:
        self.job, self.hours = job, hours
        self.figure = go.FigureWidget(timeline_figure(job, hours, seed))
        self.status = widgets.HTML().add_class("failures-status")
        controls = self._controls(job, seed)
        super().__init__([controls, self.status, self.figure])
        self.redraw()

    def _controls(self, job: Job, seed: int) -> widgets.Box:
        """The six settings, two rows of sliders that each redraw on change."""
        style = {"style": {"description_width": "initial"}, "layout": widgets.Layout(width="400px")}
        log = {"base": 10, "step": 0.05, "continuous_update": False, **style}
        self.ranks = widgets.SelectionSlider(
            options=sorted({*RANKS, job.ranks}), value=job.ranks, description="ranks N", **style
        )
        self.mtbf = widgets.FloatLogSlider(
            value=job.mtbf_h, min=0, max=6, description="MTBF per rank (h)", **log
        )
        self.checkpoint = widgets.FloatLogSlider(
            value=job.checkpoint_s, min=-1, max=3, description="checkpoint cost C (s)", **log
        )
        self.interval = widgets.SelectionSlider(
            options=sorted({*STEPS, job.interval_steps}),
            value=job.interval_steps,
            description=f"checkpoint every K steps (of {job.step_s:g} s)",
            **style,
        )
        self.restart = widgets.FloatSlider(
            value=job.restart_s / 60, min=0, max=60, step=1, description="restart R (min)", **style
        )
        self.seed = widgets.BoundedIntText(value=seed, min=0, max=10**6, description="seed")
        for control in (self.ranks, self.mtbf, self.checkpoint, self.interval, self.restart):
            control.continuous_update = False
            control.observe(self._on_change, "value")
        self.seed.observe(self._on_change, "value")
        rows = [
            [self.ranks, self.mtbf, self.seed],
            [self.checkpoint, self.interval, self.restart],
        ]
        flow = widgets.Layout(flex_flow="row wrap")
        return widgets.VBox([widgets.HBox(row, layout=flow) for row in rows])

    def _on_change(self, _change: dict[str, Any]) -> None:
        self.job = replace(
            self.job,
            ranks=self.ranks.value,
            mtbf_h=self.mtbf.value,
            checkpoint_s=self.checkpoint.value,
            interval_steps=self.interval.value,
            restart_s=60 * self.restart.value,
        )
        self.redraw()

    def redraw(self) -> None:
        """Draw the run again with the current settings and seed; push the changes at once."""
        data = figure_data(self.job, self.hours, self.seed.value)
        with self.figure.batch_update():
            apply(self.figure, data)
        self.status.value = _status(self.job, data["totals"])


def _status(job: Job, totals: dict[str, Any]) -> str:
    """One line: the job's MTBF, what the drawn run lost, and the goodputs beside it."""
    drawn = (
        f"{totals['hours']:.3g} h drawn: {count(totals['failures'], 'failure')}, "
        f"{totals['lost_h']:.2f} h of training lost, {totals['restart_h']:.2f} h restarting, "
        f"{totals['checkpoint_h']:.2f} h writing checkpoints; goodput {totals['goodput']:.1%}"
    )
    expected = (
        f"expected over a long run: {totals['expected']:.1%} at this interval, "
        f"{totals['best']:.1%} at the best; per-step quorum {totals['quorum']:.2%}"
    )
    mtbf = job.job_mtbf_s / 3600
    heading = f"job MTBF {mtbf:,.0f} h" if mtbf >= 100 else f"job MTBF {mtbf:.3g} h"
    return "<br>".join(html.escape(line) for line in (f"{heading} | {drawn}", expected))


def failures_widget(
    ranks: int = 4096,
    mtbf_h: float = 50_000.0,
    checkpoint_s: float = 60.0,
    interval_steps: int = 60,
    restart_s: float = 600.0,
    step_s: float = 10.0,
    hours: float = 24.0,
    seed: int = 0,
) -> FailuresWidget:
    """The widget for a job of ``ranks`` ranks (each failing every ``mtbf_h`` hours on average),
    a checkpoint of ``checkpoint_s`` every ``interval_steps`` steps of ``step_s``, a restart of
    ``restart_s``: a drawn ``hours`` of it and its goodput against the interval."""
    job = Job(ranks, mtbf_h, checkpoint_s, interval_steps, restart_s, step_s)
    return FailuresWidget(job, hours, seed)
