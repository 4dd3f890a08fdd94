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


def _start_release(page: object, lab: object, helpers: object, name: str) -> None:
    """Open the release notebook ``name`` as handed out and start Restart and Run All."""
    nbformat.write(
        nbformat.read(REPO / "release" / name / f"{name}.ipynb", 4), lab.root_dir / f"{name}.ipynb"
    )
    helpers.open_notebook(page, lab, f"{name}.ipynb")
    page.locator(".jp-Notebook").first.click()
    page.get_by_role("menuitem", name="Kernel", exact=True).click()
    page.get_by_role("menuitem", name="Restart Kernel and Run All Cells…").click()
    page.get_by_role("button", name="Confirm Kernel Restart").click()
    page.wait_for_selector(".jp-OutputArea-output", timeout=60_000)


def _check_release(page: object, lab: object, helpers: object, name: str, artifact: object) -> None:
    """Wait for the run started by :func:`_start_release`, then check what it left."""
    helpers.wait_for_idle(page, timeout_s=400, all_run=True)
    prompts = page.locator(".jp-CodeCell .jp-InputPrompt").all_text_contents()
    assert prompts and all(re.search(r"\[\d+\]", p) for p in prompts), prompts
    saved = helpers.saved_notebook(page, lab, f"{name}.ipynb")
    outputs = [o for c in saved.cells if c.cell_type == "code" for o in c.outputs]
    assert not [f"{o.ename}: {o.evalue}" for o in outputs if o.output_type == "error"]
    text = "".join(o.get("text", "") for o in outputs)
    assert re.search(r"answer_\w+_1 is not answered yet", text), text[:800]
    for leak in ("Traceback", 'File "', "site-packages"):
        assert leak not in text, text[text.index(leak) - 400 : text.index(leak) + 400]
    items = items_of(REPO / "source" / name / f"{name}.ipynb")
    assert giveaway_leaks(saved, items, outputs=True) == []  # no output hands a key over
    page.screenshot(path=artifact(f"run-all-{name}.png"), full_page=False)  # the last cells


# Two notebooks at a time, one per core: a notebook's run leaves a core idle while its ranks
# wait out a deadline or a measured hang.
PAIRS = [COURSE_ORDER[i : i + 2] for i in range(0, len(COURSE_ORDER), 2)]


def _halves_animate(page: object, artifact: object) -> None:
    """The zero release, run: do both half widgets draw and step, counting steps without the
    whole half's total before question zero_1?"""
    page.wait_for_selector(".ring-step", timeout=30_000)
    steps = page.locator(".ring-step").all_text_contents()
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


def _ring_bytes(page: object, artifact: object) -> None:
    """The ring release, run: does the measured bytes cell show gloo's ring's traffic?"""
    bytes_cell = page.locator(".jp-CodeCell", has_text="with WireMeter() as wire:")
    measured = bytes_cell.locator(".jp-OutputArea-output").first
    measured.scroll_into_view_if_needed()
    assert "6.00 MB to rank" in measured.text_content()  # gloo's ring: 2 (N-1)/N of 4 MB, N = 4
    page.wait_for_timeout(500)
    bytes_cell.screenshot(path=artifact("release-ring-bytes.png"))


# What else a notebook's release run is checked for.
AND_THEN = {"zero": _halves_animate, RING: _ring_bytes}


@pytest.mark.slow
@pytest.mark.parametrize("names", PAIRS, ids="+".join)
def test_restart_and_run_all_runs_every_cell_of_the_release(
    names, lab, page, second_page, artifact, helpers
):
    """As handed out, nothing answered: does Kernel > Restart and Run All run every code cell
    (an execution count on each, no error), the first item saying it is not answered yet, and
    no output but an item's own measurement showing one of its give-aways? (The zero
    notebook's half widgets also draw and step; the ring's bytes cell shows gloo's traffic.)"""
    pages = [page, second_page][: len(names)]
    for each, name in zip(pages, names, strict=True):
        _start_release(each, lab, helpers, name)
    for each, name in zip(pages, names, strict=True):
        _check_release(each, lab, helpers, name, artifact)
        AND_THEN.get(name, lambda *_: None)(each, artifact)


# The model ring with the all-gather's send index one off: on 3 ranks and 7 elements (chunks
# of 3, 2 and 2) a rank sends 12 bytes into a receive of 8, and gloo aborts it.
SEND_INDEX = "send_c, recv_c = (rank + 1 - t) % world_size, (rank - t) % world_size"


def _off_by_one() -> str:
    source = nbformat.read(REPO / "source" / RING / f"{RING}.ipynb", as_version=4)
    model = next(c.source for c in source.cells if c.get("id") == "ring_allreduce")
    assert SEND_INDEX in model
    return model.replace(SEND_INDEX, SEND_INDEX.replace("rank + 1 - t", "rank - t", 1))


# The release's cells a student's ring passes through: its setup, the ring, the try cell, the
# widget after it and the visible tests after that.
AROUND_THE_TRY = {"setup", "ring_allreduce", "try_it", "watch_yours", "visible_tests"}


def test_run_all_goes_on_past_a_failing_try_cell(lab, page, artifact, helpers):
    """With a wrong ring, does Run All go on past the failing `%%ranks` try cell (tagged
    raises-exception), so that the widget after it shows the student's run, and does the try
    cell read as one line per rank with its hint, with no C++ words or the course's frames?"""
    nb = nbformat.read(REPO / "release" / RING / f"{RING}.ipynb", as_version=4)
    nb.cells = [c for c in nb.cells if c.get("id") in AROUND_THE_TRY]  # no quiz measurements
    cell = next(c for c in nb.cells if c.get("id") == "ring_allreduce")
    cell.source = _off_by_one()
    nbformat.write(nb, lab.root_dir / "wrong-ring.ipynb")
    helpers.open_notebook(page, lab, "wrong-ring.ipynb")
    helpers.run_all(page, timeout_s=240)
    helpers.wait_for_idle(page, timeout_s=240)
    saved = {c.get("id"): c for c in helpers.saved_notebook(page, lab, "wrong-ring.ipynb").cells}
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
