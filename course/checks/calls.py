"""The simplest check: call the student's function on a fresh rank, compare what it returned.

    print(check_returns(add_one, [(1,), (-5,)], [2, -4]))

For exercises that need no communication. The calls run on one fresh rank (confined, when
graded) with a deadline; the values come back as plain data and are compared here, so a grade
cell never calls the student's code itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from course.checks.teaching import failure_message, teaches

__all__ = ["check_returns"]


def _call_all(fn: Callable[..., Any], calls: list[tuple]) -> list[dict[str, Any]]:
    """On the rank: each call's value, or the exception it raised, in words."""
    out = []
    for args in calls:
        try:
            out.append({"value": fn(*args)})
        except Exception as exc:  # noqa: BLE001 - the student's code may raise anything; each becomes a message
            out.append({"raised": f"{type(exc).__name__}: {exc}"})
    return out


@teaches
def check_returns(
    fn: Callable[..., Any],
    calls: Sequence[tuple],
    expected: Sequence[Any],
    name: str | None = None,
    timeout: float = 10.0,
) -> str:
    """Check that ``fn(*calls[i]) == expected[i]`` for each i, within ``timeout`` seconds."""
    from course.ranks import launch

    name = name or getattr(fn, "name", None) or getattr(fn, "__name__", "your function")
    result = launch(_call_all, 1, fn, [tuple(c) for c in calls], timeout=timeout)
    if not result.ok:
        doing = f" (the deadline was {timeout:g} s)"
        raise AssertionError(failure_message(name, 1, result.failures, doing))
    for args, want, got in zip(calls, expected, result.results[0], strict=True):
        shown = ", ".join(map(repr, args))
        if "raised" in got:
            raise AssertionError(f"{name}({shown}) raised {got['raised']}")
        if got.get("value") != want:
            raise AssertionError(
                f"{name}({shown}) returned {got.get('value')!r}, expected {want!r}"
            )
    return f"{name} returned what it should for {len(calls)} calls."
