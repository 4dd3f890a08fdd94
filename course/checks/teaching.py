"""One way for every check to turn a failed run of ranks into a message that teaches.

The launcher has already decided what each rank did and where in the student's code
(``course.ranks.RankFailure``: kind, message, ``where``, the student's own traceback); this
module only words it: which ranks failed and how, what the check was doing, the hint that
fits (a deadlock, a message that did not fit its buffer) and the first cause's traceback.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Mapping
from typing import Any

from course.ranks import RankError, RankFailure

__all__ = ["DEADLOCK_HINT", "failure_message", "on_ranks", "user_traceback"]

DEADLOCK_HINT = (
    "Every rank was waiting for another and none could go on: a deadlock. Look at the line "
    "each rank was blocked in: every send needs a matching receive on the peer, and every "
    "collective must be called by every rank, in the same order, with the same sizes."
)
ABORT_HINT = (
    "gloo aborts a rank when a message does not fit the buffer posted to receive it: check "
    "that each send and the peer's receive use the same number of elements and dtype."
)


def failure_message(
    name: str,
    world_size: int,
    failures: Mapping[int, RankFailure],
    doing: str = "",
    deadlock_hint: str = DEADLOCK_HINT,
) -> str:
    """What each rank did (causes first), the hint that fits, and the first cause's traceback."""
    lines = [f"{name} failed on {world_size} ranks{doing}:"]
    ordered = sorted(failures.values(), key=lambda f: (not f.is_cause, f.rank))
    lines += [f"  {f}" for f in ordered]
    causes = [f for f in ordered if f.is_cause]
    if not causes:
        lines.append(deadlock_hint)
    if any("SIGABRT" in f.message for f in causes):
        lines.append(ABORT_HINT)
    for f in causes[:1]:
        if f.traceback.strip():
            lines += [f"Rank {f.rank}'s traceback:", f.traceback]
    return "\n".join(lines)


def on_ranks(
    name: str, fn: Callable[..., Any], world_size: int, *args: Any, timeout: float = 30.0
) -> list[Any]:
    """Run ``fn`` on fresh ranks; a crash or deadlock becomes an AssertionError naming ``name``."""
    from course.ranks import run

    try:
        return run(fn, world_size, *args, timeout=timeout)
    except RankError as err:
        raise AssertionError(failure_message(name, world_size, err.failures)) from None
    except TypeError as err:  # the launcher could not pickle the student's code
        raise AssertionError(f"{name} could not be sent to the ranks: {err}") from None


def user_traceback(exc: BaseException) -> str:
    """The traceback of an exception raised by student code, without the checker's frame."""
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__.tb_next))
