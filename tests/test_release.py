"""Golden test: release/ is exactly what `nbgrader generate_assignment` makes of source/."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

from course.instructor import commands, pipeline

REPO = Path(__file__).resolve().parent.parent


def _files(folder: Path) -> dict[Path, bytes]:
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """release/ regenerated from a copy of source/ by the real nbgrader command line."""
    root = pipeline.prepare_course(tmp_path_factory.mktemp("course"))
    commands.release(root)
    return root / "release"


@pytest.mark.nbgrader
def test_release_has_one_notebook_per_source_assignment(regenerated):
    """Does every source assignment, and nothing else, have its notebook in release/?"""
    expected = {Path(a) / f"{a}.ipynb" for a in commands.assignments(REPO)}
    assert {p for p in _files(REPO / "release") if p.suffix == ".ipynb"} == expected
    assert not [p for p in _files(REPO / "release") if p.suffix == ".py"], "never release the .py"


@pytest.mark.nbgrader
def test_release_equals_what_nbgrader_generates(regenerated):
    """Is each committed release file byte for byte what generate_assignment writes now?

    On a failure, regenerate with `make release` and commit release/: never edit it by hand.
    """
    made, kept = _files(regenerated), _files(REPO / "release")
    assert sorted(made) == sorted(kept), "run `make release`: release/ has other files"
    stale = [str(p) for p in made if made[p] != kept[p]]
    assert not stale, f"release/ is stale for {stale}: run `make release` and commit release/"


def test_release_notebooks_carry_no_outputs_and_no_answers():
    """Are the committed release notebooks clean: no outputs, no solutions, no hidden tests?"""
    for path in sorted((REPO / "release").glob("*/*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        for cell in nb.cells:
            assert "BEGIN SOLUTION" not in cell.source, path
            assert "HIDDEN TESTS" not in cell.source, path
            if cell.cell_type == "code":
                assert cell.outputs == [] and cell.execution_count is None, path
