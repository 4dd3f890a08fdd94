"""Quiz answer checks: formats accepted, formats refused, keys and explanations."""

from __future__ import annotations

import pytest

from course.checks.answers import check_answer, normalise_answer


@pytest.mark.parametrize("value", ["c", "C", " c", "c ", "\tC\n"])
def test_accepts_case_and_stray_spaces(value: str) -> None:
    """Are upper case and stray spaces read as the letter they hold?"""
    assert normalise_answer("answer_x", value) == "c"


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ("", "still empty"),
        ("   ", "still empty"),
        ("e", "not one of the valid answers"),
        ("ab", "not one of the valid answers"),
        ("c)", "not one of the valid answers"),
        (3, "should be a string"),
        (None, "should be a string"),
        (["c"], "should be a string"),
    ],
)
def test_refuses_other_formats_naming_the_valid_letters(value: object, needle: str) -> None:
    """Does a wrong format fail with a message that names the valid letters?"""
    with pytest.raises(AssertionError) as info:
        normalise_answer("answer_x", value, choices="abcd")
    assert needle in str(info.value)
    assert '"a", "b", "c", "d"' in str(info.value)


def test_a_str_subclass_that_equals_everything_is_refused() -> None:
    """Can an object whose __eq__ is always true pass for the right letter?"""

    class Anything(str):
        __slots__ = ()

        def __eq__(self, other: object) -> bool:
            return True

        __hash__ = str.__hash__

    with pytest.raises(AssertionError, match="should be a string"):
        check_answer("answer_x", Anything("a"), key="c")


def test_right_answer_prints_the_explanation(capsys: pytest.CaptureFixture[str]) -> None:
    """Does a right answer pass, return nothing a grade cell could count, and print why?"""
    assert check_answer("answer_x", "C", key="c", explanation="Two phases.") is None
    out = capsys.readouterr().out
    assert 'answer_x = "c" is right.' in out
    assert "Two phases." in out


def test_wrong_answer_fails_with_the_explanation() -> None:
    """Does a wrong answer fail with a message that carries the explanation?"""
    with pytest.raises(AssertionError) as info:
        check_answer("answer_x", "b", key="c", explanation="Two phases.")
    assert 'answer_x = "b" is not right.' in str(info.value)
    assert "Two phases." in str(info.value)


def test_format_only_check_needs_no_key(capsys: pytest.CaptureFixture[str]) -> None:
    """Without a key, is only the format checked, and does a valid answer say it was read?"""
    check_answer("answer_x", " D")
    assert capsys.readouterr().out.strip() == (
        'answer_x = "d" is a valid answer: it is marked against the key when graded.'
    )
    with pytest.raises(AssertionError):
        check_answer("answer_x", "z")


@pytest.mark.parametrize("value", ["", "   "])
def test_an_unanswered_item_says_so_without_stopping_run_all(value, capsys) -> None:
    """Without a key, does an empty answer print one line saying it is unanswered, and not
    raise (so Run All goes on), while the keyed check still fails it?"""
    check_answer("answer_x", value)
    out = capsys.readouterr().out
    assert out.startswith("answer_x is not answered yet") and out.count("\n") == 1
    with pytest.raises(AssertionError, match="still empty"):
        check_answer("answer_x", value, key="c")


def test_choices_can_be_narrower() -> None:
    """Is a letter outside a narrower set of choices refused?"""
    with pytest.raises(AssertionError, match='"a", "b", "c"'):
        check_answer("answer_x", "d", choices="abc")
