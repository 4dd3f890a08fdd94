"""Worker slots of a class run: each grades as its own uid and is emptied after each submission.

Linux counts the process limit (``RLIMIT_NPROC``, :class:`course.instructor.sandbox.Limits`)
per uid, so submissions graded at the same time as one shared uid could starve each other:
one that fills its limit would make the other's ranks fail to start. Each worker slot
therefore lends its own uid (``SLOT_UID_BASE + slot``) to the submission it grades, through
``$COURSE_SANDBOX_UID``, and when that submission ends (graded, failed or timed out) every
process still owned by the uid is killed, so nothing it started outlives it.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import queue
import signal
import time
from collections.abc import Iterator

import psutil

from course.instructor.sandbox import SLOT_UID_BASE, SandboxUnavailable

__all__ = [
    "Slots",
    "kill_uid",
    "owned_by",
    "slot_uid",
]


def slot_uid(slot: int) -> int:
    """The uid of worker ``slot``; refused if an account owns it, since its processes die."""
    uid = SLOT_UID_BASE + slot
    with contextlib.suppress(KeyError):
        name = pwd.getpwuid(uid).pw_name
        raise SandboxUnavailable(
            f"uid {uid} belongs to the account {name!r}, but a class run kills every process "
            f"of its worker uids ({SLOT_UID_BASE} + slot): free that uid or grade with fewer "
            "workers"
        )
    return uid


def owned_by(uid: int) -> list[psutil.Process]:
    """Live processes whose real, effective or saved uid is ``uid`` (zombies are already dead)."""
    return [
        p
        for p in psutil.process_iter(["uids", "status"])
        if p.info["uids"] is not None
        and uid in p.info["uids"]
        and p.info["status"] != psutil.STATUS_ZOMBIE
    ]


def kill_uid(uid: int, rounds: int = 50) -> int:
    """SIGKILL every process ``uid`` owns until none is left; return how many were signalled.

    Repeated because a process may fork while its siblings are being killed; a
    process that left its process group (setsid) is found all the same, by its uid.
    """
    if uid in (0, os.geteuid()):
        raise ValueError(f"refusing to kill every process of uid {uid} (root or this process)")
    killed = 0
    for _ in range(rounds):
        alive = owned_by(uid)
        if not alive:
            break
        for proc in alive:
            with contextlib.suppress(psutil.Error):
                proc.send_signal(signal.SIGKILL)
                killed += 1
        time.sleep(0.05)
    return killed


class Slots:
    """``workers`` uids, lent one per submission and emptied of processes when given back."""

    def __init__(self, workers: int) -> None:
        self._free: queue.SimpleQueue[int] = queue.SimpleQueue()
        for slot in range(workers):
            self._free.put(slot_uid(slot))

    @contextlib.contextmanager
    def lend(self) -> Iterator[int]:
        """A free slot's uid for one submission; every process of it is killed afterwards."""
        uid = self._free.get()
        try:
            yield uid
        finally:
            kill_uid(uid)
            self._free.put(uid)
