"""The accumulation checks: do they pass the references and fail known-wrong ones, saying why?"""

from __future__ import annotations

import time

import pytest
from accumulation_impls import (
    accumulation_step,
    contiguous_sampler,
    never_syncs,
    no_division,
    sampler_indices,
    strided_sampler,
    stub_loop,
    stub_step,
    sync_every_time,
    train_no_step_when_done,
    train_plain,
    train_to_the_shortest,
    train_uneven,
    train_with_join,
    unseeded_sampler,
)

from course.lessons.accumulation import (
    check_accumulation_syncs,
    check_accumulation_values,
    check_sampler_indices,
    check_train_uneven,
)
from course.lessons.accumulation.uneven import UNEVEN_PG_TIMEOUT

pytestmark = pytest.mark.ranks


def test_reference_sampler_passes(no_leftovers) -> None:
    """Does the reference sampler match DistributedSampler in order and shuffled?"""
    assert "matches" in check_sampler_indices(sampler_indices, "in order")
    assert "matches" in check_sampler_indices(sampler_indices, "shuffled")


@pytest.mark.parametrize(
    ("fn", "part", "says"),
    [
        (contiguous_sampler, "in order", "positions r, r + num_replicas"),
        (strided_sampler, "in order", "pad the index list"),
        (unseeded_sampler, "shuffled", "seed + epoch"),
    ],
)
def test_wrong_samplers_fail_with_a_teaching_message(no_leftovers, fn, part, says) -> None:
    """Does each known-wrong sampler fail, naming the call and what to fix?"""
    with pytest.raises(AssertionError) as failure:
        check_sampler_indices(fn, part)
    assert says in str(failure.value) and "DistributedSampler gives" in str(failure.value)


def test_the_stubs_are_not_checked_yet(no_leftovers) -> None:
    """Do the released stubs get a one-line note saying they are not implemented, not a
    diagnosis, and start no rank?"""
    for check in (check_accumulation_values, check_accumulation_syncs):
        note = check(stub_step, world_sizes=(2,), seed=1)
        assert note.startswith("Not checked yet: stub_step is not implemented yet")
    note = check_train_uneven(stub_loop, world_sizes=(2,), seed=1)
    assert note.startswith("Not checked yet: stub_loop is not implemented yet")


def test_reference_accumulation_passes(by_value, no_leftovers) -> None:
    """Does the reference step give the large-batch step with one sync, on 2 and 3 ranks?"""
    assert "large-batch" in check_accumulation_values(accumulation_step, world_sizes=(2, 3))
    assert "once per step" in check_accumulation_syncs(accumulation_step, world_sizes=(2,))


@pytest.mark.parametrize(
    ("fn", "check", "says"),
    [
        (no_division, check_accumulation_values, "K = 4 times too large"),
        (sync_every_time, check_accumulation_syncs, "4 times in one step"),
        (never_syncs, check_accumulation_syncs, "never all-reduced"),
    ],
)
def test_wrong_accumulation_fails_with_a_teaching_message(by_value, no_leftovers, fn, check, says):
    """Does each known-wrong step fail its check, naming its mistake?"""
    with pytest.raises(AssertionError) as failure:
        check(fn, world_sizes=(2,), seed=5)
    assert says in str(failure.value)


def test_syncing_every_time_still_earns_the_values(by_value, no_leftovers) -> None:
    """Partial credit: is a step that syncs every micro-batch right on values?"""
    assert "large-batch" in check_accumulation_values(sync_every_time, world_sizes=(2,), seed=5)


def test_reference_uneven_loop_passes(by_value, no_leftovers) -> None:
    """Does the loop that agrees each step finish on 2 and 3 ranks with Join's weights?"""
    assert "without Join" in check_train_uneven(train_uneven, world_sizes=(2, 3))


def test_a_join_loop_is_refused(by_value, no_leftovers) -> None:
    """Does a loop that uses Join (right weights) fail, saying the exercise is without Join?"""
    with pytest.raises(AssertionError) as failure:
        check_train_uneven(train_with_join, world_sizes=(2,), seed=3)
    message = str(failure.value)
    assert "without Join: agree each step" in message and "accumulation_6" in message


def test_a_plain_loop_fails_after_the_gloo_timeout(by_value, no_leftovers) -> None:
    """Does the plain loop fail within about pg_timeout, saying that a rank waited and why?"""
    start = time.monotonic()
    with pytest.raises(AssertionError) as failure:
        check_train_uneven(train_plain, world_sizes=(2,), seed=2)
    assert time.monotonic() - start < UNEVEN_PG_TIMEOUT + 15
    message = str(failure.value)
    assert "did not finish" in message and "rank 0 (5 batches): waited" in message
    assert "Agree each step" in message and "Join([ddp])" not in message


@pytest.mark.parametrize(
    ("fn", "says"),
    [
        (train_no_step_when_done, "must still step its optimizer"),
        (train_to_the_shortest, "stopped when the first rank ran out of data"),
    ],
)
def test_a_loop_with_other_weights_fails_saying_why(by_value, no_leftovers, fn, says) -> None:
    """Does a loop that finishes with other weights than Join's fail, naming its mistake?"""
    with pytest.raises(AssertionError, match=says):
        check_train_uneven(fn, world_sizes=(2,), seed=4)
