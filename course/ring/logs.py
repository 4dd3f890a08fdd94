"""The recorder's logs: one JSON-lines file per rank, read back into one :class:`Trace`.

Each rank streams its messages as they happen, so a rank that deadlocks or is killed still
leaves what it did; the caller assembles the (partial) trace from plain JSON only.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, TextIO

from course.ranks.confined import read_rank_file
from course.ring.trace import Message, Trace

__all__ = ["as_list", "log_path", "open_log", "read_log", "read_trace"]

MAX_LOG = 16 * 2**20  # bytes read of one rank's log


def log_path(directory: str | os.PathLike, rank: int, tag: str = "") -> Path:
    """Where rank ``rank`` streams its messages (one file per rank and ``tag``)."""
    return Path(directory) / f"rank{rank}{'-' + tag if tag else ''}.jsonl"


def open_log(path: str | os.PathLike) -> TextIO:
    """A rank's log, opened to append line by line; its folder made if it is not there (a
    graded rank's scratch folder is its own: ``course.ranks.isolation``)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    return open(path, "a", buffering=1)


def as_list(m: Message) -> list[Any]:
    """A message as the JSON list the logs hold."""
    return [m.rank, m.peer, m.op, m.order, m.numel, m.nbytes, m.offset, m.holds]


def read_log(path: str | os.PathLike) -> tuple[list[Message], list[str]]:
    """One rank's streamed messages (the last word on each) and collective names."""
    latest: dict[tuple[str, int], Message] = {}
    collectives: list[str] = []
    try:
        text = read_rank_file(str(path), MAX_LOG)  # written by a rank: links not followed
    except FileNotFoundError:
        return [], []
    for line in text.splitlines():
        try:
            record = json.loads(line)
            if record["op"] == "collective":
                collectives.append(str(record["name"])[:80])
            else:
                m = _message(record["message"])
                latest[m.op, m.order] = m
        # A line cut short by a kill, not a log's, or nested deep enough to exhaust the parser.
        except (ValueError, KeyError, TypeError, RecursionError):
            continue
    return sorted(latest.values(), key=lambda m: (m.op, m.order)), collectives


def _message(fields: Any) -> Message:
    """A logged message, its fields checked: a log is written on the rank, not trusted."""
    if not isinstance(fields, list) or len(fields) != 8 or fields[2] not in ("send", "recv"):
        raise TypeError("not a logged message")
    ints = [fields[i] for i in (0, 1, 3, 4, 5)] + [f for f in fields[6:] if f is not None]
    if not all(isinstance(i, int) and not isinstance(i, bool) and abs(i) < 2**62 for i in ints):
        raise TypeError("not a logged message")
    return Message(*fields)


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
