"""How checks fail: the teaching line first, no checker source, a hint for common mistakes."""

from __future__ import annotations

import pytest

from course.checks.teaching import (
    CheckFailed,
    hint_for,
    not_implemented,
    say_if_unimplemented,
    teaches,
)
from course.grading.student import StudentCode


def stub(tensor):
    """The released stub: a docstring and a comment."""
    # YOUR CODE HERE


def stub_pass(tensor):
    pass


def stub_ellipsis(tensor): ...


def implemented(tensor):
    """Does something."""
    return None if tensor is None else tensor


class HalfDone:
    """A class whose __init__ is written and finish() is not."""

    def __init__(self) -> None:
        self.x = 1

    def finish(self) -> None:
        """Wait for everything."""
        # YOUR CODE HERE


@teaches
def check_thing(fn, value: int = 0) -> str:
    assert value >= 0, f"value is {value}: it must not be negative"
    return "fine"


def test_failed_check_renders_as_its_message_only() -> None:
    """Does IPython get the message's lines, the first one marked, and no source or frames?"""
    lines = CheckFailed("answer_ring_1 is still empty.\n  a hint")._render_traceback_()
    assert len(lines) == 2
    assert "Check failed:" in lines[0] and "answer_ring_1 is still empty." in lines[0]
    assert lines[1] == "  a hint"


def test_teaches_turns_assertions_into_check_failures() -> None:
    """Does a decorated check raise CheckFailed (still an AssertionError) with the message?"""
    assert check_thing(implemented) == "fine"
    with pytest.raises(CheckFailed, match="must not be negative") as info:
        check_thing(implemented, -1)
    assert isinstance(info.value, AssertionError)
    assert info.value.__suppress_context__


@pytest.mark.parametrize("fn", [stub, stub_pass, stub_ellipsis])
def test_stubs_are_skipped_saying_not_implemented(fn) -> None:
    """In a notebook, does a check of a function whose body is only a docstring, pass or ...
    say it is not implemented yet, in one line, without raising (Run All goes on)?"""
    note = check_thing(fn)
    assert note.startswith(f"Not checked yet: {fn.__name__} is not implemented yet")
    assert "\n" not in note


def test_a_graded_stub_fails_its_check() -> None:
    """Graded, does a check of the released stub still fail, so it scores no points?"""
    cells = (("ring_allreduce", 'def stub(tensor):\n    """Doc."""\n    # YOUR CODE HERE\n'),)
    with pytest.raises(CheckFailed, match="stub is not implemented yet: its body is still"):
        check_thing(StudentCode(cells, "stub"))


def test_written_code_is_not_a_stub() -> None:
    """Are real functions, classes, strings and lambdas left alone?"""
    assert not_implemented(implemented) is None
    assert not_implemented("answer_ring_1") is None
    assert not_implemented(lambda t: t) is None
    assert not_implemented(HalfDone) is None  # partly written: the check will say what is wrong

    class Released:
        def __init__(self) -> None:
            """Set up."""

        def finish(self) -> None:
            """Finish."""

    note = not_implemented(Released)
    assert "Released.__init__, Released.finish are not implemented yet: their bodies are" in note


def test_say_if_unimplemented_prints_a_note(capsys) -> None:
    """Does a try-it cell on a stub say so instead of printing unchanged values silently?"""
    say_if_unimplemented(stub)
    say_if_unimplemented(implemented)
    assert capsys.readouterr().out.count("not implemented yet") == 1


def test_a_future_divided_as_a_list_gets_a_hint() -> None:
    """Does dividing a future's value (a list) by an int point at fut.value()[0]?"""
    text = "TypeError: unsupported operand type(s) for /: 'list' and 'int'"
    assert "fut.value()[0]" in hint_for(text)
    assert hint_for("ZeroDivisionError: division by zero") is None


def test_kernel_and_feedback_page_show_the_message_without_checker_source(tmp_path) -> None:
    """In a real kernel, and in the page nbgrader's generate_feedback renders from it, does a
    failed check show its teaching line first and none of the checker's own source?"""
    import os

    import nbformat
    import nbgrader
    from nbclient import NotebookClient
    from nbconvert import HTMLExporter
    from traitlets.config import Config

    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell(
            "from course.checks import check_answer\n"
            'check_answer("answer_ring_1", "e", choices="abcd")'
        )
    ]
    NotebookClient(
        nb,
        timeout=60,
        kernel_name="python3",
        allow_errors=True,
        resources={"metadata": {"path": str(tmp_path)}},
    ).execute()
    (error,) = nb.cells[0].outputs
    assert error.ename == "CheckFailed"
    text = "\n".join(error.traceback)
    assert "is not one of the valid answers" in error.traceback[0]
    for leak in ("Traceback", "File ", "raise ", "def ", "normalise_answer"):
        assert leak not in text

    formgrader = os.path.join(os.path.dirname(nbgrader.__file__), "server_extensions", "formgrader")
    config = Config()  # what nbgrader's GenerateFeedback configures
    config.HTMLExporter.template_name = "feedback"
    config.HTMLExporter.extra_template_basedirs = [os.path.join(formgrader, "templates")]
    css = os.path.join(formgrader, "static", "node_modules", "bootstrap", "dist", "css")
    config.HTMLExporter.extra_template_paths = [css]
    grade = {"grade": True, "solution": False, "grade_id": "ring_1_check", "points": 1, "score": 0}
    nb.cells[0].metadata["nbgrader"] = grade
    scores = {"nbgrader": {"notebook": "ring_1", "score": 0, "max_score": 1, "late_penalty": 0}}
    body, _ = HTMLExporter(config=config).from_notebook_node(nb, resources=scores)
    assert "is not one of the valid answers" in body
    assert "normalise_answer" not in body and "raise AssertionError" not in body
