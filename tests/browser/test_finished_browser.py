"""The model sample submissions in a real JupyterLab and Chromium, two notebooks at a time (one
per core): does Run All run every cell of a finished notebook, and do the widgets play the
student's own runs?

A quiz item's measuring cell that names nothing the student's cells define measures gloo, not
the student: it runs as it does in the release, whose Run All (test_release_browser.py) runs
every cell. Such cells are left out here; those that run the student's code stay.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import nbformat
import pytest

pytestmark = [pytest.mark.browser, pytest.mark.slow]

RING = "ring_allreduce"


def _widget_rendered(page) -> None:
    page.wait_for_selector(".ring-step", timeout=30_000)
    page.wait_for_selector(".js-plotly-plot", timeout=30_000)


def test_finished_notebooks_run_all_cells_in_the_browser(lab, page, second_page, artifact, helpers):
    """Filled in as the model sample submissions, the ring's and accumulation's (two at a time):
    does every cell run, no error, no hang, the ring's widget showing its run, and does the
    student's uneven loop finish?"""
    _run_finished(lab, helpers, 240, [
        (page, RING, lambda ring: _finished_ring(ring, artifact, helpers)),
        (second_page, "accumulation",
         lambda acc: _finished_accumulation(acc, lab, artifact, helpers)),
    ])  # fmt: skip


def _run_finished(lab: object, helpers: object, timeout_s: float, runs: list) -> None:
    """Open each (page, notebook, check)'s notebook filled in as the model sample, start Run All
    in every page, then wait for each in turn and check it."""
    for page, name, _check in runs:
        finished = helpers.write_finished(lab.root_dir, name)
        _leave_out_gloos_measurements(lab.root_dir / finished)
        helpers.open_notebook(page, lab, finished)
        helpers.start_run_all(page)
    for page, _name, check in runs:
        helpers.wait_for_idle(page, timeout_s=timeout_s, all_run=True)
        check(page)


MEASURING = re.compile(r"\w+_\d+_measure")  # a quiz item's measuring cell: <item>_measure...


def _leave_out_gloos_measurements(path: Path) -> None:
    """Drop the measuring cells that name nothing the student's (solution) cells define."""
    nb = nbformat.read(path, as_version=4)
    theirs: set[str] = set()
    for cell in nb.cells:
        if cell.cell_type == "code" and cell.metadata.get("nbgrader", {}).get("solution"):
            theirs |= _names(cell.source, bound=True) or set()
    nb.cells = [c for c in nb.cells if _kept(c, theirs)]
    nbformat.write(nb, path)


def _kept(cell: dict, theirs: set[str]) -> bool:
    """Anything but a measuring cell; a measuring cell only if it names one of ``theirs`` (or
    cannot be read)."""
    if not MEASURING.match(cell.get("id", "")):
        return True
    names = _names(cell.source, bound=False)
    return names is None or bool(names & theirs)


def _names(source: str, bound: bool) -> set[str] | None:
    """The names ``source`` defines at its top level (functions, classes, assignments) or, if
    not ``bound``, all it mentions; a cell magic's body (``%%ranks``) read as the Python it
    is. None: unreadable."""
    lines = source.splitlines()
    if lines and lines[0].startswith("%%"):
        lines = lines[1:]
    try:
        tree = ast.parse("\n".join(x for x in lines if not x.lstrip().startswith(("%", "!"))))
    except SyntaxError:
        return None
    if not bound:
        return {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    found = set()
    for node in tree.body:  # what the cell defines for the cells after it
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            found.add(node.name)
        targets = getattr(node, "targets", None) or [getattr(node, "target", None)]
        for target in filter(None, targets):
            found |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
    return found


def _finished_ring(page: object, artifact: object, helpers: object) -> None:
    _widget_rendered(page)
    tracebacks = helpers.stderr_errors(page)
    assert not tracebacks, tracebacks[0][:800]
    page.screenshot(path=artifact("release-finished.png"), full_page=False)


def _finished_accumulation(page: object, lab: object, artifact: object, helpers: object) -> None:
    saved = helpers.saved_notebook(page, lab, "accumulation-finished.ipynb")
    outputs = [o for c in saved.cells if c.cell_type == "code" for o in c.outputs]
    errors = [f"{o.ename}: {o.evalue}" for o in outputs if o.output_type == "error"]
    assert not errors, errors[0][:800]
    text = "".join(o.get("text", "") for o in outputs)
    assert "train_uneven finishes on [2] ranks" in text, text[-800:]
    checked = page.locator(".jp-CodeCell", has_text="check_train_uneven(train_uneven")
    checked.scroll_into_view_if_needed()
    page.wait_for_timeout(500)
    page.screenshot(path=artifact("accumulation-finished.png"), full_page=False)


def _finished_zero(page: object, artifact: object, helpers: object) -> None:
    tracebacks = helpers.stderr_errors(page)
    assert not tracebacks, tracebacks[0][:800]
    assert page.locator(".ring-step").count() == 4  # two reference halves, then yours
    page.screenshot(path=artifact("zero-finished.png"), full_page=False)
    figure = page.locator(".js-plotly-plot", has_text="Bytes per rank")
    figure.scroll_into_view_if_needed()
    page.wait_for_timeout(1000)
    page.screenshot(path=artifact("zero-memory-figure.png"), full_page=False)


def _finished_fsdp(page: object, artifact: object, helpers: object) -> None:
    tracebacks = helpers.stderr_errors(page)
    assert not tracebacks, tracebacks[0][:800]
    headings = page.locator(".ring-heading").all_text_contents()
    assert any("your run" in h for h in headings), headings
    yours = page.locator(".jp-CodeCell", has_text="animate_fully_shard(fully_shard")
    assert "fit no unit" not in yours.inner_text()
    yours.scroll_into_view_if_needed()
    page.wait_for_timeout(1500)  # let plotly draw
    yours.screenshot(path=artifact("fsdp-your-step.png"))


def test_finished_zero_and_fsdp_notebooks_run_all_cells(lab, page, second_page, artifact, helpers):
    """Filled in as the model sample submissions, zero's and fsdp's (two at a time): does every
    cell run with no error, zero's widgets showing the student's halves after the two
    reference ones, and fsdp's widget playing the student's own step, every call matched to a
    unit?"""
    _run_finished(lab, helpers, 300, [
        (page, "zero", lambda zero: _finished_zero(zero, artifact, helpers)),
        (second_page, "fsdp", lambda fsdp: _finished_fsdp(fsdp, artifact, helpers)),
    ])  # fmt: skip
