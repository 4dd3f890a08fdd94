"""The launcher: run code on N real ``torch.distributed`` ranks from a cell, a test or a check.

    from course.ranks import run
    run(fn, 4, *args)          # one value per rank, in rank order

``%%ranks N`` (``course.ranks.magics``, loaded by ``%load_ext course``) does the same for a
cell's source. Failures come back as :class:`RankError`, one :class:`RankFailure` per rank.
"""

from __future__ import annotations

from course.ranks.launcher import (
    PerRank,
    RankError,
    RankFailure,
    RunResult,
    launch,
    max_world_size,
    run,
    run_source,
    shutdown,
    warm_up,
)

__all__ = [
    "PerRank",
    "RankError",
    "RankFailure",
    "RunResult",
    "launch",
    "max_world_size",
    "run",
    "run_source",
    "shutdown",
    "warm_up",
]
