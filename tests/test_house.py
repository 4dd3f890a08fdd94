"""The house rules that keep the architecture easy to see: one idea per module, no circles.

The package's rooms stand on floors, machinery below and lessons above it; a module may
import only from its own room or from a room on a lower floor. Imports are read from the
source, lazy ones and those only a type checker sees included: each is a dependency a reader
has to follow.
"""

from __future__ import annotations

import ast
import importlib
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "course"
MODULES = sorted(PACKAGE.rglob("*.py"))
MAX_MODULE_LINES, MAX_FUNCTION_LINES = 400, 60  # a module is one idea: cut by ideas, not size
LESSONS = sorted(p.parent.name for p in (PACKAGE / "lessons").glob("*/__init__.py"))
# Bottom to top. A lesson is a room of its own, and lessons share a floor: none imports
# another (what two lessons share moves down). Grading shares it too: it finds a lesson's
# checks through the notebook's own import cell, never by importing a lesson.
FLOORS: list[set[str]] = [
    {"ranks"},
    {"ring", "exports", "models"},
    {"checks"},
    {"pictures"},
    {"grading", *(f"lessons.{lesson}" for lesson in LESSONS)},
    {"instructor"},
    {"", "lessons"},  # the package itself (``%load_ext course``) and the lessons' index
]


def _module(path: Path) -> str:
    """``course/lessons/fsdp/check.py`` -> ``course.lessons.fsdp.check``."""
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


NAMES = {_module(p): p for p in MODULES}


def _imports(path: Path) -> Iterator[str]:
    """The course modules ``path`` imports, wherever the import stands (a name imported from a
    package counts as its submodule when it is one)."""
    here = _module(path).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names if a.name.split(".")[0] == "course")
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            if base.split(".")[0] != "course":
                continue
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                yield sub if sub in NAMES else base


def _room(module: str) -> str:
    """The room a module stands in: ``course.lessons.fsdp.check`` -> ``lessons.fsdp``."""
    parts = module.split(".")[1:]
    if parts[:1] == ["lessons"] and len(parts) > 1:
        return ".".join(parts[:2])
    return parts[0] if parts else ""


def _floor(room: str) -> int:
    return next(i for i, rooms in enumerate(FLOORS) if room in rooms)


GRAPH = {name: set(_imports(path)) & set(NAMES) - {name} for name, path in NAMES.items()}


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


def test_every_room_has_a_floor() -> None:
    """Does every module stand in a room the floor plan names?"""
    rooms = {_room(name) for name in NAMES}
    assert rooms <= set().union(*FLOORS), f"rooms with no floor: {rooms - set().union(*FLOORS)}"


def test_no_arrow_runs_back_up() -> None:
    """Does every import stay in its room or go down a floor (no lesson imports another)?"""
    upward = sorted(
        f"{a} -> {b}"
        for a, targets in GRAPH.items()
        for b in targets
        if _room(a) != _room(b) and _floor(_room(b)) >= _floor(_room(a))
    )
    assert not upward, "imports that run up or sideways:\n" + "\n".join(upward)


def test_no_circles() -> None:
    """Is the module graph free of circles (Tarjan's strongly connected components)?"""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
            if len(component) > 1:
                circles.append(sorted(component))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    assert not circles, f"modules that import each other, round a circle: {circles}"


@pytest.mark.parametrize("init", sorted(PACKAGE.rglob("__init__.py")), ids=str)
def test_every_package_says_its_job_and_what_it_offers(init: Path) -> None:
    """Does each package open with a docstring that says what it is for, and list ``__all__``?"""
    tree = ast.parse(init.read_text())
    assert ast.get_docstring(tree), f"{init.parent.name}: say what this package is for"
    names = {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets}
    assert "__all__" in names, f"{init.parent.name}: list what it offers in __all__"


@pytest.mark.parametrize("lesson", LESSONS)
def test_a_lesson_offers_what_it_lists(lesson: str) -> None:
    """Does every name in a lesson's ``__all__`` resolve, each from the module its table says?"""
    package = importlib.import_module(f"course.lessons.{lesson}")
    assert sorted(package.__all__) == sorted(package.EXPORTS.names)
    for name in package.__all__:
        value, where = getattr(package, name), package.EXPORTS.module_of(name)
        module = importlib.import_module(where)
        assert value is module or vars(module).get(name) is value, f"{name} is not {where}'s"
