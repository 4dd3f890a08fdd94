"""The ring picture's look: colours, sizes that shrink as N grows, and short texts.

Pure: no plotly, no torch. Shared by the figure (``course.pictures.base``), the per-step view
(``course.pictures.view``) and the widget.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from course.ring.schedule import num_steps, phase
from course.ring.trace import ranks_in

__all__ = [
    "BAD",
    "FULL",
    "GATHERED",
    "INK",
    "NODE",
    "OWN",
    "SHARDED",
    "Sizes",
    "colorscale",
    "counter",
    "phase_name",
    "ranks_text",
    "sizes",
]

OWN, FULL, BAD, INK, NODE = "#e6e6e6", "#f28e2b", "#d62728", "#333333", "#4c72b0"
PARTIAL_LIGHT, PARTIAL_DARK = (198, 219, 239), (33, 113, 181)
GATHERED, SHARDED = "rgb(158,202,225)", "#59a14f"  # FSDP: a gathered slot, a gradient shard


def phase_name(step: int, world_size: int) -> str:
    """What the frame after ``step`` ring steps shows (0 is the start, before any message)."""
    if step == 0:
        return "start: each rank holds only its own contribution"
    if step <= num_steps(world_size):
        return phase(step - 1, world_size)
    return "extra steps (more than the ring's schedule makes)"


def counter(step: int, world_size: int, total: bool = True) -> str:
    """``step 3 / 6 - reduce-scatter``: steps count from 1, and the arrows drawn with this
    text are the messages of that same step (the grid shows the chunks after it). Without
    ``total`` (before a question asks for it) the count of a whole ring and the phases' names
    are left out: where one phase ends is for the grid to show."""
    if not total:
        return f"step {step}"
    return f"step {step} / {num_steps(world_size)} - {phase_name(step, world_size)}"


@functools.lru_cache(maxsize=4096)
def ranks_text(mask: int) -> str:
    """``0-3, 5`` for a mask holding ranks 0, 1, 2, 3 and 5."""
    return runs_text(ranks_in(mask))


def runs_text(ranks: list[int]) -> str:
    """``0-3, 5`` for the sorted ranks 0, 1, 2, 3, 5 (``none`` for none)."""
    runs: list[list[int]] = []
    for r in ranks:
        if runs and runs[-1][1] == r - 1:
            runs[-1][1] = r
        else:
            runs.append([r, r])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs) or "none"


def _partial(count: int, world_size: int) -> str:
    """Colour of a chunk holding ``count`` of ``world_size`` contributions (2 <= count < N)."""
    t = (count - 2) / max(world_size - 3, 1)
    rgb = (round(a + (b - a) * t) for a, b in zip(PARTIAL_LIGHT, PARTIAL_DARK, strict=True))
    return "rgb({},{},{})".format(*rgb)


def colorscale(world_size: int) -> list[tuple[float, str]]:
    """Stepped colour scale for ``z`` = contribution count 1..N over ``[0.5, N + 0.5]``."""
    scale = []
    for count in range(1, world_size + 1):
        colour = OWN if count == 1 else FULL if count == world_size else _partial(count, world_size)
        scale += [((count - 1) / world_size, colour), (count / world_size, colour)]
    return scale


@dataclass(frozen=True)
class Sizes:
    """Marker, font and line sizes for one world size: legible from N = 2 to 32."""

    node: int  # rank marker diameter
    node_font: int
    label_font: int  # the chunk labels on arrows
    labels: bool  # whether arrows carry chunk labels (too crowded beyond 16 ranks)
    head: int  # arrow head
    line: float  # arrow width
    gap: int  # heatmap cell gap
    tick: int  # axis tick spacing


def sizes(world_size: int) -> Sizes:
    """The sizes for ``world_size`` ranks."""
    n = world_size
    if n <= 8:
        return Sizes(34, 13, 12, True, 13, 2.0, 2, 1)
    if n <= 16:
        return Sizes(24, 10, 9, True, 10, 2.0, 1, 2)
    return Sizes(17, 8, 8, False, 7, 1.5, 1, 4)
