"""The hints for common mistakes and gloo's errors in plain words: pure text, no ranks."""

from __future__ import annotations

import pytest

from course.ranks.mistakes import (
    ABORT_HINT,
    CELL_NAMES_HINT,
    TUPLE_HINT,
    hint_for,
    native_crash,
    plain_gloo,
)
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


ENFORCE = "[enforce fail at /pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:456]"
DUMP = f"""terminate called after throwing an instance of 'gloo::EnforceNotMet'
  what():  {ENFORCE} op.preamble.length <= op.nbytes. 12 vs 8
Fatal Python error: Aborted

Thread 0x00007f (most recent call first):
  File "/work/main/course/ranks/worker.py", line 120 in _run
Extension modules: numpy.core._multiarray_umath, torch._C (total: 2)
"""


def test_a_native_crash_is_cut_and_said_in_a_line() -> None:
    """Is gloo's abort cut from a rank's stderr, what came before kept, and its cause said in
    bytes? Another crash is named by faulthandler's words; no dump, nothing changes."""
    assert native_crash("mine\n" + DUMP) == (
        "mine\n",
        "gloo aborted it: a message of 12 bytes arrived for a receive of 8 bytes",
    )
    assert hint_for("a message of 12 bytes arrived for a receive of 8 bytes") == ABORT_HINT
    segv = "Fatal Python error: Segmentation fault\n\nCurrent thread 0x1 (most recent call):\n"
    assert native_crash(segv) == ("", "it crashed in native code (Segmentation fault)")
    assert native_crash("a warning\n") == ("a warning\n", None)
