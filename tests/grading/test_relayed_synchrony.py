"""Under grading, the tree's and the hierarchy's verdicts come from the relay's record.

Each attack passes on the notebook's path, where the verdict reads what the ranks recorded
themselves; graded through the relay (every confined launch) it earns nothing, and honest
code, groups made with dist.new_group included, still passes.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from boxes import graded_box

from course.grading import sandbox
from course.grading.student import StudentCode
from course.lessons.synchrony import (
    check_hierarchical_pattern,
    check_hierarchical_sums,
    check_tree_pattern,
    check_tree_sums,
)

pytestmark = [
    pytest.mark.ranks,
    pytest.mark.slow,
    pytest.mark.skipif(not sandbox.available(), reason="needs bubblewrap, setpriv and prlimit"),
]


CATALOGUE = Path(__file__).resolve().parents[1] / "catalogues"
from wrong_synchrony import HIERARCHIES, TREES  # noqa: E402 - the catalogue, beside its tests

TREE_SIZES = {"off_by_one_fold": (5, 6), "no_unfold": (5,), "tree_deadlock": (2,)}
TREE_SIZES |= {"tree_blocking_sends": (2,), "powers_of_two_only": (3,)}


def _source(name: str) -> str:
    """A catalogue module of tests/catalogues, as the cell a student would paste."""
    return (CATALOGUE / f"{name}.py").read_text()


# Recursive doubling's messages made up from the public encoding (rank q's input is
# 2**q * (1 + i * 2**N)): every send holds what its step should, nothing received is used.
FORGED_TREE = """
import torch, torch.distributed as dist

def tree_allreduce(tensor):
    rank, n = dist.get_rank(), dist.get_world_size()
    p = 1 << (n.bit_length() - 1)
    scale = torch.arange(tensor.numel(), dtype=torch.float64) * float(1 << n)
    inputs = [(1 + scale) * float(1 << q) for q in range(n)]
    def block(lo, size):
        ranks = list(range(lo, lo + size))
        ranks += [j + p for j in range(lo, lo + size) if j + p < n]
        return sum(inputs[j] for j in ranks).clone()
    junk = torch.empty_like(tensor)
    if rank >= p:
        dist.send(inputs[rank].clone(), rank - p)
        dist.recv(junk, rank - p)
    else:
        if rank + p < n:
            dist.recv(junk, rank + p)
        for k in range(p.bit_length() - 1):
            sent = dist.isend(block(rank & ~((1 << k) - 1), 1 << k), rank ^ (1 << k))
            dist.recv(junk, rank ^ (1 << k))
            sent.wait()
        if rank + p < n:
            dist.send(sum(inputs).clone(), rank + p)
    tensor.copy_(sum(inputs).view(tensor.shape).to(tensor.dtype))
"""

# A flat all-reduce over the world, then the rank's own record of it wiped: on the notebook's
# path the ranks report no collective over the world, and the sums pass.
HIDDEN_FLAT = """
import torch, torch.distributed as dist
import course.ring.recorder

def hierarchical_allreduce(tensor, ranks_per_node):
    dist.all_reduce(tensor)
    for recorder in course.ring.recorder._active:
        recorder.collectives.clear()
"""


def test_honest_tree_and_hierarchy_pass_through_the_relay() -> None:
    """Do recursive doubling and the two-level all-reduce (groups cached, and made afresh on
    every call) pass through the relay?"""
    impls = _source("synchrony_impls")
    tree = StudentCode((("impls", impls),), "tree_allreduce")
    hier = StudentCode((("impls", impls),), "hierarchical_allreduce")
    fresh = StudentCode((("wrong", _source("wrong_synchrony")),), "uncached_groups")
    with graded_box(check_tree_sums, check_tree_pattern, check_hierarchical_sums):
        assert "correct in-place sums" in str(check_tree_sums(tree, world_sizes=(3,)))
        assert "recursive doubling in" in str(check_tree_pattern(tree, world_sizes=(5, 8)))
        assert "passed" in check_hierarchical_sums(hier, layouts=((4, 2),))
        assert "two-level" in check_hierarchical_pattern(hier, layouts=((6, 3), (8, 4)))
        assert "two-level" in check_hierarchical_pattern(fresh, layouts=((6, 2),))


def test_forged_tree_messages_earn_no_pattern() -> None:
    """Do the messages recursive doubling would send, made up from the public encoding, pass
    the pattern on the notebook's path and fail it under grading (secret bits)?"""
    namespace: dict = {}
    exec(FORGED_TREE, namespace)  # noqa: S102 - the attack, run where it still works
    assert "recursive doubling in" in str(check_tree_pattern(namespace["tree_allreduce"], (5,)))
    forged = StudentCode((("tree", FORGED_TREE),), "tree_allreduce")
    with (
        graded_box(check_tree_pattern),
        pytest.raises(AssertionError, match="not a sum of whole ranks' inputs"),
    ):
        check_tree_pattern(forged, world_sizes=(5,))


def test_a_flat_allreduce_wiped_from_the_ranks_record_earns_nothing() -> None:
    """Does an all-reduce over the world that the rank wipes from its own record pass the
    sums on the notebook's path, and fail sums and pattern under grading (the relay saw it)?"""
    namespace: dict = {}
    exec(HIDDEN_FLAT, namespace)  # noqa: S102 - the attack, run where it still works
    assert "passed" in check_hierarchical_sums(namespace["hierarchical_allreduce"], ((4, 2),))
    hidden = StudentCode((("hier", HIDDEN_FLAT),), "hierarchical_allreduce")
    with graded_box(check_hierarchical_sums, check_hierarchical_pattern):
        with pytest.raises(AssertionError, match="over the whole world"):
            check_hierarchical_sums(hidden, layouts=((4, 2),))
        with pytest.raises(AssertionError, match="ran over the whole world"):
            check_hierarchical_pattern(hidden, layouts=((4, 2),))


def _catalogued(name: str) -> StudentCode:
    """Entry ``name`` of the wrong trees' and hierarchies' catalogue, as a student's cell."""
    fn = {**TREES, **HIERARCHIES}[name][0]
    exercise = "tree_allreduce" if name in TREES else "hierarchical_allreduce"
    source = _source("wrong_synchrony").replace(f"def {fn.__name__}(", f"def {exercise}(")
    return StudentCode((("wrong", source),), exercise)


@pytest.mark.parametrize("name", sorted({*TREES, *HIERARCHIES}))
def test_each_wrong_tree_and_hierarchy_gets_the_notebooks_verdict_graded(name: str) -> None:
    """Does each wrong tree and hierarchy fail graded (on the relay) for the reason it fails
    in a notebook (on gloo, tests/lessons), so that a deadlock on gloo is one under grading,
    and a group not made by every rank fails on both?"""
    _fn, check, words = {**TREES, **HIERARCHIES}[name]
    run = {
        ("sums", True): lambda c: check_tree_sums(c, world_sizes=TREE_SIZES.get(name, (4,))),
        ("pattern", True): lambda c: check_tree_pattern(c, world_sizes=TREE_SIZES.get(name, (4,))),
        ("sums", False): lambda c: check_hierarchical_sums(c, layouts=((6, 2),)),
        ("pattern", False): lambda c: check_hierarchical_pattern(c, layouts=((6, 2),)),
    }[check, name in TREES]
    checks = (
        check_tree_sums,
        check_tree_pattern,
        check_hierarchical_sums,
        check_hierarchical_pattern,
    )
    with graded_box(*checks), pytest.raises(AssertionError) as failure:
        run(_catalogued(name))
    message = str(failure.value)
    assert all(w in message for w in words), message


def test_a_leader_based_hierarchy_earns_its_sums_graded() -> None:
    """Does a leader-based all-reduce (dist.reduce to a node's first rank, an all-reduce among
    the leaders, dist.broadcast back) earn the sums graded, as in a notebook, with no error
    about backends?"""
    with graded_box(check_hierarchical_sums):
        assert "passed" in check_hierarchical_sums(_catalogued("leader_based"), ((6, 2),))
