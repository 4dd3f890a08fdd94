"""An instructor in formgrader: from a fresh clone under `make lab`, are the assignments
listed with links that open their source and preview; and is an autograded submission open
for manual grading?"""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from course.instructor import lab, pipeline
from course.instructor.pipeline import load_specs
from course.instructor.workcopies import COURSE_ORDER

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


@pytest.fixture
def fresh_clone(tmp_path: Path) -> Path:
    """This checkout as a clone of it holds it: the files git tracks (and new files it does
    not ignore); no gradebook, no work/, no exchange."""
    root = tmp_path / "clone"
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=REPO, capture_output=True, check=True,
    ).stdout  # fmt: skip
    for name in filter(None, listed.decode().split("\0")):
        if (REPO / name).is_file():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, root / name)
    assert not (root / "gradebook.db").exists() and not (root / "work").exists()
    return root


def _without_venv_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """PATH as `make lab` gets it: the venv's bin (nbgrader's alembic) not on it."""
    here = str(Path(sys.executable).parent)
    path = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p != here]
    monkeypatch.setenv("PATH", os.pathsep.join(path))


def test_make_lab_on_a_fresh_clone_opens_the_first_notebook_and_a_working_formgrader(
    fresh_clone, browser, tmp_path, artifact, helpers, monkeypatch
) -> None:
    """From a fresh clone, as `make lab` starts it: does the lab open the ring notebook, the
    gradebook carry its migration stamp, and formgrader list the five assignments with links
    that open each one's source and preview folders?"""
    _without_venv_on_path(monkeypatch)
    monkeypatch.chdir(fresh_clone)
    first = lab.prepare(fresh_clone)
    command = lab.lab_command(fresh_clone, first)
    with sqlite3.connect(fresh_clone / "gradebook.db") as db:
        assert db.execute("SELECT version_num FROM alembic_version").fetchone()
    with helpers.running_lab(fresh_clone, tmp_path / "home", fresh_clone, command) as running:
        context = browser.new_context(viewport={"width": 1280, "height": 1000})
        context.set_default_timeout(30_000)
        page = context.new_page()
        page.goto(running.url(""))
        page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)
        assert page.url.split("?")[0].endswith("/lab/tree/work/ring_allreduce/ring_allreduce.ipynb")
        page.get_by_role("menuitem", name="Nbgrader", exact=True).click()
        page.get_by_role("menuitem", name="Formgrader", exact=True).click()
        grader = page.frame_locator("iframe").first
        names = grader.locator("td.name a")
        names.first.wait_for()
        assert sorted(names.all_text_contents()) == sorted(COURSE_ORDER)
        page.screenshot(path=artifact("formgrader-fresh-clone.png"))
        crumbs = page.locator(".jp-FileBrowser .jp-BreadCrumbs").first
        listing = page.locator(".jp-FileBrowser .jp-DirListing-itemText")
        ring = grader.locator("tr", has=grader.locator("td.name a", has_text="ring_allreduce"))
        for link, folder in (
            (ring.locator("td.name a"), "source"),
            (ring.locator("td.preview a"), "release"),
        ):
            link.click()
            page.wait_for_function(
                "([el, want]) => el.textContent.includes(want)",
                arg=[crumbs.element_handle(), f"{folder}/ring_allreduce"],
            )
            page.wait_for_timeout(500)
            assert "ring_allreduce.ipynb" in listing.all_text_contents()
        page.screenshot(path=artifact("formgrader-preview-link.png"))
        context.close()
