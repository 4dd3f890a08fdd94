"""The cost of synchrony drawn: does each figure show the data it is given, and the model?"""

from __future__ import annotations

import pytest

from course.lessons.synchrony.picture import (
    alpha_beta_figure,
    crossover_figure,
    loss_curves_figure,
    timeline_figure,
)
from course.ring.cost import crossover_size, recursive_doubling, ring

ALPHA, BETA = 50e-6, 1 / 3e9


def test_alpha_beta_fit_is_drawn_over_the_points() -> None:
    """Are the measured points drawn as markers, the model as alpha + m beta on log axes,
    and nothing marked at alpha/beta (question synchrony_1 builds on what happens there)?"""
    times = {1024: 60e-6, 2**20: 400e-6, 2**26: 25e-3}
    fig = alpha_beta_figure(times, ALPHA, BETA)
    points, line = fig.data
    assert list(points.x) == sorted(times) and list(points.y) == [times[s] for s in sorted(times)]
    assert line.mode == "lines"
    assert line.y[0] == pytest.approx(ALPHA + 1024 * BETA)
    assert line.y[-1] == pytest.approx(ALPHA + 2**26 * BETA)
    assert fig.layout.xaxis.type == "log" and fig.layout.yaxis.type == "log"
    assert "50 μs" in fig.layout.title.text
    assert not fig.layout.shapes


def test_crossover_shows_measured_times_and_both_models() -> None:
    """Does the crossover figure hold each algorithm's measured points and its alpha-beta
    line, and mark the predicted crossover size?"""
    measured = {"ring": {1024: 3e-3, 2**25: 0.05}, "tree": {1024: 1e-3, 2**25: 0.1}}
    fig = crossover_figure(measured, ALPHA, BETA, world_size=4)
    names = [t.name for t in fig.data]
    assert names == [
        "ring, measured",
        "ring, alpha-beta model",
        "tree, measured",
        "tree, alpha-beta model",
    ]
    assert list(fig.data[2].y) == [1e-3, 0.1]
    assert fig.data[1].y[0] == pytest.approx(ring(1024, 4, ALPHA, BETA).seconds)
    assert fig.data[3].y[-1] == pytest.approx(recursive_doubling(2**25, 4, ALPHA, BETA).seconds)
    assert fig.layout.shapes[0].x0 == pytest.approx(crossover_size(ALPHA, BETA, 4))


def test_timeline_has_a_compute_and_a_waiting_bar_per_rank_and_step() -> None:
    """Does the timeline draw, for every rank and step, its compute span and then its wait?"""
    step = {"start": 0.0, "forward_end": 0.03, "backward_end": 0.06, "end": 0.061}
    slow = {"start": 0.0, "forward_end": 0.06, "backward_end": 0.062, "end": 0.063}
    spans = [[step, step], [slow, slow]]
    compute, waiting = timeline_figure(spans).data
    assert (compute.name, waiting.name) == ("compute", "waiting in all-reduce")
    assert list(compute.y) == ["rank 0"] * 2 + ["rank 1"] * 2
    assert list(compute.x) == pytest.approx([30, 30, 60, 60])
    assert list(waiting.base) == pytest.approx([30, 30, 60, 60])
    assert list(waiting.x) == pytest.approx([30, 30, 2, 2])


def test_loss_curves_one_panel_per_rule_one_line_per_world_size() -> None:
    """Does the sweep's figure put each rule in its own panel, a line per N, a legend once?"""
    curves = {
        (n, rule): [1.0, 0.5 / n]
        for n in (1, 2, 4)
        for rule in ("same lr", "lr x N", "lr x N, warmup")
    }
    fig = loss_curves_figure(curves)
    assert [a.text for a in fig.layout.annotations] == ["same lr", "lr x N", "lr x N, warmup"]
    assert len(fig.data) == 9
    assert [t.name for t in fig.data if t.showlegend] == ["N = 1", "N = 2", "N = 4"]
    assert list(fig.data[-1].y) == [1.0, 0.125]
    assert fig.layout.yaxis.type == "log"
