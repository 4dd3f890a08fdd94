"""A catalogue's function as a student's: its module pasted into a notebook cell."""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable


def as_student_code(fn: Callable[..., object]) -> Callable[..., object]:
    """``fn``'s module pasted into a notebook cell: the same code, none of it the course's."""
    namespace = {"__name__": "__main__"}
    exec(compile(inspect.getsource(sys.modules[fn.__module__]), "<cell>", "exec"), namespace)  # noqa: S102 - runs a catalogue module as a notebook cell would
    return namespace[fn.__name__]
