"""Quiz answers read from the submitted text: which forms count, and what the others are told."""

from __future__ import annotations

import pytest

from course.grading.quiz import quiz_call, quiz_verdict, read_answer

NAME = "answer_ring_1"
RELEASED = f'{NAME} = ""  # your answer: one letter, "a" to "d"\n'


@pytest.mark.parametrize(
    "cells",
    [
        [("ring_1_answer", f'{NAME} = "b"')],
        [("ring_1_answer", RELEASED + f'{NAME} = "b"\n')],  # the stub line left above the answer
        [("ring_1_answer", f'{NAME} = " B "  # spaces and case are fine')],
        [("ring_1_answer", f'{NAME}: str = "b"\nprint({NAME})\nwhile True:\n    pass')],
        [("setup", "import torch"), ("ring_1_answer", f'%time\n{NAME} = "b"')],
    ],
)
def test_a_string_literal_is_read(cells: list) -> None:
    assert read_answer(cells, NAME).strip().lower() == "b"


@pytest.mark.parametrize(
    ("cells", "said"),
    [
        ([("ring_1_answer", f'{NAME} = "B".lower()')], "set in a way the grader does not read"),
        ([("ring_1_answer", f'{NAME} = f"b"')], "set in a way the grader does not read"),
        ([("ring_1_answer", f'{NAME} = "b"'), ("other", f'{NAME} = "c"')], "more than one cell"),
        ([("ring_1_answer", f'{NAME} = "b"'), ("x", f"def f():\n    global {NAME}")], "line 2"),
        ([("ring_1_answer", f'{NAME} = "b"'), ("x", f"for {NAME} in 'ab': pass")], "line 1"),
        ([("ring_1_answer", f'{NAME} = "b"'), ("x", f"import os as {NAME}")], "import os as"),
        (
            [("ring_1_answer", f'{NAME} = "b"'), ("x", f"globals()['{NAME}'] = 1\ndel {NAME}")],
            "del",
        ),
        ([("ring_1_answer", f'{NAME} = ("b")\n{NAME} += ""')], "does not read"),
        ([("ring_1_answer", f'{NAME} = "b" +')], "not Python the grader can read (line 1)"),
        (
            [("ring_1_answer", f'{NAME} = "b"'), ("x", f"{NAME} = " + "-" * 3000 + "1")],
            "not Python",
        ),
        ([("other", "x = 1")], "not set anywhere"),
        ([], "not set anywhere"),
    ],
)
def test_anything_else_scores_nothing_and_says_the_form(cells: list, said: str) -> None:
    with pytest.raises(AssertionError) as err:
        read_answer(cells, NAME)
    assert said in str(err.value)
    assert f'write it as {NAME} = "a"' in str(err.value)


GRADE_CELL = f"""check_answer("{NAME}", {NAME}, choices="abcd")
### BEGIN HIDDEN TESTS
check_answer(
    "{NAME}",
    {NAME},
    choices="abcd",
    key="b",
    explanation=\"\"\"
    Because.
    \"\"\",
)
### END HIDDEN TESTS
"""


def test_the_key_comes_from_the_grade_cells_hidden_part() -> None:
    call = quiz_call(GRADE_CELL)
    assert call == {
        "name": NAME,
        "choices": "abcd",
        "key": "b",
        "explanation": "\n    Because.\n    ",
    }
    assert quiz_verdict([("a", f'{NAME} = "B"')], call) == f'{NAME} = "b" is right.\n\nBecause.'
    with pytest.raises(AssertionError, match=f'{NAME} = "c" is not right.\n\nBecause.'):
        quiz_verdict([("a", f'{NAME} = "c"')], call)
    with pytest.raises(AssertionError, match="is not one of the valid answers"):
        quiz_verdict([("a", f'{NAME} = "e"')], call)
    assert quiz_call("print(check_ring_sums(ring_allreduce))") is None
