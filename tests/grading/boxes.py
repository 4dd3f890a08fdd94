"""The rank box grading opens for a check: the one ``box_options`` gives a submission whose
grade cells call it (``torch._dynamo`` preloaded only where the check may train with DDP)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from course.grading.preload import trains_ddp
from course.grading.rankbox import RankBox

__all__ = ["graded_box"]


def graded_box(*checks: Callable[..., Any], **options: Any) -> RankBox:
    """The box the judge would open for grade cells that call ``checks``."""
    return RankBox(ddp=trains_ddp(check.__name__ for check in checks), **options)
