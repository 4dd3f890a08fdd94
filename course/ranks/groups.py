"""``dist.new_group`` on the relay, as on gloo: the k-th group of every rank shares one name.

    groups = Groups(world_size=4)
    groups.call(pending, [0, 1])     # the calls to answer now: [] while members are missing
    groups.expired(deadline)         # the groups whose members never all came

torch names a rank's k-th new group ``k`` (without ``use_local_synchronization``), and gloo
meets its members under that name: a rank outside the group goes on at once, the members
wait for each other, and two ranks whose k-th groups differ (one skipped a group, or made them
in another order) meet under one name and hang or mix their groups up. Here they fail
instead, with the rule. A group of one rank meets no one, so its name collides with nothing.
"""

from __future__ import annotations

from typing import Any

from course.ranks.combine import Call, Pending
from course.ranks.frames import RelayError

__all__ = ["GROUPS_RULE", "Groups"]

GROUPS_RULE = (
    "torch requires every rank of the world to call dist.new_group for every group, even "
    "the groups it is not in, with the same ranks and in the same order (on gloo, ranks whose "
    "k-th groups differ meet under one name: they hang or mix their groups up)"
)


class Groups:
    """Each rank's new groups so far, and the groups whose members are still meeting."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self._made: dict[int, int] = {}  # rank -> how many new groups it has called
        self._named: dict[int, tuple[int, ...]] = {}  # k -> the ranks of every k-th group
        self._forming: dict[int, Call] = {}  # k -> its members' calls so far

    def members(self, header: dict[str, Any]) -> tuple[int, ...]:
        """The ranks a request names, checked."""
        ranks = header.get("members")
        if not isinstance(ranks, list) or not all(type(r) is int for r in ranks):
            raise RelayError("a new_group without its ranks")
        group = tuple(ranks)
        if len(set(group)) != len(group) or not all(0 <= r < self.world_size for r in group):
            raise RelayError(f"dist.new_group of ranks outside 0..{self.world_size - 1}, or twice")
        return group

    def call(self, pending: Pending, group: tuple[int, ...]) -> list[Pending]:
        """Rank ``pending.rank``'s next new group: the calls to answer now (its own, if it is
        not a member; every member's, once the last has come); RelayError if its k-th group
        is not the others' k-th."""
        rank = pending.rank
        k = self._made[rank] = self._made.get(rank, 0) + 1
        if rank not in group or len(group) == 1:  # a group of one meets no one, on gloo too
            return [pending]
        named = self._named.setdefault(k, group)
        if named != group:
            raise RelayError(
                f"rank {rank}'s dist.new_group number {k} names other ranks than the group "
                f"number {k} that rank {named[0]} made or waits in: {GROUPS_RULE}"
            )
        forming = self._forming.setdefault(k, Call(group))
        forming.calls[rank] = pending
        if len(forming.calls) < len(group):
            return []
        del self._forming[k]
        return [forming.calls[r] for r in group]

    def waiting(self) -> set[int]:
        """The ranks waiting in a new group for its other members."""
        return {r for call in self._forming.values() for r in call.calls}

    def lost(self, rank: int) -> list[list[Pending]]:
        """Remove every forming group that waits for ``rank``, which died: its calls."""
        out = []
        for k, call in list(self._forming.items()):
            if rank in call.group and rank not in call.calls:
                del self._forming[k]
                out.append(list(call.calls.values()))
        return out

    def expired(self, deadline: float) -> list[tuple[list[Pending], str]]:
        """Remove every group whose first member came before ``deadline``: its calls, and why."""
        out = []
        for k, call in list(self._forming.items()):
            if min(p.since for p in call.calls.values()) < deadline:
                del self._forming[k]
                absent = ", ".join(str(r) for r in call.group if r not in call.calls)
                why = (f"dist.new_group waited for rank(s) {absent} of its group, which never "
                       f"made it: {GROUPS_RULE}")  # fmt: skip
                out.append((list(call.calls.values()), why))
        return out
