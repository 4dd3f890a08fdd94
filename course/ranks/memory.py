"""What a rank holds, read from outside it: the kernel's count, not the rank's own.

    probe = Probe(pids=[4012, 4013], box=cgroups.memory_used)   # in the launching process
    probe()            # ((bytes of rank 0, bytes of rank 1), bytes of the whole sandbox)

The relay takes a :class:`Probe`'s reading at a snapshot (``course.ranks.relay.snapshot``),
when every rank is blocked in it, so what a rank's code keeps in Python globals, in a
thread or in a tensor no check walks to is counted all the same. A rank's figure is what its
process holds of its own: anonymous and shared memory, resident or swapped out (``RssAnon``
+ ``RssShmem`` + ``VmSwap`` of ``/proc/PID/status``), not the pages of the files it maps
(torch's libraries), which fault in and out as code runs; the sandbox's, when the
submission has a memory cgroup, is the same for everything charged to it (every process it
started, and the files it wrote to a tmpfs), which a rank cannot move out of.

Memory a rank frees is only seen to go if its allocator hands it back: :func:`exact_malloc`
makes glibc map every block over :data:`MMAP_THRESHOLD` on its own and unmap it when freed
(``mallopt(M_MMAP_THRESHOLD)``, which also stops glibc raising the threshold as it goes).
Graded ranks call it before any of a check's code runs.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from course.ranks.frames import RelayError

__all__ = ["MMAP_THRESHOLD", "Probe", "exact_malloc", "process_memory"]

MMAP_THRESHOLD = 128 * 2**10  # bytes: every tensor larger than this is mapped on its own
M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter (malloc.h)
READY_WAIT = 5.0  # seconds a snapshot waits for the launcher to name the ranks' processes
# What a process holds of its own, as /proc/PID/status counts it: anonymous memory (the heap,
# every tensor), shared memory (a tmpfs file it maps), and what of either was swapped out;
# not the pages of files it maps (torch's libraries), which come and go as code runs.
ANONYMOUS = ("RssAnon", "RssShmem", "VmSwap")


def exact_malloc() -> bool:
    """Make this process's freed large blocks go back to the kernel; False without glibc."""
    try:  # the C library this process runs on (find_library would run ldconfig: 1.4 ms)
        libc = ctypes.CDLL(None)
        return bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD))
    except (OSError, AttributeError):
        return False


def process_memory(pid: int) -> int:
    """Bytes process ``pid`` holds, resident or swapped out, as the kernel reports them; -1
    if it is gone."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            fields = dict(line.split(":", 1) for line in status if ":" in line)
    except (OSError, ValueError):
        return -1
    if "RssAnon" not in fields:  # a zombie: its memory is gone already
        return -1
    kib = [int(fields[key].split()[0]) for key in ANONYMOUS if key in fields]
    return sum(kib) * 1024


@dataclass
class Probe:
    """Reads, from this process, what each rank and the whole sandbox hold."""

    pids: Sequence[int] = ()  # rank r's process, as this process sees it
    box: Callable[[], int | None] | None = None  # the sandbox's memory cgroup, if it has one
    ready: threading.Event = field(default_factory=threading.Event)

    def name(self, pids: Sequence[int], box: Callable[[], int | None] | None) -> None:
        """Say which processes the ranks are (the launcher, once every rank has started)."""
        self.pids, self.box = tuple(pids), box
        self.ready.set()

    def at(self, headers: Sequence[dict[str, Any]], world_size: int) -> dict[str, Any]:
        """A snapshot's reading, once every rank of ``world_size`` called it (their requests'
        ``headers``): the relay's event fields ``tag``, ``memory`` and ``box``."""
        tags = {h.get("tag") for h in headers}
        if len(headers) != world_size or len(tags) != 1:
            raise RelayError("a snapshot is taken by every rank at once, with one tag")
        (tag,) = tags
        if not isinstance(tag, int) or isinstance(tag, bool):
            raise RelayError(f"a snapshot's tag must be an int, not {tag!r}")
        memory, box = self()
        return {"tag": tag, "memory": memory, "box": box}

    def __call__(self) -> tuple[tuple[int, ...], int]:
        """Every rank's bytes (-1: not known), and the sandbox's (-1: not measured)."""
        if not self.ready.wait(READY_WAIT):
            return (), -1
        ranks = tuple(process_memory(pid) for pid in self.pids)
        whole = self.box() if self.box else None
        return ranks, -1 if whole is None else whole
