"""The recorder's logs: one JSON-lines file per rank, read back into one :class:`Trace`.

Each rank streams its messages as they happen, so a rank that deadlocks or is killed still
leaves what it did; the caller assembles the (partial) trace from plain JSON only.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

from course.ring.trace import Message, Trace

__all__ = ["as_list", "log_path", "read_log", "read_trace"]


def log_path(directory: str | os.PathLike, rank: int, tag: str = "") -> Path:
    """Where rank ``rank`` streams its messages (one file per rank and ``tag``)."""
    return Path(directory) / f"rank{rank}{'-' + tag if tag else ''}.jsonl"


def as_list(m: Message) -> list[Any]:
    """A message as the JSON list the logs hold."""
    return [m.rank, m.peer, m.op, m.order, m.numel, m.nbytes, m.offset, m.holds]


def read_log(path: str | os.PathLike) -> tuple[list[Message], list[str]]:
    """One rank's streamed messages (the last word on each) and collective names."""
    latest: dict[tuple[str, int], Message] = {}
    collectives: list[str] = []
    with contextlib.suppress(FileNotFoundError), open(path) as f:
        for line in f:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:  # a line cut short by a kill
                continue
            if record["op"] == "collective":
                collectives.append(record["name"])
            else:
                m = Message(*record["message"])
                latest[m.op, m.order] = m
    return sorted(latest.values(), key=lambda m: (m.op, m.order)), collectives


def read_trace(
    directory: str | os.PathLike,
    world_size: int,
    numel: int,
    itemsize: int,
    failures: dict[int, Any] | None = None,
    tag: str = "",
) -> Trace:
    """Assemble a :class:`Trace` from the ranks' logs; ``failures`` come from ``course.ranks``."""
    messages: list[Message] = []
    collectives: list[tuple[int, str]] = []
    for rank in range(world_size):
        rank_messages, names = read_log(log_path(directory, rank, tag))
        messages += rank_messages
        collectives += [(rank, name) for name in dict.fromkeys(names)]
    failures = failures or {}
    blocked = {r: f.message for r, f in sorted(failures.items())}
    unfinished = tuple(sorted(failures))
    return Trace(
        world_size, numel, itemsize, tuple(messages), tuple(collectives), unfinished, blocked
    )
