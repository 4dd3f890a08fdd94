"""The ring widget in a real JupyterLab and Chromium: does it draw, play and say where a run
goes wrong?"""

from __future__ import annotations

import re

import pytest

pytestmark = pytest.mark.browser

REFERENCE = """\
from course.pictures.widgets import ring_widget
w4 = ring_widget(world_size=4, numel=13)
w4.speed.value = "4x"
w4"""
MID_REDUCE_SCATTER = """\
w8 = ring_widget(world_size=8, numel=25)
w8.slider.value = 3
w8"""
WRONG = """\
import dataclasses
from course.ring.trace import ring_trace
from course.pictures.widgets import show_trace
ref = ring_trace(4, 13)
# rank 1 sends its step-2 chunk to rank 3 instead of its neighbour rank 2
bad = dataclasses.replace(ref, messages=tuple(
    dataclasses.replace(m, peer=3) if (m.rank, m.op, m.order) == (1, "send", 1) else m
    for m in ref.messages))
wrong = show_trace(bad, "a wrong ring")
wrong.slider.value = 2
wrong"""


def _step_text(page, index: int) -> str:
    return page.locator(".ring-step").nth(index).inner_text()


def test_widget_draws_plays_and_reports(run_notebook, artifact, helpers) -> None:
    """Does the widget render in JupyterLab, advance when Play is pressed, and flag a wrong
    message in red words?"""
    page = run_notebook("ring_widget.ipynb", [REFERENCE, MID_REDUCE_SCATTER, WRONG])
    page.wait_for_selector(".ring-step")
    helpers.wait_for_figures(page, 3)
    assert _step_text(page, 0).startswith("step 0 / 6")
    assert _step_text(page, 1).startswith("step 3 / 14")

    first = page.locator(".jp-OutputArea-output").nth(0)
    first.locator(".widget-play button").first.click()  # the play button of the Play widget
    page.wait_for_function(
        "() => /step [2-6] \\/ 6/.test(document.querySelector('.ring-step').textContent)",
        timeout=15_000,
    )
    assert re.match(r"step [2-6] / 6", _step_text(page, 0))
    first.screenshot(path=artifact("widget-n4-playing.png"))
    page.locator(".jp-OutputArea-output").nth(1).screenshot(path=artifact("widget-n8-step3.png"))

    report = page.locator(".ring-report").nth(2)
    assert "sent to rank 3" in report.inner_text()
    assert report.locator("li[style*='bold']").count() >= 1  # this step's deviation stands out
    page.locator(".jp-OutputArea-output").nth(2).screenshot(path=artifact("widget-wrong.png"))


def test_exported_figure_plays_offline(browser, artifact, tmp_path) -> None:
    """Does the figure, exported by nbconvert, play in a browser with no kernel and no
    network?"""
    import nbformat
    from nbclient import NotebookClient
    from nbconvert import HTMLExporter

    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell(
            "from course.pictures.figures import ring_figure\n"
            "from course.ring.trace import ring_trace\n"
            'ring_figure(ring_trace(8, 25)).show(renderer="notebook")'
        )
    ]
    NotebookClient(nb, timeout=120, kernel_name="python3").execute()
    page_path = tmp_path / "ring.html"
    page_path.write_text(HTMLExporter().from_notebook_node(nb)[0])

    context = browser.new_context(viewport={"width": 1200, "height": 900}, offline=True)
    page = context.new_page()
    page.goto(page_path.as_uri())
    title = page.locator(".gtitle")
    title.wait_for()
    assert "step 0 / 14" in title.text_content()
    page.get_by_text("Play", exact=True).click()
    page.wait_for_function(
        "() => /step ([3-9]|1[0-4]) \\/ 14/.test(document.querySelector('.gtitle').textContent)",
        timeout=15_000,
    )
    page.get_by_text("Pause", exact=True).click()
    page.locator(".js-plotly-plot").screenshot(path=artifact("static-n8-playing.png"))
    context.close()


LARGE = """\
from course.pictures.widgets import ring_widget
w16 = ring_widget(world_size=8)
w16"""
RESIZED = """\
w16.world_size.value = 16  # redrawn in the figure already shown
w16.slider.value = 9"""
LARGEST = """\
w32 = ring_widget(world_size=32)
w32.slider.value = 40
w32"""
DEADLOCK = """\
from course.pictures.widgets import show_trace
from course.ring.trace import Message, Trace
n = 16
posted = tuple(Message(r, (r - 1) % n, "recv", 0, 3, 24, None, None) for r in range(n))
blocked = {r: f"deadlocked in dist.recv at ring.py line 5" for r in range(n)}
show_trace(Trace(n, 3 * n + 1, 8, posted, (), tuple(range(n)), blocked), "your ring_allreduce")"""


def test_widget_is_legible_at_16_and_32_ranks_and_shows_a_deadlock(run_notebook, artifact, helpers):
    """At N = 16 (drawn at 8, then resized in place) and 32, and for a run where every rank
    blocks in its first receive, is there one title, one step counter matching the arrows,
    and one deviation line with a count?"""
    page = run_notebook("ring_sizes.ipynb", [LARGE, LARGEST, DEADLOCK, RESIZED])
    helpers.wait_for_figures(page, 3)
    page.wait_for_function(  # the colour bar's top label, from the redrawn layout and traces
        """() => document.querySelector('.js-plotly-plot').textContent
            .includes('all 16: fully reduced')""",
        polling=500,
    )
    assert _step_text(page, 0).startswith("step 9 / 30 - reduce-scatter")
    assert _step_text(page, 1).startswith("step 40 / 62 - all-gather")
    outputs = page.locator(".jp-OutputArea-output")
    assert outputs.nth(0).locator(".gtitle").count() == 0  # the status line is the only title
    report = page.locator(".ring-report").nth(2).inner_text()
    assert report.count("never finished") == 1 and "the same on 15 more ranks: 1-15" in report
    assert "made 1 receives" not in report
    dashed = page.locator(".js-plotly-plot").nth(2).locator("path.js-line[style*='dasharray']")
    assert dashed.count() >= 1  # the blocked receives, drawn dashed
    for i, name in enumerate(("widget-n16.png", "widget-n32.png", "widget-deadlock.png")):
        outputs.nth(i).screenshot(path=artifact(name))
