"""A lesson's names, each imported on first use: what a notebook may call, and from where.

A lesson package (``course.lessons.<lesson>``) lists its names with :class:`Exports` and
hands its ``__getattr__`` and ``__dir__`` over (PEP 562), so ``from course.lessons.fsdp import
check_fully_shard`` imports the check's module and nothing of the lesson's figures or
experiments. The grader reads the same table (:meth:`Exports.module_of`) to preload what a
notebook's import cell will need on its ranks, without importing any of it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["Exports", "module_of"]


class Exports:
    """``names``: each exported name to the module that defines it, or (for a module exported
    whole) the module itself; ``package``: the lesson package's ``__name__``."""

    def __init__(self, package: str, names: Mapping[str, str]) -> None:
        self.package, self.names = package, dict(names)

    def module_of(self, name: str) -> str | None:
        """The module ``name`` lives in (a module exported whole: itself); None if not ours."""
        return self.names.get(name)

    def getattr(self, name: str) -> Any:
        """The package's ``__getattr__``: import ``name``'s module now, and hand it over."""
        where = self.names.get(name)
        if where is None:
            raise AttributeError(f"module {self.package!r} has no attribute {name!r}")
        module = importlib.import_module(where)
        return module if where.rpartition(".")[2] == name else getattr(module, name)

    def dir(self) -> Callable[[], list[str]]:
        """The package's ``__dir__``: its exported names."""
        return lambda: sorted(self.names)


def module_of(package: Any, name: str) -> str | None:
    """Where ``package`` (an imported module) keeps ``name``, without importing it: from its
    :class:`Exports` if it is a lesson, else from the attribute it already holds."""
    exports = getattr(package, "EXPORTS", None)
    if isinstance(exports, Exports):
        return exports.module_of(name)
    value = vars(package).get(name)
    return getattr(value, "__module__", None) or getattr(value, "__name__", None)
