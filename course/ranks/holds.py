"""The stragglers the relay makes: a rank whose requests wait, unread, until the others are done.

    holds = Holds([Hold(after=0, rank=2)], world_size=4, timeout=5.0)  # drawn by the judge
    holds.barrier_done(now)                     # the relay completed a barrier of the world
    holds.holding(2)                            # True: rank 2's requests are deferred
    holds.due(at_barrier, waiting, pids, now)   # the holds to end now

A check that needs a straggler (backup workers, Chen et al. 2016) asks the relay for one
rather than telling a rank to sleep: the straggler is the judge's choice, known to no rank,
and its lateness is not a time a loaded machine could stretch past. After the ``after``-th
barrier of the whole world (counting from 0), every request of ``rank`` waits in the relay
until each other rank either reached the next barrier of the world (its step is done, without
the straggler) or is blocked (its job's main thread asleep in a call the relay holds: a
receive, a collective, a send not yet received) for :data:`QUIET` seconds on end, which only a
step that waits for the straggler is; or until ``timeout`` has passed. The relay records the
release as an event (``kind`` "release", ``tag`` the hold's ``after``), so a verdict reads
which rank's step ended before the straggler was let through, and which only after.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

import psutil

__all__ = ["QUIET", "Hold", "Holds"]

QUIET = 0.3  # seconds every other rank must stay blocked before a held straggler goes


@dataclass(frozen=True)
class Hold:
    """Rank ``rank`` is the straggler of the stretch after the ``after``-th world barrier."""

    after: int
    rank: int


class Holds:
    """Which ranks the relay holds now, and when each may go."""

    def __init__(self, holds: Sequence[Hold], world_size: int, timeout: float) -> None:
        self.planned, self.world_size, self.timeout = tuple(holds), world_size, timeout
        self._barriers = 0
        self._held: dict[int, tuple[Hold, float]] = {}  # rank -> its hold, since when
        self._stuck_since: float | None = None

    def barrier_done(self, now: float) -> None:
        """The relay completed a barrier of the whole world: start the holds planned after it."""
        for hold in self.planned:
            if hold.after == self._barriers:
                self._held[hold.rank] = (hold, now)
        self._barriers += 1

    def holding(self, rank: int) -> bool:
        return rank in self._held

    @property
    def active(self) -> bool:
        """Whether any rank is held now."""
        return bool(self._held)

    def due(
        self, at_barrier: Collection[int], waiting: Collection[int], pids: Sequence[int],
        now: float,
    ) -> list[Hold]:  # fmt: skip
        """The holds to end now: every other rank at the world's next barrier, or blocked for
        ``QUIET`` seconds (``waiting``: the ranks with a call the relay holds; ``pids``: each
        rank's job process, to tell blocked from busy), or ``timeout`` passed."""
        if not self._held:
            return []
        others = [r for r in range(self.world_size) if r not in self._held]
        done = bool(others) and all(r in at_barrier for r in others)
        stuck = bool(others) and all(
            r in at_barrier or (r in waiting and _asleep(pids, r)) for r in others
        )
        if not stuck:
            self._stuck_since = None
        elif self._stuck_since is None:
            self._stuck_since = now
        quiet = self._stuck_since is not None and now - self._stuck_since >= QUIET
        due = []
        for rank, (hold, since) in list(self._held.items()):
            if done or quiet or now - since > self.timeout:
                del self._held[rank]
                due.append(hold)
        if due:
            self._stuck_since = None
        return due


def _asleep(pids: Sequence[int], rank: int) -> bool:
    """Whether rank ``rank``'s job is asleep (blocked), not running or waiting for a CPU."""
    try:
        return psutil.Process(pids[rank]).status() == psutil.STATUS_SLEEPING
    except (psutil.Error, IndexError):
        return False
