"""Student markdown rendered inert: no script, no event handler, wherever nbgrader shows it.

nbgrader's feedback page and the formgrader's view of a submission both render markdown
cells with their own templates, ``cell.source | markdown2html``, and nbconvert's renderer
passes raw HTML through (``escape=False``): a student's ``<img src=x onerror=...>`` or
``<script>`` would run in the student's feedback page, or in the instructor's Jupyter origin
when the formgrader shows it. ``HTMLExporter.sanitize_html`` does not reach those templates'
markdown. So the course replaces the ``markdown2html`` filter itself (``nbgrader_config.py``)::

    c.HTMLExporter.filters = {"markdown2html": "course.grading.inert.markdown2html"}

It renders as nbconvert does, then keeps only the tags and attributes that markdown makes
(:data:`TAGS`, :func:`allowed`): any other tag is shown as text, every ``on*`` attribute,
``style`` and ``javascript:`` link is dropped (bleach's HTML5 sanitizer, nbconvert's own
dependency for ``sanitize_html``).
"""

from __future__ import annotations

from typing import Any

import bleach
from jinja2 import pass_context

__all__ = ["TAGS", "allowed", "clean", "markdown2html"]

TAGS = frozenset({
    *bleach.ALLOWED_TAGS, "p", "div", "span", "pre", "br", "hr", "img", "sup", "sub", "del",
    "s", "kbd", "dl", "dt", "dd", "details", "summary", "h1", "h2", "h3", "h4", "h5", "h6",
    "table", "thead", "tbody", "tr", "th", "td",
})  # fmt: skip
_ANY_TAG = frozenset({"class", "id", "title", "alt", "align"})
_LINKS = ("http:", "https:", "mailto:", "#", "/", "./", "../")


def allowed(tag: str, name: str, value: str) -> bool:
    """Keep an attribute markdown itself writes: never an event handler or a style."""
    if name in _ANY_TAG:
        return True
    if tag == "a" and name == "href":
        return value.startswith(_LINKS) or ":" not in value.split("/", 1)[0]
    if tag == "img" and name in ("width", "height"):
        return value.isdigit()
    if tag == "img" and name == "src":  # an attachment is embedded as a data: image
        return value.startswith((*_LINKS, "data:image/")) or ":" not in value.split("/", 1)[0]
    return False


def clean(html: str) -> str:
    """``html`` with only :data:`TAGS` and :func:`allowed` attributes (the rest as text)."""
    return bleach.clean(
        html,
        tags=TAGS,
        attributes=allowed,
        protocols=["http", "https", "mailto", "data"],
        strip=False,
        strip_comments=True,
    )


@pass_context
def markdown2html(context: Any, source: str) -> str:
    """nbconvert's ``HTMLExporter.markdown2html`` (attachments included), made inert."""
    from nbconvert.filters.markdown_mistune import IPythonRenderer, MarkdownWithMath

    cell = context.get("cell", {})
    path = context.get("resources", {}).get("metadata", {}).get("path", "")
    renderer = IPythonRenderer(escape=False, attachments=cell.get("attachments", {}), path=path)
    return clean(MarkdownWithMath(renderer=renderer).render(source))
