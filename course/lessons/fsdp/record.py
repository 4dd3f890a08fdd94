"""Your ``fully_shard``'s step, recorded on real ranks and drawn by the FSDP widget.

    from course.lessons.fsdp.record import animate_fully_shard
    animate_fully_shard(fully_shard, world_size=3)

Each rank shards the checks' model (``course.lessons.fsdp.model.tiny_lm``: each block,
then the root) with the function given, and runs one forward and backward under the ring's
recorder; rank 0's all-gathers and reduce-scatters, in the order it called them, are mapped
onto the units by their sizes (``course.lessons.fsdp.schedule.schedule_from_trace``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from course.checks.compare import MODEL_SEED
from course.lessons.fsdp.model import loss_of, make_batches, tiny_lm, units
from course.lessons.fsdp.rank import shard_units
from course.ring.recorder import Recorder

__all__ = ["animate_fully_shard", "recorded_step"]

MAX_WORLD_SIZE = 8


def recorded_step(fully_shard: Callable[..., Any]) -> list[tuple[str, int]]:
    """On each rank: ``(collective, elements of the whole unit)`` of one step, in call order."""
    n = dist.get_world_size()
    model = tiny_lm(MODEL_SEED)
    shard_units(fully_shard, model)  # each block, then the root, as the checks do
    batch = make_batches(1, torch.Generator().manual_seed(dist.get_rank()))[0]
    with Recorder() as seen:
        loss_of(model, batch).backward()
    return [(c.name, c.numel * n // (n + 1)) for c in seen.collectives]


def animate_fully_shard(
    fully_shard: Callable[..., Any], world_size: int = 3, timeout: float = 60.0
) -> Any:
    """The FSDP widget playing your ``fully_shard``'s own step on ``world_size`` ranks, or one
    line saying why there is nothing to play (the stub, a failing run, a bad world size)."""
    from course.checks.teaching import not_implemented
    from course.lessons.fsdp.picture import fsdp_widget
    from course.pictures.widgets import note
    from course.ranks import RankError, run

    if not 2 <= world_size <= MAX_WORLD_SIZE:
        return note(f"the widget draws 2 to {MAX_WORLD_SIZE} ranks, not world_size={world_size}")
    message = not_implemented(fully_shard)
    if message:
        return note(f"Nothing to animate yet: {message}")
    try:
        calls = run(recorded_step, world_size, fully_shard, timeout=timeout)[0]
    except RankError as err:
        return note(f"Your fully_shard did not finish a step on {world_size} ranks: {err}")
    numels = [u.numel for u in units(tiny_lm(MODEL_SEED))]
    return fsdp_widget(world_size=world_size, trace=calls, unit_numels=numels)
