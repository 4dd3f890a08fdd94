"""Does the quiz bank measure the student: no key cued by its form, none shown in the release?

The bank is read from the source notebooks (``course.instructor.bank``); the release is what
students get for graded work. Each item lists its give-aways (the numbers and wording that
would hand its key over) beside its key, in the hidden part of its check cell.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import nbformat
import pytest

from course.instructor.bank import (
    LIMITS,
    Item,
    bank,
    form,
    form_problems,
    giveaway_leaks,
    shown_before,
)

REPO = Path(__file__).resolve().parents[2]
BANK = bank()
RELEASE = {
    p.parent.name: nbformat.read(p, as_version=4) for p in (REPO / "release").glob("*/*.ipynb")
}


def _item(key: str = "a", options: dict[str, str] | None = None, points: float = 1) -> Item:
    options = options or {"a": "one option", "b": "another one", "c": "a third", "d": "a last"}
    return Item("toy", "toy_1", "A stem?", options, key, points, ("secret",))


def test_the_bank_is_read_whole() -> None:
    """Is every item of every source notebook read, with four options, a key and points?"""
    assert {i.assignment for i in BANK} == set(RELEASE)
    assert len(BANK) >= 28
    for i in BANK:
        assert sorted(i.options) == ["a", "b", "c", "d"], i.item_id
        assert i.key in i.options and i.points > 0 and i.stem, i.item_id


def test_no_option_form_points_at_the_keys() -> None:
    """Is the key rarely the longest, do picking the longest or the shortest option score
    little, are options of one length within an item, do the keys spread over a to d, is no
    key the only hedged option or the only one with a number, and do picking the option that
    repeats the shared parts or the lone negated one score little?"""
    f = form(BANK)
    assert form_problems(f) == []
    assert len(f.key_longest) <= LIMITS["key_longest"] * f.items


def test_the_form_figures_catch_a_cued_bank() -> None:
    """Would a bank whose key is always the longest, always "a", hedged or alone in holding a
    number be caught?"""
    long = {"a": "the right one, with more words", "b": "wrong", "c": "wrong too", "d": "nope"}
    cued = [_item("a", long, 2) for _ in range(8)]
    problems = " ".join(form_problems(form(cued)))
    for cue in ("strictly longest", "always longest", "different lengths", '"a" is the key'):
        assert cue in problems
    hedged = {
        "a": "about ten of them",
        "b": "ten of them all",
        "c": "none of them at",
        "d": "x" * 15,
    }
    numbered = {"a": "3 of them", "b": "all of them", "c": "one of them", "d": "few of them"}
    assert form([_item("a", hedged)]).lone_hedge == ["toy_1"]
    assert form([_item("a", numbered)]).lone_number == ["toy_1"]
    assert form([_item("b", long, 3)]).always_longest == 0.0


def _cued(options: dict[str, str], key: str = "a", n: int = 8, stem: str = "A stem?") -> list[Item]:
    return [
        dataclasses.replace(_item(key, options, 2), item_id=f"toy_{k}", stem=stem) for k in range(n)
    ]


def test_the_cue_figures_catch_a_converging_bank() -> None:
    """Would a bank whose key always repeats the parts its distractors share be caught, while
    one whose key is the odd one out scores nothing by that cue?"""
    built = {"a": "2 steps, 4 bytes", "b": "2 Steps; 8 bytes", "c": "3 steps: 4 bytes.", "d": "1"}
    f = form(_cued(built))
    assert f.always_convergent == 1.0 and f.convergent_parted == 1.0 and len(f.parted) == 8
    assert any(p.startswith("always convergent scores 100%") for p in form_problems(f))
    assert "toy_7" in " ".join(form_problems(f))
    assert form(_cued(built, key="d")).always_convergent == 0.0
    tied = {"a": "2 steps, 4 bytes", "b": "2 steps, 8 bytes", "c": "one", "d": "two"}
    assert form(_cued(tied)).always_convergent == 0.5  # a tie of two: half the points
    plain = {"a": "one option", "b": "another one", "c": "a third", "d": "a last"}
    assert form(_cued(plain)).always_convergent == 0.25 and form(_cued(plain)).parted == {}


def test_parts_are_the_stretches_between_separators() -> None:
    """Does an option split into parts at commas, semicolons, colons, parentheses, "and" and
    "with", but not inside a code span nor at a "/" between numbers?"""
    from course.instructor.cues import parts

    assert parts("2 Steps, 4 bytes (with `a, b`) and 16 / 4.") == {
        "2 steps",
        "4 bytes",
        "a b",
        "16 / 4",
    }


def test_the_cue_figures_catch_a_lone_negation() -> None:
    """Would a bank whose key is the only negated option, or the only plain one among negated
    ones, be caught, while ``no_sync`` in code and a split of two against two are no cue?"""
    negated = {"a": "it does not stop", "b": "it stops", "c": "it stops late", "d": "it stops now"}
    plain = {"a": "it stops", "b": "it doesn't stop", "c": "it never stops", "d": "no stop"}
    for options in (negated, plain):
        f = form(_cued(options))
        assert f.always_lone_negation == 1.0 and set(f.lone_negated) == {
            f"toy_{k}" for k in range(8)
        }
        assert any(p.startswith("always lone negation scores 100%") for p in form_problems(f))
    code = {"a": "`no_sync` stops it", "b": "it stops", "c": "it stops late", "d": "it stops now"}
    halves = {"a": "not now", "b": "never", "c": "it stops late", "d": "it stops now"}
    for options in (code, halves):
        assert form(_cued(options)).lone_negated == {}
        assert form(_cued(options)).always_lone_negation == 0.25


def test_the_figures_list_the_stems_that_say_measured() -> None:
    """Are the items whose stem says "measured" or "on this machine" listed, and no others?"""
    measured = _cued({"a": "x", "b": "y", "c": "z", "d": "w"}, n=1, stem="How long, measured?")
    machine = dataclasses.replace(measured[0], item_id="toy_9", stem="On this machine, what?")
    assert form([*measured, machine, _item()]).measured == ["toy_0", "toy_9"]


@pytest.mark.parametrize("pick", ["always_convergent", "always_lone_negation"])
def test_no_cue_beyond_length_scores_the_bank(pick: str) -> None:
    """Does picking the option that repeats the parts the others share, or the one negated (or
    plain) option where the others are not (or are), score at most its limit of the points?"""
    f = form(BANK)
    assert getattr(f, pick) <= LIMITS[pick], form_problems(f)


@pytest.mark.parametrize("item", BANK, ids=lambda i: i.item_id)
def test_every_item_names_its_giveaways(item: Item) -> None:
    """Does each item list patterns that would give it away, most of them stating part of what
    its key or its explanation says (so that the release check below is not vacuous)?"""
    from course.instructor.selfstudy import quiz_items

    assert len(item.giveaways) >= 2, f"{item.item_id}: add giveaways=(...) to its check_answer"
    nb = nbformat.read(REPO / "source" / item.assignment / f"{item.assignment}.ipynb", as_version=4)
    explanation = next(q.explanation for q in quiz_items(nb) if q.item_id == item.item_id)
    said = " ".join((explanation + " " + item.options[item.key]).split())
    found = [p for p in item.giveaways if re.search(p, said, re.IGNORECASE)]
    assert len(found) * 2 >= len(item.giveaways), (item.item_id, set(item.giveaways) - set(found))


@pytest.mark.parametrize("assignment", sorted(RELEASE))
def test_no_release_cell_gives_an_item_away(assignment: str) -> None:
    """Does no cell a student sees (markdown or code, in this notebook or one before it in
    course order) state an item's give-away, outside the item's own question?"""
    seen = shown_before(assignment, list(RELEASE))
    items = [i for i in BANK if i.assignment == assignment]
    leaks = [leak for a in seen for leak in giveaway_leaks(RELEASE[a], items)]
    assert leaks == []


def test_the_giveaway_check_would_catch_a_leak() -> None:
    """Would a summary that states an answer, or an output that prints it, be caught, while
    the item's own question and its own measuring cell's output are not flagged?"""
    nb = nbformat.v4.new_notebook()
    cells = [
        ("markdown", "toy_1_question", "Which one? * a) the secret one"),
        ("code", "toy_1_measure", "print(1)"),
        ("markdown", "summary", "The answer was the Secret one."),
    ]
    for kind, gid, source in cells:
        cell = getattr(nbformat.v4, f"new_{kind}_cell")(source)
        cell.metadata["nbgrader"] = {"grade_id": gid}
        nb.cells.append(cell)
    nb.cells[1].outputs = [nbformat.v4.new_output("stream", text="secret: 42")]
    nb.cells[2].outputs = []
    assert giveaway_leaks(nb, [_item()]) == ["toy_1: 'secret' in summary"]
    assert giveaway_leaks(nb, [_item()], outputs=True) == []
    nb.cells[0].outputs = [nbformat.v4.new_output("stream", text="a secret")]
    assert giveaway_leaks(nb, [_item()], outputs=True) == ["toy_1: 'secret' in toy_1_question"]


def test_no_docstring_or_comment_of_the_student_package_gives_an_item_away() -> None:
    """Does no docstring or comment of a module students get state an item's give-away? (The
    code itself computes what the checks and the widget need; that is said in docs/grading.md.)"""
    from course.instructor.bank import prose
    from course.instructor.studentview import student_files

    leaks = []
    for path in student_files(REPO):
        text = prose((REPO / path).read_text())
        leaks += [
            f"{i.item_id}: {g!r} in {path}"
            for i in BANK
            for g in i.giveaways
            if re.search(g, text, re.IGNORECASE)
        ]
    assert leaks == []
