"""Source notebooks: generated from their scripts, committed clean."""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest

from course.instructor.authoring import build_notebook, sources

SCRIPTS = sources()


def test_every_assignment_has_a_script() -> None:
    """Is each source assignment authored as a script beside its notebook?"""
    names = {p.parent.name for p in SCRIPTS}
    assert "ring_allreduce" in names
    for script in SCRIPTS:
        assert script.with_suffix(".ipynb").exists(), (
            f"run: python -m course.instructor.authoring ({script})"
        )


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.parent.name)
def test_committed_notebook_matches_its_script(script: Path) -> None:
    """Is the committed .ipynb exactly what its script generates (course.instructor.authoring)?"""
    committed = nbformat.read(script.with_suffix(".ipynb"), as_version=4)
    expected = build_notebook(script)
    assert [c.source for c in committed.cells] == [c.source for c in expected.cells]
    assert [c.metadata for c in committed.cells] == [c.metadata for c in expected.cells]
    assert committed.metadata == expected.metadata


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.parent.name)
def test_source_notebook_has_no_outputs_and_no_pairing(script: Path) -> None:
    """Is the source notebook free of outputs, execution counts and jupytext pairing?"""
    nb = json.loads(script.with_suffix(".ipynb").read_text())
    assert "jupytext" not in nb["metadata"]
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            assert cell["outputs"] == [] and cell["execution_count"] is None


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.parent.name)
def test_every_cell_has_nbgrader_metadata_with_a_unique_id(script: Path) -> None:
    """Does every cell carry nbgrader metadata, with grade_ids unique in the notebook?"""
    nb = build_notebook(script)
    ids = [c.metadata["nbgrader"]["grade_id"] for c in nb.cells]
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)
