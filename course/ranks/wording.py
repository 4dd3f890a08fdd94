"""Counts and lists of ranks in the words a student reads: "1 element", "ranks 0 and 2".

Plain strings, no torch: the launcher's reports, the checks and the pictures word their
numbers here, so no message says "1 elements" or "world sizes 3".
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["count", "listed", "ranks_text", "world_sizes_text"]


def count(n: int, noun: str, many: str | None = None) -> str:
    """``1 element``, ``3 elements`` (``many``: the plural when it is not noun + "s")."""
    return f"{n} {noun if n == 1 else many or noun + 's'}"


def listed(items: Iterable[object]) -> str:
    """``0``, ``0 and 2``, ``0, 2 and 3``."""
    words = [str(i) for i in items]
    return " and ".join(words) if len(words) < 3 else f"{', '.join(words[:-1])} and {words[-1]}"


def ranks_text(ranks: Iterable[int]) -> str:
    """``rank 0``, ``ranks 0 and 2``."""
    ranks = list(ranks)
    return f"{'rank' if len(ranks) == 1 else 'ranks'} {listed(ranks)}"


def world_sizes_text(world_sizes: Iterable[int]) -> str:
    """``world size 3``, ``world sizes 2 and 3``."""
    sizes = list(world_sizes)
    return f"{'world size' if len(sizes) == 1 else 'world sizes'} {listed(sizes)}"
