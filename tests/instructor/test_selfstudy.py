"""Self-study notebooks: instant feedback after a committed answer, no key readable at a glance."""

from __future__ import annotations

import base64
from pathlib import Path

import nbformat
import pytest
from nbgrader.preprocessors import ClearSolutions

from course.instructor import selfstudy
from course.instructor.selfstudy import (
    build_selfstudy,
    feedback,
    grade_id,
    quiz_items,
    seal,
    unseal,
)

REPO = Path(__file__).resolve().parents[2]
TOY = REPO / "tests" / "fixtures" / "toy_course" / "source" / "toy" / "toy.ipynb"
EXPLANATION = "Two phases of N-1 steps each: 2(N-1) steps, whatever the tensor size."


def _toy() -> nbformat.NotebookNode:
    return nbformat.read(TOY, as_version=4)


def _source_notebooks() -> list[Path]:
    return sorted(p for p in (REPO / "source").glob("*/*.ipynb") if p.stem == p.parent.name)


def test_seal_round_trip():
    """Does unseal recover the key and the explanation that seal was given?"""
    assert unseal(seal("c", EXPLANATION)) == ("c", EXPLANATION)
    assert unseal(seal("e", EXPLANATION), choices="abcde") == ("e", EXPLANATION)


def test_seal_hides_key_and_explanation_from_a_glance():
    """Is neither the explanation nor any of its words readable in the seal or its base64?"""
    sealed = seal("b", EXPLANATION)
    decoded = base64.b64decode(sealed.split(":", 1)[1]).decode()
    for text in (sealed, decoded):
        assert "whatever" not in text
        assert "phases" not in text
        assert '"b"' not in text
    assert seal("b", EXPLANATION) != sealed, "each seal should use a fresh salt"


def test_seal_of_a_letter_outside_the_choices_is_rejected():
    """Does a seal whose key is not among the choices fail with a clear message?"""
    with pytest.raises(ValueError, match="none of the choices"):
        unseal(seal("z", EXPLANATION))


def test_feedback_on_the_right_answer(capsys):
    """Does the right letter, in upper case with spaces, print "Right" and the explanation,
    and return nothing (no stray True under the text)?"""
    assert feedback("answer_x", " C ", seal("c", EXPLANATION)) is None
    out = capsys.readouterr().out
    assert out.startswith('Right: answer_x = "c"')
    assert EXPLANATION in out


def test_a_wrong_answer_gets_a_second_try_then_the_key(capsys):
    """Does a first wrong letter get a second try (what to measure, no key, no explanation;
    the same letter again is no new try), and a second wrong letter the key and the why?"""
    sealed = seal("c", EXPLANATION)
    for _ in range(2):
        assert feedback("answer_w", "a", sealed) is None
        out = capsys.readouterr().out
        assert out.startswith('Not yet: "a"') and "measuring cell" in out
        assert '"c"' not in out and EXPLANATION not in out
    feedback("answer_w", "b", sealed)
    out = capsys.readouterr().out
    assert 'you chose "b"' in out and 'supports "c"' in out and EXPLANATION in out


@pytest.mark.parametrize("value", ["", "ab", 3, "z"])
def test_feedback_before_an_answer_neither_raises_nor_reveals(value, capsys):
    """Does an empty or malformed answer get a format hint, no key, and no exception?"""
    assert feedback("answer_x", value, seal("c", EXPLANATION)) is None
    out = capsys.readouterr().out
    assert out.startswith("No feedback yet")
    assert EXPLANATION not in out


def test_quiz_items_read_the_hidden_check():
    """Are key, choices, name, points and explanation read from the source's hidden check?"""
    (item,) = quiz_items(_toy())
    assert (item.item_id, item.name, item.key, item.choices, item.points) == (
        "toy_1",
        "answer_toy_1",
        "b",
        "abcd",
        2.0,
    )
    assert item.explanation.startswith("A ring of N ranks runs N-1")
    assert "\n    " not in item.explanation, "explanation should be dedented"


def test_build_replaces_each_quiz_check_by_sealed_feedback():
    """Does the self-study notebook call feedback() where the check was, with no key in clear?"""
    source = _toy()
    built = build_selfstudy(source)
    (check,) = [c for c in built.cells if "feedback(" in c.source]
    assert (
        'feedback("answer_toy_1", answer_toy_1, choices="abcd", sealed="sealed-v1:' in check.source
    )
    text = "\n".join(c.source for c in built.cells)
    assert 'key="b"' not in text
    assert "reduce-scatter steps and then" not in text
    assert "BEGIN SOLUTION" not in text and "BEGIN HIDDEN TESTS" not in text
    assert all("nbgrader" not in c.metadata for c in built.cells)
    assert len(built.cells) == len(source.cells)


def test_build_keeps_exercise_hidden_tests_runnable():
    """Do exercise checks keep their hidden tests (markers gone) since nothing is graded?"""
    built = build_selfstudy(_toy())
    small = next(c for c in built.cells if "[(-5,)]" in c.source)
    assert "check_returns(add_one, [(1,)], [2])" in small.source
    assert "HIDDEN" not in small.source


def test_build_clears_solutions_exactly_like_nbgrader():
    """Are solution cells cleared to what nbgrader's ClearSolutions (our config) makes of them?"""
    source = _toy()
    expected, _ = ClearSolutions(code_stub={"python": selfstudy.CODE_STUB}).preprocess(
        nbformat.from_dict(source), {}
    )
    built = build_selfstudy(source)
    for mine, theirs, orig in zip(built.cells, expected.cells, source.cells, strict=True):
        if orig.metadata.get("nbgrader", {}).get("solution"):
            assert mine.source == theirs.source, grade_id(orig)


@pytest.mark.parametrize("path", _source_notebooks(), ids=lambda p: p.stem)
def test_every_course_quiz_item_gets_sealed_feedback(path):
    """Does every quiz item of a course notebook become exactly one sealed feedback cell?"""
    source = nbformat.read(path, as_version=4)
    items = quiz_items(source)
    built = build_selfstudy(source)
    calls = [c.source for c in built.cells if "feedback(" in c.source]
    assert len(calls) == len(items)
    text = "\n".join(c.source for c in built.cells)
    for item in items:
        assert f'feedback("{item.name}", {item.name},' in text
        assert item.explanation[:60] not in text


def test_write_selfstudy_builds_one_notebook_per_assignment(tmp_path):
    """Does write_selfstudy write selfstudy/<a>/<a>.ipynb for each source assignment?"""
    written = selfstudy.write_selfstudy(TOY.parent.parent, tmp_path)
    assert written == [tmp_path / "toy" / "toy.ipynb"]
    nbformat.validate(nbformat.read(written[0], as_version=4))


@pytest.mark.slow
def test_selfstudy_notebook_gives_feedback_when_run():
    """Run top to bottom unanswered, then wrong, then right: does each run read the verdict?"""
    from nbclient import NotebookClient

    nb = build_selfstudy(_toy())
    fed = next(c for c in nb.cells if "feedback(" in c.source)
    for answer in ("d", "b"):  # the learner answers, then runs the feedback cell again
        nb.cells.append(nbformat.v4.new_code_cell(f'answer_toy_1 = "{answer}"'))
        nb.cells.append(nbformat.v4.new_code_cell(fed.source))
    NotebookClient(nb, timeout=60, kernel_name="python3", allow_errors=True).execute()
    runs = [c for c in nb.cells if "feedback(" in c.source]
    outs = ["".join(o.get("text", "") for o in c.outputs) for c in runs]
    assert [o.split(":")[0] for o in outs] == ["No feedback yet", "Not yet", "Right"]
    assert '"d" is not what the measurement supports' in outs[1]
    assert ["steps and then" in o for o in outs] == [False, False, True]
    assert not [o for c in runs for o in c.outputs if o.output_type == "error"]
