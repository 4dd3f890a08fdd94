"""Under grading, what each rank of a ZeRO step holds, measured from outside the rank.

The ranks train the toy model :data:`GRADED_WIDTH` wide (12 square layers: 12.6 M
parameters, 48 MiB in fp32) and stop three times in the relay (``course.ranks.relay.snapshot``):
before the job, and so any cell of the student's, is unpickled (``relay.BASELINE``), once
the model is built, and once the student's optimizer has stepped. At each stop the judge
reads, itself, every rank process's memory and the whole sandbox's
(:mod:`course.ranks.memory`), and the bytes the relay holds sent but not yet received.
From the first stop to the second a rank may grow by the model and :data:`RUNTIME`
(:func:`from_the_start`): what the student's cells hold from their first line on counts, so
memory made early and freed during the step (ballast) cannot hide what the step keeps.

ZeRO-2 on N ranks adds Adam's two moments and the gradient for its shard: 12/N bytes a
parameter. A replica of Adam's state adds 8, of the gradients 4. A rank may add its shards,
a quarter of the parameters' bytes for buffers of its own, and :data:`RUNTIME` for what
torch and Python keep; the sandbox, N times that. What the student's optimizer holds in its
own tensors is still counted on the rank (``course.lessons.zero.check``), for the finer message.
"""

from __future__ import annotations

from collections.abc import Sequence

from course.ranks.frames import Event
from course.ranks.relay import BASELINE
from course.ring.relayed import bytes_between_snapshots

__all__ = ["GRADED_WIDTH", "MIB", "RUNTIME", "from_the_start", "growth", "measured"]

GRADED_WIDTH = 1024  # the toy model's width under grading: its depth stays 12
RUNTIME = 16 * 2**20  # bytes torch and Python may add to a rank between the snapshots
MIB = 2**20


def measured(relayed: Sequence[Event], world_size: int, psi: int, steps: int) -> str:
    """Raise, with what to fix, if a rank or the sandbox grew by more than ZeRO-2 allows from
    the relay's snapshot once the model was built to those after each of ``steps`` steps of a
    run of ``world_size`` ranks (``psi`` parameters), each taken between one step's traffic
    and the next's; else say what the most a rank grew was."""
    snaps = from_the_start(relayed, world_size, 4 * psi, "the model was built")
    if [e.tag for e in snaps] != list(range(steps + 1)):
        raise AssertionError(
            f"the ranks' memory could not be measured: the relay saw snapshots "
            f"{[e.tag for e in snaps]}, where the check takes one before the first step and "
            "one after each (only the check takes them)"
        )
    _between_steps(relayed, world_size, psi, steps)
    if any(after.held for after in snaps[1:]):
        held = max(after.held for after in snaps[1:])
        raise AssertionError(
            f"when step() had returned on every rank, {held} bytes one rank had sent "
            "another were not yet received: wait() on every isend, and receive every "
            "message, inside step()"
        )
    ranks, box = growth(snaps[0], snaps[1:], world_size)
    allowed = 12 * psi / world_size + psi + RUNTIME
    for rank, grew in enumerate(ranks):
        if grew > allowed:
            raise AssertionError(_too_much(f"rank {rank} of {world_size}", grew, allowed, psi,
                                           world_size))  # fmt: skip
    if box is not None and box > world_size * allowed:
        what = f"the sandbox of your {world_size} ranks, all its processes and files,"
        raise AssertionError(_too_much(what, box, world_size * allowed, psi, world_size))
    most = max(ranks)
    return (
        f"Measured from outside, on {psi / 1e6:.1f} M parameters, no rank grew by more than "
        f"{most / MIB:.0f} MiB in step() (ZeRO-2's shards: {12 * psi / world_size / MIB:.0f} MiB)."
    )


def _between_steps(relayed: Sequence[Event], n: int, psi: int, steps: int) -> None:
    """Raise unless every rank's snapshots after each step fall between one step's traffic
    and the next's, as the relay recorded it: no step moves less than half or more than one
    and a half times a reduce-scatter and an all-gather of the gradients (so a snapshot
    cannot be moved past a step, nor a step's traffic into another's), and nothing moves
    after the last."""
    step = 2 * (n - 1) / n * 4 * psi  # a ring's reduce-scatter and all-gather, per rank
    for rank in range(n):
        stretches = bytes_between_snapshots(relayed, rank)[2:]  # from snapshot 0 on
        moved, after = stretches[:steps], stretches[steps:]
        if all(step / 2 <= b <= 1.5 * step for b in moved) and not any(after):
            continue
        shown = ", ".join(f"{b / MIB:.0f}" for b in moved)
        raise AssertionError(
            f"rank {rank} of {n} moved {shown} MiB in its {steps} steps and {sum(after) / MIB:.0f} "
            f"MiB after the last, as the relay recorded them, where a ZeRO-2 step moves a "
            f"reduce-scatter and an all-gather of the gradients, {step / MIB:.0f} MiB a rank: "
            "the check measures memory between steps, by their traffic. Communicate only "
            "inside step(), with your reduce_scatter and all_gather."
        )


def from_the_start(relayed: Sequence[Event], n: int, built: int, when: str) -> list[Event]:
    """The check's own snapshots (tag 0 on), once none of ``n`` ranks, nor the sandbox, grew
    from the launch's ``BASELINE`` to snapshot 0 by more than the ``built`` bytes the check
    made by then and :data:`RUNTIME`; raise, saying so, if one did."""
    snaps = [e for e in relayed if e.kind == "snapshot"]
    if not snaps or snaps[0].tag != BASELINE or len(snaps) < 2:
        raise AssertionError(
            "the ranks' memory could not be measured: the relay saw no snapshot before your "
            "code was loaded (only the check takes them)"
        )
    ranks, box = growth(snaps[0], snaps[1:2], n)
    allowed = built + RUNTIME
    worst = max(range(n), key=ranks.__getitem__)
    if ranks[worst] > allowed or (box is not None and box > n * allowed):
        who = f"rank {worst} of {n}" if ranks[worst] > allowed else f"the sandbox of your {n} ranks"
        grew = ranks[worst] if ranks[worst] > allowed else box
        raise AssertionError(
            f"{who} held {grew / MIB:.0f} MiB more once {when} than when its run began, "
            f"measured from outside the ranks; the check's own part of that is "
            f"{built / MIB:.0f} MiB, and at most {allowed / MIB:.0f} MiB is allowed a rank. "
            "Something your notebook's cells make when they run (a tensor at a cell's top "
            "level, say) is held from the start: memory is measured from the first line of "
            "your code on, so make nothing large outside your functions."
        )
    return snaps[1:]


def growth(base: Event, later: Sequence[Event], n: int) -> tuple[list[int], int | None]:
    """The most each of ``n`` ranks held at the snapshots ``later`` over what it held at
    ``base``, and the same for the whole sandbox (None where it has no memory cgroup);
    raise if a rank's memory could not be read."""
    if any(len(e.memory) != n or min(e.memory) < 0 for e in (base, *later)):
        raise AssertionError("the ranks' memory could not be measured: a rank's process was gone")
    ranks = [max(e.memory[r] for e in later) - base.memory[r] for r in range(n)]
    boxes = [e.box for e in (base, *later)]
    return ranks, (max(boxes[1:]) - boxes[0] if min(boxes) >= 0 else None)


def _too_much(who: str, grew: int, allowed: float, psi: int, n: int) -> str:
    return (
        f"{who} held {grew / MIB:.0f} MiB more after step() than before your optimizer was "
        f"made, measured from outside the ranks on a model of {psi / 1e6:.1f} M parameters "
        f"({4 * psi / MIB:.0f} MiB): ZeRO-2 on {n} ranks adds only Adam's state and the "
        f"gradient for a rank's shard, {12 * psi / n / MIB:.0f} MiB a rank, and at most "
        f"{allowed / MIB:.0f} MiB is allowed. Something full-sized stays between steps: a "
        "replica of Adam's state or of the gradients, or a copy of the parameters, kept "
        "somewhere your optimizer's own attributes do not show."
    )
