"""Does the quiz bank measure the student: no key cued by its form, none shown in the release?

The bank is read from the source notebooks (``course.instructor.bank``); the release is what
students get for graded work. Each item lists its give-aways (the numbers and wording that
would hand its key over) beside its key, in the hidden part of its check cell.
"""

from __future__ import annotations

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
    little, are options of one length within an item, do the keys spread over a to d, and is
    no key the only hedged option or the only one with a number?"""
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
    code itself computes what the checks and the widget need; that is said in the README.)"""
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
