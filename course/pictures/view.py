"""The ring after each step, as plain plotly properties: one :class:`Frame` per step.

:class:`RingView` turns a :class:`~course.ring.trace.Trace` into per-step trace updates; the
static figure (``course.pictures.figures``) plays them as plotly frames and the widget
(``course.pictures.widgets``) pushes them to a live ``FigureWidget``. Steps count from 1: the
frame after step k draws the arrows of step k (the messages of order k - 1) and the chunks as
they are once those messages have landed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import plotly.graph_objects as go

from course.pictures import base, style
from course.pictures.base import ARROWS, BAD_ARROWS, BYTES, GRID, LABELS, RANKS, RECEIVED, WAITING
from course.pictures.deviations import Deviation, deviations, pending_receives, pending_sends
from course.pictures.style import BAD, NODE
from course.ranks.wording import count
from course.ring.schedule import chunk_bounds, num_steps, ring_bytes_formula
from course.ring.trace import Message, Trace, bytes_sent, chunk_states, full_mask

__all__ = ["Frame", "RingView"]

Point = tuple[float, float]


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


def _overlapping(m: Message, bounds: list[tuple[int, int]]) -> list[int]:
    """Chunks a payload overlaps (empty if its offset could not be read)."""
    if m.offset is None:
        return []
    lo, hi = m.offset, m.offset + max(m.numel, 1)
    return [c for c, (a, b) in enumerate(bounds) if a < b and a < hi and lo < b]


class RingView:
    """Per-step drawing data for one trace; shared by the static figure and the widget."""

    def __init__(self, trace: Trace, label: str = "reference ring", formulas: bool = True) -> None:
        """``formulas=False`` leaves out the ring's closed forms (its steps and bytes), for a
        picture a question asks the student to read."""
        self.trace, self.label, self.formulas = trace, label, formulas
        self.n = trace.world_size
        self.size = style.sizes(self.n)
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
        self.waiting = pending_receives(trace)
        self.unsent = pending_sends(trace)  # drawn dashed, like the receives, never counted
        self._cache: dict[int, Frame] = {}
        self._texts: dict[tuple[int, int, int], str] = {}

    @cached_property
    def deviations(self) -> list[Deviation]:
        """Where the run departs from a ring, repeated deviations collapsed into one line
        each (``course.pictures.deviations``); the reference ring has none."""
        return deviations(self.trace)

    def at(self, step: int) -> list[Deviation]:
        """The deviations the frame after ``step`` steps shows: those of the step just played,
        and at the last frame those of the whole run (counts, volume, who never finished)."""
        return [
            d
            for d in self.deviations
            if (d.step is not None and d.step + 1 == step) or (d.step is None and step == self.last)
        ]

    def bad_ranks(self, step: int) -> set[int]:
        """Ranks to highlight at ``step``: those named by :meth:`at`."""
        return {r for d in self.at(step) for r in d.ranks}

    @property
    def heading(self) -> str:
        """What is drawn: whose run, on how many ranks, of what tensor."""
        t = self.trace
        size = f"{count(t.numel, 'element')} x {t.itemsize} B"
        return f"Ring all-reduce, {self.label}: N = {self.n}, {size}"

    def counter(self, step: int) -> str:
        """``step 3 / 6 - reduce-scatter``; see :func:`course.pictures.style.counter`."""
        return style.counter(step, self.n, total=self.formulas)

    def frame(self, step: int) -> Frame:
        """The picture after ``step`` ring steps (0 = start, ``self.last`` = end of the trace)."""
        if not 0 <= step <= self.last:
            raise ValueError(f"step must be between 0 and {self.last}, got {step}")
        if step not in self._cache:
            bad = self.bad_ranks(step)
            data = {GRID: self._grid(step), BYTES: self._bytes(step), RANKS: self._ranks(bad)}
            data |= self._messages(step, bad)
            data[WAITING] = self._waiting(step)
            title = f"{self.heading}<br><b>{self.counter(step)}</b>"
            self._cache[step] = Frame(step, data, title, [d.line for d in self.at(step)])
        return self._cache[step]

    def base(self) -> go.Figure:
        """The figure at step 0, with every trace the frames update (``course.pictures.base``)."""
        return base.base_figure(self)

    def apply(self, fig: go.Figure, frame: Frame) -> None:
        """Draw ``frame`` into a figure made by :meth:`base`, in one batch."""
        with fig.batch_update():
            for index, props in frame.data.items():
                fig.data[index].update(props)
            fig.layout.title.text = frame.title

    # --- the chunks, the bytes and the ranks --------------------------------------------

    def _grid(self, step: int) -> dict:
        """Contribution counts (NaN: an empty chunk) and hover texts, as numpy arrays: plotly
        checks those in one pass, where nested lists cost it a call per cell."""
        masks = self.states[step]
        # None, not NaN, for a cell drawn blank: a live widget sends its data as JSON, and
        # NaN is no JSON (jupyter_client warns in the notebook and drops it).
        z = np.array([[m.bit_count() for m in row] for row in masks], dtype=object)
        z[:, self.empty] = None
        text = np.empty((self.n, self.n), dtype=object)
        for r, row in enumerate(masks):
            text[r] = [self._cell_text(r, c, m) for c, m in enumerate(row)]
        return {"z": z, "text": text}

    def _cell_text(self, rank: int, chunk: int, mask: int) -> str:
        key = (rank, chunk, mask)
        if key not in self._texts:
            lo, hi = self.bounds[chunk]
            if lo >= hi:
                text = f"rank {rank}, chunk {chunk}: empty (fewer elements than ranks)"
            else:
                tag = " - fully reduced" if mask == full_mask(self.n) else ""
                text = (
                    f"rank {rank}, chunk {chunk} (elements {lo}-{hi - 1})<br>holds "
                    f"{mask.bit_count()}/{self.n}: ranks {style.ranks_text(mask)}{tag}"
                )
            self._texts[key] = text
        return self._texts[key]

    def sent(self, step: int) -> list[int]:
        """Bytes each rank has sent in its first ``step`` sends, those that completed."""
        sent = bytes_sent(self.trace, upto_step=step)
        for m in self.unsent:
            if m.order < step:
                sent[m.rank] -= m.nbytes
        return sent

    def _bytes(self, step: int) -> dict:
        sent = self.sent(step)
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
            where = self.trace.blocked.get(rank, "it did not return")
            return f"rank {rank} never finished: {where}"
        return f"rank {rank}"

    # --- the messages -------------------------------------------------------------------

    def _messages(self, step: int, bad: set[int]) -> dict[int, dict]:
        """This step's arrows (good and flagged), their chunk labels and where they land."""
        arrows = {ok: _Polyline() for ok in (True, False)}
        labels = _Polyline()
        for m in self.trace.messages:
            if m.op != "send" or m.order != step - 1 or m in self.unsent:
                continue
            if not 0 <= m.peer < self.n or m.peer == m.rank:
                continue  # the deviation text says so; there is no arrow to draw
            chunks = _overlapping(m, self.bounds)
            start, end, mid = self._arrow(m.rank, m.peer)
            arrows[m.rank not in bad].add(start, end, self.size.head, self._hover(m, chunks))
            labels.point(mid, _label(m, chunks) if self.size.labels else "")
        out = {key: arrows[ok].props() for key, ok in ((ARROWS, True), (BAD_ARROWS, False))}
        out[LABELS] = {"x": labels.xs, "y": labels.ys, "text": labels.texts}
        out[RECEIVED] = self._received(step)
        return out

    def _hover(self, m: Message, chunks: list[int]) -> str:
        name = "chunk " + (", ".join(map(str, chunks)) if chunks else "?")
        if m.numel == 0:
            holds = "empty (0 elements)"
        elif m.holds is None:
            holds = "unreadable payload"
        else:
            holds = f"holds ranks {style.ranks_text(m.holds)}"
        return (
            f"step {m.order + 1}: rank {m.rank} -> rank {m.peer}: {name}, {m.nbytes:,} B, {holds}"
        )

    def _waiting(self, step: int) -> dict:
        """At the last frame, the messages that were posted and never completed: a dashed
        arrow from the peer each blocked receive waited for, and along each blocked send."""
        line = _Polyline()
        if step != self.last:
            return line.props()
        for m in [*self.waiting, *self.unsent]:
            ends = (m.peer, m.rank) if m.op == "recv" else (m.rank, m.peer)
            if 0 <= m.peer < self.n and m.peer != m.rank:
                line.add(*self._arrow(*ends)[:2], self.size.head, _blocked_text(m))
        return line.props()

    def _arrow(self, src: int, dst: int) -> tuple[Point, Point, Point]:
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
                lo_x, hi_x, lo_y, hi_y = c - 0.45, c + 0.45, m.rank - 0.45, m.rank + 0.45
                xs += [lo_x, hi_x, hi_x, lo_x, lo_x, None]
                ys += [lo_y, lo_y, hi_y, hi_y, lo_y, None]
        return {"x": xs, "y": ys}


def _blocked_text(m: Message) -> str:
    """The hover text of a send or receive that never completed."""
    if m.op == "recv":
        what = f"a receive from rank {m.peer} (its receive no. {m.order + 1})"
        return f"rank {m.rank} is blocked in {what} that never completed"
    what = f"a send to rank {m.peer} (its send no. {m.order + 1})"
    why = "a gloo send waits for the peer to post the matching receive"
    return f"rank {m.rank} is blocked in {what} that never completed: {why}"


def _label(m: Message, chunks: list[int]) -> str:
    """``c3`` on an arrow carrying chunk 3; ``empty`` for a 0-element message."""
    if chunks:
        return "c" + ",".join(map(str, chunks))
    return "empty" if m.numel == 0 else "?"


class _Polyline:
    """Arrows as one scatter trace (start, end, gap), plus text points."""

    def __init__(self) -> None:
        self.xs: list[float | None] = []
        self.ys: list[float | None] = []
        self.sizes: list[int] = []
        self.hovers: list[str] = []
        self.texts: list[str] = []

    def add(self, start: Point, end: Point, head: int, hover: str) -> None:
        self.xs += [start[0], end[0], None]
        self.ys += [start[1], end[1], None]
        self.sizes += [0, head, 0]
        self.hovers += [hover, hover, ""]

    def point(self, at: Point, text: str) -> None:
        self.xs.append(at[0])
        self.ys.append(at[1])
        self.texts.append(text)

    def props(self) -> dict:
        return {"x": self.xs, "y": self.ys, "marker_size": self.sizes, "hovertext": self.hovers}
