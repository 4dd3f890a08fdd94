"""check_returns: the student's function called on a fresh rank, compared in the caller."""

from __future__ import annotations

import time

import pytest

from course.checks import check_returns

pytestmark = pytest.mark.ranks


def add_one(x: int) -> int:
    return x + 1


def add_two(x: int) -> int:
    return x + 2


def refuses(x: int) -> int:
    raise ValueError(f"no {x}")


def dawdles(x: int) -> int:
    time.sleep(30)
    return x + 1


def test_right_values_pass() -> None:
    assert "3 calls" in check_returns(add_one, [(1,), (-5,), (41,)], [2, -4, 42])


@pytest.mark.parametrize(
    ("fn", "said"),
    [
        (add_two, "add_two(1) returned 3, expected 2"),
        (refuses, "refuses(1) raised ValueError: no 1"),
        (dawdles, "the deadline was 3 s"),
    ],
)
def test_each_way_to_fail_says_what_happened(fn: object, said: str) -> None:
    with pytest.raises(AssertionError) as failure:
        check_returns(fn, [(1,)], [2], timeout=3)
    assert said in str(failure.value)
