"""Quiz answers read from the submitted notebook's text: graded without running a line of it.

An answer counts when the student's cells assign one string literal to its name
(``answer_ring_1 = "b"``; case and spaces around the letter do not matter), at top level, in
one cell. Anything else (an expression, a call, an f-string, the name bound again in another
cell or in any other way, no assignment at all) scores 0 with a message saying the form the
grader reads. The key comes from the grade cell's hidden part, as the gradebook holds it.
"""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass
from typing import Any

from course.checks.answers import answer_verdict
from course.grading.student import UNREADABLE, cell_source, parse_cell

__all__ = ["quiz_call", "quiz_verdict", "read_answer"]

Cells = list[tuple[str, str]]  # (label, source) of the cells the student could edit


def quiz_call(grade_source: str) -> dict[str, Any] | None:
    """The arguments of a grade cell's ``check_answer`` call (the keyed one, if there is one)."""
    tree = parse_cell(grade_source)
    calls = []
    for node in tree.body if tree else []:
        call = node.value if isinstance(node, ast.Expr) else None
        func = getattr(call, "func", None)
        if isinstance(func, ast.Name) and func.id == "check_answer" and call.args:
            found = {"name": ast.literal_eval(call.args[0])}
            found |= {k.arg: ast.literal_eval(k.value) for k in call.keywords if k.arg}
            calls.append(found)
    keyed = [c for c in calls if c.get("key") is not None]
    return (keyed or calls or [None])[-1]


def quiz_verdict(cells: Cells, call: dict[str, Any]) -> str:
    """What the student reads for a right answer; an AssertionError that says why otherwise."""
    name = call["name"]
    value = read_answer(cells, name)
    return answer_verdict(
        name, value, call.get("choices", "abcd"), call.get("key"), call.get("explanation")
    )


def _form(name: str) -> str:
    return f'write it as {name} = "a" (one letter in quotes, nothing else), in its answer cell'


def read_answer(cells: Cells, name: str) -> str:
    """The string literal the student's cells assign to ``name``, read without running them."""
    accepted: list[tuple[str, str]] = []
    other: list[str] = []
    for label, source in cells:
        cell = _read_cell(source)
        if cell.error is not None:
            if name in source:
                other.append(f"cell {label} is not Python the grader can read ({cell.error})")
            continue
        accepted += [(label, value) for value in cell.literals.get(name, ())]
        other += [f"cell {label}, {where}" for where in cell.others.get(name, ())]
    if other:
        raise AssertionError(
            f"{name} is set in a way the grader does not read ({other[0]}): {_form(name)}."
        )
    if not accepted:
        raise AssertionError(f"{name} is not set anywhere in your notebook: {_form(name)}.")
    if len({label for label, _ in accepted}) > 1:
        where = ", ".join(dict.fromkeys(label for label, _ in accepted))
        raise AssertionError(f"{name} is set in more than one cell ({where}): {_form(name)}.")
    return accepted[-1][1]


@dataclass(frozen=True)
class _Cell:
    """What one cell's text binds, read once however many quiz items look at it."""

    error: str | None  # why it is not Python the grader can read
    literals: dict[str, tuple[str, ...]]  # name -> the string literals assigned at top level
    others: dict[str, tuple[str, ...]]  # name -> "line N: ..." of every other binding


@functools.lru_cache(maxsize=64)
def _read_cell(source: str) -> _Cell:
    """Parse a cell once (a cell of megabytes beside an answer costs one parse, not one per
    item); the cache holds what each name is bound to."""
    text = cell_source(source)
    try:
        tree = ast.parse(text or "")
    except UNREADABLE as err:
        return _Cell(f"line {getattr(err, 'lineno', None) or '?'}", {}, {})
    literals: dict[str, list[str]] = {}
    allowed = set()
    for node in tree.body:
        name = _literal(node)
        if name is not None:
            literals.setdefault(name, []).append(node.value.value)
            allowed.add(id(node.targets[0] if isinstance(node, ast.Assign) else node.target))
    lines = (text or "").splitlines()
    others: dict[str, list[str]] = {}
    for name, node in _bindings(tree):
        if id(node) not in allowed:
            line = f"line {node.lineno}: {lines[node.lineno - 1].strip()[:80]}"
            others.setdefault(name, []).append(line)
    return _Cell(
        None,
        {k: tuple(v) for k, v in literals.items()},
        {k: tuple(v) for k, v in others.items()},
    )


def _literal(node: ast.stmt) -> str | None:
    """The name of ``name = "..."`` (or ``name: str = "..."``) with a plain string literal."""
    if isinstance(node, ast.Assign):
        target, value = (node.targets[0] if len(node.targets) == 1 else None), node.value
    elif isinstance(node, ast.AnnAssign):
        target, value = node.target, node.value
    else:
        return None
    named = isinstance(target, ast.Name)
    literal = isinstance(value, ast.Constant) and isinstance(value.value, str)
    return target.id if named and literal else None


def _bindings(tree: ast.AST) -> list[tuple[str, ast.AST]]:
    """(name, node) for every node that binds, deletes or declares global a name, at any depth."""
    named = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.ExceptHandler)
    named += (ast.MatchAs, ast.MatchStar)
    found: list[tuple[str, ast.AST]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            if not isinstance(node.ctx, ast.Load):
                found.append((node.id, node))
        elif isinstance(node, ast.Global | ast.Nonlocal):
            found += [(n, node) for n in node.names]
        elif isinstance(node, ast.alias):
            found.append((node.asname or node.name.split(".")[0], node))
        elif isinstance(node, named) and isinstance(getattr(node, "name", None), str):
            found.append((node.name, node))
    return found
