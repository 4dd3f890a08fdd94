"""One way for every check to turn a failed run of ranks into a message that teaches.

The launcher has already decided what each rank did and where in the student's code
(``course.ranks.RankFailure``: kind, message, ``where``, the student's own traceback); this
module only words it: which ranks failed and how, what the check was doing, the hint that
fits (a deadlock, a message that did not fit its buffer) and the first cause's traceback.

A failed check raises :class:`CheckFailed`, an ``AssertionError`` that IPython renders as its
message alone: the student (in JupyterLab, and in nbgrader's feedback page, which stores what
IPython rendered) reads the teaching line first, never the checker's own source.
"""

from __future__ import annotations

import dis
import functools
import traceback
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from course.ranks import RankError, RankFailure
from course.ranks.mistakes import ABORT_HINT, hint_for

__all__ = [
    "DEADLOCK_HINT",
    "TIMEOUT",
    "CheckFailed",
    "failure_message",
    "hint_for",
    "need_function",
    "not_implemented",
    "on_ranks",
    "read_record",
    "say_if_unimplemented",
    "stub_text",
    "teaches",
    "user_traceback",
    "world_sizes_of",
]

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")

# Seconds per launch of a check's ranks: DDP's first construction on a rank imports torch._dynamo.
TIMEOUT = 30.0

DEADLOCK_HINT = (
    "Every rank was waiting for another and none could go on: a deadlock. Look at the line "
    "each rank was blocked in: every send needs a matching receive on the peer, and every "
    "collective must be called by every rank, in the same order, with the same sizes."
)
RED, BOLD, RESET = "\x1b[0;31m", "\x1b[1m", "\x1b[0m"


class CheckFailed(AssertionError):  # noqa: N818 - the heading students read: "Check failed"
    """A check's verdict on the student's work: IPython shows the message, not our source."""

    def _render_traceback_(self) -> list[str]:
        """The lines IPython prints (and nbgrader stores) instead of a traceback."""
        head, *rest = str(self).splitlines() or [""]
        return [f"{RED}{BOLD}Check failed:{RESET} {head}", *rest]


def _is_stub(fn: Any) -> bool:
    """Whether ``fn`` is a function whose body is only a docstring, comments, pass or ``...``."""
    code = getattr(fn, "__code__", None)
    if code is None:
        return False
    for ins in dis.get_instructions(code):
        if ins.opname in ("RESUME", "NOP", "RETURN_VALUE", "RETURN_CONST", "POP_TOP"):
            if ins.opname == "RETURN_CONST" and ins.argval is not None:
                return False
            continue
        if ins.opname == "LOAD_CONST" and ins.argval in (None, Ellipsis):
            continue
        return False
    return True


def not_implemented(obj: Any) -> str | None:
    """If ``obj`` (a function, or a class all of whose own methods are stubs) is still the
    released stub, say so. A class with some methods written is left to the check: an empty
    method can be meant (a ``zero_grad`` that does nothing, say). The grader's stand-in for
    a student's function answers from the submitted text (``stub_message``)."""
    if _graded(obj):  # the grader's: judged from the submitted text
        return obj.stub_message()
    if isinstance(obj, type):
        own = [v for v in vars(obj).values() if callable(v) and hasattr(v, "__code__")]
        stubs = [f"{obj.__name__}.{f.__name__}" for f in own if _is_stub(f)]
        if not stubs or len(stubs) < len(own):
            return None
        return stub_text(stubs)
    if _is_stub(obj):
        return stub_text([obj.__name__])
    return None


def _graded(obj: Any) -> bool:
    """Whether ``obj`` is the grader's stand-in for a student's code (``StudentCode``)."""
    return type(obj).__module__ == "course.grading.student"


def stub_text(stubs: list[str]) -> str:
    """ "f is not implemented yet: ..." for the stubs named."""
    one = len(stubs) == 1
    body = "its body is" if one else "their bodies are"
    return (
        f"{', '.join(stubs)} {'is' if one else 'are'} not implemented yet: {body} still only "
        "the docstring. Replace # YOUR CODE HERE with your code, run that cell, then run this "
        "one again."
    )


def say_if_unimplemented(obj: Any) -> None:
    """Print, once (on rank 0 when in a process group), that ``obj`` is still a stub."""
    import torch.distributed as dist

    message = not_implemented(obj)
    if message and (not dist.is_initialized() or dist.get_rank() == 0):
        print(f"Note: {message}")


def teaches(check: F) -> F:
    """Make a check fail with :class:`CheckFailed`, and skip an unimplemented stub: graded,
    it fails (no points); in a notebook it returns a note, so Run All goes on past it. Every
    function handed to the check positionally is looked at (a check of two functions skips
    while either is a stub)."""

    @functools.wraps(check)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        stubs = [(a, m) for a in args if callable(a) and (m := not_implemented(a))]
        obj, message = stubs[0] if stubs else (None, None)
        if message and _graded(obj):
            raise CheckFailed(message)
        if message:
            return f"Not checked yet: {message}"
        try:
            return check(*args, **kwargs)
        except CheckFailed:
            raise
        except AssertionError as err:
            raise CheckFailed(str(err)) from None

    return wrapper  # type: ignore[return-value]


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
    hints = {hint_for(f"{f.message}\n{f.traceback}") for f in causes} - {None}
    if any("SIGABRT" in f.message for f in causes):
        hints.add(ABORT_HINT)
    lines += sorted(hints)
    for f in causes[:1]:
        if f.traceback.strip():
            lines += [f"Rank {f.rank}'s traceback:", f.traceback]
    return "\n".join(lines)


def need_function(name: str, fn: Any, kind: str = "function") -> None:
    """Fail the check, in words, unless ``fn`` is callable (the student's ``name`` function,
    or class for ``kind="class"``: an unrun cell leaves something else under its name)."""
    if not callable(fn):
        raise CheckFailed(
            f"expected your {name} {kind}, got {type(fn).__name__}: run its cell first"
        )


def world_sizes_of(world_sizes: Any) -> tuple[int, ...]:
    """``world_sizes`` as a tuple; ValueError unless it holds integers of at least 2."""
    sizes = tuple(world_sizes)
    if not sizes or any(type(n) is not int or n < 2 for n in sizes):
        raise ValueError(f"world_sizes must be integers of at least 2, got {sizes}")
    return sizes


def on_ranks(
    name: str,
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    timeout: float = TIMEOUT,
    before: Callable[[], list[str]] | None = None,
) -> list[Any]:
    """Run ``fn`` on fresh ranks; a crash or deadlock becomes an AssertionError naming ``name``.

    ``before``: what each rank does before the job (and the student's code) is unpickled,
    the check's refusals (``course.checks.refusals.refusing``)."""
    from course.ranks import launch

    try:
        return launch(fn, world_size, *args, timeout=timeout, before=before).check()
    except RankError as err:
        raise CheckFailed(failure_message(name, world_size, err.failures)) from None
    except TypeError as err:  # the launcher could not pickle the student's code
        raise CheckFailed(f"{name} could not be sent to the ranks: {err}") from None


def on_recorded_ranks(
    name: str,
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    timeout: float = 30.0,
    before: Callable[[], list[str]] | None = None,
    measured: bool = False,
) -> tuple[list[Any], tuple]:
    """:func:`on_ranks`, with the relay's record of the run (empty off the relay: in a
    notebook, where ranks talk over gloo); ``measured``: see ``course.ranks.launch``."""
    from course.ranks import launch

    options = {"timeout": timeout, "before": before, "measured": measured}
    try:
        result = launch(fn, world_size, *args, **options)
    except TypeError as err:  # the launcher could not pickle the student's code
        raise CheckFailed(f"{name} could not be sent to the ranks: {err}") from None
    if result.failures:
        raise CheckFailed(failure_message(name, world_size, result.failures))
    return result.results, result.relayed


def read_record(run: str, how: str, read: Callable[..., T], *args: Any) -> T:
    """``read(*args)``, a reading of the relay's record of ``run`` ("ring_allreduce's run on 3
    ranks"); a record it cannot read ``how`` ("case by case"; ``read``'s ValueError) fails
    the check with the reason."""
    try:
        return read(*args)
    except ValueError as err:
        raise CheckFailed(f"{run} cannot be read{' ' + how if how else ''}: {err}") from None


def user_traceback(exc: BaseException) -> str:
    """The traceback of an exception raised by student code, without the course's frames."""
    from course.ranks.report import format_traceback

    frames = [tuple(f) for f in traceback.extract_tb(exc.__traceback__)]
    last = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    return format_traceback(frames, last)
