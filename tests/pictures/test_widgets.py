"""The ring widget without a browser: do its controls drive the figure the browser receives?"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import plotly.io
import pytest

from course.lessons.fsdp.picture import fsdp_widget
from course.pictures.figures import BAD, BAD_ARROWS, FORMULA, GRID, RANKS, WAITING
from course.pictures.widgets import RingWidget, animate, half_widget, ring_widget, show_trace
from course.ring.trace import ring_trace


def _z(w: RingWidget) -> np.ndarray:
    return np.asarray(w.figure.data[GRID].z, dtype=float)


def test_step_buttons_move_the_picture() -> None:
    """Do forward/back move one step, stop at both ends, and redraw the counter and chunks?"""
    w = ring_widget(world_size=4, numel=13)
    w.back.click()
    assert w.slider.value == 0 and (_z(w) == 1).all()
    for _ in range(3):
        w.forward.click()
    assert w.slider.value == 3
    assert not w.figure.layout.title.text  # one title: the status line's
    assert "step 3 / 6 - reduce-scatter" in w.status.value and "N = 4" in w.status.value
    assert (_z(w) == 4).sum(axis=1).tolist() == [1, 1, 1, 1]  # reduce-scatter is done
    for _ in range(10):
        w.forward.click()
    assert w.slider.value == 6 and (_z(w) == 4).all()


def test_slider_and_play_share_one_step() -> None:
    """Is the Play widget bounded like the slider, and does speed change its interval?"""
    w = ring_widget(world_size=5, numel=11)
    assert w.play.max == w.slider.max == 8
    w.slider.value = 4
    assert (_z(w) == 5).sum() == 5  # one full chunk per rank after N-1 steps
    w.speed.value = "2x"
    slow = w.play.interval
    w.speed.value = "0.5x"
    assert w.play.interval == 4 * slow


def test_world_size_control_rebuilds_from_the_simulator() -> None:
    """Does changing world_size redraw an N x N grid and a 2(N-1)-step slider from step 0?"""
    w = ring_widget(world_size=4, numel=13)
    w.slider.value = 5
    w.world_size.value = 7
    assert _z(w).shape == (7, 7) and w.slider.max == 12 and w.slider.value == 0
    assert w.numel.value == 22 and not np.isnan(_z(w)).any()  # numel follows N: no empty chunk
    assert w.figure in w.children
    w.numel.value = 3  # fewer elements than ranks: four empty chunks
    assert np.isnan(_z(w)).sum() == 7 * 4


def _drawn(w: RingWidget) -> dict:
    """The figure as the browser receives it, less the traces' random ids."""
    fig = json.loads(plotly.io.to_json(w.figure))
    for trace in fig["data"]:
        trace.pop("uid", None)
    return fig


@pytest.mark.parametrize(
    "make",
    [
        lambda n: ring_widget(world_size=n),
        lambda n: half_widget("all-gather", world_size=n),
        lambda n: fsdp_widget(units=3, world_size=n),
    ],
    ids=["ring", "half", "fsdp"],
)
def test_a_new_size_is_drawn_in_the_figure_already_shown(make) -> None:
    """Does a new world size redraw the same FigureWidget (not a new one: each sends plotly.js,
    5 MB, to the browser again) into what a widget made at that size draws? The browser merges
    the new layout into the old, so every size must draw the same layout keys."""
    w = make(4)
    figure = w.figure
    w.world_size.value = 6
    assert w.figure is figure, "a new size made a new FigureWidget"
    assert _drawn(w) == _drawn(make(6))
    assert not w.world_size.continuous_update  # redrawn when the slider is let go
    keys = {tuple(sorted(make(n).figure.layout.to_plotly_json())) for n in (2, 3, 8)}
    assert len(keys) == 1


def test_deviation_report_names_the_wrong_message() -> None:
    """On a misrouted message, does the report name it, emphasise it at its step only, and
    turn the sender red in the figure?"""
    ref = ring_trace(4, 13)
    bad = dataclasses.replace(
        ref,
        messages=tuple(
            dataclasses.replace(m, peer=3) if (m.rank, m.op, m.order) == (1, "send", 1) else m
            for m in ref.messages
        ),
    )
    w = show_trace(bad)
    assert "sent to rank 3" in w.report.value and "font-weight:bold" not in w.report.value
    w.slider.value = 2
    assert "font-weight:bold" in w.report.value
    assert w.figure.data[RANKS].marker.color[1] == BAD
    assert len(w.figure.data[BAD_ARROWS].x) == 3


def test_reference_has_no_deviations() -> None:
    """Does the reference ring report no deviation at all?"""
    w = ring_widget(world_size=6, numel=5)
    assert "No deviations" in w.report.value


def test_world_size_out_of_range_is_refused_with_advice() -> None:
    """Does asking for 40 ranks say what range the widget draws?"""
    with pytest.raises(ValueError, match="2 to 32"):
        ring_widget(world_size=40)


def _recv_first(tensor) -> None:
    """Every rank waits for its left neighbour first: nobody ever sends."""
    import torch.distributed as dist

    rank, n = dist.get_rank(), dist.get_world_size()
    dist.recv(tensor, (rank - 1) % n)


@pytest.mark.ranks
def test_animate_records_a_real_run() -> None:
    """Does animate() record the reference ring_allreduce on real ranks with no deviation,
    ending with every chunk full?"""
    from course.instructor.reference import ring_allreduce

    w = animate(ring_allreduce, world_size=3, numel=7)
    assert w.slider.max == 4 and "No deviations" in w.report.value
    w.slider.value = 4
    assert (_z(w) == 3).all()


@pytest.mark.ranks
def test_animate_a_deadlock_says_who_was_blocked() -> None:
    """Does a deadlocked run animate what little it did and say every rank never finished?"""
    w = animate(_recv_first, world_size=2, numel=4, timeout=6.0)
    assert w.slider.max == 0
    assert w.report.value.count("never finished") == 1  # one line, with a count
    assert "the same on 1 more rank: 1" in w.report.value and " made " not in w.report.value
    assert all(c == BAD for c in w.figure.data[RANKS].marker.color)
    assert len(w.figure.data[WAITING].x) == 6  # both blocked receives, drawn dashed


@pytest.mark.parametrize(("world_size", "numel"), [(24, 32), (25, 8), (32, 1)])
def test_animate_records_what_fits_up_to_32_ranks(monkeypatch, world_size, numel) -> None:
    """On 24 to 32 ranks, does animate() record as many elements as the encoding holds
    exactly (saying so), and refuse a larger numel in one line, starting no rank?"""
    from course.ring import recorder

    asked = []

    def record(fn, n, numel, timeout):
        asked.append(numel)
        return ring_trace(n, numel, 8)

    monkeypatch.setattr(recorder, "record", record)
    w = animate(_recv_first, world_size=world_size)
    assert asked == [numel] and isinstance(w, RingWidget)
    assert f"at most {numel} element" in w.status.value
    refused = animate(_recv_first, world_size=world_size, numel=numel + 1)
    assert "cannot be recorded" in refused.value and asked == [numel]


def test_animate_a_stub_says_it_is_not_implemented() -> None:
    """Does animating the released stub say so, without starting any rank?"""

    def ring_allreduce(tensor) -> None:
        """Sum ``tensor`` in place across all ranks, with point-to-point calls only."""
        # YOUR CODE HERE

    shown = animate(ring_allreduce)
    assert "ring_allreduce is not implemented yet" in shown.value


def test_before_the_questions_the_widget_states_no_formula() -> None:
    """With formulas=False, does the widget leave out 2(N-1) and 2(N-1)/N, which ring_1 and
    ring_2 ask for, even from its hidden line's name, and the phases' names, while still
    counting steps and bytes as they happen?"""
    w = ring_widget(world_size=4, formulas=False)
    w.slider.value = 2
    assert "step 2" in w.status.value and "/ 6" not in w.status.value
    assert "reduce-scatter" not in w.status.value  # where a phase ends is the grid's to show
    assert "2(N-1)" not in w.status.value
    assert w.figure.data[FORMULA].visible is False
    assert "N-1" not in w.figure.data[FORMULA].name  # a saved widget state keeps hidden traces


def test_before_the_questions_the_bytes_axis_gives_no_total_away() -> None:
    """With formulas=False, is the bytes axis scaled by the bars drawn so far, not fixed at the
    total a rank sends by the end (at step 0 that total would be on the axis already)?"""
    w = ring_widget(world_size=4, formulas=False)
    axis = w.figure.layout.yaxis3
    assert axis.autorange is True and axis.range is None, axis
    with_formulas = ring_widget(world_size=4).figure.layout.yaxis3
    assert with_formulas.range[1] >= w.view.formula  # after the questions: the closed form's line


def test_a_widget_that_is_not_resizable_stays_at_its_world_size() -> None:
    """With resizable=False (the picture before question ring_1), is there no world_size or
    numel control, so that the ring is shown at its one world size only?"""
    w = ring_widget(world_size=4, formulas=False, resizable=False)
    assert not hasattr(w, "world_size") and not hasattr(w, "numel")
    controls = [c for row in w.children for c in getattr(row, "children", ())]
    assert "world_size" not in {getattr(c, "description", "") for c in controls}
    assert w.slider.max == w.view.last and "N = 4" in w.status.value
