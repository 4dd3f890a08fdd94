"""The cues of form in a quiz item: which options a student who knows nothing of the topic picks.

Each pick takes an item's options (``{"a": text, ...}``) and returns the letters a test-wise
student would pick by one cue, all of them when the cue says nothing; the student then picks
among those at random, so an item scores its points over their number when its key is among
them (Millman, Bishop & Ebel 1965, "An analysis of test-wiseness"; Haladyna, Downing &
Rodriguez 2002: options of one length and form, phrased positively, no clues to the key).
``course.instructor.bank`` sums the picks over the bank and holds each to its limits.

- Length and wording: the longest option, or the shortest (:func:`longest`,
  :func:`shortest`); the one option hedged or holding a number where no other is
  (:func:`lone`).
- Convergence (Smith 1982, "Converging on correct answers: a peculiarity of multiple choice
  items"): where options are built of parts ("2 steps, 4 bytes", "2 steps, 8 bytes", "3
  steps, 4 bytes"), the key tends to hold the parts the most distractors repeat. A *part* is a
  stretch of an option between separators (``,`` ``;`` ``:`` parentheses, the words "and" and
  "with"), in lower case, its outer punctuation dropped; a code span is never split. "/" is no
  separator: here it divides numbers and names ("16 / 4", "alpha / beta", "ZeRO-1/2"). Each
  option scores, for each of its parts, the number of other options that hold the same part;
  the student picks the top score. An item where that picks fewer than all options is
  *multi-part*.
- A lone negation: the one option that says "not", "no", "never", "nothing", "none", "nor",
  "cannot", "n't" or "without" where no other does, or the one that says none where all the
  others do (outside code spans, so ``no_sync`` is no negation).
- A stem that says "measured", "on this machine" or "here" may mark that the key departs from
  the textbook answer. Using that takes knowing which option the textbook gives, which a
  student who knows nothing of the topic does not, so it is no pick of form: the bank lists
  those stems (:func:`says_measured`) for a reader to judge, and holds them to no limit.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Protocol

__all__ = [
    "DIGIT",
    "HEDGE",
    "Keyed",
    "convergent",
    "expected",
    "lone",
    "lone_negation",
    "longest",
    "parts",
    "says_measured",
    "share",
    "shortest",
    "won",
]

HEDGE = re.compile(
    r"\b(about|roughly|approximately|usually|typically|likely|may|might|at (?:least|most))\b",
    re.IGNORECASE,
)
DIGIT = re.compile(r"\d")
_CODE = re.compile(r"`[^`]*`")
_SEPARATOR = re.compile(r"[,;:()]|\b(?:and|with)\b", re.IGNORECASE)
_NEGATION = re.compile(
    r"\b(?:not|no|never|nothing|none|nor|cannot|without)\b|n['\u2019]t\b", re.IGNORECASE
)
_MEASURED = re.compile(r"\b(?:measured|on this machine|here)\b", re.IGNORECASE)


def longest(options: dict[str, str]) -> list[str]:
    """The longest options, in characters (several when tied)."""
    top = max(map(len, options.values()))
    return [k for k, v in options.items() if len(v) == top]


def shortest(options: dict[str, str]) -> list[str]:
    """The shortest options, in characters (several when tied)."""
    low = min(map(len, options.values()))
    return [k for k, v in options.items() if len(v) == low]


def lone(options: dict[str, str], pattern: re.Pattern[str]) -> list[str]:
    """The one option that matches ``pattern`` (a hedge, a number) where no other does."""
    found = [k for k, v in options.items() if pattern.search(v)]
    return found if len(found) == 1 else []


def parts(option: str) -> frozenset[str]:
    """The parts an option is built of, normalised so that a repeated part compares equal."""
    whole = _CODE.sub(lambda m: _SEPARATOR.sub(" ", m.group()).replace("`", ""), option)
    chunks = (" ".join(c.lower().split()).strip(" .!?'\"") for c in _SEPARATOR.split(whole))
    return frozenset(c for c in chunks if c)


def _all_or(options: dict[str, str], picked: list[str]) -> list[str]:
    return picked or sorted(options)


def convergent(options: dict[str, str]) -> list[str]:
    """The options that share the most parts with the others (every option when none shares)."""
    held = {k: parts(v) for k, v in options.items()}
    shared = {
        k: sum(p in held[other] for p in mine for other in held if other != k)
        for k, mine in held.items()
    }
    top = max(shared.values(), default=0)
    return _all_or(options, [k for k, n in shared.items() if n == top and top > 0])


def _negated(option: str) -> bool:
    return bool(_NEGATION.search(_CODE.sub(" ", option)))


def lone_negation(options: dict[str, str]) -> list[str]:
    """The one option negated where no other is, or plain where all others are (else all)."""
    negated = [k for k, v in options.items() if _negated(v)]
    plain = [k for k in options if k not in negated]
    alone = negated if len(negated) == 1 else plain if len(plain) == 1 else []
    return _all_or(options, alone if len(options) > 2 else [])  # of two, neither is alone


def says_measured(stem: str) -> bool:
    """Does the stem say the answer was measured, on this machine or here?"""
    return bool(_MEASURED.search(stem))


class Keyed(Protocol):
    """What the figures read of a quiz item (``course.instructor.bank.Item``)."""

    @property
    def item_id(self) -> str: ...
    @property
    def options(self) -> dict[str, str]: ...
    @property
    def key(self) -> str: ...
    @property
    def points(self) -> float: ...


def expected(item: Keyed, picks: Sequence[str]) -> float:
    """The points a student expects who picks at random among ``picks``."""
    return item.points / len(picks) if item.key in picks else 0.0


def won(items: Sequence[Keyed], pick: Callable[[dict[str, str]], list[str]]) -> dict[str, float]:
    """Each item where ``pick`` narrows the options: the share of its points the pick wins."""
    picks = {i.item_id: pick(i.options) for i in items}
    return {
        i.item_id: expected(i, picks[i.item_id]) / i.points
        for i in items
        if len(picks[i.item_id]) < len(i.options)
    }


def share(items: Sequence[Keyed], wins: dict[str, float]) -> float:
    """The share of the points of ``items`` a student wins by a cue that wins ``wins`` (as
    :func:`won` gives them), guessing among all the options elsewhere."""
    got = sum(i.points * wins.get(i.item_id, 1 / len(i.options)) for i in items)
    return got / (sum(i.points for i in items) or 1.0)
