"""The two-level all-reduce as plain data: what crosses between nodes, what it costs, and the
verdict on a record of one run.

Pure Python, no torch. Ranks ``node * R .. node * R + R - 1`` form node ``node`` (R ranks per
node, M = N / R nodes). A hierarchical all-reduce of S bytes reduce-scatters inside each node
(each rank then holds one shard, S / R bytes, summed over its node), all-reduces the shard
across nodes on a group of one rank per node, and all-gathers the shards inside the node.

A record is a list of :class:`Call` (a collective with its group and each member's bytes, or
one point-to-point message), in each rank's order: the relay's own record under grading, the
recorder's in a notebook. From it:

- **bytes across nodes** (:func:`cross_node_bytes`): what each rank would send over links
  between nodes if every collective ran as a ring over its group (an all-reduce or a reduce
  of M members sends 2(M-1)/M of its contribution, a reduce-scatter, an all-to-all or a
  scatter (M-1)/M, an all-gather, a broadcast or a gather M-1 times its own), every byte
  of a group that spans nodes counted as crossing, plus every point-to-point message to
  another node;
- **emulated time** (:func:`emulated_time`): the alpha-beta model of those rings, each step
  costing ``ALPHA`` plus its bytes times ``BETA_IN`` inside a node or ``BETA_ACROSS`` (10x)
  when its group spans nodes; a rank's time is the sum over its calls, the run's the slowest
  rank's. The flat ring over all N ranks crosses nodes at every step (:func:`flat_ring_time`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from course.ranks.wording import count, listed
from course.ring.verdict import Violation

__all__ = [
    "ALPHA",
    "BETA_ACROSS",
    "BETA_IN",
    "EMULATION",
    "Call",
    "cross_node_bytes",
    "emulated_time",
    "flat_ring_time",
    "hierarchy_violations",
    "node_of",
    "two_level_bytes",
]

ALPHA = 10e-6  # seconds per message, any link
BETA_IN = 1e-9  # seconds per byte inside a node (1 GB/s)
BETA_ACROSS = 10e-9  # seconds per byte between nodes: the emulated slow link, 10x
EMULATION = (
    "emulated with the alpha-beta model on the run's record: every collective runs as a "
    "ring over its group, each step costing alpha = 10 us plus its bytes at 1 ns/byte inside "
    "a node, 10 ns/byte (10x slower) when the group spans nodes; a rank's time is the sum "
    "over its calls, the run's the slowest rank's"
)
NAMES = {"all_reduce", "reduce_scatter", "all_gather", "broadcast", "all_to_all", "barrier"}
NAMES |= {"reduce", "gather", "scatter"}


@dataclass(frozen=True, slots=True)
class Call:
    """One collective (``kind`` a torch.distributed name, ``group`` its global ranks,
    ``nbytes`` each member's contribution in group order, ``itemsize`` of its dtype) or one
    point-to-point message (``kind`` "send", ``group`` (sender, receiver), ``nbytes`` one)."""

    kind: str
    group: tuple[int, ...]
    nbytes: tuple[int, ...]
    itemsize: int = 8


def node_of(rank: int, ranks_per_node: int) -> int:
    return rank // ranks_per_node


def _nodes(group: Sequence[int], ranks_per_node: int) -> list[int]:
    return sorted({node_of(r, ranks_per_node) for r in group})


def _ring(call: Call, member: int) -> tuple[int, float]:
    """Steps and bytes per step of ``call`` run as a ring, for its member at ``member``."""
    m, b = len(call.group), call.nbytes[member]
    if call.kind == "send":
        return 1, b
    if m < 2:
        return 0, 0.0
    if call.kind in ("all_reduce", "reduce"):  # a reduce: a reduce-scatter, then a gather
        return 2 * (m - 1), b / m
    if call.kind in ("reduce_scatter", "all_to_all", "scatter"):  # scatter: the root's pieces
        return m - 1, b / m
    if call.kind in ("all_gather", "broadcast", "gather"):
        return m - 1, b
    return m - 1, 0.0  # a barrier moves no data


def _mine(call: Call, rank: int) -> int | None:
    """Where ``rank`` sits in ``call`` (None: not a member; a message counts on its sender)."""
    if call.kind == "send":
        return 0 if call.group[0] == rank else None
    return call.group.index(rank) if rank in call.group else None


def _spans(call: Call, ranks_per_node: int) -> bool:
    return len(_nodes(call.group, ranks_per_node)) > 1


def cross_node_bytes(calls: Sequence[Call], rank: int, ranks_per_node: int) -> float:
    """The bytes ``rank`` sends over links between nodes, counted as rings over each group."""
    total = 0.0
    for call in calls:
        member = _mine(call, rank)
        if member is not None and _spans(call, ranks_per_node):
            steps, each = _ring(call, member)
            total += steps * each
    return total


def emulated_time(calls: Sequence[Call], world_size: int, ranks_per_node: int) -> float:
    """Seconds the run takes under the emulated slow link: the slowest rank's sum of steps."""
    worst = 0.0
    for rank in range(world_size):
        spent = 0.0
        for call in calls:
            member = _mine(call, rank)
            if member is None:
                continue
            steps, each = _ring(call, member)
            beta = BETA_ACROSS if _spans(call, ranks_per_node) else BETA_IN
            spent += steps * (ALPHA + each * beta)
        worst = max(worst, spent)
    return worst


def flat_ring_time(world_size: int, nbytes: int) -> float:
    """The flat ring over all N ranks (``course.ring.cost.ring``), every step over a slow link."""
    n = world_size
    return 2 * (n - 1) * (ALPHA + nbytes / n * BETA_ACROSS)


def two_level_bytes(numel: int, itemsize: int, world_size: int, ranks_per_node: int) -> float:
    """The formula: each rank sends 2(M-1)/M of its shard (S / R, rounded up) across nodes."""
    m = world_size // ranks_per_node
    shard = -(-numel // ranks_per_node) * itemsize
    return 2 * (m - 1) / m * shard


def _group_violations(
    calls: Sequence[Call], world_size: int, r: int, numel: int
) -> list[Violation]:
    """Collectives on the wrong groups, or carrying too much across nodes: the first call
    that breaks each rule, and how many more break it."""
    found: dict[str, list[str]] = {}
    for call in calls:
        if call.kind == "send" or not _spans(call, r) or call.kind == "barrier":
            continue
        broken = _broken_rule(call, world_size, r, numel)
        if broken:
            found.setdefault(broken[0], []).append(broken[1])
    out = []
    for same in found.values():
        more = f" (and {count(len(same) - 1, 'more call')} like it)" if len(same) > 1 else ""
        out.append(Violation(None, None, same[0] + more))
    return out


def _broken_rule(call: Call, world_size: int, r: int, numel: int) -> tuple[str, str] | None:
    """The rule a collective that spans nodes breaks, and how, in words (None: none)."""
    name, nodes = f"dist.{call.kind}", _nodes(call.group, r)
    if tuple(sorted(call.group)) == tuple(range(world_size)):
        return "world", (
            f"{name} ran over the whole world (ranks 0..{world_size - 1}): a flat "
            "collective; the hierarchy calls collectives only on a node's ranks, and "
            "across nodes on one rank per node"
        )
    where = f"{name} on ranks {listed(call.group)} (nodes {listed(nodes)})"
    if call.kind != "all_reduce":
        return "spans", (
            f"{where} spans nodes: across nodes the hierarchy makes only the all-reduce of "
            "each rank's shard (the reduce-scatter and all-gather stay inside a node)"
        )
    if len(nodes) != len(call.group):
        return "per_node", (
            f"{where} has more than one rank of a node: a cross-node group holds one rank "
            f"per node (the ranks with the same place in their node, such as "
            f"{listed(range(0, world_size, r))})"
        )
    shard, big = -(-numel // r), max(call.nbytes) // call.itemsize
    if big > shard:
        return "shard", (
            f"{where} carried {count(big, 'element')} per rank; across nodes each rank "
            f"all-reduces only its shard, at most ceil({numel} / {r}) = "
            f"{count(shard, 'element')} (reduce-scatter inside the node first)"
        )
    return None


def _missing_levels(
    calls: Sequence[Call], world_size: int, ranks_per_node: int, numel: int
) -> list[Violation]:
    """The first rank that skips a level: no call inside its node, or less than its shard
    (numel // R elements, rounded down) carried across nodes."""
    r = ranks_per_node
    least = numel // r
    for rank in range(world_size):
        inside = across = 0
        for call in calls:
            member = _mine(call, rank)
            if member is None or call.kind == "barrier":
                continue
            if not _spans(call, r):
                inside += len(call.group) > 1
            elif call.kind in ("all_reduce", "send"):
                across += call.nbytes[member] // call.itemsize
        if not inside:
            return [
                Violation(
                    rank,
                    None,
                    f"rank {rank} made no call inside its node (node {node_of(rank, r)}): the "
                    "hierarchy first reduce-scatters inside each node, and all-gathers there last",
                )
            ]
        if across < least:
            return [
                Violation(
                    rank,
                    None,
                    f"rank {rank} all-reduced {count(across, 'element')} across nodes; its "
                    f"shard of the {numel}-element tensor has at least {numel} // {r} = {least}",
                )
            ]
    return []


def hierarchy_violations(
    calls: Sequence[Call], world_size: int, ranks_per_node: int, numel: int, itemsize: int
) -> list[Violation]:
    """Every way a run's record departs from a two-level all-reduce (empty: it is one).

    No collective over the whole world; every collective whose group spans nodes is an
    all-reduce on at most one rank per node, of at most ceil(numel / R) elements per member;
    every rank makes a call inside its node and carries at least numel // R elements across;
    each rank's bytes across nodes within :func:`two_level_bytes`; and the emulated time
    below the flat ring's.
    """
    r = ranks_per_node
    found = _group_violations(calls, world_size, r, numel)
    found += _missing_levels(calls, world_size, r, numel)
    allowed = two_level_bytes(numel, itemsize, world_size, r)
    slack = 2 * itemsize  # rounding of the shard's halves
    for rank in range(world_size):
        sent = cross_node_bytes(calls, rank, r)
        if sent > allowed + slack:
            m = world_size // r
            found.append(
                Violation(
                    rank,
                    None,
                    f"rank {rank} sends {sent:.0f} bytes across nodes (counted as a ring over "
                    f"each group it is in that spans nodes, plus its messages to other nodes); "
                    f"the two-level all-reduce sends 2(M-1)/M x S/R = 2({m}-1)/{m} x "
                    f"{numel * itemsize}/{r} = {allowed:.0f} bytes (the shard rounded up)",
                )
            )
            break
    took = emulated_time(calls, world_size, r)
    flat = flat_ring_time(world_size, numel * itemsize)
    if took >= flat:
        found.append(
            Violation(
                None,
                None,
                f"under an emulated slow link between nodes this run takes {took * 1e6:.0f} us, "
                f"no faster than the flat ring's {flat * 1e6:.0f} us ({EMULATION})",
            )
        )
    return found
