"""The notebook as data: which cell is which comes from the gradebook, never from the notebook.

A student can edit any cell's nbgrader metadata: mark their solution cell as a grade cell,
raise a grade cell's points, copy a grade cell before the real one, delete one, rename one.
:class:`GradebookCells` runs first in nbgrader's autograde, before any of nbgrader's own
preprocessors reads that metadata, and rebuilds it from the gradebook:

* a cell whose ``grade_id`` the gradebook knows gets the gradebook's metadata (grade or
  solution, locked, points, cell type, checksum); a locked cell also gets its source back;
* a copy of a known cell: a locked one (the instructor's text) is dropped, a solution cell's
  copy stays as a cell of the student's own, without the id;
* nbgrader metadata with no grade id (not even a dict) is dropped: the cell is the
  student's own;
* nbgrader metadata under an id the gradebook does not know is dropped from a cell the
  student could have added, and refuses the notebook when it claims to be a locked or grade
  cell (an instructor's cell renamed): :class:`NotGradable`, with the reason;
* a grade cell missing from the notebook is put back, from the gradebook;
* a notebook whose code holds more than :data:`MAX_SOURCE` characters is refused.

A refusal is the submission's fault and says so (``course.grading.scratch`` reports it as
rejected, with the reason); the grader itself never fails on a notebook's structure.
"""

from __future__ import annotations

from typing import Any

__all__ = ["MAX_SOURCE", "NotGradable", "gradebook_cells", "restore_cells"]

MAX_SOURCE = 4 * 2**20  # characters of source in all the notebook's cells together


class NotGradable(ValueError):  # noqa: N818 - a verdict on the notebook, shown as its reason
    """A notebook that cannot be graded as handed in; the message is the reason."""


def gradebook_cells(record: Any) -> dict[str, dict[str, Any]]:
    """{grade_id: what the gradebook holds of that cell} for one notebook's record."""
    points = {c.name: c.max_score for c in record.grade_cells}
    solutions = {c.name for c in record.solution_cells}
    return {
        c.name: {"cell_type": c.cell_type, "locked": bool(c.locked), "source": c.source,
                 "checksum": c.checksum, "grade": c.name in points,
                 "points": points.get(c.name, 0.0), "solution": c.name in solutions}
        for c in record.source_cells
    }  # fmt: skip


def restore_cells(nb: Any, known: dict[str, dict[str, Any]]) -> list[str]:
    """Rebuild ``nb``'s nbgrader metadata from ``known`` in place (module docstring); what was
    changed, in words, for the log. Raises :class:`NotGradable` with the reason."""
    size = sum(len(str(c.get("source", ""))) for c in nb.cells)
    if size > MAX_SOURCE:
        raise NotGradable(
            f"the notebook's cells hold {size / 2**20:.1f} MiB of text, over the "
            f"{MAX_SOURCE // 2**20} MiB a notebook may hold: keep data in files, not in cells"
        )
    last = {_grade_id(c): i for i, c in enumerate(nb.cells) if _grade_id(c) in known}
    changes: list[str] = []
    kept = []
    for i, cell in enumerate(nb.cells):
        gid = _grade_id(cell)
        if gid is None and "nbgrader" in cell.get("metadata", {}):
            cell.metadata.pop("nbgrader")  # no cell of the gradebook's: the student's own
            kept.append(cell)
            changes.append(f"cell {i + 1}: nbgrader metadata without a grade id dropped")
        elif gid is None:
            kept.append(cell)
        elif gid not in known:
            kept.append(_unknown(cell, gid, i))
            changes.append(f"cell {i + 1}: metadata for unknown cell {gid!r} dropped")
        elif last[gid] != i and known[gid]["locked"]:
            changes.append(f"cell {i + 1}: a copy of {gid} dropped")
        elif last[gid] != i:
            cell.metadata.pop("nbgrader")
            kept.append(cell)
            changes.append(f"cell {i + 1}: a copy of {gid} kept as the student's own cell")
        else:
            kept.append(_restored(cell, gid, known[gid]))
    nb.cells = _put_back(kept, known, changes)
    return changes


def _put_back(cells: list, known: dict[str, dict[str, Any]], changes: list[str]) -> list:
    """``cells`` with every grade cell the gradebook has and they lack, from the gradebook,
    after the nearest cell before it (in the gradebook's order) that is there."""
    from nbformat.v4 import new_code_cell, new_markdown_cell

    order = list(known)
    for gid in order:
        present = [_grade_id(c) for c in cells]
        if not known[gid]["grade"] or gid in present:
            continue
        make = new_code_cell if known[gid]["cell_type"] == "code" else new_markdown_cell
        cell = _restored(make(source=known[gid]["source"]), gid, known[gid])
        before = [present.index(g) for g in order[: order.index(gid)] if g in present]
        cells.insert(max(before) + 1 if before else len(cells), cell)
        changes.append(f"grade cell {gid} was missing: put back from the gradebook")
    return cells


def _grade_id(cell: Any) -> str | None:
    meta = cell.get("metadata", {}).get("nbgrader")
    gid = meta.get("grade_id") if isinstance(meta, dict) else None
    return gid if isinstance(gid, str) else None


def _unknown(cell: Any, gid: str, index: int) -> Any:
    """A cell under an id the gradebook does not know: the student's, or refused."""
    meta = cell.metadata["nbgrader"]
    if meta.get("locked") or meta.get("grade"):
        raise NotGradable(
            f"cell {index + 1} claims to be the grade cell {gid[:80]!r}, which this assignment "
            "does not have (a renamed or invented grade cell): hand in a notebook made from "
            "the release, with its cells' ids as released"
        )
    cell.metadata.pop("nbgrader")
    return cell


def _restored(cell: Any, gid: str, known: dict[str, Any]) -> Any:
    """``cell`` with the gradebook's metadata (and its source, when the cell is locked)."""
    from nbformat.v4 import new_code_cell, new_markdown_cell

    source = known["source"] if known["locked"] else cell.get("source", "")
    if cell.get("cell_type") != known["cell_type"]:
        make = new_code_cell if known["cell_type"] == "code" else new_markdown_cell
        cell = make(source=source, metadata=cell.get("metadata", {}))
    cell.source = source
    cell.metadata["nbgrader"] = {
        "cell_type": known["cell_type"], "grade": known["grade"], "grade_id": gid,
        "locked": known["locked"], "schema_version": 3, "solution": known["solution"],
        "task": False,
        **({"points": known["points"]} if known["grade"] else {}),
        **({"checksum": known["checksum"]} if known["checksum"] else {}),
    }  # fmt: skip
    return cell


def _make_preprocessor() -> type:
    """Build :class:`GradebookCells` on first use: nbgrader is too heavy for every kernel."""
    from nbgrader.api import Gradebook
    from nbgrader.preprocessors import NbGraderPreprocessor

    class GradebookCells(NbGraderPreprocessor):
        """Rebuild a submitted notebook's nbgrader metadata from the gradebook (module doc)."""

        def preprocess(self, nb: Any, resources: dict) -> tuple[Any, dict]:
            info = resources["nbgrader"]
            with Gradebook(info["db_url"]) as gb:
                known = gradebook_cells(gb.find_notebook(info["notebook"], info["assignment"]))
            for change in restore_cells(nb, known):
                self.log.warning("%s", change)
            return nb, resources

    GradebookCells.__module__ = __name__
    return GradebookCells


_LAZY: dict[str, type] = {}


def __getattr__(name: str) -> type:
    if name == "GradebookCells":
        return _LAZY.setdefault(name, _make_preprocessor())
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
