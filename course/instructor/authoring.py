"""Source notebooks are written as jupytext percent scripts; this turns them into notebooks.

    .venv/bin/python -m course.instructor.authoring   # source/<a>/<a>.py -> source/<a>/<a>.ipynb

The script is what authors edit and review (nbgrader metadata sits on each ``# %%`` line);
the ``.ipynb`` beside it is generated, without outputs, and is what nbgrader reads. Only
``source/`` is paired: ``release/`` notebooks carry no jupytext metadata, so a student's
JupyterLab never writes a paired script next to them.
"""

from __future__ import annotations

import sys
from pathlib import Path

import jupytext
import nbformat
from nbformat import NotebookNode

__all__ = ["build_notebook", "sources", "sync"]

SOURCE = Path(__file__).resolve().parents[2] / "source"


def sources(root: Path = SOURCE) -> list[Path]:
    """Every authored script: ``source/<a>/<a>.py``."""
    return sorted(p for p in root.glob("*/*.py") if p.stem == p.parent.name)


def build_notebook(script: Path) -> NotebookNode:
    """The notebook a percent script describes: no jupytext metadata, no outputs, stable ids."""
    nb = jupytext.read(script)
    nb.metadata.pop("jupytext", None)
    for cell in nb.cells:
        cell.id = cell.metadata["nbgrader"]["grade_id"]  # stable ids: no churn on rebuild
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    return nb


def sync(root: Path = SOURCE) -> list[Path]:
    """Write every script's notebook beside it; return the notebooks that changed."""
    changed = []
    for script in sources(root):
        target = script.with_suffix(".ipynb")
        text = nbformat.writes(build_notebook(script)) + "\n"
        if not target.exists() or target.read_text() != text:
            target.write_text(text)
            changed.append(target)
    return changed


if __name__ == "__main__":
    for path in sync(Path(sys.argv[1]) if len(sys.argv) > 1 else SOURCE):
        print(f"wrote {path}")
