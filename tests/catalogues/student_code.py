"""A catalogue's function as a student's: its module pasted into a notebook cell, or the
function as the cell the judge grades."""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable

from course.grading.student import StudentCode


def as_student_code(fn: Callable[..., object]) -> Callable[..., object]:
    """``fn``'s module pasted into a notebook cell: the same code, none of it the course's."""
    namespace = {"__name__": "__main__"}
    exec(compile(inspect.getsource(sys.modules[fn.__module__]), "<cell>", "exec"), namespace)  # noqa: S102 - runs a catalogue module as a notebook cell would
    return namespace[fn.__name__]


def graded_cell(
    fn: Callable[..., object], name: str, header: str, *helpers: Callable[..., object]
) -> StudentCode:
    """``fn`` as the student's cell ``name``, for the judge: ``header`` (the notebook's
    imports), the helpers' sources, and ``fn``'s renamed ``name``."""
    source = inspect.getsource(fn).replace(f"def {fn.__name__}(", f"def {name}(")
    pasted = "".join(inspect.getsource(h) + "\n\n" for h in helpers)
    return StudentCode(((name, header + pasted + source),), name)
