"""The hints for common mistakes and gloo's errors in plain words: pure text, no ranks."""

from __future__ import annotations

import pytest

from course.ranks.mistakes import CELL_NAMES_HINT, TUPLE_HINT, hint_for, plain_gloo
from course.ranks.wording import count, listed, ranks_text, world_sizes_text

GLOO = "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] "


@pytest.mark.parametrize(
    ("error", "hint"),
    [
        ("NameError: name 'rank' is not defined", CELL_NAMES_HINT),
        ("NameError: name 'world_size' is not defined", CELL_NAMES_HINT),
        ("TypeError: 'tuple' object does not support item assignment", TUPLE_HINT),
        ("NameError: name 'ranks' is not defined", None),
        ("TypeError: 'list' object does not support item assignment", None),
    ],
)
def test_a_hint_only_for_the_error_it_explains(error: str, hint: str | None) -> None:
    """Is the hint given for exactly its error, and none for a near miss?"""
    assert hint_for(error) == hint


def test_gloo_timeouts_are_said_in_seconds_without_its_source_file() -> None:
    """Does gloo's "[...cc:78] Timed out waiting 5000ms for recv" read as a plain sentence?"""
    text = plain_gloo(
        f"RuntimeError: {GLOO}Timed out waiting 5000ms for recv operation to complete"
    )
    assert text == "RuntimeError: gloo gave up after 5 s: a receive got no message from its peer"
    sent = plain_gloo(f"{GLOO}Timed out waiting 1500ms for send operation to complete")
    assert sent == "gloo gave up after 1.5 s: a send was never taken by its peer"
    assert plain_gloo("ValueError: bad") == "ValueError: bad"


def test_counts_and_lists_read_as_english() -> None:
    """No "1 elements", no "rank 0, 2", no "world sizes 3"?"""
    assert (count(1, "element"), count(3, "element")) == ("1 element", "3 elements")
    assert listed([0, 2, 3]) == "0, 2 and 3"
    assert (ranks_text([1]), ranks_text([0, 2])) == ("rank 1", "ranks 0 and 2")
    assert world_sizes_text([3]) == "world size 3"
    assert world_sizes_text([2, 3]) == "world sizes 2 and 3"
