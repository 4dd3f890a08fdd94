"""The halves drawn: do the figure and the widget show N-1 steps of one half, and its bytes?"""

from __future__ import annotations

import pytest

from course.pictures.figures import FORMULA, GRID
from course.pictures.halves import HalfView, half_figure
from course.pictures.widgets import HalfWidget, half_widget
from course.ring.halves import HALVES, half_trace


@pytest.mark.parametrize("half", HALVES)
def test_reference_half_has_n_minus_one_frames_and_no_deviation(half) -> None:
    """Does the reference half play N-1 steps, clean, against the (N-1)/N bytes line?"""
    fig = half_figure(half_trace(half, 4, 13), half)
    assert len(fig.frames) == 4
    assert fig.data[FORMULA].name.startswith("(N-1)/N x size")
    view = HalfView(half_trace(half, 5, 11), half)
    assert view.deviations == [] and view.last == 4
    assert "/ 4" in view.counter(2)


def test_all_gather_starts_with_only_the_own_shard() -> None:
    """At step 0 of an all-gather, does each rank hold its own shard whole, and nothing else
    (drawn blank, not in the colour of one rank's contribution), and the colour bar say so?"""
    view = HalfView(half_trace("all-gather", 4, 8), "all-gather")
    z = view.frame(0).data[GRID]["z"]
    assert [list(row) for row in z] == [[4 if c == r else None for c in range(4)] for r in range(4)]
    assert (view.frame(view.last).data[GRID]["z"] == 4).all()
    bar = view.base().data[GRID].colorbar
    assert "not<br>received yet" in bar.title.text and "own only" not in bar.ticktext


def test_widget_steps_and_resizes() -> None:
    """Does the live widget step, say what a whole half sends, and redraw for a new N?"""
    w = half_widget("reduce-scatter", world_size=3)
    assert isinstance(w, HalfWidget)
    w.step_by(5)
    assert w.slider.value == 2 and "a whole reduce-scatter" in w.status.value
    assert "ring reduce-scatter" in w.report.value
    w.world_size.value = 6
    assert w.view.last == 5


@pytest.mark.parametrize("half", HALVES)
def test_before_the_question_the_half_widget_states_no_formula(half) -> None:
    """With formulas=False and resizable=False (the pictures before question zero_1), does the
    half widget leave out (N-1)/N and the count of a whole half, even from its hidden line's
    name, keep no size controls, and still count steps and bytes as they happen?"""
    w = half_widget(half, world_size=4, formulas=False, resizable=False)
    w.slider.value = 2
    assert f"step 2 - {half}" in w.status.value and "/ 3" not in w.status.value
    assert "N-1" not in w.status.value and "(the tensor: 52 B)" in w.status.value
    assert w.figure.data[FORMULA].visible is False
    assert "N-1" not in w.figure.data[FORMULA].name  # a saved widget state keeps hidden traces
    assert w.figure.layout.yaxis3.autorange is True  # no axis fixed at the end's total
    assert not hasattr(w, "world_size") and not hasattr(w, "numel")
    w.step_by(-2)
    assert "step 0 - start" in w.status.value and "/ 3" not in w.status.value
