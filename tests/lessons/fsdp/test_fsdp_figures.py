"""One FSDP step drawn: does the schedule hold FSDP's invariants, do the frames draw exactly
the schedule, does a recorded run's order of collectives map back onto its units?"""

from __future__ import annotations

import math

import numpy as np
import pytest

from course.lessons.fsdp.picture import fsdp_figure, fsdp_widget, run_figure
from course.lessons.fsdp.schedule import (
    Schedule,
    calls_from_trace,
    fsdp_schedule,
    map_calls,
    schedule_from_trace,
)
from course.lessons.fsdp.view import GRID, MARK, OUTLINE, FsdpView, describe
from course.ring.collectives import Collective

SETTINGS = [(r, p) for r in (True, False) for p in (False, True)]


@pytest.mark.parametrize(("reshard", "prefetch"), SETTINGS)
@pytest.mark.parametrize(("units", "world_size"), [(1, 2), (3, 4), (5, 3)])
def test_each_unit_is_gathered_and_reduced_as_fsdp_does(units, world_size, reshard, prefetch):
    """Is each unit all-gathered twice with resharding (once without), reduce-scattered once,
    after its backward compute, which follows its last gather; and does every rank end the
    step with shards only (no full parameters, no full gradient)?"""
    s = fsdp_schedule(units, world_size, reshard, prefetch)
    for u in range(units):
        mine = [(k, e) for k, e in enumerate(s.events) if e.unit == u]
        gathers = [k for k, e in mine if e.kind == "all-gather"]
        reduces = [k for k, e in mine if e.kind == "reduce-scatter"]
        (grad,) = [k for k, e in mine if e.kind == "compute" and e.phase == "backward"]
        (fwd,) = [k for k, e in mine if e.kind == "compute" and e.phase == "forward"]
        assert len(gathers) == (2 if reshard else 1) and len(reduces) == 1
        assert gathers[0] < fwd < grad < reduces[0] and gathers[-1] < grad
    assert all(x.params == "shard" and x.grad == "shard" for x in s.states[-1])
    assert all(x.params == "shard" and x.grad == "none" for x in s.states[0])


@pytest.mark.parametrize("sizes", [3, [1, 1, 1, 1], [2, 5, 1], [1, 3, 2, 4]])
@pytest.mark.parametrize("world_size", [2, 4])
def test_peak_parameters_are_the_shards_plus_the_largest_unit(sizes, world_size):
    """With resharding, does a rank hold at most its shards (1/N of the model) plus the largest
    unit; without, the shards plus the whole model; and with prefetch, the largest two
    neighbouring units at once (one unit more, when units are equal)?"""
    share = np.array([1.0] * sizes if isinstance(sizes, int) else sizes, dtype=float)
    share /= share.sum()
    shards = 1 / world_size
    peak = fsdp_schedule(sizes, world_size).peak()
    assert math.isclose(peak, shards + share.max())
    whole = fsdp_schedule(sizes, world_size, reshard_after_forward=False).peak()
    assert math.isclose(whole, shards + 1)
    pairs = max(share[:-1] + share[1:])
    prefetched = fsdp_schedule(sizes, world_size, prefetch=True).peak()
    assert math.isclose(prefetched, shards + pairs)
    if isinstance(sizes, int):
        assert math.isclose(prefetched - peak, 1 / sizes)


def test_a_step_that_never_frees_holds_the_whole_model():
    """Is the memory read from the events, not a formula: does the resharded schedule with its
    frees dropped peak at the whole model, and does a full gradient count its whole unit until
    the reduce-scatter leaves 1/N of it?"""
    s = fsdp_schedule(4, 4)
    kept = [e for e in s.events if not (e.kind == "free" and e.phase == "forward")]
    leaky = Schedule(4, s.sizes, tuple(kept))
    assert math.isclose(leaky.peak(), 0.25 + 1) and not math.isclose(s.peak(), leaky.peak())
    kept = fsdp_schedule(4, 4, reshard_after_forward=False)
    first = next(
        k for k, e in enumerate(kept.events) if e.kind == "compute" and e.phase == "backward"
    )
    assert kept.memory(first + 1) == (0.25 + 1, 0.25)  # the last unit's full gradient
    assert kept.memory(first + 2) == (0.25 + 1, 0.25 / 4)  # reduce-scattered: its shard


@pytest.mark.parametrize(("reshard", "prefetch"), SETTINGS)
def test_the_frames_draw_the_schedule(reshard, prefetch):
    """Does the figure have one frame per event and the start, each drawing every rank's slots
    as the schedule says (own shard, N-1 gathered slots, full or sharded gradient), the
    event's words in the title, the memory mark at the schedule's numbers?"""
    n, units = 3, 4
    s = fsdp_schedule(units, n, reshard, prefetch)
    fig = fsdp_figure(units, n, reshard, prefetch)
    assert len(fig.frames) == len(s.events) + 1
    view = FsdpView(s)
    for k, frame in enumerate(fig.frames):
        z = np.array(frame.data[frame.traces.index(GRID)].z, dtype=object)
        for u, state in enumerate(s.states[k]):
            cols = [view.slot_x(u, j) for j in range(n)]
            params = z[0::3][:, cols].astype(int)
            grads = z[1::3][:, cols].astype(int)
            assert (np.diag(params) == 1).all()
            off = params[~np.eye(n, dtype=bool)]
            assert (off == (2 if state.params == "full" else 0)).all()
            want = {"none": np.zeros((n, n)), "full": np.full((n, n), 3), "shard": 4 * np.eye(n)}
            assert (grads == want[state.grad]).all(), (k, u, state)
        if k:
            assert describe(s.events[k - 1]) in frame.layout.title.text
        mark = frame.data[frame.traces.index(MARK)]
        params, grads = s.memory(k)
        assert np.allclose(mark.y, [params, params + grads])


def test_the_outline_boxes_the_unit_of_the_event():
    """Does the box round the current event's unit span exactly that unit's N slots?"""
    view = FsdpView(fsdp_schedule(3, 4))
    for k, e in enumerate(view.schedule.events, start=1):
        box = view.frame(k).data[OUTLINE]["x"]
        assert (min(box), max(box)) == (view.slot_x(e.unit, 0) - 0.5, view.slot_x(e.unit, 3) + 0.5)
    assert view.frame(0).data[OUTLINE]["x"] == []


def _trace(s: Schedule, numels: list[int]) -> list[Collective]:
    """One rank's collectives as the recorder writes them: (N+1) x shard elements each."""
    n = s.world_size
    return [
        Collective(
            "all_gather_into_tensor" if e.kind == "all-gather" else "reduce_scatter_tensor",
            numel=(n + 1) * math.ceil(numels[e.unit] / n),
            nbytes=0,
            async_op=False,
            t=0.0,
        )
        for e in s.events
        if e.kind in ("all-gather", "reduce-scatter")
    ]


@pytest.mark.parametrize(("reshard", "prefetch"), SETTINGS)
@pytest.mark.parametrize("numels", [[10, 10, 10], [7, 13, 7, 5], [6]])
def test_a_recorded_order_maps_back_onto_the_units(numels, reshard, prefetch):
    """From a synthetic trace of the reference (units of equal size told apart only by the
    order, sizes that do not divide by N), does the mapping find each call's unit, and,
    without prefetch, rebuild the reference step itself?"""
    n = 3
    ref = fsdp_schedule(numels, n, reshard, prefetch)
    calls = calls_from_trace([*_trace(ref, numels), Collective("barrier", 0, 0, False, 0.0)], n)
    mapped, notes = map_calls(calls, numels, n)
    want = [(e.kind, e.unit) for e in ref.events if e.kind in ("all-gather", "reduce-scatter")]
    assert [(op, u) for op, u, _ in mapped] == want and notes == []
    got = schedule_from_trace(_trace(ref, numels), numels, n)
    assert got.reshard_after_forward == reshard
    if not prefetch:
        assert got.events == ref.events and math.isclose(got.peak(), ref.peak())


def test_calls_that_fit_no_unit_are_named():
    """Does a gather of a size no unit has, or one gather too many, become a note, the rest
    still mapped; and do plain (op, numel) pairs map like the recorder's records?"""
    numels = [8, 8]
    ag, rs = ("all_gather_into_tensor", 8), ("reduce_scatter_tensor", 8)
    calls = [ag, ("all_gather", 99), ag, ag, rs, ag, rs, ag, rs]
    s = schedule_from_trace(calls, numels, 2)
    assert len(s.notes) == 3 and "call 2: all-gather of 99 elements: no unit has" in s.notes[0]
    assert "call 8: all-gather of 8 elements: every unit of that size was gathered" in s.notes[1]
    assert "call 9: reduce-scatter of 8 elements: every unit" in s.notes[2]
    assert s.reshard_after_forward and [e.unit for e in s.events if e.kind == "all-gather"] == [
        0,
        1,
        1,
        0,
    ]
    fig = run_figure(calls, numels, 2)
    assert "99 elements" in fig.layout.annotations[0].text


def test_widget_builds_steps_and_redraws_for_new_settings():
    """Does the live widget step through the events, say what one rank holds, and redraw
    from event 0 for a new world size, number of units, reshard or prefetch setting?"""
    w = fsdp_widget(units=3, world_size=4)
    assert w.slider.max == len(fsdp_schedule(3, 4).events)
    w.step_by(2)
    assert w.slider.value == 2 and "event 2 / 21 - forward: compute unit 0" in w.status.value
    assert "0.583 x the model in parameters" in w.status.value
    z = np.array(w.figure.data[GRID].z, dtype=object)
    assert (z[0, 1:4] == 2).all()  # rank 0 holds unit 0 whole
    w.step_by(100)
    assert w.slider.value == w.slider.max
    w.reshard.value = False
    assert w.slider.value == 0 and w.slider.max == len(fsdp_schedule(3, 4, False).events)
    w.world_size.value, w.units.value = 6, 2
    assert w.view.n == 6 and w.view.units == 2 and w.figure in w.children


def test_widget_can_leave_out_the_prefetch_switch():
    """With ``prefetch_control=False``, does the widget offer world size, units and reshard only,
    and still redraw for a new reshard setting, with no prefetch drawn?"""
    w = fsdp_widget(units=3, world_size=4, prefetch_control=False)
    settings = w.children[1].children
    assert [c.description for c in settings] == ["world_size", "units", "reshard_after_forward"]
    w.reshard.value = False
    assert w.slider.max == len(fsdp_schedule(3, 4, False).events)
    assert not w.view.schedule.prefetch


def test_widget_of_a_recorded_run_reports_what_it_left_out():
    """Driven by a trace, does the widget play the run and list the calls that fit no unit?"""
    numels = [12, 20]
    ref = fsdp_schedule(numels, 4)
    trace = [*_trace(ref, numels), Collective("all_gather_into_tensor", 50, 0, False, 0.0)]
    w = fsdp_widget(trace=trace, unit_numels=numels, world_size=4)
    assert w.view.schedule.events == ref.events and "your run" in w.status.value
    assert "40 elements" in w.report.value
    with pytest.raises(ValueError, match="unit_numels"):
        fsdp_widget(trace=trace)


def _fsdp_like_step(numels: list[int]) -> list[tuple[str, int]]:
    """On each rank: the collectives of one resharding FSDP step on flat buffers, recorded."""
    import torch
    import torch.distributed as dist

    from course.ring.recorder import Recorder

    n = dist.get_world_size()
    shards = [torch.ones(math.ceil(p / n)) for p in numels]
    with Recorder() as seen:
        order = [*range(len(numels)), *reversed(range(len(numels)))]
        for i, u in enumerate(order):
            full = torch.empty(n * shards[u].numel())
            dist.all_gather_into_tensor(full, shards[u])
            if i >= len(numels):
                dist.reduce_scatter_tensor(torch.empty_like(shards[u]), full)
    return [(c.name, c.numel) for c in seen.collectives]


@pytest.mark.ranks
def test_a_real_recording_maps_onto_the_units():
    """Do the recorder's own records of real gloo collectives (their element counts as the
    recorder takes them) map onto the units and rebuild the resharding step?"""
    from course.ranks import run

    numels = [9, 4, 9]
    (records, _, _) = run(_fsdp_like_step, 3, numels)
    assert {name for name, _ in records} == {"all_gather_into_tensor", "reduce_scatter_tensor"}
    calls = [Collective(name, numel, 0, False, 0.0) for name, numel in records]
    assert schedule_from_trace(calls, numels, 3).events == fsdp_schedule(numels, 3).events


def test_a_recorded_root_stays_gathered_through_the_blocks_forward():
    """The order a right fully_shard makes (the root gathered first, reduce-scattered last):
    is the root drawn gathered while every block computes its forward, and freed only when
    the forward ends, a block each time after its compute?"""
    numels, n = [6, 6, 3], 3  # two blocks, then the root
    ag, rs = "all_gather_into_tensor", "reduce_scatter_tensor"
    calls = [(ag, 3), (ag, 6), (ag, 6), (ag, 3), (ag, 6), (rs, 6), (ag, 6), (rs, 6), (rs, 3)]
    s = schedule_from_trace(calls, numels, n)
    assert list(s.notes) == []
    forward = [i for i, e in enumerate(s.events) if e.phase == "forward"]
    for i in forward:
        e = s.events[i]
        if e.kind == "compute" and e.unit < 2:
            assert s.states[i + 1][2].params == "full", (i, e)  # the root, as a block runs
    frees = [
        (e.unit, i) for i, e in enumerate(s.events) if e.kind == "free" and e.phase == "forward"
    ]
    assert [u for u, _ in frees] == [0, 1, 2]  # the root's last, once both blocks have run
