"""Does the judge hold up against what it reads, without a course root: the pure parts.

The notebook's metadata rebuilt from the gradebook, the judge's own caps, replies of another
dtype, a cell parsed once for every quiz item, and the errors that fail a cell rather than
the submission. ``test_judge_input.py`` grades the same attacks through the real pipeline.
"""

from __future__ import annotations

import ast
import json
import time
from pathlib import Path

import nbformat
import pytest
import torch
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from course.checks.compare import close, ratio
from course.grading import judge, limits, quiz
from course.grading.cells import MAX_SOURCE, NotGradable, restore_cells
from course.ring.logs import read_log

KNOWN = {
    "ring_allreduce": {"cell_type": "code", "locked": False, "source": "def f(): ...",
                       "checksum": "s", "grade": False, "points": 0.0, "solution": True},
    "ring_sums": {"cell_type": "code", "locked": True, "source": "check_ring_sums(f)",
                  "checksum": "g", "grade": True, "points": 6.0, "solution": False},
}  # fmt: skip
PUT_BACK = ("ring_sums", True, 6.0)  # a grade cell the notebook lacks, from the gradebook


def _cell(gid: str | None, source: str = "x = 1", **meta: object) -> nbformat.NotebookNode:
    cell = new_code_cell(source)
    if gid is not None:
        cell.metadata["nbgrader"] = {"grade_id": gid, "grade": False, "solution": False,
                                     "locked": False, **meta}  # fmt: skip
    return cell


def _ids(nb: nbformat.NotebookNode) -> list[tuple[str | None, bool, float | None]]:
    return [
        (m.get("grade_id"), bool(m.get("grade")), m.get("points"))
        for m in (c.metadata.get("nbgrader", {}) for c in nb.cells)
    ]


def test_a_solution_cell_marked_as_a_grade_cell_is_a_solution_cell_again() -> None:
    nb = new_notebook(cells=[_cell("ring_allreduce", "mine", grade=True, points=50)])
    restore_cells(nb, KNOWN)
    assert _ids(nb) == [("ring_allreduce", False, None), PUT_BACK]
    assert nb.cells[0].source == "mine"  # the student's code stays theirs


def test_a_copy_of_a_grade_cell_before_the_real_one_is_dropped() -> None:
    copy = _cell("ring_sums", "pass", grade=True, locked=True, points=100)
    real = _cell("ring_sums", "check_ring_sums(f)", grade=True, locked=True, points=6)
    nb = new_notebook(cells=[copy, _cell(None), real])
    restore_cells(nb, KNOWN)
    assert _ids(nb) == [(None, False, None), ("ring_sums", True, 6.0)]


def test_a_copy_of_a_solution_cell_stays_the_students_without_the_id() -> None:
    nb = new_notebook(cells=[_cell("ring_allreduce", "one"), _cell("ring_allreduce", "two")])
    restore_cells(nb, KNOWN)
    assert (nb.cells[0].source, nb.cells[0].metadata.get("nbgrader")) == ("one", None)
    assert _ids(nb)[1] == ("ring_allreduce", False, None)


def test_points_source_and_cell_type_come_from_the_gradebook() -> None:
    edited = new_markdown_cell("pass")
    edited.metadata["nbgrader"] = {"grade_id": "ring_sums", "grade": True, "points": 100}
    nb = new_notebook(cells=[edited])
    restore_cells(nb, KNOWN)
    (cell,) = nb.cells
    assert (cell.cell_type, cell.source) == ("code", "check_ring_sums(f)")
    assert _ids(nb) == [("ring_sums", True, 6.0)]
    assert cell.metadata.nbgrader["locked"] and cell.metadata.nbgrader["checksum"] == "g"


def test_an_unknown_id_is_dropped_or_refused() -> None:
    """The student's own cell loses metadata it should not have; a grade cell under a new id
    (a renamed one) refuses the notebook, with the reason."""
    nb = new_notebook(cells=[_cell("my_notes", "y = 2", solution=True)])
    restore_cells(nb, KNOWN)
    assert _ids(nb) == [(None, False, None), PUT_BACK]
    nb = new_notebook(cells=[_cell("ring_sums_mine", "pass", grade=True, points=100)])
    with pytest.raises(NotGradable, match="claims to be the grade cell 'ring_sums_mine'"):
        restore_cells(nb, KNOWN)


def test_a_notebook_over_its_cap_is_refused_with_its_size() -> None:
    nb = new_notebook(cells=[_cell("ring_allreduce", "x" * (MAX_SOURCE + 1))])
    with pytest.raises(NotGradable, match=r"4.0 MiB of text, over the 4 MiB"):
        restore_cells(nb, KNOWN)


def test_a_reply_of_another_dtype_fails_with_the_reason() -> None:
    """float64 or bool where the model is float32: the comparison says so, never raises."""
    want = torch.ones(3)
    with pytest.raises(AssertionError, match="float64 values; the model is float32"):
        close(torch.ones(3, dtype=torch.float64), want)
    with pytest.raises(AssertionError, match="bool values; the model is float32"):
        ratio(torch.ones(3, dtype=torch.bool), want)
    with pytest.raises(AssertionError, match="came back as list, not a tensor"):
        close([1.0, 1.0, 1.0], want)
    assert close(torch.ones(3), want)
    assert not close(torch.ones(4), want)


def test_a_log_line_nested_too_deep_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "rank0.jsonl"
    good = json.dumps({"op": "collective", "name": "all_reduce"})
    path.write_text("[" * 100_000 + "\n" + good + "\n")
    assert read_log(path) == ([], ["all_reduce"])


def test_a_large_cell_is_parsed_once_for_every_quiz_item(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 3 MB literal beside eleven answers: one parse of it, not eleven."""
    parsed = []
    real = ast.parse
    monkeypatch.setattr(quiz.ast, "parse", lambda text, *_: parsed.append(len(text)) or real(text))
    quiz._read_cell.cache_clear()  # noqa: SLF001 - what is cached is what this test measures
    big = "".join(f'answer_q{i} = "b"\n' for i in range(11)) + 'notes = "' + "y" * 3_000_000 + '"'
    cells = [("answers", big)]
    for i in range(11):
        assert quiz.read_answer(cells, f"answer_q{i}") == "b"
    assert len(parsed) == 1


def _spin(seconds: float) -> None:
    """The judge's own CPU, busy (as decoding a reply would keep it)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def test_the_judges_time_cap_fails_the_cell_not_the_submission() -> None:
    """Past its own CPU seconds, the cell being judged fails, and every cell after it."""
    with limits.JudgeLimits(seconds=0.5) as cap:
        assert cap.spent() is None
        started = time.monotonic()
        with pytest.raises(limits.OverLimit, match="of its own time"), cap.judging():
            _spin(10)
        assert time.monotonic() - started < 5
        assert "before this check could run" in (cap.spent() or "")


def test_waiting_for_ranks_is_not_the_judges_time() -> None:
    """Time spent waiting (for ranks, or for a CPU on a busy machine) does not count."""
    with limits.JudgeLimits(seconds=0.5) as cap, cap.judging():
        time.sleep(1.5)
    assert cap.spent() is None


def test_the_judges_memory_cap_fails_the_cell_not_the_submission() -> None:
    import psutil

    held: list[bytearray] = []

    def grow() -> None:  # up to 1.6 GB, 40 MB at a time
        for _ in range(40):
            held.append(bytearray(40 * 2**20))
            time.sleep(0.05)

    cap = psutil.Process().memory_info().rss + 300 * 2**20
    with limits.JudgeLimits(seconds=60, memory=cap) as watch:
        with pytest.raises(limits.OverLimit, match="GiB of the grader's memory"), watch.judging():
            grow()
        assert len(held) < 40
        held.clear()


@pytest.mark.parametrize(
    ("error", "said"),
    [(RecursionError(), "nested too deeply"), (MemoryError(), "too large to read"),
     (RuntimeError("Float did not match Double"), "Float did not match Double")],
)  # fmt: skip
def test_an_error_computing_a_verdict_fails_that_cell(
    error: BaseException, said: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Raised by a check's own arithmetic: the cell fails with the reason and what to do."""

    def check(_sub: object, _source: str) -> str:
        raise error

    monkeypatch.setattr(judge, "_run_check", check)
    passed, text = judge.judge_cell(None, "print(check_ring_sums(ring_allreduce))")
    assert not passed
    assert said in text and "same dtypes, shapes and sizes" in text


def test_an_error_in_the_machinery_that_runs_ranks_is_the_graders() -> None:
    """One raised in the launcher is the machine's: it is not blamed on the student."""
    from course.ranks import launcher

    namespace: dict = {}
    exec(compile("def boom():\n    raise OSError('no forkserver')\n", launcher.__file__, "exec"),  # noqa: S102 - a frame that claims the launcher's file
         namespace)  # fmt: skip
    with pytest.raises(OSError, match="no forkserver") as machine:
        namespace["boom"]()
    assert judge.machine_side(machine.value)
    with pytest.raises(ValueError, match="bad reply") as reply:
        _bad_reply()
    assert not judge.machine_side(reply.value)


def _bad_reply() -> None:
    raise ValueError("bad reply")


def test_a_deleted_grade_cell_is_put_back_from_the_gradebook() -> None:
    """After the cell before it in the gradebook's order, with the gradebook's source."""
    nb = new_notebook(cells=[_cell(None, "setup"), _cell("ring_allreduce", "mine")])
    restore_cells(nb, KNOWN)
    assert _ids(nb) == [(None, False, None), ("ring_allreduce", False, None), PUT_BACK]
    assert nb.cells[2].source == "check_ring_sums(f)"
