"""The feedback page: nbgrader's own (``HTMLExporter``, its ``feedback`` template), made
without doing again for every page what one page's work already did.

Measured on a graded FSDP notebook, ``nbgrader generate_feedback`` forked warm
(:mod:`course.grading.warm`) took 0.65 s a page (0.23 s now), most of it the same for every
page; under cProfile, of 1.2 s:

* 0.16 s compiling the template's nine Jinja files (every exporter makes a Jinja environment
  of its own, which compiles each template again);
* 0.26 s compiling regular expressions (pygments' Python lexer, Jinja's, mistune's), for the
  first page of each process;
* 0.42 s in one BeautifulSoup pass over the page, which gives each ``<img>`` without alt
  text one and makes JupyterLab's cells focusable: the feedback template draws no
  JupyterLab cell, and most pages hold no image.

:class:`FeedbackExporter` is ``HTMLExporter`` with the compiled templates kept in this
process (a Jinja bytecode cache, keyed by each template's source) and the soup pass made only
where it changes something; :func:`warm` makes one page, so that every grader forked after
(``course.grading.warmpage``) starts with all of it. The pages are the same
(``tests/grading/test_feedback.py``).
"""

from __future__ import annotations

from typing import Any

from bs4 import BeautifulSoup
from jinja2 import BytecodeCache, Environment
from jinja2.bccache import Bucket
from nbconvert.exporters import HTMLExporter, TemplateExporter
from nbconvert.filters.highlight import Highlight2HTML
from nbconvert.filters.widgetsdatatypefilter import WidgetsDataTypeFilter

__all__ = ["FeedbackExporter", "warm"]

# nbconvert's alt text, word for word (nbconvert.exporters.html.HTMLExporter).
NO_ALT = "No description has been provided for this image"


class _InMemory(BytecodeCache):
    """Compiled templates, kept for this process and the processes forked from it."""

    def __init__(self) -> None:
        self._code: dict[str, bytes] = {}

    def load_bytecode(self, bucket: Bucket) -> None:
        code = self._code.get(bucket.key)
        if code is not None:
            bucket.bytecode_from_string(code)

    def dump_bytecode(self, bucket: Bucket) -> None:
        self._code[bucket.key] = bucket.bytecode_to_string()


_COMPILED = _InMemory()


class FeedbackExporter(HTMLExporter):
    """``HTMLExporter`` (nbconvert 7.16+), its templates compiled once per process and its
    soup pass made only on a page with an image or a JupyterLab cell."""

    def _create_environment(self) -> Environment:
        environment = super()._create_environment()
        environment.bytecode_cache = _COMPILED  # a key is the template's name and source
        return environment

    def from_notebook_node(  # type: ignore[override]
        self, nb: Any, resources: dict[str, Any] | None = None, **kw: Any
    ) -> tuple[str, dict[str, Any]]:
        """``HTMLExporter.from_notebook_node``, its filters and soup pass as nbconvert's."""
        info = nb.metadata.get("language_info", {})
        lexer = info.get("pygments_lexer", info.get("name", None))
        highlight = self.filters.get(
            "highlight_code", Highlight2HTML(pygments_lexer=lexer, parent=self)
        )
        resources = self._init_resources(resources)
        data_type = WidgetsDataTypeFilter(
            notebook_metadata=self._nb_metadata, parent=self, resources=resources
        )
        self.register_filter("highlight_code", highlight)
        self.register_filter("filter_data_type", data_type)
        html, resources = TemplateExporter.from_notebook_node(self, nb, resources, **kw)
        if "<img" not in html and "jp-Notebook" not in html:
            return html, resources  # the soup pass would change nothing
        return self._soup_pass(html), resources

    def _soup_pass(self, html: str) -> str:
        """nbconvert's: alt text for images that have none, focusable JupyterLab cells."""
        soup = BeautifulSoup(html, features="html.parser")
        missing_alt = 0
        for elem in soup.select("img:not([alt])"):
            elem.attrs["alt"] = NO_ALT
            missing_alt += 1
        if missing_alt:
            self.log.warning("Alternative text is missing on %s image(s).", missing_alt)
        for elem in soup.select(".jp-Notebook div.jp-Cell-inputWrapper"):
            elem.attrs["tabindex"] = "0"
        for elem in soup.select(".jp-Notebook div.jp-OutputArea-output"):
            elem.attrs["tabindex"] = "0"
        return str(soup)


def warm() -> None:
    """Make one feedback page here, as nbgrader's generate_feedback would (its template and
    folders, the course's filters): what it compiles stays for every process forked after."""
    from nbgrader.converters import GenerateFeedback
    from traitlets.config import Config

    config = Config()
    config.HTMLExporter.sanitize_html = True  # as nbgrader_config.py
    config.HTMLExporter.filters = {"markdown2html": "course.grading.inert.markdown2html"}
    converter = GenerateFeedback(config=config)  # adds the feedback template and its folders
    exporter = FeedbackExporter(parent=converter, config=converter.config)
    scores = {"notebook": "page", "score": 1.0, "max_score": 2.0, "late_penalty": 0.0}
    exporter.from_notebook_node(_page(), resources={"nbgrader": scores})


def _page() -> Any:
    """A graded notebook of one answer, one graded test and a comment."""
    from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

    def graded(grade_id: str, **more: Any) -> dict[str, Any]:
        return {"nbgrader": {"grade_id": grade_id, "locked": False, "schema_version": 3,
                             "solution": False, "grade": False, "task": False, **more}}  # fmt: skip

    answer = new_code_cell("def f(x):\n    return 2 * x", metadata=graded("f", solution=True))
    test = new_code_cell(
        "assert f(1) == 2",
        metadata=graded("test_f", grade=True, points=2, score=1.0, comment="*Half* the points."),
        outputs=[new_output("stream", name="stdout", text="checked\n")],
    )
    return new_notebook(
        cells=[new_markdown_cell("# A page\nWith `code` and *emphasis*."), answer, test],
        metadata={"language_info": {"name": "python", "pygments_lexer": "ipython3"}},
    )
