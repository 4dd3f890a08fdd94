"""The FSDP widget in a real JupyterLab and Chromium at 1280 px: does it draw, step forward,
and redraw when reshard_after_forward is switched off; and does a finished fsdp notebook run
every cell, its own step animated?"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.browser

WIDGET = """\
from course.lessons.fsdp.picture import fsdp_widget
w = fsdp_widget(units=3, world_size=4)
w.slider.value = 10
w"""


def _step(page) -> str:
    return page.locator(".ring-step").first.inner_text()


def test_fsdp_widget_draws_steps_and_resets(run_notebook, artifact) -> None:
    """Does the widget render mid-backward, move one event with the forward button, and start
    again from event 0 with one gather per unit once reshard_after_forward is unticked?"""
    page = run_notebook("fsdp_widget.ipynb", [WIDGET])
    page.wait_for_selector(".ring-step")
    page.wait_for_function(
        "document.querySelectorAll('.js-plotly-plot .heatmaplayer').length >= 1", timeout=60_000
    )
    assert _step(page).startswith("event 10 / 21 - backward: all-gather unit 2 again")
    output = page.locator(".jp-OutputArea-output").first
    output.locator("button[title='one event forward']").click()
    page.wait_for_function(
        "() => document.querySelector('.ring-step').textContent.startsWith('event 11 / 21')",
        timeout=15_000,
    )
    page.wait_for_timeout(1000)  # let plotly restyle the grid
    output.screenshot(path=artifact("fsdp-widget-event11.png"))
    output.locator(".widget-checkbox input").first.click()  # reshard_after_forward
    page.wait_for_function(
        "() => document.querySelector('.ring-step').textContent.startsWith('event 0 / 15')",
        timeout=15_000,
    )
    assert "reshard_after_forward=False" in output.locator(".ring-heading").inner_text()


def test_a_finished_fsdp_notebook_runs_all_cells(lab, page, artifact, helpers) -> None:
    """Filled in as the model sample submission: does every cell run with no error, and does
    the widget play the student's own step, every call matched to a unit?"""
    helpers.open_notebook(page, lab, helpers.write_finished(lab.root_dir, "fsdp"))
    helpers.run_all(page, timeout_s=300)
    tracebacks = helpers.stderr_errors(page)
    assert not tracebacks, tracebacks[0][:800]
    headings = page.locator(".ring-heading").all_text_contents()
    assert any("your run" in h for h in headings), headings
    yours = page.locator(".jp-CodeCell", has_text="animate_fully_shard(fully_shard")
    assert "fit no unit" not in yours.inner_text()
    yours.scroll_into_view_if_needed()
    page.wait_for_timeout(1500)  # let plotly draw
    yours.screenshot(path=artifact("fsdp-your-step.png"))
