"""One FSDP step, drawn: what each rank holds of each unit after each event, and its memory.

    from course.lessons.fsdp.picture import fsdp_figure, fsdp_widget
    fsdp_figure(units=3, world_size=4)                   # plotly frames: animates without a kernel
    fsdp_widget(reshard_after_forward=False)             # the same picture with live controls
    fsdp_widget(trace=recorder.collectives, unit_numels=[...], world_size=4)   # your own run

Left, the grid: a band per rank (its parameters above, its gradients below), a column of N
slots per unit, slot k standing for rank k's shard. Right, the parameters and gradients one
rank holds over the step (ranks are alike), the current event marked. The frames come from
``course.lessons.fsdp.view.FsdpView``, which has the interface of
``course.pictures.view.RingView`` (``base``, ``frame``, ``apply``, ``last``), so the ring's
``figures.animation`` plays it and ``course.lessons.fsdp.widget`` drives it live.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import plotly.graph_objects as go

from course.lessons.fsdp.schedule import Schedule, fsdp_schedule, schedule_from_trace
from course.lessons.fsdp.view import FsdpView
from course.lessons.fsdp.widget import FsdpWidget
from course.pictures.figures import animation

__all__ = ["fsdp_figure", "fsdp_widget", "run_figure", "schedule_figure"]


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
    """The FSDP step with play/step controls (``course.lessons.fsdp.widget``; a prefetch
    switch unless ``prefetch_control`` is off); with a ``trace`` (one rank's collectives) and
    its ``unit_numels``, the step of your own run."""
    if trace is not None:
        if unit_numels is None:
            raise ValueError("a trace needs unit_numels: the elements of each unit, in order")
        schedule = schedule_from_trace(trace, unit_numels, world_size)
        return FsdpWidget(schedule, "your run")
    schedule = fsdp_schedule(units, world_size, reshard_after_forward, prefetch)
    return FsdpWidget(schedule, "reference", simulate=True, prefetch_control=prefetch_control)
