"""Can a submission gain points by attacking the grading instead of solving the problem?

Every attack in tests/fixtures/tamper/course_kit.py is autograded through the real nbgrader
pipeline (sandboxed kernel + ``course.instructor.rejudge.Rejudge``) next to an honest right and an
honest wrong submission. Each attack must score no more than the honest wrong one; the ones
marked as beating plain nbgrader must also have fooled the kernel (so the test can fail).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import nbformat
import pytest
from nbgrader.api import Gradebook
from nbgrader.utils import determine_grade

from course.instructor import classrun, sandbox

pytestmark = [pytest.mark.nbgrader, pytest.mark.slow, pytest.mark.ranks, pytest.mark.timeout(1500)]

_spec = importlib.util.spec_from_file_location(
    "course_kit", Path(__file__).parents[1] / "fixtures" / "tamper" / "course_kit.py"
)
kit = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(kit)


OUTCOMES: dict[str, classrun.Outcome] = {}


@pytest.fixture(scope="module")
def graded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = kit.make_course(tmp_path_factory.mktemp("tamper") / "course", sandbox.available())
    kit.submit(root, "honest_right", kit.honest_right)
    kit.submit(root, "honest_wrong")
    for name, (edit, _) in kit.ATTACKS.items():
        kit.submit(root, name, edit)
    outcomes = classrun.autograde_class(kit.ASSIGNMENT, root, workers=2, progress=lambda _: None)
    OUTCOMES.update((o.student, o) for o in outcomes)
    return root


def score(root: Path, student: str) -> float:
    """The student's total; a submission the grader could not finish has none (listed failed)."""
    if OUTCOMES[student].status == "failed":
        return 0.0
    with Gradebook(f"sqlite:///{root / 'gradebook.db'}") as gb:
        return float(gb.find_submission(kit.ASSIGNMENT, student).score)


def kernel_score(root: Path, student: str) -> float:
    """What plain nbgrader would have given: the autograded outputs minus the re-check's."""
    path = root / "autograded" / student / kit.ASSIGNMENT / f"{kit.ASSIGNMENT}.ipynb"
    nb = nbformat.read(path, as_version=4)
    total = 0.0
    for cell in nb.cells:
        if cell.metadata.get("nbgrader", {}).get("grade") and cell.cell_type == "code":
            cell.outputs = [o for o in cell.outputs if o.get("ename") != "RecheckFailed"]
            total += determine_grade(cell)[0] or 0.0
    return total


def test_honest_right_scores_full(graded: Path) -> None:
    """Does a right submission keep full marks under the sandbox and the re-check?"""
    assert OUTCOMES["honest_right"].status == "graded"
    assert score(graded, "honest_right") == 3.0


def test_honest_wrong_scores_nothing(graded: Path) -> None:
    """Does the baseline (answer "a", exercise left as released) score 0?"""
    assert OUTCOMES["honest_wrong"].status == "graded"
    assert score(graded, "honest_wrong") == 0.0


@pytest.mark.parametrize("attack", sorted(kit.ATTACKS))
def test_attack_gains_nothing(graded: Path, attack: str) -> None:
    """Does this attack score no more than the honest wrong one (or end as a listed failure)?"""
    assert OUTCOMES[attack].status == "graded" or OUTCOMES[attack].error
    assert score(graded, attack) <= score(graded, "honest_wrong")


@pytest.mark.parametrize("attack", sorted(a for a, (_, beats) in kit.ATTACKS.items() if beats))
def test_attack_beats_plain_nbgrader(graded: Path, attack: str) -> None:
    """Would this attack have scored above the baseline in the kernel alone (plain nbgrader)?"""
    assert kernel_score(graded, attack) > kernel_score(graded, "honest_wrong")


def test_recheck_explains_itself(graded: Path) -> None:
    """Does a cell zeroed by the re-check say why, in the student's feedback?"""
    path = graded / "autograded" / "input_transformer" / kit.ASSIGNMENT / "tamper.ipynb"
    nb = json.loads(path.read_text())
    check = kit.cell(nb, "tamper_1_check")
    assert check["outputs"][0]["ename"] == "RecheckFailed"
    assert "fresh Python" in check["outputs"][0]["evalue"]
