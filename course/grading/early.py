"""A submission's rank box, started before nbgrader's own start-up, which its imports overlap.

The grading process reads the submission's notebook and the gradebook's cells, starts the
confined forkserver its checks need (``course.grading.preload``) and then runs nbgrader;
the judge takes the box over (``course.grading.rankbox.start_early``), or it is stopped.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from course.grading.gradebook import nbgrader_quiet
from course.grading.judge import Submission
from course.grading.preload import box_options
from course.grading.rankbox import discard_early, start_early

__all__ = ["rank_box_started", "start_rank_box"]


def start_rank_box(db_url: str, assignment: str, student: str, root: str) -> None:
    """Start the confined forkserver the Judge will take for ``student``'s notebook of
    ``assignment`` now, before nbgrader's own start-up, which its imports then overlap (the
    Judge starts another if the notebook it gets asks for a different one)."""
    import nbformat
    from nbgrader.api import Gradebook

    path = Path(root) / "submitted" / student / assignment / f"{assignment}.ipynb"
    try:
        nb = nbformat.read(path, as_version=4)
        with nbgrader_quiet(), Gradebook(db_url) as gb:
            sub = Submission(nb, gb.find_notebook(assignment, assignment))
    except Exception:  # noqa: BLE001 - nbgrader reads it again, and says what is wrong
        return
    start_early(**box_options(sub))


@contextlib.contextmanager
def rank_box_started(db_url: str, assignment: str, student: str, root: str) -> Iterator[None]:
    """Within: the forkserver of :func:`start_rank_box` is started; stopped after, if the
    Judge never took it."""
    start_rank_box(db_url, assignment, student, root)
    try:
        yield
    finally:
        discard_early()
