"""A run's clock that a busy machine does not run down: wall time less the ranks' wait for a CPU.

A deadline in wall time charges honest code for the machine's load: on two cores shared with
other work, a right ring can take several times as long as on a quiet machine and miss it.
:class:`RunClock` counts the wall time since the start less the longest time any rank was
runnable but waiting for a CPU (the kernel's ``run_delay`` in ``/proc/<pid>/schedstat``, read
from outside the ranks). A deadlocked or sleeping rank is not runnable, so its deadline
passes at the wall clock's pace, loaded or not; a rank kept from running gets that time back.
Where schedstat is missing (a kernel without ``CONFIG_SCHED_INFO``) the clock is the wall's.
``WALL_FACTOR`` bounds it all the same: no run outlasts that many times its deadline.
"""

from __future__ import annotations

import time

__all__ = ["WALL_FACTOR", "RunClock", "run_delay"]

WALL_FACTOR = 5.0  # a run ends at this many times its deadline in wall time, however loaded


def run_delay(pid: int) -> float:
    """Seconds the process's main thread has waited, runnable, for a CPU (0 if unreadable)."""
    try:
        with open(f"/proc/{pid}/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return 0.0


class RunClock:
    """Seconds charged to a run of ``pids`` since it started (see the module docstring)."""

    def __init__(self, pids: list[int]) -> None:
        self.started = time.monotonic()
        self.pids = pids
        self.base = {pid: run_delay(pid) for pid in pids}
        self.waited = dict.fromkeys(pids, 0.0)

    def elapsed(self) -> float:
        """Wall seconds since the start, less the longest any rank waited for a CPU."""
        for pid in self.pids:  # a rank that exited keeps what it had waited
            now = run_delay(pid) - self.base[pid]
            self.waited[pid] = max(self.waited[pid], now)
        wall = time.monotonic() - self.started
        return wall - max(self.waited.values(), default=0.0)

    def wall(self) -> float:
        """Wall seconds since the start."""
        return time.monotonic() - self.started

    def past(self, deadline: float) -> bool:
        """Has the run used up ``deadline`` charged seconds, or ``WALL_FACTOR`` times it in all?"""
        return self.elapsed() >= deadline or self.wall() >= WALL_FACTOR * deadline
