"""The definitions-only re-check (definitions, rejudge) and the in-kernel tamper check."""

from __future__ import annotations

import builtins
import json
import subprocess
import sys
from pathlib import Path

import pytest

import course.ring.schedule
from course.instructor.definitions import definitions_only, judge_cells
from course.instructor.integrity import check_integrity
from course.instructor.rejudge import run_judge

FIXTURE = Path(__file__).parents[1] / "fixtures" / "tamper" / "source" / "tamper" / "tamper.ipynb"


def fixture_cells(**replace: str) -> list[dict]:
    """The fixture notebook as re-check cells (the source version: right answers)."""
    cells = []
    for cell in json.loads(FIXTURE.read_text())["cells"]:
        meta = cell["metadata"]["nbgrader"]
        if cell["cell_type"] != "code":
            continue
        kind = "solution" if meta["solution"] else "grade" if meta["grade"] else "setup"
        source = replace.get(meta["grade_id"], "".join(cell["source"]))
        cells.append({"kind": kind, "grade_id": meta["grade_id"], "source": source})
    return cells


def test_definitions_only_keeps_definitions() -> None:
    """Are imports, defs, classes and literal answers kept as written?"""
    source = 'import math\nanswer_x = "b"\n\n\ndef f(t, n=2):\n    return t * n\n'
    kept, dropped = definitions_only(source)
    assert dropped == []
    namespace: dict = {}
    exec(kept, namespace)  # noqa: S102 - the definitions the re-check keeps
    assert namespace["answer_x"] == "b" and namespace["f"](3) == 6


@pytest.mark.parametrize(
    "line",
    [
        'get_ipython().input_transformers_post.append(lambda lines: ["pass\\n"])',
        "answer_x = str('b')",
        "@staticmethod\ndef f():\n    pass",
        "def f(x=__import__('os').system('true')):\n    pass",
        "def f(x: print('annotation runs at def time')):\n    pass",
        "class C(metaclass=type):\n    pass",
        "class C:\n    print('class bodies run at def time')",
        "for i in range(3):\n    pass",
        "x = [i for i in range(3)]",
    ],
)
def test_definitions_only_drops_code_that_runs(line: str) -> None:
    """Is every statement that would run student code at definition time left out?"""
    kept, dropped = definitions_only(line)
    assert kept == "" and len(dropped) == 1


def test_definitions_only_protects_reserved_names() -> None:
    """Can a solution not rebind a name the checks use, except by repeating their import?"""
    reserved = {"run", "torch", "all"}
    same = {definitions_only_dump("import torch")}
    source = "import torch\nimport numpy as torch\ndef run():\n    pass\ndef all(x):\n    pass\n"
    kept, dropped = definitions_only(source, reserved, same)
    assert kept == "import torch"
    assert [d.split()[-1] for d in dropped] == ["torch", "run", "all"]


def definitions_only_dump(source: str) -> str:
    import ast

    return ast.dump(ast.parse(source).body[0])


def test_judge_cells_reserves_what_the_checks_use() -> None:
    """Does the re-check keep the student's answer and function but drop a shadowed ``run``?"""
    shadow = 'answer_tamper_1 = "b"\n\n\ndef run(*a, **k):\n    return []\n'
    cells = judge_cells(fixture_cells(tamper_1_answer=shadow))
    answer = next(c for c in cells if c["grade_id"] == "tamper_1_answer")
    assert answer["source"] == "answer_tamper_1 = 'b'"
    assert answer["dropped"] == ["line 4 rebinds run"]


@pytest.mark.ranks
@pytest.mark.slow
def test_run_judge_gives_honest_and_attacked_verdicts() -> None:
    """Does the re-check pass the right solution and fail a transformer attack with a stub?"""
    assert run_judge(judge_cells(fixture_cells()), sandbox=False) == {
        "tamper_1_check": (True, ""),
        "allreduce_sum_check": (True, ""),
    }
    attack = 'answer_tamper_1 = "a"\nget_ipython().input_transformers_post.append(lambda l: [])\n'
    stub = 'def allreduce_sum(tensor):\n    """Sum."""\n'
    verdicts = run_judge(
        judge_cells(fixture_cells(tamper_1_answer=attack, allreduce_sum=stub)), sandbox=False
    )
    assert not verdicts["tamper_1_check"][0] and "is not right" in verdicts["tamper_1_check"][1]
    assert not verdicts["allreduce_sum_check"][0]
    assert "every rank should get" in verdicts["allreduce_sum_check"][1]


def test_check_integrity_is_quiet_when_nothing_changed() -> None:
    """Does an unaltered interpreter pass the tamper check?

    In a fresh process: the check compares functions with their files on disk, so a module
    edited after this test process imported it would (rightly) be reported.
    """
    code = (
        "import course.instructor.integrity, course.ranks, course.checks.answers\n"
        "import torch.distributed\n"
        "print(course.instructor.integrity.check_integrity())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_check_integrity_sees_patched_builtins() -> None:
    """Is a replaced builtin reported by name?"""
    real = builtins.isinstance
    builtins.isinstance = lambda *_: True  # restored at once: pytest itself needs the real one
    try:
        problems = check_integrity()
    finally:
        builtins.isinstance = real
    assert "builtins.isinstance was replaced" in problems


def test_check_integrity_sees_patched_course_function(monkeypatch: pytest.MonkeyPatch) -> None:
    """Is a course function whose code was swapped reported, and a replaced one too?"""
    monkeypatch.setattr(course.ring.schedule.chunk_bounds, "__code__", (lambda _n, _w: []).__code__)
    assert "course.ring.schedule.chunk_bounds was patched" in check_integrity()


def test_check_integrity_sees_replaced_module(monkeypatch: pytest.MonkeyPatch) -> None:
    """Is a ``sys.modules['course...']`` entry swapped for another module reported?"""
    import types

    from course.instructor import integrity

    name = next(iter(integrity._PRISTINE_MODULES))  # noqa: SLF001 - the list the check walks
    monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    assert f"sys.modules[{name!r}] was replaced" in check_integrity()


def test_check_integrity_sees_input_transformer() -> None:
    """In an IPython shell, is an added input transformer (the cells-to-pass attack) seen?"""
    code = (
        "from IPython.core.interactiveshell import InteractiveShell\n"
        "sh = InteractiveShell.instance()\n"
        "import course.instructor.integrity as I\n"
        "assert I.check_integrity() == [], I.check_integrity()\n"
        "sh.input_transformers_post.append(lambda lines: ['pass\\n'])\n"
        "print(I.check_integrity())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "input_transformers_post changed" in out.stdout
