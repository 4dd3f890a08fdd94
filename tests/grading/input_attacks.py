"""Submissions that attack what the judge reads: its replies, its parser, the notebook's data.

Each is an honest submission (wrong unless a test says otherwise) with one thing changed: a
cell's code, a cell's nbgrader metadata, or a markdown cell added. ``test_judge_input.py``
grades them through the real pipeline.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# A trace line the judge's JSON parser cannot finish: 100,000 "[" in the recorder's own log.
DEEP_TRACE = """
import gc

def ring_allreduce(tensor):
    for obj in gc.get_objects():
        log = getattr(obj, "_file", None) if type(obj).__name__ == "Recorder" else None
        if log is not None and not log.closed:
            log.write("[" * 100_000 + "\\n")
    tensor.mul_(0)
"""

# An expression the parser and the compiler take but ast.unparse cannot (nested too deeply):
# the near-copy comparison reads every definition the cells make.
DEEP_EXPRESSION = "def ring_allreduce(tensor):\n    x = " + "+".join(["tensor"] * 500) + "\n"

# An honest accumulation step that leaves the weights float64 (the model is float32).
FLOAT64_STEP = """
import torch

def accumulation_step(ddp, optimizer, micro_batches):
    k = len(micro_batches)
    with ddp.no_sync():
        for x, y in micro_batches[:-1]:
            (torch.nn.functional.mse_loss(ddp(x), y) / k).backward()
    x, y = micro_batches[-1]
    (torch.nn.functional.mse_loss(ddp(x), y) / k).backward()
    optimizer.step()
    optimizer.zero_grad()
    for p in ddp.module.parameters():
        p.data = p.data.double()
"""

# Markdown that would run script in whoever renders it, were it rendered live.
XSS_MARKDOWN = (
    "My notes.\n\n<img src=x onerror=\"fetch('/hub/api/token')\">\n\n"
    "<script>document.title = 'owned'</script>\n\n"
    '<a href="javascript:alert(1)" onclick="alert(2)">see</a>\n\n<svg onload=alert(3)></svg>'
)

Cell = dict[str, Any]


def nbgrader_meta(cell: Cell) -> dict[str, Any]:
    return cell["metadata"].setdefault("nbgrader", {})


def solution_as_grade(cells: list[Cell], gid: str) -> list[Cell]:
    """The student's solution cell ``gid`` marked as a grade cell worth 50 points."""
    for cell in cells:
        if cell["metadata"].get("nbgrader", {}).get("grade_id") == gid:
            nbgrader_meta(cell).update(grade=True, points=50)
    return cells


def duplicate_before(cells: list[Cell], gid: str) -> list[Cell]:
    """A copy of grade cell ``gid``, emptied and worth 100 points, placed before the real one."""
    out: list[Cell] = []
    for cell in cells:
        if cell["metadata"].get("nbgrader", {}).get("grade_id") == gid:
            copy = {**cell, "metadata": {**cell["metadata"]}, "source": "pass"}
            copy["metadata"]["nbgrader"] = {**cell["metadata"]["nbgrader"], "points": 100}
            out.append(copy)
        out.append(cell)
    return out


def delete(cells: list[Cell], gid: str) -> list[Cell]:
    """Grade cell ``gid`` deleted."""
    return [c for c in cells if c["metadata"].get("nbgrader", {}).get("grade_id") != gid]


def raise_points(cells: list[Cell], gid: str) -> list[Cell]:
    """Grade cell ``gid`` worth 100 points, unlocked, its check emptied."""
    for cell in cells:
        if cell["metadata"].get("nbgrader", {}).get("grade_id") == gid:
            nbgrader_meta(cell).update(points=100, locked=False)
            cell["source"] = "pass"
    return cells


def rename(cells: list[Cell], gid: str) -> list[Cell]:
    """Grade cell ``gid`` under an id the assignment does not have."""
    for cell in cells:
        if cell["metadata"].get("nbgrader", {}).get("grade_id") == gid:
            nbgrader_meta(cell)["grade_id"] = gid + "_mine"
    return cells


def meta_not_a_dict(cells: list[Cell]) -> list[Cell]:
    """A code cell of the student's own whose nbgrader metadata is a string."""
    cell = {"cell_type": "code", "metadata": {"nbgrader": "oops"}, "source": "x = 1",
            "outputs": [], "execution_count": None}  # fmt: skip
    return [*cells, cell]


def add_markdown(cells: list[Cell], text: str = XSS_MARKDOWN) -> list[Cell]:
    """A markdown cell of the student's own at the top."""
    return [{"cell_type": "markdown", "metadata": {}, "source": text}, *cells]


Edit = Callable[[list[Cell]], list[Cell]]
