"""The house rules that keep the architecture easy to see: small modules, short functions."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "course"
MODULES = sorted(PACKAGE.rglob("*.py"))
MAX_MODULE_LINES, MAX_FUNCTION_LINES = 400, 60  # a module is one idea: cut by ideas, not size


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_modules_and_functions_stay_small(path: Path) -> None:
    """Is every module under 400 lines, and every function in it under 60?"""
    source = path.read_text()
    assert len(source.splitlines()) <= MAX_MODULE_LINES, "split this module by concept"
    long = [
        f"{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert not long, f"split these functions: {long}"


def test_every_subpackage_says_its_job() -> None:
    """Does each subpackage of course/ open with a docstring that says what it is for?"""
    for init in sorted(PACKAGE.glob("*/__init__.py")):
        assert ast.get_docstring(ast.parse(init.read_text())), init.parent.name
