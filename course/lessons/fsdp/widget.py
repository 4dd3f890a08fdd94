"""The FSDP widget: play, step and scrub through one FSDP step, the reference or your own run.

    from course.lessons.fsdp.picture import fsdp_widget
    fsdp_widget(units=3, world_size=4)    # with world size, units, reshard, prefetch controls

The ring widget's machinery (``course.pictures.widgets.RingWidget``: the Play/slider pair, the
step buttons, one restyle per changed trace) around ``course.lessons.fsdp.view.FsdpView``;
ipywidgets comes from ``course.pictures.widgets``, the one module that imports it.
"""

from __future__ import annotations

import html
from typing import Any

import plotly.graph_objects as go

from course.lessons.fsdp.schedule import Schedule, fsdp_schedule
from course.lessons.fsdp.view import HEIGHT, FsdpView
from course.pictures.style import BAD
from course.pictures.widgets import RingWidget, widgets

__all__ = ["MAX_UNITS", "MAX_WORLD_SIZE", "FsdpWidget"]

MAX_WORLD_SIZE, MAX_UNITS = 8, 6  # beyond these the slots get too small to read at 1280 px


class FsdpWidget(RingWidget):
    """Play/step/scrub controls, the current event and the memory held around one schedule."""

    def __init__(
        self,
        schedule: Schedule,
        label: str = "reference",
        simulate: bool = False,
        prefetch_control: bool = True,
    ) -> None:
        self.label, self.formulas = label, True
        rows: list[widgets.Widget] = [self._controls("event")]
        if simulate:
            rows.append(self._settings(schedule, prefetch_control))
        self.figure = go.FigureWidget(self._figure(schedule))  # type: ignore[arg-type]
        widgets.VBox.__init__(self, [*rows, self.status, self.figure, self.report])
        self.slider.observe(lambda change: self.show(change["new"]), "value")
        self.show(0)

    def _settings(self, s: Schedule, prefetch_control: bool = True) -> widgets.HBox:
        """World size, units, and the FSDP settings (prefetch unless ``prefetch_control`` is
        off, as where a quiz asks what a prefetch holds): each change redraws from event 0."""
        # A slider's description takes the width it needs and the track keeps 160 px: in an
        # HBox at 1280 px the defaults squeeze a track to about 25 px. It redraws when let go.
        slider = {
            "style": {"description_width": "initial"},
            "layout": widgets.Layout(width="260px"),
            "continuous_update": False,
        }
        box = {"indent": False, "layout": widgets.Layout(width="auto", margin="0 0 0 16px")}
        self.world_size = widgets.IntSlider(
            value=s.world_size, min=2, max=MAX_WORLD_SIZE, description="world_size", **slider
        )
        self.units = widgets.IntSlider(
            value=s.units, min=1, max=MAX_UNITS, description="units", **slider
        )
        self.reshard = widgets.Checkbox(
            value=s.reshard_after_forward, description="reshard_after_forward", **box
        )
        self.prefetch = widgets.Checkbox(value=s.prefetch, description="prefetch", **box)
        controls = [self.world_size, self.units, self.reshard]
        controls += [self.prefetch] if prefetch_control else []
        for control in controls:
            control.observe(self._on_settings, "value")
        return widgets.HBox(controls, layout=widgets.Layout(flex_flow="row wrap"))

    def _on_settings(self, _change: dict[str, Any]) -> None:
        self.load(
            fsdp_schedule(  # type: ignore[arg-type]
                self.units.value, self.world_size.value, self.reshard.value, self.prefetch.value
            )
        )

    def _view(self, schedule: Schedule) -> FsdpView:  # type: ignore[override]
        return FsdpView(schedule, self.label)

    def _figure(self, schedule: Schedule) -> Any:  # type: ignore[override]
        fig = super()._figure(schedule)  # type: ignore[arg-type]
        fig.layout.height = HEIGHT - 90
        return fig

    def _status(self, step: int) -> str:
        view = self.view
        params, grads = view.memory[step]
        held = (
            f"one rank holds {params:.3f} x the model in parameters, {grads:.3f} in gradients "
            f"(most so far: {max(p for p, _ in view.memory[: step + 1]):.3f} in parameters)"
        )
        return (
            f"<div class='ring-heading' style='font-size:15px'>{html.escape(view.heading)}</div>"
            f"<b class='ring-step'>{html.escape(view.counter(step))}</b> &nbsp;|&nbsp; {held}"
        )

    def _report(self, _step: int) -> str:
        notes = self.view.schedule.notes
        if not notes:
            return ""
        items = "".join(f"<li>{html.escape(n)}</li>" for n in notes)
        return f"<b style='color:{BAD}'>Calls that fit no unit (left out):</b><ul>{items}</ul>"
