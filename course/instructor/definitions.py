"""A solution cell's definitions only: what the re-check keeps of a student's cell.

Imports, ``def``/``class`` and literal assignments are kept; anything that runs code when it
is defined (a call in a default, a decorator, a class body's statements) is dropped and
named, and names the instructor's cells rely on cannot be rebound.
"""

from __future__ import annotations

import ast
import builtins
from collections.abc import Iterable

from course.ranks.magics import bound_names

__all__ = ["definitions_only", "judge_cells", "strip_magics"]

_BUILTIN_NAMES = frozenset(vars(builtins))  # as at import, before any student code


_UNSAFE = (ast.Call, ast.Lambda, ast.NamedExpr, ast.Await, ast.Yield, ast.YieldFrom)
_UNSAFE += (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


def _safe_expr(node: ast.AST | None) -> bool:
    """Does evaluating ``node`` at definition time run no code of the student's?"""
    return node is None or not any(isinstance(n, _UNSAFE) for n in ast.walk(node))


def _def_time_parts(node: ast.AST) -> Iterable[ast.AST | None]:
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        a = node.args
        yield from [*a.defaults, *a.kw_defaults, node.returns]
        yield from [x.annotation for x in [*a.posonlyargs, *a.args, *a.kwonlyargs]]
        yield from [a.vararg and a.vararg.annotation, a.kwarg and a.kwarg.annotation]
    elif isinstance(node, ast.ClassDef):
        yield from node.bases


def _allowed(node: ast.stmt, in_class: bool = False) -> bool:  # noqa: PLR0911 - a decision table, one return per kind of statement
    """Statements a solution cell may run at top level: definitions and literal values."""
    if isinstance(node, ast.Import | ast.ImportFrom | ast.Pass):
        return not in_class
    if isinstance(node, ast.Expr):
        return isinstance(node.value, ast.Constant)
    if isinstance(node, ast.Assign | ast.AnnAssign):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        try:
            ast.literal_eval(node.value) if node.value is not None else None
        except ValueError:
            return False
        return all(isinstance(t, ast.Name) for t in targets)
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        if node.decorator_list or (isinstance(node, ast.ClassDef) and node.keywords):
            return False
        if not all(_safe_expr(part) for part in _def_time_parts(node)):
            return False
        return not isinstance(node, ast.ClassDef) or all(_allowed(s, True) for s in node.body)
    return False


def definitions_only(
    source: str, reserved: set[str] = frozenset(), same_imports: set[str] = frozenset()
) -> tuple[str, list[str]]:
    """Keep a solution cell's imports, defs and literal assignments; say what was left out.

    ``reserved`` names (builtins, names the instructor's cells use) may not be rebound, so a
    solution cannot redefine ``all`` or ``check_answer`` under the checks; an import that
    repeats one of the instructor's (``same_imports``, as ``ast.dump``) may.
    """
    try:
        tree = ast.parse(source)
    except SyntaxError as err:
        return "", [f"the cell has a syntax error (line {err.lineno}): {err.msg}"]
    kept, dropped = [], []
    for node in tree.body:
        repeat = isinstance(node, ast.Import | ast.ImportFrom) and ast.dump(node) in same_imports
        clash = bound_names(node, deep=False) & reserved if _allowed(node) and not repeat else set()
        if _allowed(node) and not clash:
            kept.append(node)
        else:
            why = f"rebinds {', '.join(sorted(clash))}" if clash else "is not a definition"
            dropped.append(f"line {node.lineno} {why}")
    return ast.unparse(ast.Module(body=kept, type_ignores=[])), dropped


def _instructor_names(sources: Iterable[str]) -> tuple[set[str], set[str], set[str]]:
    """Names the instructor's cells read and bind, and their imports (magic lines skipped)."""
    reads, binds, imports = set(), set(), set()
    for source in sources:
        try:
            tree = ast.parse(strip_magics(source))
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Name):
                (reads if isinstance(node.ctx, ast.Load) else binds).add(node.id)
            elif isinstance(node, ast.Import | ast.ImportFrom):
                imports.add(ast.dump(node))
                binds.update((a.asname or a.name).split(".")[0] for a in node.names)
            elif isinstance(node, ast.FunctionDef | ast.ClassDef | ast.AsyncFunctionDef):
                binds.add(node.name)
    return reads, binds, imports


def strip_magics(source: str) -> str:
    """A cell's source without its IPython magic lines (%...), as plain Python."""
    return "\n".join("" if line.lstrip().startswith("%") else line for line in source.splitlines())


def judge_cells(cells: list[dict]) -> list[dict]:
    """Turn notebook cells into the re-check's program: setup, vetted solutions, grade cells.

    ``cells`` are ``{"kind": "setup"|"solution"|"grade", "grade_id", "source"}`` in notebook
    order; solution sources are reduced with :func:`definitions_only`.
    """
    instructor = [c["source"] for c in cells if c["kind"] != "solution"]
    reads, binds, imports = _instructor_names(instructor)
    expected = reads - binds - set(_BUILTIN_NAMES)  # what the checks take from the student
    reserved = (reads | binds | set(_BUILTIN_NAMES)) - expected
    out = []
    for cell in cells:
        if cell["kind"] == "solution":
            source, dropped = definitions_only(cell["source"], reserved, imports)
            out.append({**cell, "source": source, "dropped": dropped})
        else:
            out.append(dict(cell))
    return out
