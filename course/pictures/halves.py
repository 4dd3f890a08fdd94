"""One half of the ring, drawn: the ring picture for a reduce-scatter alone or an all-gather
alone, from the same trace format.

:class:`HalfView` is a :class:`~course.pictures.view.RingView` that counts ``N-1`` steps, draws
``(N-1)/N x size`` as the bytes line (unless ``formulas=False``), starts from the half's own
state (every rank's own contribution everywhere, or each rank's shard whole and nothing else)
and reports deviations from half a ring (``course.ring.halves.half_violations``).
:func:`half_figure` plays it without a kernel; ``course.pictures.widgets.half_widget`` and
``animate_half`` drive it live.
"""

from __future__ import annotations

from functools import cached_property

import numpy as np
import plotly.graph_objects as go

from course.pictures.base import FORMULA, GRID
from course.pictures.deviations import Deviation, deviations
from course.pictures.figures import animation
from course.pictures.view import RingView
from course.ranks.wording import count
from course.ring.halves import Half, half_bytes_formula, half_states, half_violations
from course.ring.trace import Trace

__all__ = ["HalfView", "half_figure"]

TITLES = {"reduce-scatter": "Reduce-scatter alone", "all-gather": "All-gather alone"}
STARTS = {
    "reduce-scatter": "each rank holds only its own contribution",
    "all-gather": "each rank holds only its own shard",
}


class HalfView(RingView):
    """Per-step drawing data for one half of a ring."""

    def __init__(
        self, trace: Trace, half: Half, label: str = "reference", formulas: bool = True
    ) -> None:
        """``formulas=False`` leaves out the half's closed forms (its steps and bytes), as
        ``RingView`` does, for a picture shown before a question asks for them."""
        self.half = half
        super().__init__(trace, label, formulas)
        self.states = half_states(trace, half)
        self.last = len(self.states) - 1
        self.ideal = trace.world_size - 1
        self.formula = half_bytes_formula(trace.nbytes, self.n)

    @cached_property
    def deviations(self) -> list[Deviation]:
        """Where the run departs from half a ring; the reference has none."""
        return deviations(self.trace, half_violations(self.trace, self.half))

    @property
    def heading(self) -> str:
        """What is drawn: which half, whose run, on how many ranks, of what tensor."""
        t = self.trace
        return (
            f"{TITLES[self.half]}, {self.label}: N = {self.n}, "
            f"{count(t.numel, 'element')} x {t.itemsize} B"
        )

    def counter(self, step: int) -> str:
        """``step 2 / 3 - reduce-scatter``: steps count from 1, as for the whole ring; without
        formulas the count of a whole half is left out."""
        of = f" / {self.ideal}" if self.formulas else ""
        if step == 0:
            return f"step 0{of} - start: {STARTS[self.half]}"
        extra = " (extra: half a ring needs only N-1)" if step > self.ideal else ""
        return f"step {step}{of} - {self.half}{extra}"

    def _cell_text(self, rank: int, chunk: int, mask: int) -> str:
        lo, hi = self.bounds[chunk]
        if mask == 0 and lo < hi:
            return f"rank {rank}, chunk {chunk}: not received yet"
        return super()._cell_text(rank, chunk, mask)

    def _grid(self, step: int) -> dict:
        """The chunks; in the all-gather, one not received yet is left blank (it holds
        nothing), not drawn in the colour of a chunk holding one rank's contribution."""
        grid = super()._grid(step)
        if self.half == "all-gather":
            grid["z"][np.array(self.states[step]) == 0] = None
        return grid

    def base(self) -> go.Figure:
        """The ring figure at step 0, with the bytes line of one half and, for the
        all-gather, a colour bar that says what a blank chunk is."""
        fig = super().base()
        # Without formulas the hidden line keeps no closed form in its name (see base._bytes).
        fig.data[FORMULA].name = f"(N-1)/N x size = {self.formula:,.0f} B" if self.formulas else ""
        if self.half == "all-gather":
            bar = fig.data[GRID].colorbar
            bar.title.text = "ranks in<br>the chunk<br>(blank: not<br>received yet)"
            bar.ticktext = ["1" if t == "own only" else t for t in bar.ticktext]
        return fig


def half_figure(
    trace: Trace, half: Half, label: str = "reference", duration_ms: int = 900
) -> go.Figure:
    """A self-contained animation of one half (frames, play button, slider): no kernel needed."""
    return animation(HalfView(trace, half, label), duration_ms)
