"""Near copies of the course's own solutions: flagged for the instructor, never scored.

A student's function or class is a near copy when, docstrings, comments and annotations
aside and its own local names renamed in order of appearance, its syntax tree is the
solution's in the instructor's source notebook. The judge records what it finds in the
autograded notebook's metadata (``course.near_copies``); the grade table lists it.

:func:`shared_rules` asks the other question, of the code students are given: does any
function of it hold one of the solutions' rules (a solution function, or a loop, branch or
``with`` block inside one), whatever its names, with a line or two added around it?
"""

from __future__ import annotations

import ast
import difflib
import functools
import io
import json
import tokenize
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path

from course.grading.student import UNREADABLE, parse_cell

__all__ = ["course_solutions", "near_copies", "normalised", "shared_rules"]

Definition = ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef


def course_solutions(source_notebook: Path) -> list[str]:
    """The solution cells of the instructor's source notebook (the gradebook keeps only the
    released stubs); none when there is no such file."""
    try:
        nb = json.loads(source_notebook.read_text())
    except (OSError, ValueError):
        return []
    return [
        "".join(c["source"]) if isinstance(c.get("source"), list) else str(c.get("source", ""))
        for c in nb.get("cells", [])
        if c.get("metadata", {}).get("nbgrader", {}).get("solution")
    ]


def near_copies(student: Iterable[str], solutions: Iterable[str]) -> list[str]:
    """Names the student's cells define as near copies of the solutions' definitions (one
    the comparison cannot read, nested too deeply for ``ast.unparse``, is not one)."""
    theirs = _solution_forms(tuple(solutions))
    found = []
    for source in student:
        for d in _definitions(source):
            if d.name in theirs and d.name not in found and _readable(d) == theirs[d.name]:
                found.append(d.name)
    return found


@functools.lru_cache(maxsize=4)
def _solution_forms(solutions: tuple[str, ...]) -> dict[str, str]:
    """Each solution definition's normal form, by name: made once for many students' cells."""
    return {d.name: normalised(d) for source in solutions for d in _definitions(source)}


def _readable(node: Definition) -> str | None:
    """:func:`normalised`, or None for a definition it cannot read."""
    try:
        return normalised(node)
    except UNREADABLE:
        return None


def _definitions(source: str) -> list[Definition]:
    tree = parse_cell(source)
    if tree is None:
        return []
    defs = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    return [n for n in tree.body if isinstance(n, defs) and _has_code(n)]


def _has_code(node: Definition) -> bool:
    """More than a docstring and ``pass``: a released stub is nobody's copy."""
    body = [n for n in ast.walk(node) if isinstance(n, ast.stmt) and n is not node]
    return any(not isinstance(n, ast.Pass | ast.Expr) for n in body)


def normalised(node: Definition) -> str:
    """The definition's tree without docstrings and annotations, its local names canonical."""
    tree = _Strip().visit(ast.parse(ast.unparse(node)))
    bound = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and not _load(n)}
    bound |= {a.arg for a in ast.walk(tree) if isinstance(a, ast.arg)}
    names: dict[str, str] = {}
    for n in ast.walk(tree):
        if isinstance(n, ast.Name) and n.id in bound:
            n.id = names.setdefault(n.id, f"v{len(names)}")
        elif isinstance(n, ast.arg):
            n.arg = names.setdefault(n.arg, f"v{len(names)}")
    return ast.dump(tree, annotate_fields=False)


def _load(n: ast.Name) -> bool:
    return isinstance(n.ctx, ast.Load)


class _Strip(ast.NodeTransformer):
    """Drop docstrings (any bare string statement) and annotations."""

    def generic_visit(self, node: ast.AST) -> ast.AST:
        super().generic_visit(node)
        if isinstance(node, ast.arg):
            node.annotation = None
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            node.returns = None
        body = getattr(node, "body", None)
        if isinstance(body, list):
            kept = [s for s in body if not _is_string(s)]
            node.body = kept or [ast.Pass()]
        return node


def _is_string(s: ast.AST) -> bool:
    return (
        isinstance(s, ast.Expr)
        and isinstance(s.value, ast.Constant)
        and isinstance(s.value.value, str)
    )


# --- rules of the solutions, inside other code ----------------------------------------------

RULE_TOKENS = 40  # a rule shorter than this is an idiom, not a solution
RULE_SHARE = 0.8  # share of a rule's tokens found, in order, in another function
_BLOCKS = (ast.For, ast.While, ast.If, ast.With)
_SKIP = {tokenize.NEWLINE, tokenize.NL, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER}


def _functions(tree: ast.AST) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    return (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef))


def _shape(node: ast.AST, local: set[str]) -> list[str]:
    """The node's tokens with docstrings and annotations dropped and every local name ``_``
    (a function's own ``def`` line left out), so that renaming hides nothing."""
    tree = _Strip().visit(ast.parse(ast.unparse(node)))
    body = tree.body[0].body if isinstance(tree.body[0], ast.FunctionDef) else tree.body
    module = ast.Module(body=body, type_ignores=[])
    for n in ast.walk(module):
        if isinstance(n, ast.Name) and n.id in local:
            n.id = "_"
        elif isinstance(n, ast.arg):
            n.arg = "_"
    text = io.StringIO(ast.unparse(module))
    return [t.string for t in tokenize.generate_tokens(text.readline) if t.type not in _SKIP]


def _locals(fn: ast.AST) -> set[str]:
    bound = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and not _load(n)}
    return bound | {a.arg for a in ast.walk(fn) if isinstance(a, ast.arg)}


def _rules(source: str) -> Iterator[tuple[str, list[str]]]:
    """Each function of ``source``, and each block inside one, as (where, tokens)."""
    tree = parse_cell(source)
    for fn in _functions(tree) if tree is not None else ():
        local = _locals(fn)
        for node in [fn, *(n for n in ast.walk(fn) if isinstance(n, _BLOCKS))]:
            tokens = _shape(node, local)
            if len(tokens) >= RULE_TOKENS:
                yield f"{fn.name} (line {node.lineno})", tokens


def _found(rule: list[str], within: difflib.SequenceMatcher) -> float:
    """The share of ``rule``'s tokens found, in order, in ``within``'s second sequence."""
    within.set_seq1(rule)
    return sum(b.size for b in within.get_matching_blocks()) / len(rule)


def shared_rules(shipped: dict[str, str], solutions: Iterable[str]) -> list[str]:
    """Functions of the ``shipped`` modules (name -> source) that hold a solution's rule."""
    rules = [(where, rule, Counter(rule)) for s in solutions for where, rule in _rules(s)]
    found = []
    for module, source in shipped.items():
        tree = parse_cell(source)
        for fn in _functions(tree) if tree is not None else ():
            tokens = _shape(fn, _locals(fn))
            counts, within = Counter(tokens), difflib.SequenceMatcher(None, autojunk=False)
            within.set_seq2(tokens)  # what the matcher indexes, once for every rule
            found += [
                f"{module}: {fn.name} holds the solution's {where} ({share:.0%})"
                for where, rule, needs in rules
                # tokens held in order are held at all: a function without enough of the
                # rule's tokens, counted, cannot hold the rule, and is not compared
                if (needs & counts).total() >= RULE_SHARE * len(rule)
                and (share := _found(rule, within)) >= RULE_SHARE
            ]
    return found
