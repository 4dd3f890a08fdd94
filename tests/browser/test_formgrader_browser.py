"""An instructor in formgrader: are the assignments listed, the exchange ready, and an
autograded submission open for manual grading?"""

from __future__ import annotations

from pathlib import Path

import pytest

from course.instructor import pipeline
from course.instructor.pipeline import load_specs

pytestmark = [pytest.mark.browser, pytest.mark.nbgrader, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
TOY = REPO / "tests" / "fixtures" / "toy_course"


@pytest.fixture(scope="module")
def graded_course(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A course (the toy fixture) released, with ada's submission autograded by nbgrader."""
    root = pipeline.prepare_course(tmp_path_factory.mktemp("formgrader") / "course", TOY / "source")
    pipeline.release(root)
    ada = [s for s in load_specs(TOY / "submissions") if s.student == "ada"]
    pipeline.submit(root, ada)
    pipeline.autograde(root, "toy")
    assert (root / "autograded" / "ada" / "toy" / "toy.ipynb").exists()
    return root


def test_formgrader_lists_assignments_and_opens_a_submission(
    graded_course, browser, tmp_path, artifact, helpers
) -> None:
    """As an instructor: no exchange warning, the assignment listed with Release available,
    and ada's autograded notebook open for manual grading with its scores."""
    with helpers.running_lab(graded_course, tmp_path / "home", cwd=graded_course) as lab:
        context = browser.new_context(viewport={"width": 1280, "height": 1000})
        context.set_default_timeout(30_000)
        page = context.new_page()
        page.goto(lab.url("formgrader/manage_assignments"))
        page.wait_for_selector("text=toy")
        assert page.locator("#warning-exchange").count() == 0
        assert (graded_course / "exchange").is_dir()  # course-local, made without root
        page.screenshot(path=artifact("formgrader-assignments.png"))

        page.goto(lab.url("formgrader/gradebook/toy/toy"))
        page.locator("a[href*='/formgrader/submissions/']").first.click()
        page.wait_for_selector(".nbgrader_cell, .panel", timeout=30_000)
        page.wait_for_selector("input.score", timeout=30_000)
        assert page.locator("input.score").count() >= 1
        assert "toy" in page.title() or "toy" in page.content()
        page.screenshot(path=artifact("formgrader-manual-grading.png"), full_page=False)
        context.close()
