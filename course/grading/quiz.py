"""Quiz answers read from the submitted notebook's text: graded without running a line of it.

An answer counts when the student's cells assign one string literal to its name
(``answer_ring_1 = "b"``; case and spaces around the letter do not matter), at top level, in
one cell. Anything else (an expression, a call, an f-string, the name bound again in another
cell or in any other way, no assignment at all) scores 0 with a message saying the form the
grader reads. The key comes from the grade cell's hidden part, as the gradebook holds it.
"""

from __future__ import annotations

import ast
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
        text = cell_source(source)
        try:
            tree = ast.parse(text or "")
        except UNREADABLE as err:
            if name in (text or ""):
                line = getattr(err, "lineno", None) or "?"
                other.append(f"cell {label} is not Python the grader can read (line {line})")
            continue
        literal = [n for n in tree.body if _literal(n, name)]
        accepted += [(label, n.value.value) for n in literal]
        allowed = {id(n.targets[0] if isinstance(n, ast.Assign) else n.target) for n in literal}
        lines = (text or "").splitlines()
        other += [
            f"cell {label}, line {node.lineno}: {lines[node.lineno - 1].strip()[:80]}"
            for node in _bindings(tree, name)
            if id(node) not in allowed
        ]
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


def _literal(node: ast.stmt, name: str) -> bool:
    """``name = "..."`` (or ``name: str = "..."``) with a plain string literal."""
    if isinstance(node, ast.Assign):
        target, value = (node.targets[0] if len(node.targets) == 1 else None), node.value
    elif isinstance(node, ast.AnnAssign):
        target, value = node.target, node.value
    else:
        return False
    named = isinstance(target, ast.Name) and target.id == name
    return named and isinstance(value, ast.Constant) and isinstance(value.value, str)


def _bindings(tree: ast.AST, name: str) -> list[ast.AST]:
    """Every node that binds (or deletes, or declares global) ``name``, at any depth."""
    named = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.ExceptHandler)
    named += (ast.MatchAs, ast.MatchStar)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            hit = node.id == name and not isinstance(node.ctx, ast.Load)
        elif isinstance(node, ast.Global | ast.Nonlocal):
            hit = name in node.names
        elif isinstance(node, ast.alias):
            hit = (node.asname or node.name.split(".")[0]) == name
        else:
            hit = isinstance(node, named) and node.name == name
        if hit:
            found.append(node)
    return found
