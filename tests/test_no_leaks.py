"""Nothing a student can read (release/, the course package) gives a quiz answer away."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

from course.instructor.selfstudy import grade_id, hidden_region, quiz_items

REPO = Path(__file__).resolve().parent.parent
SOURCES = sorted(p for p in (REPO / "source").glob("*/*.ipynb") if p.stem == p.parent.name)
KEY_ARGUMENT = re.compile(r"""\bkey\s*=\s*["'][a-z]["']""")
_SOLUTION = re.compile(r"### BEGIN SOLUTION\n(.*?)\n\s*### END SOLUTION", re.DOTALL)


def _flat(text: str) -> str:
    return " ".join(text.split())


def _readable_text(path: Path) -> str:
    """What a student can read in a file: for a notebook, its cells' sources and outputs."""
    if path.suffix != ".ipynb":
        return path.read_text(errors="replace")
    nb = nbformat.read(path, as_version=4)
    parts = []
    for cell in nb.cells:
        parts.append(cell.source)
        parts += [str(o.get("text", "")) + str(o.get("data", "")) for o in cell.get("outputs", [])]
    return "\n".join(parts)


def _student_readable() -> dict[str, str]:
    files = [p for p in (REPO / "release").rglob("*") if p.is_file()]
    files += list((REPO / "course").rglob("*.py"))
    return {str(p.relative_to(REPO)): _readable_text(p) for p in sorted(files)}


READABLE = _student_readable()
FLAT = {name: _flat(text) for name, text in READABLE.items()}


def _sentences(text: str) -> list[str]:
    """The explanation's sentences long enough to be a giveaway if quoted anywhere."""
    return [s for s in re.split(r"(?<=[.:;!?])\s+", _flat(text)) if len(s) >= 30]


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.stem)
def test_source_notebook_has_keys_to_protect(path):
    """Does each source notebook key its quiz items (so the checks below are not vacuous)?"""
    items = quiz_items(nbformat.read(path, as_version=4))
    assert items, f"{path.name}: no keyed check_answer call found in a hidden test region"
    assert all(item.explanation for item in items), "every key should come with its explanation"


def test_no_key_argument_anywhere_a_student_can_read():
    """Is there no `key="x"` (a keyed check_answer call) in release/ or course/?"""
    found = {name: KEY_ARGUMENT.findall(text) for name, text in READABLE.items()}
    assert not {k: v for k, v in found.items() if v}


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.stem)
def test_no_explanation_sentence_in_release_or_package(path):
    """Does no sentence of any hidden explanation appear in release/ or course/?"""
    leaks = [
        (item.item_id, sentence[:50], name)
        for item in quiz_items(nbformat.read(path, as_version=4))
        for sentence in _sentences(item.explanation)
        for name, text in FLAT.items()
        if sentence in text
    ]
    assert not leaks


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.stem)
def test_no_answer_assignment_or_hidden_test_in_release(path):
    """Are the answer lines (answer_x = "c") and hidden test blocks absent from release/?"""
    source = nbformat.read(path, as_version=4)
    release = FLAT.get(f"release/{path.parent.name}/{path.name}", "")
    assert release, f"no release notebook for {path.name}: run `make release`"
    for item in quiz_items(source):
        for quote in "\"'":
            assert f"{item.name} = {quote}{item.key}{quote}" not in release, item.item_id
    for cell in source.cells:
        hidden = _flat(hidden_region(cell.source))
        assert not hidden or hidden not in release, grade_id(cell)
        for solution in _SOLUTION.findall(cell.source):
            body = _flat(solution)
            assert len(body) < 20 or body not in release, grade_id(cell)


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.stem)
def test_no_solution_body_in_the_package(path):
    """Does no exercise's solution (its body, from a solution region) appear in course/?"""
    package = {name: text for name, text in FLAT.items() if name.startswith("course/")}
    for cell in nbformat.read(path, as_version=4).cells:
        for solution in _SOLUTION.findall(cell.source):
            body = _flat(solution)
            if len(body) < 40 or body.startswith("answer_"):
                continue
            assert not [name for name, text in package.items() if body in text], grade_id(cell)


def test_the_checks_would_catch_a_leak():
    """Would a quoted explanation sentence, a key argument or a hidden block be caught?"""
    sentence = "Each rank sends one chunk of size S/N per step, for 2(N-1) steps in all."
    leaky = _flat(f'print("{sentence}")\ncheck_answer("answer_x", answer_x, key="c")')
    assert KEY_ARGUMENT.search(leaky)
    assert all(s in leaky for s in _sentences(sentence))
    assert _flat(hidden_region("a\n### BEGIN HIDDEN TESTS\nb = 1\n### END HIDDEN TESTS")) == "b = 1"


def test_package_defines_no_sharded_solution():
    """Does the package define none of the zero and synchrony exercises (they are the
    student's to write)?"""
    import importlib
    import pkgutil

    import course

    exercises = {"reduce_scatter", "all_gather", "ZeroOptimizer", "ef_fp16_hook"}
    exercises |= {"tree_allreduce", "hierarchical_allreduce"}
    found = []
    for info in pkgutil.walk_packages(course.__path__, "course."):
        module = importlib.import_module(info.name)
        found += [f"{info.name}.{n}" for n in exercises if callable(getattr(module, n, None))]
    assert not found
    definitions = re.compile(
        r"^\s*(def (reduce_scatter|all_gather|tree_allreduce|hierarchical_allreduce)\("
        r"|class ZeroOptimizer\b)",
        re.MULTILINE,
    )
    assert not [n for n, t in READABLE.items() if n.startswith("course/") and definitions.search(t)]
