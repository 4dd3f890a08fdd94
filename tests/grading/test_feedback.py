"""The course's feedback exporter makes nbgrader's page, and a warm grader compiles nothing."""

from __future__ import annotations

import copy
import importlib
import sys
from pathlib import Path

import jinja2
import nbformat
import pytest
from bs4 import BeautifulSoup
from nbconvert.exporters import HTMLExporter
from nbformat.v4 import new_output
from nbgrader.converters import GenerateFeedback
from traitlets.config.loader import PyFileConfigLoader

from course.grading import feedback
from course.grading.feedback import NO_ALT, FeedbackExporter

REPO = Path(__file__).resolve().parents[2]
# A 1x1 PNG, as a notebook's image output holds it.
PNG = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5E"
    "rkJggg=="
)
SCORES = {"nbgrader": {"notebook": "fsdp", "score": 3.0, "max_score": 8.0, "late_penalty": 0.0}}


def _exporter(kind: type[HTMLExporter]) -> HTMLExporter:
    """``kind`` configured as generate_feedback configures its exporter, with the course's
    nbgrader_config.py."""
    config = PyFileConfigLoader("nbgrader_config.py", path=str(REPO)).load_config()
    converter = GenerateFeedback(config=config)
    return kind(parent=converter, config=converter.config)


def _notebook(image: bool) -> nbformat.NotebookNode:
    """The FSDP assignment with printed output, and an image without alt text if asked."""
    nb = nbformat.read(REPO / "source" / "fsdp" / "fsdp.ipynb", as_version=4)
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    code[0].outputs = [new_output("stream", name="stdout", text="step 1: loss 2.31\n")]
    if image:
        code[1].outputs = [new_output("display_data", data={"image/png": PNG})]
    for cell in nb.cells:  # graded, as nbgrader's GetGrades leaves the cells
        marks = cell.metadata.get("nbgrader", {})
        if marks.get("grade"):
            marks["score"] = marks["points"] / 2
        if marks.get("solution") or marks.get("task"):
            marks["comment"] = "*Half* the points: see the hint."
    nb.metadata["language_info"] = {"name": "python", "pygments_lexer": "ipython3"}
    return nb


@pytest.mark.parametrize("image", [False, True], ids=["text", "image"])
def test_the_page_is_nbgraders(image: bool) -> None:
    """Does the course's exporter make the page nbgrader's HTMLExporter makes (the same
    tree of tags, attributes and text), with or without an image to give alt text to?"""
    nb = _notebook(image)
    ours, _ = _exporter(FeedbackExporter).from_notebook_node(copy.deepcopy(nb), SCORES)
    stock, _ = _exporter(HTMLExporter).from_notebook_node(copy.deepcopy(nb), SCORES)
    assert "step 1: loss 2.31" in ours
    assert (NO_ALT in ours) == image
    assert BeautifulSoup(ours, "html.parser") == BeautifulSoup(stock, "html.parser")


def test_after_warm_a_page_compiles_no_template(monkeypatch: pytest.MonkeyPatch) -> None:
    """A warm grader makes one page before it forks graders: does a grader's page then
    compile no template (and one made without it compile them)?"""
    compiled: list[str] = []
    compile_ = jinja2.Environment.compile

    def counted(self: jinja2.Environment, source: str, name: str | None = None, *a, **kw):
        compiled.append(name or "")
        return compile_(self, source, name, *a, **kw)

    monkeypatch.setattr(jinja2.Environment, "compile", counted)
    monkeypatch.setattr(feedback, "_COMPILED", feedback._InMemory())  # noqa: SLF001 - a cold process's
    _exporter(FeedbackExporter).from_notebook_node(_notebook(image=False), SCORES)
    assert "index.html.j2" in compiled
    monkeypatch.setattr(feedback, "_COMPILED", feedback._InMemory())  # noqa: SLF001 - (same)
    feedback.warm()
    compiled.clear()
    _exporter(FeedbackExporter).from_notebook_node(_notebook(image=True), SCORES)
    assert compiled == []


def test_a_page_that_cannot_be_made_ahead_costs_only_the_head_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The warm grader's forkserver imports warmpage: does a page that fails there (a
    template gone, say) leave the import, and so the forkserver, standing?"""

    def broken() -> None:
        raise jinja2.TemplateNotFound("feedback/index.html.j2")

    monkeypatch.setattr(feedback, "warm", broken)
    monkeypatch.delitem(sys.modules, "course.grading.warmpage", raising=False)
    importlib.import_module("course.grading.warmpage")
