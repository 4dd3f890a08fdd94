"""Can what a submission sends the judge, or how it edits its notebook, make grading fail?

One class of two assignments (ring_allreduce, 16 points; accumulation) is autograded the one
way the course grades (``classrun``, the course's ``nbgrader_config.py``): honest wrong
submissions, honest right ones with their notebook's structure edited, and one submission per
attack in ``input_attacks.py``. None may end FAILED (the machine blamed), none may gain a point
over the honest wrong answer, and each failed cell says why in words a student can act on.
"""

from __future__ import annotations

import html.parser
import re
from pathlib import Path

import attacks
import input_attacks as ia
import nbformat
import pytest
from marks import CONFINED

from course.grading import classrun
from course.instructor.commands import nbgrader
from course.instructor.grades import grade_rows
from course.instructor.pipeline import prepare_course
from course.instructor.submissions import Submission, submit

pytestmark = [
    pytest.mark.nbgrader,
    pytest.mark.slow,
    pytest.mark.ranks,
    pytest.mark.timeout(1500),
    CONFINED,
]

RING, ACC = "ring_allreduce", "accumulation"
WRONG, KEY, STUB = {"*": "wrong"}, {"*": "key"}, {"*": "stub"}
RIGHT_RING = {"ring_allreduce": attacks.HONEST_RING.replace(attacks.TOKEN, "a ring")}
BIG = 'blob = "' + "x" * (5 * 2**20) + '"\n'  # over the notebook's cap
LITERAL = 'answer_accumulation_1 = "{key}"\nnotes = "' + "y" * (3 * 2**20) + '"\n'

# (student, assignment, answers, cells, edit of the submitted notebook's cells or None)
CLASS = [
    ("honest_wrong", RING, WRONG, STUB, None),
    ("deep_trace", RING, WRONG, {"ring_allreduce": ia.DEEP_TRACE}, None),
    ("solution_as_grade", RING, WRONG, STUB, lambda c: ia.solution_as_grade(c, "ring_allreduce")),
    ("duplicate_grade", RING, WRONG, STUB,
     lambda c: ia.duplicate_before(ia.duplicate_before(c, "ring_allreduce_sums"), "ring_1_check")),
    ("deleted_grade", RING, WRONG, STUB, lambda c: ia.delete(c, "ring_allreduce_sums")),
    ("raised_points", RING, WRONG, STUB, lambda c: ia.raise_points(c, "ring_allreduce_sums")),
    ("renamed_grade", RING, WRONG, STUB, lambda c: ia.rename(c, "ring_1_check")),
    ("markdown", RING, WRONG, STUB, ia.add_markdown),
    ("deep_expression", RING, WRONG, {"ring_allreduce": ia.DEEP_EXPRESSION}, None),
    ("meta_not_a_dict", RING, WRONG, STUB, ia.meta_not_a_dict),
    ("bad_timestamp", RING, WRONG, STUB, "timestamp"),
    ("too_large", RING, WRONG, {"ring_allreduce": "# YOUR CODE HERE\n" + BIG}, None),
    ("deleted_right", RING, KEY, RIGHT_RING,
     lambda c: ia.delete(ia.delete(c, "ring_allreduce_pattern"), "ring_2_check")),
    ("raised_right", RING, KEY, RIGHT_RING,
     lambda c: ia.raise_points(ia.solution_as_grade(c, "ring_allreduce"), "ring_1_check")),
    ("acc_wrong", ACC, WRONG, STUB, None),
    ("acc_float64", ACC, WRONG, {"*": "stub", "accumulation_step": ia.FLOAT64_STEP}, None),
    ("acc_literal", ACC, KEY, STUB, "literal"),
]  # fmt: skip


def _path(root: Path, folder: str, student: str, assignment: str, ext: str = "ipynb") -> Path:
    return root / folder / student / assignment / f"{assignment}.{ext}"


def _edit_cells(root: Path, student: str, assignment: str, edit: object) -> None:
    path = _path(root, "submitted", student, assignment)
    if edit == "timestamp":
        path.with_name("timestamp.txt").write_text("not a date at all\n")
        return
    nb = nbformat.read(path, as_version=4)
    if edit == "literal":
        cell = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id")
                    == "accumulation_1_answer")  # fmt: skip
        key = re.search(r'answer_accumulation_1 = "(\w)"', cell.source)
        cell.source = LITERAL.format(key=key[1])
    else:
        nb.cells = [nbformat.from_dict(c) for c in edit([dict(c) for c in nb.cells])]
    nbformat.write(nb, path)


@pytest.fixture(scope="module")
def graded(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = prepare_course(tmp_path_factory.mktemp("judge-input") / "course")
    outcomes = {}
    for assignment in (RING, ACC):
        nbgrader(root, "generate_assignment", assignment, "--force")
        mine = [row for row in CLASS if row[1] == assignment]
        submit(root, [Submission(s, a, answers, cells) for s, a, answers, cells, _ in mine])
        for student, _, _, _, edit in mine:
            if edit is not None:
                _edit_cells(root, student, assignment, edit)
        done = classrun.autograde_class(assignment, root, workers=2, progress=lambda _: None)
        outcomes |= {o.student: o for o in done}
    scores: dict[str, dict[str, float]] = {}
    for row in grade_rows(root):
        scores.setdefault(row.student, {})[row.grade_id] = row.score
    return {"root": root, "outcomes": outcomes, "scores": scores}


def _outputs(root: Path, student: str, assignment: str, grade_id: str) -> str:
    nb = nbformat.read(_path(root, "autograded", student, assignment), as_version=4)
    cells = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id]
    assert len(cells) == 1, f"{len(cells)} cells {grade_id} in {student}'s autograded notebook"
    return "\n".join(o.get("text") or o.get("evalue") or "" for o in cells[0].get("outputs", []))


def test_no_submission_fails_the_grader(graded: dict) -> None:
    """Every submission is graded, or rejected with its reason: none is FAILED."""
    statuses = {s: o.status for s, o in graded["outcomes"].items()}
    rejected = {"renamed_grade", "too_large", "bad_timestamp"}
    errors = {s: o.error[-1500:] for s, o in graded["outcomes"].items() if o.status == "failed"}
    assert statuses == {s: "rejected" if s in rejected else "graded" for s, *_ in CLASS}, errors


@pytest.mark.parametrize(
    "attack", ["deep_trace", "solution_as_grade", "duplicate_grade", "deleted_grade",
               "raised_points", "markdown", "deep_expression", "meta_not_a_dict"],
)  # fmt: skip
def test_an_attack_on_the_ring_gains_nothing(graded: dict, attack: str) -> None:
    """Each scores what the honest wrong answer scores, cell by cell, from the gradebook's cells."""
    assert graded["scores"][attack] == graded["scores"]["honest_wrong"]
    assert sum(graded["scores"]["honest_wrong"].values()) == 0


def test_a_trace_line_the_parser_cannot_read_is_skipped(graded: dict) -> None:
    """100,000 "[" in a rank's log: the line is not a message, so the trace is read without
    it; the cell fails as a wrong ring does, not over the line."""
    text = _outputs(graded["root"], "deep_trace", RING, "ring_allreduce_pattern")
    assert "ring_allreduce" in text
    assert "nested too deeply" not in text and "RecursionError" not in text


def test_points_and_grade_cells_come_from_the_gradebook(graded: dict) -> None:
    """Deleted grade cells are put back and graded; raised points and a solution cell marked
    as a grade cell change nothing: an honest right ring scores 16, no more."""
    for student in ("deleted_right", "raised_right"):
        scores = graded["scores"][student]
        assert sum(scores.values()) == 16, (student, scores)
        assert "ring_allreduce" not in scores  # the solution cell is never a grade
    assert "ring_2_check" in graded["scores"]["deleted_right"]
    text = _outputs(graded["root"], "duplicate_grade", RING, "ring_allreduce_sums")
    assert "not implemented yet" in text


def test_a_refused_notebook_says_why(graded: dict) -> None:
    renamed = graded["outcomes"]["renamed_grade"].error
    assert "claims to be the grade cell 'ring_1_check_mine'" in renamed
    assert "made from the release" in renamed
    large = graded["outcomes"]["too_large"].error
    assert "MiB of text, over the 4 MiB a notebook may hold" in large
    stamp = graded["outcomes"]["bad_timestamp"].error
    assert "timestamp.txt holds 'not a date at all', which is not a date" in stamp


def test_float64_weights_fail_their_cell_with_the_reason(graded: dict) -> None:
    """An honest step that leaves the weights float64: that cell fails and says so; the
    communication cell, which the step gets right, keeps its points; nothing else changes."""
    scores, wrong = graded["scores"]["acc_float64"], graded["scores"]["acc_wrong"]
    assert scores["accumulation_step_matches_large_batch"] == 0
    text = _outputs(graded["root"], "acc_float64", ACC, "accumulation_step_matches_large_batch")
    assert "float64 weights; the model is float32" in text
    assert scores["accumulation_step_communication"] == 2
    others = {k: v for k, v in scores.items() if k != "accumulation_step_communication"}
    assert others == {k: v for k, v in wrong.items() if k != "accumulation_step_communication"}


def test_a_large_literal_beside_an_answer_costs_nothing(graded: dict) -> None:
    """3 MB of text in an answer cell: the quiz is read (every item its points) and graded."""
    scores = graded["scores"]["acc_literal"]
    quiz = {k: v for k, v in scores.items() if k.startswith("accumulation_") and "_step" not in k}
    assert len(quiz) == 11 and all(v > 0 for v in quiz.values()), quiz


class _Live(html.parser.HTMLParser):
    """Every script's text and every event-handler attribute of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []
        self._script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._script = tag == "script"
        self.found += [f"<{tag} {k}={v}>" for k, v in attrs if k.startswith("on")]
        self.found += [f"<{tag} {k}={v}>" for k, v in attrs if "javascript:" in (v or "")]

    def handle_endtag(self, _tag: str) -> None:
        self._script = False

    def handle_data(self, data: str) -> None:
        if self._script:
            self.found.append(data)


def _live(page: str) -> list[str]:
    parser = _Live()
    parser.feed(page)
    return parser.found


def _feedback(root: Path, student: str) -> str:
    path = _path(root, "feedback", student, RING, "html")
    if not path.exists():  # the worker could not make it: the pipeline's own fallback
        nbgrader(root, "generate_feedback", RING, "--student", student, "--force")
    return path.read_text()


def _formgrade(root: Path, student: str) -> str:
    """The formgrader's page for a submission, made as its SubmissionHandler makes it."""
    from nbconvert.exporters import HTMLExporter
    from nbgrader.server_extensions.formgrader import handlers
    from traitlets.config.loader import PyFileConfigLoader

    config = PyFileConfigLoader("nbgrader_config.py", path=str(root)).load_config()
    config.HTMLExporter.template_name = "formgrade"  # FormgradeExtension.build_extra_config
    config.HTMLExporter.extra_template_basedirs = [handlers.template_path]
    resources = {"assignment_id": RING, "notebook_id": RING, "submission_id": "x", "index": 0,
                 "total": 1, "base_url": "", "student": student, "last_name": "",
                 "first_name": "", "notebook_path": f"autograded/{student}/{RING}"}  # fmt: skip
    page, _ = HTMLExporter(config=config).from_filename(
        str(_path(root, "autograded", student, RING)), resources=resources
    )
    return page


@pytest.mark.parametrize("render", [_feedback, _formgrade])
def test_student_markdown_is_inert(graded: dict, render: object) -> None:
    """The feedback page and the formgrader's page of a submission whose markdown holds
    ``onerror=``, ``<script>``, ``onclick=`` and a ``javascript:`` link carry no script and
    no event handler of the student's: the same as the honest wrong one's page; the text
    itself is still shown."""
    root = graded["root"]
    page, honest = render(root, "markdown"), render(root, "honest_wrong")
    assert "My notes." in page
    assert _live(page) == _live(honest)
    assert "document.title" in page  # shown as text
