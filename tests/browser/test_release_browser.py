"""The released notebooks in a real JupyterLab and Chromium: does "Run All" run them through?"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

from course.instructor.bank import giveaway_leaks, items_of
from course.instructor.workcopies import COURSE_ORDER

pytestmark = pytest.mark.browser

REPO = Path(__file__).resolve().parents[2]
RING = "ring_allreduce"


def _widget_rendered(page) -> None:
    page.wait_for_selector(".ring-step", timeout=30_000)
    page.wait_for_selector(".js-plotly-plot", timeout=30_000)


@pytest.mark.slow
@pytest.mark.parametrize("name", COURSE_ORDER)
def test_restart_and_run_all_runs_every_cell_of_the_release(name, lab, page, artifact, helpers):
    """As handed out, nothing answered: does Kernel > Restart and Run All run every code cell
    (an execution count on each, no error), the first item saying it is not answered yet, and
    no output but an item's own measurement showing one of its give-aways?"""
    nbformat.write(
        nbformat.read(REPO / "release" / name / f"{name}.ipynb", 4), lab.root_dir / f"{name}.ipynb"
    )
    helpers.open_notebook(page, lab, f"{name}.ipynb")
    page.locator(".jp-Notebook").first.click()
    page.get_by_role("menuitem", name="Kernel", exact=True).click()
    page.get_by_role("menuitem", name="Restart Kernel and Run All Cells…").click()
    page.get_by_role("button", name="Confirm Kernel Restart").click()
    page.wait_for_selector(".jp-OutputArea-output", timeout=60_000)
    helpers.wait_for_idle(page, timeout_s=400, all_run=True)
    prompts = page.locator(".jp-CodeCell .jp-InputPrompt").all_text_contents()
    assert prompts and all(re.search(r"\[\d+\]", p) for p in prompts), prompts
    page.locator(".jp-Notebook").first.click()
    page.keyboard.press("Control+s")  # the saved file holds every output, rendered or not
    page.wait_for_timeout(2000)
    saved = nbformat.read(lab.root_dir / f"{name}.ipynb", as_version=4)
    outputs = [o for c in saved.cells if c.cell_type == "code" for o in c.outputs]
    assert not [f"{o.ename}: {o.evalue}" for o in outputs if o.output_type == "error"]
    text = "".join(o.get("text", "") for o in outputs)
    assert re.search(r"answer_\w+_1 is not answered yet", text), text[:800]
    for leak in ("Traceback", 'File "', "site-packages"):
        assert leak not in text, text[text.index(leak) - 400 : text.index(leak) + 400]
    items = items_of(REPO / "source" / name / f"{name}.ipynb")
    assert giveaway_leaks(saved, items, outputs=True) == []  # no output hands a key over
    page.screenshot(path=artifact(f"run-all-{name}.png"), full_page=False)  # the last cells


def test_a_finished_notebook_runs_all_cells_in_the_browser(lab, page, artifact, helpers):
    """Filled in as the model sample submission: does every cell run, no error, no hang?"""
    helpers.open_notebook(page, lab, helpers.write_finished(lab.root_dir, RING))
    helpers.run_all(page, timeout_s=240)
    _widget_rendered(page)
    tracebacks = helpers.stderr_errors(page)
    assert not tracebacks, tracebacks[0][:800]
    page.screenshot(path=artifact("release-finished.png"), full_page=False)
    bytes_cell = page.locator(".jp-CodeCell", has_text="with WireMeter() as wire:")
    measured = bytes_cell.locator(".jp-OutputArea-output").first
    measured.scroll_into_view_if_needed()
    assert "6.00 MB to rank" in measured.text_content()  # gloo's ring: 2 (N-1)/N of 4 MB, N = 4
    page.wait_for_timeout(500)
    bytes_cell.screenshot(path=artifact("release-ring-bytes.png"))


def test_the_finished_accumulation_notebook_runs_all_cells(lab, page, artifact, helpers):
    """The accumulation notebook as the model sample: every cell runs, hangs are cut short?"""
    name = "accumulation"
    finished = helpers.write_finished(lab.root_dir, name)
    helpers.open_notebook(page, lab, finished)
    helpers.run_all(page, timeout_s=240)
    page.wait_for_selector(".js-plotly-plot", timeout=30_000)
    page.locator(".jp-Notebook").first.click()
    page.keyboard.press("Control+s")  # the saved file has every output, rendered or not
    page.wait_for_timeout(2000)
    saved = nbformat.read(lab.root_dir / finished, as_version=4)
    outputs = [o for c in saved.cells if c.cell_type == "code" for o in c.outputs]
    errors = [f"{o.ename}: {o.evalue}" for o in outputs if o.output_type == "error"]
    assert not errors, errors[0][:800]
    text = "".join(o.get("text", "") for o in outputs)
    assert "train_uneven finishes on [2] ranks" in text, text[-800:]
    page.locator(".js-plotly-plot").first.scroll_into_view_if_needed()
    page.wait_for_timeout(1000)
    page.screenshot(path=artifact("accumulation-finished.png"), full_page=False)


# The model ring with the all-gather's send index one off: on 3 ranks and 7 elements (chunks
# of 3, 2 and 2) a rank sends 12 bytes into a receive of 8, and gloo aborts it.
SEND_INDEX = "send_c, recv_c = (rank + 1 - t) % world_size, (rank - t) % world_size"


def _off_by_one() -> str:
    source = nbformat.read(REPO / "source" / RING / f"{RING}.ipynb", as_version=4)
    model = next(c.source for c in source.cells if c.get("id") == "ring_allreduce")
    assert SEND_INDEX in model
    return model.replace(SEND_INDEX, SEND_INDEX.replace("rank + 1 - t", "rank - t", 1))


def test_run_all_goes_on_past_a_failing_try_cell(lab, page, artifact, helpers):
    """With a wrong ring, does Run All go on past the failing `%%ranks` try cell (tagged
    raises-exception), so that the widget after it shows the student's run, and does the try
    cell read as one line per rank with its hint, with no C++ words or the course's frames?"""
    nb = nbformat.read(REPO / "release" / RING / f"{RING}.ipynb", as_version=4)
    cell = next(c for c in nb.cells if c.get("id") == "ring_allreduce")
    cell.source = _off_by_one()
    nbformat.write(nb, lab.root_dir / "wrong-ring.ipynb")
    helpers.open_notebook(page, lab, "wrong-ring.ipynb")
    helpers.run_all(page, timeout_s=240)
    helpers.wait_for_idle(page, timeout_s=240)
    page.locator(".jp-Notebook").first.click()
    page.keyboard.press("Control+s")
    page.wait_for_timeout(2000)
    saved = {c.get("id"): c for c in nbformat.read(lab.root_dir / "wrong-ring.ipynb", 4).cells}
    tried = saved["try_it"]
    errors = [o for o in tried.outputs if o.output_type == "error"]
    assert errors, tried.outputs
    said = "\n".join(errors[0].traceback) + "".join(o.get("text", "") for o in tried.outputs)
    assert "a message of 12 bytes arrived for a receive of 8 bytes" in said, said
    for internal in ("terminate called", "Fatal Python error", "course/ranks"):
        assert internal not in said, said
    watched = saved["watch_yours"]
    assert watched.execution_count is not None and watched.outputs, watched
    page.screenshot(path=artifact("run-all-past-a-failing-try.png"), full_page=False)
