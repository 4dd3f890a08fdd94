"""The FSDP widget in a real JupyterLab and Chromium at 1280 px: does it draw, step forward,
and redraw when reshard_after_forward is switched off? (A finished fsdp notebook, its own
step animated: tests/browser/test_finished_browser.py.)"""

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


def test_fsdp_widget_draws_steps_and_resets(run_notebook, artifact, helpers) -> None:
    """Does the widget render mid-backward, move one event with the forward button, and start
    again from event 0 with one gather per unit once reshard_after_forward is unticked?"""
    page = run_notebook("fsdp_widget.ipynb", [WIDGET])
    page.wait_for_selector(".ring-step")
    helpers.wait_for_figures(page, 1)
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
