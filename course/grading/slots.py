"""Worker uids of grading: each submission graded leases a uid no other run on the machine holds.

Linux counts the process limit (``RLIMIT_NPROC``, :class:`course.grading.sandbox.Limits`)
per uid, so submissions graded at the same time as one shared uid could starve each other:
one that fills its limit would make the other's ranks fail to start. Each submission graded
therefore runs its sandboxed code as a uid of its own (``$COURSE_SANDBOX_UID``), and when it
ends (graded, failed or timed out) every process still owned by the uid is killed, so nothing
it started outlives it.

The uids come from a machine-wide pool (``SLOT_UID_BASE`` to ``SLOT_UID_BASE + POOL - 1``),
each leased by an ``flock`` on its own lock file: two class runs, two Dask workers, or a run
and a test on one machine never hold the same uid, so one's cleanup never kills the other's
ranks. The kernel drops a lock when its holder dies, so a killed run leaves no stale lease;
whoever leases the uid next first kills whatever that run left running as it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pwd
import secrets
import signal
import stat
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil

from course.grading.sandbox import SLOT_UID_BASE, SandboxUnavailable

__all__ = [
    "POOL",
    "UIDS",
    "Lease",
    "Slots",
    "kill_uid",
    "lease_uid",
    "lock_dir",
    "owned_by",
]

POOL = 1000  # uids a machine's grading runs may lease: SLOT_UID_BASE .. SLOT_UID_BASE + 999
UIDS = range(SLOT_UID_BASE, SLOT_UID_BASE + POOL)
LOCKS_ENV = "COURSE_UID_LOCKS"  # where the lock files live (default below)


@dataclass(frozen=True)
class Lease:
    """A uid held by this process: ``fd`` is its lock (pass it on to keep the lease alive)."""

    uid: int
    fd: int


def lock_dir() -> Path:
    """The folder of the uid locks, shared by every run of this user on the machine."""
    base = os.environ.get(LOCKS_ENV) or (
        "/run/lock" if os.path.isdir("/run/lock") else tempfile.gettempdir()
    )
    path = Path(base) / f"course-grading-uids-{os.geteuid()}"
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700)
    info = path.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
        raise SandboxUnavailable(f"{path} is not a folder of this user's: uids cannot be leased")
    return path


def _free_of_accounts(uid: int) -> bool:
    """No account owns ``uid`` (its processes are killed when a submission ends)."""
    try:
        pwd.getpwuid(uid)
    except KeyError:
        return True
    return False


def _try_lock(folder: Path, uid: int) -> int | None:
    """The locked fd of ``uid``'s lock file, or None if another process holds it."""
    fd = os.open(folder / str(uid), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


@contextlib.contextmanager
def lease_uid(uids: Iterable[int] = UIDS) -> Iterator[Lease]:
    """Lease a free uid of ``uids`` for one submission; empty of processes before and after."""
    folder = lock_dir()
    uids = list(uids)
    start = secrets.randbelow(len(uids)) if uids else 0  # runs rarely try the same locks
    for uid in uids[start:] + uids[:start]:
        if not _free_of_accounts(uid):
            continue
        fd = _try_lock(folder, uid)
        if fd is not None:
            break
    else:
        raise SandboxUnavailable(
            f"every grading uid asked for ({min(uids, default='none')} to "
            f"{max(uids, default='none')}) is leased or belongs to an account: "
            "grade with fewer workers on this machine"
        )
    try:
        kill_uid(uid)  # what a run that died holding it left behind
        yield Lease(uid, fd)
    finally:
        try:
            kill_uid(uid)
        finally:
            os.close(fd)  # the lease ends with the lock


def owned_by(uid: int, pids: Iterable[int] | None = None) -> list[psutil.Process]:
    """Live processes whose real, effective or saved uid is ``uid`` (zombies are already dead),
    among ``pids`` if given (a box's cgroups), else among every process on the machine."""
    procs = psutil.process_iter(["uids", "status"]) if pids is None else _looked_at(pids)
    return [
        p
        for p in procs
        if p.info["uids"] is not None
        and uid in p.info["uids"]
        and p.info["status"] != psutil.STATUS_ZOMBIE
    ]


def _looked_at(pids: Iterable[int]) -> Iterator[psutil.Process]:
    """The processes of ``pids`` still there, each with ``info`` as ``process_iter`` sets it."""
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            proc = psutil.Process(pid)
            proc.info = proc.as_dict(["uids", "status"])
            yield proc


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
    """At most ``workers`` submissions at a time, each with a uid leased for it alone."""

    def __init__(self, workers: int) -> None:
        self._free = threading.Semaphore(workers)

    @contextlib.contextmanager
    def lend(self) -> Iterator[Lease]:
        """A leased uid for one submission (waits for a free slot); emptied when given back."""
        with self._free, lease_uid() as lease:
            yield lease
