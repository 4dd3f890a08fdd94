"""Quiz answers: one letter per item, checked with a message that teaches.

Answer cells hold ``answer_<id> = "c"``. Upper case and stray spaces are accepted;
anything else fails with a message naming the valid letters. The key and the explanation
are passed in by the hidden part of a grade cell, so this module carries neither.
"""

from __future__ import annotations

import builtins
import textwrap
from collections.abc import Sequence

from course.checks.teaching import teaches

__all__ = ["answer_status", "answer_verdict", "check_answer", "normalise_answer"]

# Captured at import: a submission that rebinds builtins later cannot change the verdict.
_str = builtins.str
_type = builtins.type
_isinstance = builtins.isinstance
_str_eq = _str.__eq__
_print = builtins.print


def normalise_answer(name: str, value: object, choices: str = "abcd") -> str:
    """Return ``value`` as one lower-case letter from ``choices``, or fail saying why."""
    valid = ", ".join(f'"{c}"' for c in choices)
    if _type(value) is not _str:
        # Exactly str: a subclass could answer True to every comparison.
        raise AssertionError(
            f"{name} should be a string holding one letter ({valid}), "
            f'but it is {_type(value).__name__}: {value!r}. Write for example {name} = "a".'
        )
    letter = _str.lower(_str.strip(value))
    if _str_eq(letter, ""):
        raise AssertionError(f'{name} is still empty: set it to one of {valid}, e.g. {name} = "a".')
    if len(letter) != 1 or letter not in choices:
        raise AssertionError(f"{name} = {value!r} is not one of the valid answers: {valid}.")
    return letter


def answer_verdict(
    name: str,
    value: object,
    choices: str = "abcd",
    key: str | None = None,
    explanation: str | None = None,
) -> str:
    """What a right (or only well-formed, without ``key``) answer prints; a wrong one raises.

    The grader calls this with the answer it read from the submitted notebook's text.
    """  # fmt: skip
    letter = normalise_answer(name, value, choices)
    if key is None:
        return ""
    why = "\n\n" + textwrap.dedent(explanation).strip() if explanation else ""
    if not _str_eq(letter, key):
        raise AssertionError(f'{name} = "{letter}" is not right.{why}')
    return f'{name} = "{letter}" is right.{why}'


@teaches
def check_answer(
    name: str,
    value: object,
    choices: str = "abcd",
    key: str | None = None,
    explanation: str | None = None,
    giveaways: Sequence[str] = (),  # noqa: ARG001 - read by the authoring tests, not here
) -> None:
    """Check the answer's format and, given the ``key``, that it is right.

    Without a key (the visible check) it says whether the item is answered and never stops
    a Run All for an empty answer; a malformed one still raises. A right answer prints the
    explanation; a wrong one raises ``AssertionError`` whose message carries it, so
    nbgrader's feedback shows why. Nothing is returned: a grade cell whose last value is a
    number would count as partial credit in nbgrader. ``giveaways``, beside the key in the
    hidden part, are the patterns that would hand the key over if a student could read them
    anywhere else (``course.instructor.bank``); checking ignores them.
    """
    if key is None:
        _print(answer_status(name, value, choices))
        return
    text = answer_verdict(name, value, choices, key, explanation)
    if text:
        _print(text)


def answer_status(name: str, value: object, choices: str = "abcd") -> str:
    """What the visible check of an item says before grading: answered (the letter it read)
    or not yet; only a malformed answer raises. An unanswered item so leaves Run All going."""
    if _type(value) is _str and _str_eq(_str.strip(value), ""):
        valid = ", ".join(f'"{c}"' for c in choices)
        return (
            f"{name} is not answered yet: set it to one of {valid} in the cell above (e.g. {name} "
            '= "a"), then run this cell again; unanswered, it scores 0 when graded.'
        )
    letter = normalise_answer(name, value, choices)
    return f'{name} = "{letter}" is a valid answer: it is marked against the key when graded.'
