"""Grade a student's ``hierarchical_allreduce(tensor, ranks_per_node)``: sums, and two levels.

    from course.checks import check_hierarchical_sums, check_hierarchical_pattern
    print(check_hierarchical_sums(hierarchical_allreduce))   # raises AssertionError that teaches

Ranks ``node * R .. node * R + R - 1`` form a node (R = ``ranks_per_node``). The function runs
on fresh ranks for several (world size, R) layouts, on tensors whose size R divides and
does not, float and integer dtypes; every rank's tensor must end as the float64 sum made
here, in the caller, and no collective over the whole world may compute it. The pattern is
judged from the record of a run (``course.ring.hierarchy.hierarchy_violations``): which
collectives ran on which groups and with how many bytes, what crosses between nodes against
the two-level formula, and the run's time under an emulated slow link between nodes against
the flat ring's. Under grading that record is the relay's own (``course.ring.relayed``);
in a notebook, the ranks' recorder's (``course.ring.recorder``). Every launch has a deadline.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from course.checks.allreduce import LAUNCH_TIMEOUT, SHOWN
from course.checks.compare import fresh_seed
from course.checks.ring_cases import DTYPES, Case, compare, inputs, running_case
from course.checks.ring_hints import hierarchy_hints
from course.checks.teaching import failure_message, need_function, read_record, teaches
from course.ranks import confined, relay
from course.ranks.wording import count, listed
from course.ring.hierarchy import EMULATION, Call, hierarchy_violations
from course.ring.logs import log_path, open_log
from course.ring.recorder import Recorder, scratch_dir
from course.ring.relayed import relayed_calls

__all__ = ["check_hierarchical_allreduce", "check_hierarchical_pattern", "check_hierarchical_sums"]

LAYOUTS = ((4, 2), (6, 3), (6, 2), (8, 4))  # (world size, ranks per node)
NAME = "hierarchical_allreduce"
PATTERN_NUMELS = (17, 4097)  # one latency-bound, one bandwidth-bound
HIERARCHY_DEADLOCK = (
    "Every rank was waiting and none could go on: a deadlock. Every rank must create every "
    "group with dist.new_group, in the same order (even the groups it is not in), and call "
    "each collective on its groups in the same order as the other members."
)


@teaches
def check_hierarchical_sums(
    fn: Callable[[torch.Tensor, int], Any], layouts: Sequence[tuple[int, int]] = LAYOUTS
) -> str:
    """Check that ``fn(tensor, ranks_per_node)`` sums in place, with no collective over the
    whole world (communication pattern not judged)."""
    n = _run_all(fn, layouts, sums=True)
    return f"{NAME} passed: correct in-place sums for {n} tensors on {_layouts(layouts)}."


@teaches
def check_hierarchical_pattern(
    fn: Callable[[torch.Tensor, int], Any], layouts: Sequence[tuple[int, int]] = LAYOUTS
) -> str:
    """Check that ``fn`` is a two-level all-reduce: only shard all-reduces cross nodes, its
    bytes across nodes within the formula, faster than the flat ring on a slow link."""
    n = _run_all(fn, layouts, sums=False)
    return (
        f"{NAME} passed: a two-level all-reduce in {n} recorded runs on {_layouts(layouts)} "
        "(across nodes only shard all-reduces, bytes within 2(M-1)/M x S/R, faster than the "
        "flat ring under the emulated slow link)."
    )


@teaches
def check_hierarchical_allreduce(
    fn: Callable[[torch.Tensor, int], Any], layouts: Sequence[tuple[int, int]] = LAYOUTS
) -> str:
    """Check both: right sums on every rank, and the two-level pattern."""
    return "\n".join(
        (
            check_hierarchical_sums.__wrapped__(fn, layouts),
            check_hierarchical_pattern.__wrapped__(fn, layouts),
        )
    )


def _layouts(layouts: Sequence[tuple[int, int]]) -> str:
    said = [f"{n} ranks as {n // r} nodes of {r}" for n, r in layouts]
    return listed(said)


# --- the rank side ---------------------------------------------------------------------


def _run_cases(fn: Callable, cases: list[tuple[Case, int]], mine: list, directory: str) -> list:
    """On each rank: call ``fn(tensor, ranks_per_node)`` once per case on this rank's own
    tensor; return the tensor, what ``fn`` returned, and what the recorder saw (for the
    notebook's verdict only: under grading the relay's record is used)."""
    rank = dist.get_rank()
    out = []
    with open_log(log_path(directory, rank, "progress")) as progress:
        for i, (_case, ranks_per_node) in enumerate(cases):
            relay.mark(i)  # under grading: where case i starts, in the relay's record
            progress.write(json.dumps({"case": i}) + "\n")
            tensor = mine[i].clone()
            with Recorder() as seen:
                returned = fn(tensor, ranks_per_node)
            collectives = [(c.name, c.group, c.contributed) for c in seen.collectives]
            sends = [(m.peer, m.nbytes) for m in seen.messages if m.op == "send"]
            kind = None if returned is None else type(returned).__name__
            out.append((tensor, kind, collectives, sends))
            progress.write(json.dumps({"done": i}) + "\n")
    return out


# --- the caller side -------------------------------------------------------------------


def _cases(world_size: int, ranks_per_node: int, sums: bool) -> list[tuple[Case, int]]:
    if not sums:
        return [(Case((numel,), torch.float64, True), ranks_per_node) for numel in PATTERN_NUMELS]
    n, r = world_size, ranks_per_node
    shapes = [(1,), (r + 1,), (4 * n,), (4 * n + 3,), (3, n + 1), (2, 3, 5)]
    return [(Case(s, DTYPES[i % len(DTYPES)]), r) for i, s in enumerate(shapes)]


def _check_layouts(layouts: Sequence[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    layouts = tuple(tuple(x) for x in layouts)  # type: ignore[misc]
    ok = layouts and all(
        len(x) == 2 and all(type(v) is int for v in x) and 2 <= x[1] < x[0] and x[0] % x[1] == 0
        for x in layouts
    )
    if not ok:
        raise ValueError(
            "layouts must be (world size, ranks per node) pairs, ranks per node at least 2, "
            f"dividing the world size into at least 2 nodes; got {layouts}"
        )
    return layouts  # type: ignore[return-value]


def _run_all(fn: Callable, layouts: Sequence[tuple[int, int]], *, sums: bool) -> int:
    need_function(NAME, fn)
    layouts = _check_layouts(layouts)
    relayed = confined.current() is not None  # graded: the relay carries every message
    checked = 0
    for world_size in dict.fromkeys(n for n, _ in layouts):
        cases = [c for n, r in layouts if n == world_size for c in _cases(n, r, sums)]
        made = [inputs(case, world_size, seed=fresh_seed(None)) for case, _ in cases]
        with scratch_dir() as directory:
            result = _launch(fn, world_size, cases, made, directory)
            for i, (case, ranks_per_node) in enumerate(cases):
                got = [r[i] for r in result.results]
                calls = _record(result, world_size, i) if relayed else _reported(got, case)
                if sums:
                    _refuse_flat(world_size, calls)
                    _judge_sums(world_size, ranks_per_node, case, made[i], got)
                else:
                    _judge_pattern(world_size, ranks_per_node, case, calls)
                checked += 1
    return checked


def _launch(fn: Callable, world_size: int, cases: list, made: list, directory: str) -> Any:
    from course.ranks import PerRank, launch

    mine = PerRank([made[i][r] for i in range(len(cases))] for r in range(world_size))
    result = launch(_run_cases, world_size, fn, cases, mine, directory, timeout=2 * LAUNCH_TIMEOUT)
    if result.ok:
        return result
    running = [running_case(directory, r, len(cases), result.relayed) for r in range(world_size)]
    index = min((i for i in running if i is not None), default=None)
    doing = ""
    if index is not None:
        case, ranks_per_node = cases[index]
        doing = f" while summing {case} with ranks_per_node={ranks_per_node}"
    raise AssertionError(
        failure_message(NAME, world_size, result.failures, doing, HIERARCHY_DEADLOCK)
    )


def _record(result: Any, world_size: int, i: int) -> list[Call]:
    """Case ``i`` as the relay recorded it (under grading: nothing a rank reported)."""
    run = f"{NAME}'s run on {world_size} ranks"
    return read_record(run, "case by case", relayed_calls, result.relayed, world_size, i)


def _reported(got: list, case: Case) -> list[Call]:
    """Case ``i`` as the ranks' recorders saw it (the notebook's path): the k-th collective
    a member made on a group matched with every other member's k-th on it."""
    itemsize = torch.empty((), dtype=case.dtype).element_size()
    calls: dict[tuple[tuple[int, ...], int], dict] = {}
    out: list[Call] = []
    for rank, (_, _, collectives, sends) in enumerate(got):
        seen: dict[tuple[int, ...], int] = {}
        for name, group, put_in in collectives:
            group = tuple(group) or (-1,)  # noqa: PLW2901 - () is a route the recorder cannot place
            k = seen.get(group, 0)
            seen[group] = k + 1
            entry = calls.setdefault((group, k), {"kind": _kind(name), "bytes": {}})
            entry["bytes"][rank] = max(put_in, 0)
        out += [Call("send", (rank, peer), (nbytes,), itemsize) for peer, nbytes in sends]
    for (group, _), entry in calls.items():
        sizes = tuple(entry["bytes"].get(m, 0) for m in group)
        out.append(Call(entry["kind"], group, sizes, itemsize))
    return out


def _kind(name: str) -> str:
    """The verdict's name for a recorded collective (all_gather_into_tensor: all_gather)."""
    for kind in ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "all_to_all"):
        if name.startswith(kind):
            return kind
    return name


def _refuse_flat(world_size: int, calls: list[Call]) -> None:
    """Fail, earning nothing, when a collective over the whole world (or one the record
    cannot place in a group) ran: it, not the hierarchy, computed the sum."""
    world = tuple(range(world_size))
    for call in calls:
        if call.kind in ("send", "barrier"):
            continue
        if call.group == (-1,):
            raise AssertionError(
                f"{NAME} called dist.{call.kind} in a way the recorder cannot place in a "
                "group: call the collectives of torch.distributed with group=... "
                "(a group from dist.new_group)"
            )
        if tuple(sorted(call.group)) == world:
            raise AssertionError(
                f"{NAME} called dist.{call.kind} over the whole world (ranks 0..{world_size - 1})"
                ": the exercise is to build the all-reduce from collectives on subgroups "
                "(dist.new_group: one per node, and one per place in a node across nodes), so "
                "a result a flat collective computed earns none of its points."
            )


def _judge_sums(world_size: int, ranks_per_node: int, case: Case, made: list, got: list) -> None:
    expected = torch.stack([t.to(torch.float64) for t in made]).sum(0).to(case.dtype)
    for rank, (tensor, returned, _, _) in enumerate(got):
        problem = compare(tensor, expected, case)
        if problem is None:
            continue
        head = (
            f"{NAME} gave a wrong result on {world_size} ranks ({world_size // ranks_per_node} "
            f"nodes of {ranks_per_node}) for {case}, rank {rank}:"
        )
        hints = hierarchy_hints(tensor, made, expected, ranks_per_node, returned, rank)
        raise AssertionError("\n".join([head, "  " + problem, *hints]))


def _judge_pattern(world_size: int, ranks_per_node: int, case: Case, calls: list[Call]) -> None:
    numel, itemsize = case.shape[0], torch.empty((), dtype=case.dtype).element_size()
    found = hierarchy_violations(calls, world_size, ranks_per_node, numel, itemsize)
    if not found:
        return
    m = world_size // ranks_per_node
    lines = [
        (
            f"{NAME} is not a two-level all-reduce on {world_size} ranks ({m} nodes of "
            f"{ranks_per_node}; tensor of {count(numel, 'element')}, recorded):"
        )
    ]
    lines += [f"  {v}" for v in found[:SHOWN]]
    if len(found) > SHOWN:
        lines.append(f"  ... and {len(found) - SHOWN} more")
    lines.append(
        "The two-level all-reduce: reduce-scatter inside each node (a group of the node's "
        "ranks), so each rank holds one shard of about 1/R of the tensor summed over its node; "
        "all-reduce that shard across nodes (a group of one rank per node); all-gather the "
        f"shards inside the node. Times are {EMULATION}."
    )
    raise AssertionError("\n".join(lines))
