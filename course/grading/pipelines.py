"""nbgrader's autograde pipelines as the course sets them, each preprocessor by its dotted name.

``nbgrader_config.py`` sets both, and every nbgrader command loads that config; only
``autograde`` builds them. nbconvert imports a preprocessor named by a string when it
registers it, so the judge, the checks and torch are imported by the command that grades,
and by no other: nbgrader's apps and this config load in 1.1 CPU-s, where importing the
judge made it 2.9 (``nbgrader export``, ``generate_feedback``, the formgrader's server).

    c.Autograde.sanitize_preprocessors = sanitize_preprocessors()
    c.Autograde.autograde_preprocessors = autograde_preprocessors()
"""

from __future__ import annotations

__all__ = ["autograde_preprocessors", "sanitize_preprocessors"]

JUDGE = "course.grading.judge.Judge"  # built on first use (the module's __getattr__)
GRADEBOOK_CELLS = "course.grading.cells.GradebookCells"


def _name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _stock(trait: str) -> list[str]:
    """nbgrader 0.9.6's own pipeline ``trait``, by name."""
    from nbgrader.converters import Autograde

    return [_name(cls) for cls in Autograde.class_traits()[trait].default()]


def autograde_preprocessors() -> list[str]:
    """nbgrader's autograde pipeline with :class:`~course.grading.judge.Judge` in place of
    ``Execute``: no kernel runs the submission."""
    from nbgrader.preprocessors import Execute

    pipeline = _stock("autograde_preprocessors")
    pipeline[pipeline.index(_name(Execute))] = JUDGE
    return pipeline


def sanitize_preprocessors() -> list[str]:
    """nbgrader's sanitizing pipeline, after the gradebook has rebuilt the notebook's nbgrader
    metadata (:class:`~course.grading.cells.GradebookCells`)."""
    return [GRADEBOOK_CELLS, *_stock("sanitize_preprocessors")]
