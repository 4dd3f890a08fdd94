"""The real nbgrader command line, run in a course root: release, autograde, feedback, export.

Every step is ``python -m nbgrader ...`` in a folder holding the course's ``nbgrader_config.py``
(so a test can run it in a temporary copy), with the venv's ``bin`` on PATH: nbgrader runs
``alembic`` when it creates a gradebook, in its own process or in ours
(``course.grading.gradebook.open_gradebook``).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import nbformat

from course.grading.gradebook import env
from course.instructor.selfstudy import grade_id

__all__ = [
    "CellError",
    "assignments",
    "execute",
    "export",
    "feedback",
    "gradebook_url",
    "nbgrader",
    "noteworthy",
    "release",
    "say",
]


def say(text: str) -> None:
    print(text, flush=True)


def assignments(root: Path) -> list[str]:
    """Assignment ids of a course: folders ``source/<a>/`` holding ``<a>.ipynb``."""
    return sorted(
        p.parent.name for p in (root / "source").glob("*/*.ipynb") if p.stem == p.parent.name
    )


def noteworthy(line: str) -> bool:
    """Whether an nbgrader log line is worth showing (warnings and errors, less known noise)."""
    # nbgrader warns about the checksum of every cell with hidden tests (it stores the
    # checksum before clearing them): expected, so not shown.
    noise = ("Attribute 'checksum'", "Removing existing assignment")
    return ("| WARNING]" in line or "| ERROR]" in line) and not any(n in line for n in noise)


def nbgrader(
    root: Path, *args: str, on_line: Callable[[str], object] | None = None, check: bool = True
) -> str:
    """Run ``nbgrader <args>`` in course ``root`` (its nbgrader_config.py); return its log.

    Streams the log line by line to ``on_line`` (default: print warnings and errors) and,
    with ``check``, raises RuntimeError with the log's tail if nbgrader fails.
    """
    cmd = [sys.executable, "-m", "nbgrader", *args]
    on_line = on_line or (lambda line: noteworthy(line) and say("    " + line))
    log = []
    with subprocess.Popen(
        cmd, cwd=root, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    ) as proc:
        for line in proc.stdout:
            log.append(line.rstrip("\n"))
            on_line(log[-1])
    if check and proc.returncode != 0:
        raise RuntimeError(
            f"`nbgrader {' '.join(args)}` failed in {root} (exit {proc.returncode}):\n"
            + "\n".join(log[-40:])
        )
    return "\n".join(log)


def gradebook_url(root: Path) -> str:
    """The SQLAlchemy URL of a course root's nbgrader gradebook."""
    return f"sqlite:///{Path(root).resolve() / 'gradebook.db'}"


def release(root: Path, assignment: str = "*") -> list[Path]:
    """``nbgrader generate_assignment '*' --force``: every source assignment (or the one
    named) into release/."""
    nbgrader(root, "generate_assignment", assignment, "--force")
    return sorted((root / "release").glob(f"{assignment}/*.ipynb"))


def feedback(root: Path) -> list[Path]:
    """``nbgrader generate_feedback '*' --force``: one HTML page per graded notebook."""
    nbgrader(root, "generate_feedback", "*", "--force")
    return sorted((root / "feedback").glob("*/*/*.html"))


def export(root: Path) -> Path:
    """``nbgrader export``: the gradebook as CSV in build/grades.csv."""
    dest = root / "build" / "grades.csv"
    dest.parent.mkdir(parents=True, exist_ok=True)
    nbgrader(root, "export", "--to", str(dest))
    return dest


# --- running notebooks -----------------------------------------------------------------------


@dataclass(frozen=True)
class CellError:
    """An error a notebook cell raised while running top to bottom."""

    notebook: str
    grade_id: str | None
    ename: str
    message: str

    @property
    def expected(self) -> bool:
        """A check's own failure (CheckFailed, an AssertionError, its message teaches); any
        other error is a bug. As released, a notebook raises neither."""
        return self.ename in ("AssertionError", "CheckFailed")


def execute(path: Path, out: Path | None = None, timeout: int = 120) -> list[CellError]:
    """Run a notebook top to bottom (errors allowed, per-cell timeout) and list its errors."""
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb,
        timeout=timeout,
        kernel_name="python3",
        allow_errors=True,
        store_widget_state=False,  # megabytes a widget, which JupyterLab does not save either
        resources={"metadata": {"path": str(path.parent)}},
    )
    client.execute()
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, out)
    errors = []
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                lines = (output.get("evalue") or "").strip().splitlines()[:2]
                message = " / ".join(x.strip() for x in lines)
                errors.append(CellError(path.stem, grade_id(cell), output["ename"], message))
    return errors
