"""What an autograded notebook says: each failing cell's error, as the student reads it."""

from __future__ import annotations

from pathlib import Path

import nbformat

from course.instructor.selfstudy import grade_id


def autograded_errors(root: Path, student: str, assignment: str) -> dict[str, str]:
    """Each failing cell's grade_id -> its error name and message, in the autograded notebook."""
    nb = nbformat.read(root / "autograded" / student / assignment / f"{assignment}.ipynb", 4)
    return {
        grade_id(c) or "?": f"{o.ename}: {o.evalue}"
        for c in nb.cells
        for o in c.get("outputs", [])
        if o.output_type == "error"
    }
