"""A student's function or class, as the grader holds it: the cells that define it, by name.

The grader never runs a student's code. A check receives a :class:`StudentCode` where the
notebook would pass the student's function; sent to a rank, it unpickles as the real thing,
defined there and only there by running the submitted cells (:func:`resolve`). Whether it is
still the released stub is read from the cells' text (:meth:`StudentCode.stub_message`).
"""

from __future__ import annotations

import ast
import builtins
import linecache
from dataclasses import dataclass
from typing import Any

__all__ = ["UNREADABLE", "StudentCode", "cell_source", "parse_cell", "resolve"]

Cells = tuple[tuple[str, str], ...]  # (label, source) in notebook order
# What ast.parse raises on a cell a student wrote: a syntax error, nesting deep enough to
# exhaust the parser, a null byte, a cell too large to hold.
UNREADABLE = (SyntaxError, RecursionError, ValueError, MemoryError)


def cell_source(source: str) -> str | None:
    """A cell as plain Python: line magics and shell lines blanked; None for a cell magic."""
    if source.lstrip().startswith("%%"):
        return None
    lines = source.splitlines()
    return "\n".join("" if ln.lstrip().startswith(("%", "!")) else ln for ln in lines)


def parse_cell(source: str) -> ast.Module | None:
    """A cell's syntax tree (magics blanked; a cell magic is empty), or None if unreadable."""
    try:
        return ast.parse(cell_source(source) or "")
    except UNREADABLE:
        return None


@dataclass(frozen=True)
class StudentCode:
    """The student's ``name``, defined by running ``cells``: on a rank, never in the grader."""

    cells: Cells
    name: str

    def __reduce__(self) -> tuple:
        return (resolve, (self.cells, self.name))

    def __call__(self, *_args: Any, **_kwargs: Any) -> Any:
        raise RuntimeError(
            f"the grade cell called the student's {self.name} itself: when grading, a student's "
            "code runs only on ranks, so a grade cell must hand it to a check that runs it there "
            "(course.checks, e.g. check_returns)"
        )

    def __repr__(self) -> str:
        return f"<{self.name}, from the submitted notebook>"

    def stub_message(self) -> str | None:
        """ "<name> is not implemented yet: ..." when its definition is still the stub."""
        from course.checks.teaching import stub_text

        node = self._definition()
        if node is None:
            return None
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            return stub_text([self.name]) if _is_stub(node) else None
        methods = [n for n in node.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
        stubs = [f"{self.name}.{m.name}" for m in methods if _is_stub(m)]
        return stub_text(stubs) if stubs and len(stubs) == len(methods) else None

    def _definition(self) -> ast.AST | None:
        """The last top-level def or class of ``name`` in the cells."""
        found = None
        for _, source in self.cells:
            tree = parse_cell(source)
            for node in tree.body if tree else []:
                defs = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
                if isinstance(node, defs) and node.name == self.name:
                    found = node
        return found


def _is_stub(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """A body of only a docstring, ``pass`` and ``...`` (comments are not in the tree)."""
    return all(
        isinstance(s, ast.Pass) or (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))
        for s in fn.body
    )


_DEFINED: dict[Cells, tuple[dict[str, Any], list[str]]] = {}


def resolve(cells: Cells, name: str) -> Any:
    """On a rank: run the submitted cells once (per process) and return the student's ``name``.

    A cell that raises is noted and the next one runs, as "Run all" with errors allowed would.
    """
    if cells not in _DEFINED:
        namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}
        problems = []
        for label, source in cells:
            text = cell_source(source)
            if text is None:
                continue
            filename = f"<cell {label}>"
            linecache.cache[filename] = (len(text), None, text.splitlines(True), filename)
            try:
                exec(compile(text, filename, "exec", dont_inherit=True), namespace)  # noqa: S102 - the student's cell, on a confined rank
            except Exception as err:  # noqa: BLE001 - noted; the student's other cells still run
                problems.append(f"cell {label} raised {type(err).__name__}: {err}")
        _DEFINED[cells] = (namespace, problems)
    namespace, problems = _DEFINED[cells]
    if name not in namespace:
        why = f" ({'; '.join(problems)})" if problems else ""
        raise NameError(f"{name} is not defined by your notebook's cells{why}")
    return namespace[name]
