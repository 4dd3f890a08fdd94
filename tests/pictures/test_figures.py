"""The kernel-free ring figure: does each frame show what the ring has done by then?"""

from __future__ import annotations

import dataclasses

import nbformat
import numpy as np
import pytest
from nbclient import NotebookClient
from nbconvert import HTMLExporter

from course.pictures.figures import (
    ARROWS,
    BAD,
    BAD_ARROWS,
    BYTES,
    FORMULA,
    GRID,
    RANKS,
    RingView,
    ring_figure,
)
from course.ring.schedule import ring_bytes_per_rank
from course.ring.trace import Trace, ring_trace


def _grid(view: RingView, step: int) -> np.ndarray:
    return np.asarray(view.frame(step).data[GRID]["z"], dtype=float)


def _arrows(view: RingView, step: int, which: int = ARROWS) -> int:
    """Number of arrows drawn: each is start, end, gap."""
    return len(view.frame(step).data[which]["x"]) // 3


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8])
def test_full_chunks_follow_the_ring(n: int) -> None:
    """Does reduce-scatter leave one full chunk per rank after N-1 steps, and does every
    all-gather step add one more, until all N are full after 2(N-1)?"""
    view = RingView(ring_trace(n, 3 * n + 1))
    assert (_grid(view, 0) == 1).all()
    for step in range(1, n - 1):
        assert not (_grid(view, step) == n).any()
    for t in range(n):
        full = (_grid(view, n - 1 + t) == n).sum(axis=1)
        assert full.tolist() == [t + 1] * n


def test_reduce_scatter_grows_one_chunk_per_rank_per_step() -> None:
    """After k reduce-scatter steps, does each rank hold exactly one chunk of k+1 contributions
    (the one it just received) and none with more?"""
    n = 6
    view = RingView(ring_trace(n, 20))
    for k in range(1, n):
        z = _grid(view, k)
        assert (z == k + 1).sum(axis=1).tolist() == [1] * n
        assert z.max() == k + 1


def test_counters_and_bytes_match_the_closed_forms() -> None:
    """Do the title, the bytes bars and the formula line agree with 2(N-1) steps and
    2(N-1)/N x size, and with the exact bytes of the ring's uneven chunks?"""
    n, numel, itemsize = 5, 23, 8
    view = RingView(ring_trace(n, numel, itemsize))
    assert view.last == 2 * (n - 1)
    assert f"step 3 / {2 * (n - 1)}" in view.frame(3).title
    assert "all-gather" in view.frame(n).title and "reduce-scatter" in view.frame(n - 1).title
    final = list(view.frame(view.last).data[BYTES]["y"])
    assert final == ring_bytes_per_rank(numel, n, itemsize)
    assert view.base().data[FORMULA].y[0] == pytest.approx(2 * (n - 1) / n * numel * itemsize)
    assert all(_arrows(view, k) == n for k in range(1, view.last + 1))
    assert _arrows(view, 0) == 0


def test_empty_chunks_are_drawn_empty() -> None:
    """With fewer elements than ranks, are the empty chunks left blank (not coloured)?"""
    view = RingView(ring_trace(5, 3))
    z = _grid(view, view.last)
    assert np.isnan(z[:, 3:]).all() and (z[:, :3] == 5).all()


def _misrouted() -> Trace:
    """Rank 1 sends its step-2 chunk to rank 3 instead of its neighbour, rank 2."""
    ref = ring_trace(4, 13)
    return dataclasses.replace(
        ref,
        messages=tuple(
            dataclasses.replace(m, peer=3) if (m.rank, m.op, m.order) == (1, "send", 1) else m
            for m in ref.messages
        ),
    )


def test_a_wrong_message_is_flagged_at_its_step() -> None:
    """Is a message to the wrong peer drawn red, its sender marked, and named in words, at
    the step it happens and not before?"""
    view = RingView(_misrouted())
    wrong = view.frame(2)  # after step 2, whose messages it shows
    assert _arrows(view, 2, BAD_ARROWS) == 1 and _arrows(view, 2, ARROWS) == 3
    assert wrong.data[RANKS]["marker_color"][1] == BAD
    assert any("sent to rank 3" in note for note in wrong.notes)
    assert _arrows(view, 1, BAD_ARROWS) == 0 and not view.frame(1).notes


def test_a_deadlocked_run_ends_where_it_stopped() -> None:
    """Does a partial trace animate up to where it stopped, then say who was blocked where?"""
    ref = ring_trace(4, 12)
    stuck = dataclasses.replace(
        ref,
        messages=tuple(m for m in ref.messages if m.order < 2),
        unfinished=(0, 1, 2, 3),
        blocked={r: f"waiting in dist.recv (line {r + 7})" for r in range(4)},
    )
    view = RingView(stuck)
    assert view.last == 2
    last = view.frame(2)
    assert all(c == BAD for c in last.data[RANKS]["marker_color"])
    (note,) = (n for n in last.notes if "never finished" in n)  # one line for four ranks
    assert "line 7" in note and "likewise on 3 more ranks: 1-3, with their own numbers" in note
    assert not any(" made " in n for n in last.notes)  # counts follow from being stuck


def test_figure_has_frames_play_button_and_slider() -> None:
    """Does the static figure carry one frame per step, a Play button and a step slider?"""
    fig = ring_figure(ring_trace(4, 13))
    assert [f.name for f in fig.frames] == [str(k) for k in range(7)]
    assert [b.label for b in fig.layout.updatemenus[0].buttons] == ["Play", "Pause"]
    assert len(fig.layout.sliders[0].steps) == 7
    assert list(fig.layout.sliders[0].steps[4].args[0]) == ["4"]


def test_exported_html_animates_without_a_kernel(tmp_path) -> None:
    """Does a notebook showing the figure, executed and exported by nbconvert, carry the
    frames, the Play button and plotly.js itself (so it animates offline)?"""
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell(
            "from course.pictures.figures import ring_figure\n"
            "from course.ring.trace import ring_trace\n"
            'ring_figure(ring_trace(4, 13)).show(renderer="notebook")'
        )
    ]
    NotebookClient(
        nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    body, _ = HTMLExporter().from_notebook_node(nb)
    assert body.count("Plotly.addFrames") >= 1 and '"updatemenus"' in body
    assert body.count('"method":"animate"') == 2 + 7  # Play, Pause and one per slider step
    assert "plotly.js v" in body  # the library itself, not a CDN link
