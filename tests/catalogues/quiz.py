"""What the quiz tests share: the keys, read from the source notebooks, and one verdict."""

from __future__ import annotations

from pathlib import Path

import nbformat

from course.instructor.selfstudy import quiz_items

SOURCE = Path(__file__).resolve().parents[2] / "source"


def keys(assignment: str) -> dict[str, str]:
    """Item id -> keyed letter, from the hidden checks of ``source/<a>/<a>.ipynb``."""
    nb = nbformat.read(SOURCE / assignment / f"{assignment}.ipynb", as_version=4)
    return {item.item_id: item.key for item in quiz_items(nb)}


def supported(options: dict[str, bool]) -> str:
    """The one option the measurement supports (fails if none or several are)."""
    letters = [letter for letter, ok in options.items() if ok]
    assert len(letters) == 1, f"measurement supports {letters}, expected exactly one"
    return letters[0]
