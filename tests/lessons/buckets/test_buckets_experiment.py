"""Buckets: does the rule match DDP's own buckets, and do the experiments measure overlap?"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from course.lessons.buckets import experiment as buckets
from course.lessons.buckets.check import ddp_bucket_rule
from course.lessons.buckets.experiment import MB


@given(
    st.lists(st.integers(min_value=1, max_value=4 * MB), min_size=1, max_size=30),
    st.floats(min_value=0.001, max_value=8),
)
def test_ddp_bucket_rule_closes_each_bucket_at_the_cap(nbytes: list[int], cap: float) -> None:
    """Are DDP's buckets a reverse-order partition, each closed by the tensor that reached the
    cap?"""
    result = ddp_bucket_rule(nbytes, cap)
    assert [i for b in result for i in b] == list(reversed(range(len(nbytes))))
    for b in result[:-1]:
        assert sum(nbytes[i] for i in b) >= cap * MB > sum(nbytes[i] for i in b[:-1])
    assert sum(nbytes[i] for i in result[-1][:-1]) < cap * MB


def test_first_bucket_cap_applies_to_the_first_bucket_only() -> None:
    """Does first_bucket_mb cap the first bucket and bucket_cap_mb the others?"""
    assert ddp_bucket_rule([MB // 2] * 6, 2.0, first_bucket_mb=1.0) == [[5, 4], [3, 2, 1, 0]]


@pytest.mark.ranks
@pytest.mark.parametrize(("cap", "first"), [(None, 1.0), (0.5, None), (2.0, None)])
def test_rule_matches_ddp_buckets_from_the_second_step(run_ranks, cap, first) -> None:
    """From step 2 on, are DDP's buckets (seen by a comm hook) exactly the rule's?"""
    steps = run_ranks(buckets.ddp_buckets, 2, cap, 2)[0]
    model = buckets.many_params_model()
    nbytes = [p.numel() * p.element_size() for p in model.parameters()]
    assert [b["params"] for b in steps[0]] == [list(range(len(nbytes)))]  # step 1: one bucket
    rule = ddp_bucket_rule(nbytes, 25.0 if cap is None else cap, first_bucket_mb=first)
    assert [b["params"] for b in steps[1]] == rule
    assert [b["nbytes"] for b in steps[1]] == [sum(nbytes[i] for i in b) for b in rule]


@pytest.mark.ranks
@pytest.mark.parametrize(
    ("options", "counts"),
    [({"static_graph": True}, [1, 1, 2, 2]), ({"find_unused_parameters": True}, [2, 2, 2, 2])],
)
def test_static_graph_waits_a_step_and_find_unused_never_rebuilds(run_ranks, options, counts):
    """With static_graph, are steps 1 and 2 one bucket each; with find_unused_parameters, are
    the buckets sized from step 1 and never rebuilt (what buckets_3's explanation says)?"""
    steps = run_ranks(buckets.ddp_buckets, 2, None, 4, **options)[0]
    assert [len(s) for s in steps] == counts
    sizes = [[b["params"] for b in s] for s in steps]
    if "find_unused_parameters" in options:
        assert sizes[0] == sizes[1] == sizes[3]


@pytest.mark.ranks
def test_allreduce_timing_makes_the_calls_it_names(run_ranks) -> None:
    """Does the timing experiment make 1, 5 and 50 calls of the same values?"""
    for r in run_ranks(buckets.allreduce_timing, 2, 50, 100, (1, 5, 50), 1):
        assert [row["calls"] for row in r["rows"]] == [1, 5, 50]
        assert all(row["seconds"] > 0 for row in r["rows"]) and r["same"]


@pytest.mark.ranks
def test_grad_storage_sees_grads_inside_buckets_only_as_views(run_ranks) -> None:
    """Is .grad a tensor of its own by default and a view into a bucket with
    gradient_as_bucket_view, the buckets as large as the gradients either way?"""
    apart, inside = (run_ranks(buckets.grad_storage, 2, v)[0] for v in (False, True))
    assert apart["grads_in_buckets"] == 0 and inside["grads_in_buckets"] == inside["params"]
    for r in (apart, inside):
        assert r["bucket_bytes"] == r["grad_bytes"]


@pytest.mark.ranks
def test_overlap_timeline_starts_communication_during_backward(run_ranks) -> None:
    """Does the first bucket's all-reduce start before the last gradient is ready?"""
    tl = run_ranks(buckets.overlap_timeline, 2, 0.25, 4, 256, 64)[0]
    last_ready = max(t for _, t in tl["grad_ready"])
    assert len(tl["buckets"]) == 4
    assert tl["buckets"][0]["start"] < last_ready
    assert all(b["done"] >= b["start"] for b in tl["buckets"])
    fig = buckets.timeline_figure(tl)
    solid = [d for d in fig.data if "until done" in str(d.hovertext or "")]
    assert len(solid) == len(tl["buckets"])  # one row per bucket
    legend = [d.name for d in fig.data if d.showlegend is not False]
    assert legend == ["gradient ready", "all-reduce in flight", "queued behind the previous one"]


def test_timeline_shows_buckets_as_a_queue() -> None:
    """Is a bucket queued while the previous one is in flight drawn light up to the moment
    that one finished, and solid from there (not as if both ran side by side)?"""
    log = [
        {"bucket": 0, "nbytes": MB, "params": [3], "start": 0.001, "done": 0.005},
        {"bucket": 1, "nbytes": MB, "params": [2], "start": 0.002, "done": 0.008},
    ]
    first, queued, second = buckets._bucket_segments(log)  # noqa: SLF001 - the timeline's parts
    assert first["base"] == [1.0] and first["x"] == pytest.approx([4.0])
    assert "queued" in queued["hovertext"] and queued["x"] == pytest.approx([3.0])
    assert queued["marker_color"] == second["marker_color"] != first["marker_color"]
    assert second["base"] == pytest.approx([5.0]) and second["x"] == pytest.approx([3.0])
    tl = {"grad_ready": [(0, 0.004)], "buckets": log, "backward_returned": 0.009}
    shapes = buckets.timeline_figure(tl).layout.shapes
    assert [s.x0 for s in shapes] == pytest.approx([4.0, 9.0])  # last ready, backward returned
