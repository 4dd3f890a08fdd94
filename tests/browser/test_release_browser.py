"""The released ring notebook in a real JupyterLab and Chromium: does "Run All" behave?"""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

from course.instructor.submissions import assemble, load_specs

pytestmark = pytest.mark.browser

REPO = Path(__file__).resolve().parents[2]
RING = "ring_allreduce"
RELEASE = REPO / "release" / RING / f"{RING}.ipynb"
SOURCE = REPO / "source" / RING / f"{RING}.ipynb"
STDERR = ".jp-RenderedText[data-mime-type='application/vnd.jupyter.stderr']"


def _widget_rendered(page) -> None:
    page.wait_for_selector(".ring-step", timeout=30_000)
    page.wait_for_selector(".js-plotly-plot", timeout=30_000)


def test_release_run_all_stops_at_the_first_unanswered_item(lab, page, artifact, helpers):
    """As handed out: does Run All stop at the first question with a clear, teaching message?"""
    nbformat.write(nbformat.read(RELEASE, as_version=4), lab.root_dir / "release.ipynb")
    helpers.open_notebook(page, lab, "release.ipynb")
    _run_all_until_idle(page, helpers)
    first = page.locator(STDERR).first.text_content()
    assert "answer_ring_1 is still empty" in first, first[:500]
    # The teaching line first, and nothing of the checker's own source or frames.
    assert first.lstrip().startswith("Check failed: answer_ring_1 is still empty"), first[:500]
    for leak in ("Traceback", "File ", "raise ", "def ", "normalise_answer"):
        assert leak not in first, first[:800]
    page.locator(STDERR).first.scroll_into_view_if_needed()
    page.wait_for_timeout(1000)  # let JupyterLab render the cells scrolled into view
    page.screenshot(path=artifact("release-run-all.png"), full_page=False)
    page.locator(STDERR).first.screenshot(path=artifact("check-failed.png"))


def test_a_finished_notebook_runs_all_cells_in_the_browser(lab, page, artifact, helpers):
    """Filled in as the model sample submission: does every cell run, no error, no hang?"""
    ada = next(s for s in load_specs() if (s.student, s.assignment) == ("ada", RING))
    nb = assemble(ada, nbformat.read(RELEASE, as_version=4), nbformat.read(SOURCE, as_version=4))
    nbformat.write(nb, lab.root_dir / "finished.ipynb")
    helpers.open_notebook(page, lab, "finished.ipynb")
    helpers.run_all(page, timeout_s=240)
    _widget_rendered(page)
    tracebacks = [t for t in page.locator(STDERR).all_text_contents() if "Error" in t]
    assert not tracebacks, tracebacks[0][:800]
    page.screenshot(path=artifact("release-finished.png"), full_page=False)
    bytes_cell = page.locator(".jp-CodeCell", has_text="with WireMeter() as wire:")
    measured = bytes_cell.locator(".jp-OutputArea-output").first
    measured.scroll_into_view_if_needed()
    assert "sent 14.0" in measured.text_content()  # gloo's bytes on the wire, on 8 ranks
    page.wait_for_timeout(500)
    bytes_cell.screenshot(path=artifact("release-ring-bytes.png"))


def _run_all_until_idle(page, helpers) -> None:
    """Run All, then wait for the kernel to settle: the first failing check stops the queue."""
    page.locator(".jp-Notebook").first.click()
    page.get_by_role("menuitem", name="Run", exact=True).click()
    page.get_by_role("menuitem", name="Run All Cells", exact=True).click()
    page.wait_for_selector(".jp-OutputArea-output", timeout=60_000)
    helpers.wait_for_idle(page, timeout_s=120)


def test_the_finished_accumulation_notebook_runs_all_cells(lab, page, artifact, helpers):
    """The accumulation notebook as the model sample: every cell runs, hangs are cut short?"""
    name = "accumulation"
    ada = next(s for s in load_specs() if (s.student, s.assignment) == ("ada", name))
    release = nbformat.read(REPO / "release" / name / f"{name}.ipynb", as_version=4)
    source = nbformat.read(REPO / "source" / name / f"{name}.ipynb", as_version=4)
    nbformat.write(assemble(ada, release, source), lab.root_dir / f"{name}.ipynb")
    helpers.open_notebook(page, lab, f"{name}.ipynb")
    helpers.run_all(page, timeout_s=240)
    page.wait_for_selector(".js-plotly-plot", timeout=30_000)
    page.locator(".jp-Notebook").first.click()
    page.keyboard.press("Control+s")  # the saved file has every output, rendered or not
    page.wait_for_timeout(2000)
    saved = nbformat.read(lab.root_dir / f"{name}.ipynb", as_version=4)
    outputs = [o for c in saved.cells if c.cell_type == "code" for o in c.outputs]
    errors = [f"{o.ename}: {o.evalue}" for o in outputs if o.output_type == "error"]
    assert not errors, errors[0][:800]
    text = "".join(o.get("text", "") for o in outputs)
    assert "train_uneven finishes on [2] ranks" in text, text[-800:]
    page.locator(".js-plotly-plot").first.scroll_into_view_if_needed()
    page.wait_for_timeout(1000)
    page.screenshot(path=artifact("accumulation-finished.png"), full_page=False)
