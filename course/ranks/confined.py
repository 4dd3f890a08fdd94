"""Launches whose ranks are not trusted: the launcher's side of grading.

    with confined_launches(server, run_root, share):
        launch(rank_side, 3, PerRank([x0, x1, x2]))   # rank r is sent x_r only

Inside the ``with``, every launch in this process forks its ranks from ``server`` (a
forkserver the grader started inside a sandbox: see ``course.grading.judge``), keeps its
run directory under ``run_root`` (handed to the ranks' user with ``share``), sends each rank
only its own element of every :class:`PerRank` argument, and takes back plain data only
(:mod:`course.ranks.plain`): nothing a rank sends is unpickled, and files the ranks wrote are
read without following links (:func:`read_rank_file`). Outside it, nothing changes.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["Confined", "PerRank", "confined_launches", "current", "rank_dir", "read_rank_file"]

MAX_RANK_FILE = 4 * 2**20  # bytes read of any one file a rank wrote


@dataclass(frozen=True)
class Confined:
    """Where and how the ranks of a confined launch run."""

    server: Any  # a course.ranks.forkserver.Server started confined
    run_root: str
    share: Callable[[str], None]
    cleanup: Callable[[], None]  # after each launch: stop whatever its ranks left running
    memory: Callable[[], int | None] | None = None  # bytes the whole sandbox holds now


_STACK: list[Confined] = []


def current() -> Confined | None:
    """The confinement in force in this process, if any."""
    return _STACK[-1] if _STACK else None


@contextlib.contextmanager
def confined_launches(
    server: Any,
    run_root: str,
    share: Callable[[str], None],
    cleanup: Callable[[], None] = lambda: None,
    memory: Callable[[], int | None] | None = None,
) -> Iterator[None]:
    """Within: every launch runs confined (see the module docstring)."""
    _STACK.append(Confined(server, run_root, share, cleanup, memory))
    try:
        yield
    finally:
        _STACK.pop()


class PerRank(list):
    """An argument that differs per rank: rank r receives element r, and only that."""

    def for_rank(self, rank: int) -> Any:
        if rank >= len(self):
            raise ValueError(f"a PerRank argument has {len(self)} elements for rank {rank}")
        return self[rank]


def rank_dir(prefix: str) -> str:
    """A fresh directory the ranks may write (in the confinement's run root, if any).

    The run root is a folder the ranks cannot write (:mod:`course.grading.rankbox`), and
    ``share`` hands the new folder over without following a link.
    """
    box = current()
    path = tempfile.mkdtemp(prefix=prefix, dir=box.run_root if box else None)
    if box:
        box.share(path)
    return path


def read_rank_file(path: str, limit: int = MAX_RANK_FILE) -> str:
    """Text of a file a rank wrote: never through a link, never a special file, capped.

    Raises FileNotFoundError when there is no such regular file.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as err:  # ELOOP (a link), ENOENT, EACCES...
        raise FileNotFoundError(path) from err
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
            raise FileNotFoundError(path)
        return f.read(limit).decode("utf-8", errors="replace")
