"""The released zero notebook in JupyterLab and Chromium: do the halves animate, and does a
finished notebook run every cell?"""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

pytestmark = pytest.mark.browser

REPO = Path(__file__).resolve().parents[2]
ZERO = "zero"
RELEASE = REPO / "release" / ZERO / f"{ZERO}.ipynb"


def test_release_animates_the_halves(lab, page, artifact, helpers):
    """As handed out: do both half widgets draw and step, with Run All going past the
    unanswered answer_zero_1?"""
    nbformat.write(nbformat.read(RELEASE, as_version=4), lab.root_dir / "zero.ipynb")
    helpers.open_notebook(page, lab, "zero.ipynb")
    page.locator(".jp-Notebook").first.click()
    page.get_by_role("menuitem", name="Run", exact=True).click()
    page.get_by_role("menuitem", name="Run All Cells", exact=True).click()
    page.wait_for_selector(".jp-OutputArea-output", timeout=60_000)
    helpers.wait_for_idle(page, timeout_s=120)
    page.wait_for_selector(".ring-step", timeout=30_000)
    steps = page.locator(".ring-step").all_text_contents()
    # before question zero_1 the widgets count steps without the whole half's total
    assert len(steps) == 2 and all(s.startswith("step 0 - ") for s in steps), steps
    assert not any("/ " in s for s in steps), steps
    assert page.get_by_text("answer_zero_1 is not answered yet").count() == 1
    forward = page.locator("button[title='one step forward']").first
    forward.scroll_into_view_if_needed()
    forward.click()
    forward.click()
    page.wait_for_selector(".ring-step:has-text('step 2 - reduce-scatter')", timeout=15_000)
    page.locator(".js-plotly-plot").first.scroll_into_view_if_needed()
    page.wait_for_timeout(1500)  # let plotly restyle the grid
    page.screenshot(path=artifact("zero-reduce-scatter.png"), full_page=False)


def test_a_finished_zero_notebook_runs_all_cells(lab, page, artifact, helpers):
    """Filled in as the model sample submission: every cell runs, no error, no hang."""
    helpers.open_notebook(page, lab, helpers.write_finished(lab.root_dir, ZERO))
    helpers.run_all(page, timeout_s=300)
    tracebacks = helpers.stderr_errors(page)
    assert not tracebacks, tracebacks[0][:800]
    assert page.locator(".ring-step").count() == 4  # two reference halves, then yours
    page.screenshot(path=artifact("zero-finished.png"), full_page=False)
    figure = page.locator(".js-plotly-plot", has_text="Bytes per rank")
    figure.scroll_into_view_if_needed()
    page.wait_for_timeout(1000)
    page.screenshot(path=artifact("zero-memory-figure.png"), full_page=False)
