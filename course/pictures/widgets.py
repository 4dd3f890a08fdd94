"""The ring widget: play, step and scrub through a ring all-reduce, the reference or your own.

    from course.pictures.widgets import ring_widget, animate
    ring_widget(world_size=8, numel=20)          # the reference schedule, from the simulator
    animate(ring_allreduce, world_size=4)        # your function, recorded on 4 real ranks

The only module of the package that imports ipywidgets. The picture is
``figures.RingView`` (the same drawing as the kernel-free ``ring_figure``) in a plotly
``FigureWidget``; a step only pushes the properties that change, and a new size redraws the
same ``FigureWidget`` (each new one would send plotly.js, 5 MB, to the browser). The widget
has one heading and one step counter, in the status line above the figure (the figure itself
has no title).
"""

from __future__ import annotations

import html
from collections.abc import Callable
from typing import Any

import ipywidgets as widgets
import plotly.graph_objects as go

from course.pictures.figures import RingView
from course.pictures.style import BAD, runs_text
from course.ranks.wording import count
from course.ring.trace import Trace, ring_trace

__all__ = [
    "HalfWidget",
    "RingWidget",
    "animate",
    "animate_half",
    "half_widget",
    "note",
    "ring_widget",
    "show_trace",
]

STEP_MS = 900  # one ring step per 0.9 s at 1x: slow enough to follow a chunk round the ring
SPEEDS = {"0.25x": 4.0, "0.5x": 2.0, "1x": 1.0, "2x": 0.5, "4x": 0.25}
MAX_WORLD_SIZE = 32


class RingWidget(widgets.VBox):
    """Play/step/scrub controls, a step counter and a deviation report around one trace."""

    def __init__(
        self,
        trace: Trace,
        label: str = "reference ring",
        simulate: bool = False,
        formulas: bool = True,
    ) -> None:
        self.label, self.itemsize, self.formulas = label, trace.itemsize, formulas
        rows: list[widgets.Widget] = [self._controls("step")]
        if simulate:
            self.world_size = widgets.IntSlider(  # a redraw when let go, not at every rank
                value=trace.world_size,
                min=2,
                max=MAX_WORLD_SIZE,
                description="world_size",
                continuous_update=False,
            )
            self.numel = widgets.BoundedIntText(
                value=trace.numel, min=1, max=1 << 16, description="numel"
            )
            self.world_size.observe(self._on_world_size, "value")
            self.numel.observe(self._on_size, "value")
            rows.append(widgets.HBox([self.world_size, self.numel]))
        self.figure = go.FigureWidget(self._figure(trace))
        super().__init__([*rows, self.status, self.figure, self.report])
        self.slider.observe(lambda change: self.show(change["new"]), "value")
        self.show(0)

    def _controls(self, unit: str) -> widgets.HBox:
        """Play, one ``unit`` back or forward, a slider and a speed; the status and report."""
        self.play = widgets.Play(interval=STEP_MS, description="play", show_repeat=False)
        self.slider = widgets.IntSlider(description=unit, continuous_update=True)
        widgets.jslink((self.play, "value"), (self.slider, "value"))
        self.back = _button("step-backward", f"one {unit} back", lambda _: self.step_by(-1))
        self.forward = _button("step-forward", f"one {unit} forward", lambda _: self.step_by(1))
        self.speed = widgets.SelectionSlider(options=list(SPEEDS), value="1x", description="speed")
        self.speed.observe(self._on_speed, "value")
        self.status = widgets.HTML().add_class("ring-status")
        self.report = widgets.HTML().add_class("ring-report")
        return widgets.HBox([self.play, self.back, self.forward, self.slider, self.speed])

    def _figure(self, trace: Trace) -> go.Figure:
        """The figure at step 0, so nothing is sent before the browser draws it."""
        self.view = self._view(trace)
        self.play.playing = False
        self.play.value = self.slider.value = 0
        self.play.max = self.slider.max = self.view.last
        fig = self.view.base()
        self.view.apply(fig, self.view.frame(0))
        # No play button or slider inside, and no title: the status line above is the title.
        fig.update_layout(height=540, margin_b=45, margin_t=10, title_text="")
        return fig

    def _view(self, trace: Trace) -> RingView:
        return RingView(trace, self.label, self.formulas)

    def load(self, trace: Trace) -> None:
        """Show another trace from its first step, in the same ``FigureWidget``: its traces
        and layout are replaced in place. (Each new ``FigureWidget`` sends plotly.js, 5 MB,
        to the browser, which loads it again, and the old one would stay in the kernel.)"""
        fig = self._figure(trace)
        self.figure.data = ()  # plotly sets a figure's data only to a subset of it: none here
        self.figure.layout = fig.layout  # every view draws the same layout keys
        self.figure.add_traces(fig.data)
        self.show(0)

    def show(self, step: int) -> None:
        """Draw the ring after ``step`` steps: restyle only the traces and leaves that change."""
        frame = self.view.frame(step)
        # One restyle per trace, not one batch_update: a batch merges every trace's keys into
        # one restyle and fills the gaps with "undefined", which plotly.js in JupyterLab
        # turned into resetting the markers of the other traces (bars and ranks lost colour).
        for index, props in frame.data.items():
            data = {key.replace("marker_", "marker."): [value] for key, value in props.items()}
            self.figure.plotly_restyle(data, trace_indexes=[index])
        self.status.value = self._status(step)
        self.report.value = self._report(step)

    def step_by(self, delta: int) -> None:
        """Move the slider (and so the picture) ``delta`` steps, within the trace."""
        self.play.playing = False
        self.slider.value = min(max(self.slider.value + delta, 0), self.view.last)

    def _on_speed(self, change: dict[str, Any]) -> None:
        self.play.interval = round(STEP_MS * SPEEDS[change["new"]])

    def _on_world_size(self, change: dict[str, Any]) -> None:
        """A new world size keeps about 3 elements per chunk (numel follows N), then redraws."""
        with self.numel.hold_trait_notifications():
            self.numel.unobserve(self._on_size, "value")
            self.numel.value = default_numel(change["new"])
            self.numel.observe(self._on_size, "value")
        self._on_size(change)

    def _on_size(self, _change: dict[str, Any]) -> None:
        self.load(ring_trace(self.world_size.value, self.numel.value, self.itemsize))

    def _whole(self) -> str:
        """The bytes one rank sends in the whole collective, as the status line says it."""
        view = self.view
        if not self.formulas:
            return f"(the tensor: {view.trace.nbytes:,} B)"
        return f"(a whole ring: 2(N-1)/N x {view.trace.nbytes:,} B = {view.formula:,.0f} B)"

    def _status(self, step: int) -> str:
        view = self.view
        sent = max(view.sent(step), default=0)
        whole = self._whole()
        return (
            f"<div class='ring-heading' style='font-size:15px'>{html.escape(view.heading)}</div>"
            f"<b class='ring-step'>{html.escape(view.counter(step))}</b> &nbsp;|&nbsp; "
            f"most bytes sent by one rank so far: {sent:,} B {whole}"
        )

    def _report(self, step: int) -> str:
        view = self.view
        if not view.deviations:
            return "<p>No deviations: every message is where a ring all-reduce puts it.</p>"
        here = set(map(id, view.at(step)))
        head = f"<b style='color:{BAD}'>{count(len(view.deviations), 'deviation')} from the ring"
        if view.trace.unfinished:
            stuck = list(view.trace.unfinished)
            who = f"{'rank' if len(stuck) == 1 else 'ranks'} {runs_text(stuck)}"
            head += f"; the run did not finish ({who}), the animation ends where it stopped"
        items = [
            f"<li style='{f'font-weight:bold;color:{BAD}' if id(v) in here else 'color:#555'}'>"
            f"{'&#9654; ' if id(v) in here else ''}{html.escape(v.line)}</li>"
            for v in view.deviations
        ]
        return f"{head}</b> (bold: shown at this step)<ul>{''.join(items)}</ul>"


def note(text: str) -> widgets.HTML:
    """One line in place of the widget, saying why there is nothing to draw."""
    return widgets.HTML(f"<p class='ring-report'>{html.escape(text)}</p>")


def _button(icon: str, tooltip: str, on_click: Callable[[Any], None]) -> widgets.Button:
    button = widgets.Button(icon=icon, tooltip=tooltip, layout=widgets.Layout(width="40px"))
    button.on_click(on_click)
    return button


def show_trace(trace: Trace, label: str = "your run") -> RingWidget:
    """Animate any trace (the reference's, a recorded run's, one read back from JSON)."""
    return RingWidget(trace, label)


def ring_widget(
    world_size: int = 4,
    numel: int | None = None,
    itemsize: int = 4,
    formulas: bool = True,
    resizable: bool = True,
) -> RingWidget:
    """The reference ring from the simulator, with world_size and numel controls;
    ``formulas=False`` leaves out the closed forms a question asks for, and
    ``resizable=False`` the size controls, for a picture of one world size only."""
    _check_world_size(world_size)
    numel = default_numel(world_size) if numel is None else numel
    trace = ring_trace(world_size, numel, itemsize)
    return RingWidget(trace, "reference ring", simulate=resizable, formulas=formulas)


def _check_world_size(world_size: int) -> None:
    if not 2 <= world_size <= MAX_WORLD_SIZE:
        raise ValueError(
            f"the widget draws 2 to {MAX_WORLD_SIZE} ranks, got world_size={world_size}"
        )


def default_numel(world_size: int) -> int:
    """Elements of the drawn tensor: 3 per chunk and one more, so chunks differ by one."""
    return 3 * world_size + 1


def animate(
    fn: Callable[[Any], Any], world_size: int = 4, numel: int | None = None, timeout: float = 20.0
) -> RingWidget | widgets.HTML:
    """Run ``fn(tensor)`` on ``world_size`` real ranks, record every message and animate it;
    a run that deadlocks or crashes is animated up to where it stopped; a function still
    left as the released stub is not run, nor a size the recording cannot hold, and the
    widget says why in one line."""
    from course.checks.teaching import not_implemented
    from course.ring.encoding import max_numel
    from course.ring.recorder import record  # torch only when a real run is asked for

    if not 2 <= world_size <= MAX_WORLD_SIZE:
        return note(f"the widget draws 2 to {MAX_WORLD_SIZE} ranks, not world_size={world_size}")
    message = not_implemented(fn)
    if message:
        return note(f"Nothing to animate yet: {message}")
    most = max_numel(world_size)
    if numel is not None and not 1 <= numel <= most:
        return note(
            f"numel={numel} cannot be recorded on {world_size} ranks: each recorded element "
            f"must spell out the ranks it holds exactly in float64, so 1 to {most:,} elements "
            "fit. Use a smaller numel (or fewer ranks)."
        )
    label = f"your {getattr(fn, '__name__', 'function')}"
    if numel is None and default_numel(world_size) > most:
        label += f" (at most {count(most, 'element')} can be recorded on {world_size} ranks)"
    numel = min(default_numel(world_size), most) if numel is None else numel
    trace = record(fn, world_size, numel=numel, timeout=timeout)
    return RingWidget(trace, label)


# --- one half of the ring: reduce-scatter alone, all-gather alone -------------------------


class HalfWidget(RingWidget):
    """The ring widget for one half (``course.pictures.halves.HalfView``), same controls."""

    def __init__(
        self,
        trace: Trace,
        half: str,
        label: str = "reference",
        simulate: bool = False,
        formulas: bool = True,
    ) -> None:
        self.half = half
        super().__init__(trace, label, simulate, formulas)

    def _view(self, trace: Trace) -> RingView:
        from course.pictures.halves import HalfView

        return HalfView(trace, self.half, self.label, self.formulas)  # type: ignore[arg-type]

    def _on_size(self, _change: dict[str, Any]) -> None:
        from course.ring.halves import half_trace

        size = (self.world_size.value, self.numel.value, self.itemsize)
        self.load(half_trace(self.half, *size))  # type: ignore[arg-type]

    def _whole(self) -> str:
        if not self.formulas:
            return super()._whole()
        view = self.view
        return f"(a whole {self.half}: (N-1)/N x {view.trace.nbytes:,} B = {view.formula:,.0f} B)"

    def _report(self, step: int) -> str:
        return super()._report(step).replace("a ring all-reduce", f"a ring {self.half}")


def half_widget(
    half: str,
    world_size: int = 4,
    numel: int | None = None,
    formulas: bool = True,
    resizable: bool = True,
) -> HalfWidget:
    """The reference reduce-scatter or all-gather from the simulator, with size controls;
    ``formulas`` and ``resizable`` as for :func:`ring_widget`."""
    from course.ring.halves import half_trace

    _check_world_size(world_size)
    numel = default_numel(world_size) if numel is None else numel
    trace = half_trace(half, world_size, numel, 4)  # type: ignore[arg-type]
    return HalfWidget(trace, half, "reference", simulate=resizable, formulas=formulas)


def animate_half(
    fn: Callable[..., Any], half: str, world_size: int = 4, numel: int | None = None
) -> HalfWidget | widgets.HTML:
    """Record ``fn`` (your ``reduce_scatter`` or ``all_gather``) on real ranks and animate it;
    a function still left as the released stub is not run, and the widget says so."""
    from course.checks.teaching import not_implemented
    from course.ring.halves_record import record_half

    message = not_implemented(fn)
    if message:
        return note(f"Nothing to animate yet: {message}")
    from course.ring.encoding import max_numel

    numel = min(default_numel(world_size), max_numel(world_size)) if numel is None else numel
    trace = record_half(fn, half, world_size, numel)  # type: ignore[arg-type]
    return HalfWidget(trace, half, f"your {getattr(fn, '__name__', 'function')}")
