"""A run's clock that a busy machine does not run down: wall time less the ranks' wait for a CPU.

A deadline in wall time charges honest code for the machine's load: on two cores shared with
other work, a right ring can take several times as long as on a quiet machine and miss it.
:class:`RunClock` counts the wall time since the start less the longest time any rank was
runnable but waiting for a CPU (the kernel's ``run_delay`` in ``/proc/<pid>/task/*/schedstat``,
every thread of the rank's process, read from outside the ranks) and, in a run whose messages
go through the launcher (the relay), the time the launcher's own threads but the one watching
the run waited for one: a rank waiting for a reply the relay was kept from sending was held
up by the machine too. A deadlocked or sleeping rank is not runnable, so its deadline
passes at the wall clock's pace, loaded or not; a rank kept from running gets that time back.
Where schedstat is missing (a kernel without ``CONFIG_SCHED_INFO``) the clock is the wall's.
``WALL_FACTOR`` bounds it all the same: no run outlasts that many times its deadline.

A run's start-up is charged the same way (:class:`Deadline`): the launcher waits for a
forkserver to fork a rank (a cold one imports torch first) and for the rank to take its job
and its namespaces, each on the clock of the processes it waits for, every thread of theirs
counted. A server or a rank that was stopped, or that waits on nothing the machine is slow to
give, still fails its start at the deadline; one that was only kept from a CPU does not.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable

__all__ = ["WALL_FACTOR", "Deadline", "RunClock", "run_delay", "waited"]

WALL_FACTOR = 5.0  # a run ends at this many times its deadline in wall time, however loaded


def run_delay(pid: int) -> float:
    """Seconds the process's main thread has waited, runnable, for a CPU (0 if unreadable)."""
    return _schedstat(f"/proc/{pid}/schedstat")


def waited(pid: int) -> float:
    """Seconds every thread of process ``pid`` has waited, runnable, for a CPU, in all (0 if
    unreadable; a thread that ended takes its share with it)."""
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0.0
    return sum(_schedstat(f"/proc/{pid}/task/{tid}/schedstat") for tid in threads)


def _schedstat(path: str) -> float:
    try:
        with open(path) as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return 0.0


def _threads_but_mine() -> dict[str, float]:
    """What each thread of this process but the calling one has waited for a CPU, by id."""
    me = str(threading.get_native_id())
    try:
        threads = os.listdir("/proc/self/task")
    except OSError:
        return {}
    return {t: _schedstat(f"/proc/self/task/{t}/schedstat") for t in threads if t != me}


class RunClock:
    """Seconds charged to a run of ``pids`` since it started (see the module docstring);
    ``relayed``: its messages go through this process, whose other threads serve them."""

    def __init__(self, pids: list[int], relayed: bool = False) -> None:
        self.started = time.monotonic()
        self.pids = pids
        self.base = {pid: waited(pid) for pid in pids}
        self.waited = dict.fromkeys(pids, 0.0)
        self.relayed = relayed
        self.relay_base = _threads_but_mine() if relayed else {}
        self.relay_waited: dict[str, float] = {}

    def elapsed(self) -> float:
        """Wall seconds since the start, less the longest any rank waited for a CPU and what
        the relay's threads did."""
        for pid in self.pids:  # a rank that exited keeps what it had waited
            now = waited(pid) - self.base[pid]
            self.waited[pid] = max(self.waited[pid], now)
        if self.relayed:
            for tid, now in _threads_but_mine().items():  # one started since counts from 0
                was = self.relay_waited.get(tid, 0.0)
                self.relay_waited[tid] = max(was, now - self.relay_base.get(tid, 0.0))
        wall = time.monotonic() - self.started
        return wall - max(self.waited.values(), default=0.0) - sum(self.relay_waited.values())

    def wall(self) -> float:
        """Wall seconds since the start."""
        return time.monotonic() - self.started

    def past(self, deadline: float) -> bool:
        """Has the run used up ``deadline`` charged seconds, or ``WALL_FACTOR`` times it in all?"""
        return self.elapsed() >= deadline or self.wall() >= WALL_FACTOR * deadline


class Deadline:
    """``seconds`` charged to the processes a wait is for: the wall time since it began less
    the time they waited, runnable, for a CPU (summed: they work in turn, a forkserver's
    bubblewrap and then its Python); ``WALL_FACTOR`` times ``seconds`` in wall time at most.

    ``pids`` gives them, called at each look (None for one not there yet; one that appears
    later, as a forkserver starting, counts from zero: it did all its waiting within this
    wait)."""

    def __init__(self, seconds: float, pids: Callable[[], Iterable[int | None]]) -> None:
        self.seconds, self.pids = seconds, pids
        self.started = time.monotonic()
        self.base = {pid: waited(pid) for pid in pids() if pid}
        self.waited: dict[int, float] = {}

    def charged(self) -> float:
        """Seconds charged so far."""
        for pid in filter(None, self.pids()):  # None: not there (yet)
            now = waited(pid) - self.base.setdefault(pid, 0.0)
            self.waited[pid] = max(self.waited.get(pid, 0.0), now)  # a thread may have ended
        return time.monotonic() - self.started - sum(self.waited.values())

    def past(self) -> bool:
        """Is the deadline reached, on the charged clock or at ``WALL_FACTOR`` times it?"""
        wall = time.monotonic() - self.started
        return wall >= WALL_FACTOR * self.seconds or self.charged() >= self.seconds

    def left(self, most: float = 0.25) -> float:
        """How long to wait before looking again (at most ``most`` s; never 0)."""
        wall = time.monotonic() - self.started
        return max(
            0.01, min(most, self.seconds - self.charged(), WALL_FACTOR * self.seconds - wall)
        )
