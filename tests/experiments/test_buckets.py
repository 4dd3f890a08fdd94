"""Buckets: does the rule match DDP's own buckets, and do the experiments measure overlap?"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from course.experiments import buckets
from course.experiments.buckets import MB, bucket_assignment


@given(
    st.lists(st.integers(min_value=1, max_value=4 * MB), min_size=1, max_size=30),
    st.floats(min_value=0.001, max_value=8),
)
def test_bucket_assignment_closes_each_bucket_at_the_cap(nbytes: list[int], cap: float) -> None:
    """Are buckets a reverse-order partition, each closed by the tensor that reached the cap?"""
    result = bucket_assignment(nbytes, cap)
    assert [i for b in result for i in b] == list(reversed(range(len(nbytes))))
    for b in result[:-1]:
        assert sum(nbytes[i] for i in b) >= cap * MB > sum(nbytes[i] for i in b[:-1])
    assert sum(nbytes[i] for i in result[-1][:-1]) < cap * MB


def test_first_bucket_cap_applies_to_the_first_bucket_only() -> None:
    """Does first_bucket_mb cap the first bucket and bucket_cap_mb the others?"""
    assert bucket_assignment([MB // 2] * 6, 2.0, first_bucket_mb=1.0) == [[5, 4], [3, 2, 1, 0]]


@pytest.mark.ranks
@pytest.mark.parametrize(("cap", "first"), [(None, 1.0), (0.5, None), (2.0, None)])
def test_rule_matches_ddp_buckets_from_the_second_step(run_ranks, cap, first) -> None:
    """From step 2 on, are DDP's buckets (seen by a comm hook) exactly the rule's?"""
    steps = run_ranks(buckets.ddp_buckets, 2, cap, 2)[0]
    model = buckets.many_params_model()
    nbytes = [p.numel() * p.element_size() for p in model.parameters()]
    assert [b["params"] for b in steps[0]] == [list(range(len(nbytes)))]  # step 1: one bucket
    rule = bucket_assignment(nbytes, 25.0 if cap is None else cap, first_bucket_mb=first)
    assert [b["params"] for b in steps[1]] == rule
    assert [b["nbytes"] for b in steps[1]] == [sum(nbytes[i] for i in b) for b in rule]


@pytest.mark.ranks
def test_allreduce_timing_counts_calls(run_ranks) -> None:
    """Does the timing experiment make one call per tensor against one per bucket?"""
    for r in run_ranks(buckets.allreduce_timing, 2, 50, 100, 25.0, 1):
        assert r["per_param"]["calls"] == 50 and r["bucketed"]["calls"] == 1
        assert r["per_param"]["seconds"] > 0 and r["bucketed"]["seconds"] > 0


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
