"""course.instructor.classrun: parallel autograde with a time cap, listed failures, resume."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from nbgrader.api import Gradebook

from course.instructor.classrun import autograde_class, submission_digest

_spec = importlib.util.spec_from_file_location(
    "course_kit", Path(__file__).parents[1] / "fixtures" / "tamper" / "course_kit.py"
)
kit = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(kit)


def test_digest_changes_with_content(tmp_path: Path) -> None:
    """Does the submission hash change when a file's content changes, and only then?"""
    (tmp_path / "a.ipynb").write_text("one")
    first = submission_digest(tmp_path)
    assert submission_digest(tmp_path) == first
    (tmp_path / "a.ipynb").write_text("two")
    assert submission_digest(tmp_path) != first


@pytest.mark.nbgrader
@pytest.mark.slow
@pytest.mark.ranks
@pytest.mark.timeout(900)
def test_class_run_grades_lists_failures_and_resumes(tmp_path: Path) -> None:
    """Are grades merged, a hanging submission stopped and listed, and a rerun incremental?"""
    root = kit.make_course(tmp_path / "course", sandbox=False)
    kit.submit(root, "right", kit.honest_right)
    kit.submit(root, "wrong")
    kit.submit(root, "hangs", kit.answer_cell_adds("import time\ntime.sleep(600)\n"))
    lines: list[str] = []
    first = {
        o.student: o for o in autograde_class("tamper", root, timeout=45, progress=lines.append)
    }
    assert first["right"].status == "graded" and first["right"].score == 3.0
    assert first["wrong"].status == "graded" and first["wrong"].score == 0.0
    assert first["hangs"].status == "failed" and "longer than 45 s" in first["hangs"].error
    assert any("failed: ['hangs']" in line for line in lines)
    with Gradebook(f"sqlite:///{root / 'gradebook.db'}") as gb:
        assert gb.find_submission("tamper", "right").score == 3.0
    manifest = json.loads((root / "autograded" / ".classrun.json").read_text())["tamper"]
    assert manifest["hangs"]["status"] == "failed"

    path = root / "submitted" / "wrong" / "tamper" / "tamper.ipynb"
    nb = json.loads(path.read_text())
    kit.honest_right(nb)
    path.write_text(json.dumps(nb))
    again = {o.student: o for o in autograde_class("tamper", root, progress=lines.append)}
    assert again["right"].status == "skipped"  # unchanged: not regraded
    assert again["hangs"].status == "failed"  # unchanged failure stays listed, not retried
    assert again["wrong"].status == "graded" and again["wrong"].score == 3.0  # changed: regraded
