"""Do the measurements support each keyed answer of the buckets quiz, and no other?

Keys are read from the source notebook's hidden checks. The one timing claim (a call costs
something beyond its bytes) is decided by a ratio far from 1: the same bytes in 200 calls
against one, on 2 ranks; the rest on call counts, sizes, addresses and event order.
"""

from __future__ import annotations

import pytest
from quiz import keys, supported

from course.experiments import buckets

pytestmark = pytest.mark.ranks

KEYS = keys("buckets")
MODEL_BYTES = [p.numel() * p.element_size() for p in buckets.many_params_model().parameters()]


def test_buckets_1_why_buckets(run_ranks) -> None:
    """Does a call cost beyond its bytes, do buckets start during backward, do they give the
    same values and cost memory rather than save it, and never wait for backward's end?"""
    timing = run_ranks(buckets.allreduce_timing, 2, 200, 1000, (1, 200), 5)[0]
    one, many = (row["seconds"] for row in timing["rows"])
    timeline = run_ranks(buckets.overlap_timeline, 2, 0.25, 4, 256, 64)[0]
    storage = [run_ranks(buckets.grad_storage, 2, v)[0] for v in (False, True)]
    last_ready = max(t for _, t in timeline["grad_ready"])
    # bytes DDP holds for gradients: its buckets, plus .grad where it is not a view into them
    held = [s["bucket_bytes"] + (s["grads_in_buckets"] == 0) * s["grad_bytes"] for s in storage]
    saves_memory = min(held) < storage[0]["grad_bytes"]  # against per-parameter all-reduces
    options = {
        "a": saves_memory,
        "b": not timing["same"],
        "c": many > 3 * one and timeline["buckets"][0]["start"] < last_ready,
        "d": timeline["buckets"][0]["start"] >= last_ready,
    }
    assert supported(options) == KEYS["buckets_1"]


def test_buckets_2_ddp_buckets_from_step_two(run_ranks) -> None:
    """With bucket_cap_mb=0.5, are there 4 buckets from step 2, the last layers' first?"""
    second = run_ranks(buckets.ddp_buckets, 2, 0.5, 2)[0][1]
    params = [b["params"] for b in second]
    n = len(MODEL_BYTES)
    options = {
        "a": len(params) == 4 and set(params[0]) == {n - 1, n - 2, n - 3, n - 4},
        "b": len(params) == 4 and set(params[0]) == {0, 1, 2, 3},
        "c": len(params) == 1,
        "d": len(params) == n,
    }
    assert supported(options) == KEYS["buckets_2"]


def test_buckets_3_default_first_and_later_steps_of_a_40_mib_model(run_ranks) -> None:
    """With the defaults, is step 1 of 10 layers of 4 MiB one bucket, and later steps one
    layer, then seven, then two?"""
    steps = run_ranks(buckets.ddp_buckets, 2, None, 3, 10, 1024, False)[0]
    counts = [len(s) for s in steps]
    layer = 1024 * 1024 * 4
    later = [b["nbytes"] for b in steps[1]]
    options = {
        "a": counts == [1, 3, 3] and later == [layer, 7 * layer, 2 * layer],
        "b": counts == [1, 2, 2],
        "c": counts[0] == 10,
        "d": counts == [2, 2, 2],
    }
    assert supported(options) == KEYS["buckets_3"]
