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


def test_buckets_1_one_bucket_for_the_whole_model(run_ranks) -> None:
    """With a cap larger than the model, is there one bucket whose all-reduce starts only once
    every gradient is ready, holding as many bytes as the small buckets together, while the
    small buckets of a small cap start during backward?"""
    one = run_ranks(buckets.overlap_timeline, 2, 1000.0, 4, 256, 64)[0]
    small = run_ranks(buckets.overlap_timeline, 2, 0.25, 4, 256, 64)[0]
    last_ready = max(t for _, t in one["grad_ready"])
    start = min(b["start"] for b in one["buckets"])
    options = {
        "a": sum(b["nbytes"] for b in one["buckets"]) < sum(b["nbytes"] for b in small["buckets"]),
        "b": len(one["buckets"]) > 1 and start < last_ready,
        "c": start < last_ready,
        "d": len(one["buckets"]) == 1 and start >= last_ready,
    }
    assert supported(options) == KEYS["buckets_1"]
    # the contrast the explanation draws: with a small cap the first bucket starts early
    assert len(small["buckets"]) > 1
    assert small["buckets"][0]["start"] < max(t for _, t in small["grad_ready"])


def test_buckets_2_ddp_buckets_follow_backward_not_registration(run_ranks) -> None:
    """With bucket_cap_mb=0.5, on a stack whose forward runs its layers last-registered first,
    does bucket 0 hold layers 0 and 1 from step 2 on, the first gradients backward produces?"""
    second = run_ranks(buckets.reversed_stack_buckets, 2, 0.5, 2)[0][1]
    params = [set(b["params"]) for b in second]
    n = len(MODEL_BYTES)
    last_two = {n - 1, n - 2, n - 3, n - 4}  # layers 7 and 6: weights and biases
    options = {
        "a": params[0] == last_two,
        "b": params[0] == {0, 1, 2, 3},
        "c": len(params) == 1,
        "d": params[0] == {n - 2, n - 1},  # layer 7 alone
    }
    assert supported(options) == KEYS["buckets_2"]
    assert len(params) == 4  # two layers per bucket: 2 x (256 KiB + 1 KiB) passes 0.5 MiB
    # and in the first step, before DDP knows the order, one bucket of everything
    first = run_ranks(buckets.reversed_stack_buckets, 2, 0.5, 1)[0][0]
    assert len(first) == 1


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
