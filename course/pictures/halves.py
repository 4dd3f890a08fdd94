"""One half of the ring, drawn: the ring picture of ``course.pictures.figures`` for a reduce-scatter
alone or an all-gather alone, from the same trace format.

:class:`HalfView` is a :class:`~course.pictures.figures.RingView` that counts ``N-1`` steps, draws
``(N-1)/N x size`` as the bytes line, starts from the half's own state (every rank's own
contribution everywhere, or each rank's shard whole and nothing else) and reports
deviations from half a ring (``course.ring.halves.half_violations``). :func:`half_figure` plays
it without a kernel; ``course.pictures.widgets.half_widget`` and ``animate_half`` drive it live.
"""

from __future__ import annotations

from functools import cached_property

import plotly.graph_objects as go

from course.pictures.figures import (
    FORMULA,
    RingView,
    _as_trace,
    _notes_annotation,
    _play_buttons,
    _slider,
)
from course.ring.halves import Half, half_bytes_formula, half_states, half_violations
from course.ring.trace import Trace
from course.ring.verdict import Violation

__all__ = ["HalfView", "half_figure"]

TITLES = {"reduce-scatter": "Reduce-scatter alone", "all-gather": "All-gather alone"}


class HalfView(RingView):
    """Per-step drawing data for one half of a ring."""

    def __init__(self, trace: Trace, half: Half, label: str = "reference") -> None:
        self.half = half
        super().__init__(trace, label)
        self.states = half_states(trace, half)
        self.last = len(self.states) - 1
        self.ideal = trace.world_size - 1
        self.formula = half_bytes_formula(trace.nbytes, self.n)

    @cached_property
    def deviations(self) -> list[Violation]:
        """Where the run departs from half a ring; the reference has none."""
        return half_violations(self.trace, self.half)

    def _title(self, step: int) -> str:
        t = self.trace
        head = (
            f"{TITLES[self.half]}, {self.label}: N = {self.n}, {t.numel} elements x {t.itemsize} B"
        )
        return f"{head}<br><b>{self.counter(step)}</b>"

    def counter(self, step: int) -> str:
        """``steps done: 2 / 3 - arrows: step 1``."""
        done = f"steps done: {step} / {self.ideal}"
        if step == 0:
            start = (
                "each rank holds only its own contribution"
                if self.half == "reduce-scatter"
                else "each rank holds only its own shard"
            )
            return f"{done} - start: {start}"
        extra = " (extra: half a ring needs only N-1)" if step > self.ideal else ""
        return f"{done} - arrows: step {step - 1}, {self.half}{extra}"

    def _describe_cell(self, rank: int, chunk: int, mask: int) -> str:
        if mask == 0:
            return f"rank {rank}, chunk {chunk}: not received yet"
        return super()._describe_cell(rank, chunk, mask)

    def base(self) -> go.Figure:
        """The ring figure at step 0, with the bytes line of one half."""
        fig = super().base()
        fig.data[FORMULA].name = f"(N-1)/N x size = {self.formula:,.0f} B"
        return fig


def half_figure(
    trace: Trace, half: Half, label: str = "reference", duration_ms: int = 900
) -> go.Figure:
    """A self-contained animation of one half (frames, play button, slider): no kernel needed."""
    view = HalfView(trace, half, label)
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
