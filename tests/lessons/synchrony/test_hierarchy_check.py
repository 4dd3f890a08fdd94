"""The hierarchy grader: the two-level all-reduce passes, each wrong one fails for its reason."""

from __future__ import annotations

import pytest
import synchrony_impls
from student_code import as_student_code
from wrong_synchrony import HIERARCHIES, uncached_groups

from course.lessons.synchrony import check_hierarchical_pattern, check_hierarchical_sums
from course.ring.hierarchy import Call, emulated_time, flat_ring_time, hierarchy_violations

pytestmark = pytest.mark.ranks

hierarchical_allreduce = as_student_code(synchrony_impls.hierarchical_allreduce)
CHECKS = {"sums": check_hierarchical_sums, "pattern": check_hierarchical_pattern}


def test_the_two_level_allreduce_passes() -> None:
    """Does the model pass sums and pattern on every default layout?"""
    assert "24 tensors" in check_hierarchical_sums(hierarchical_allreduce)
    assert "8 recorded runs" in check_hierarchical_pattern(hierarchical_allreduce)


def test_groups_made_on_every_call_pass() -> None:
    """Do groups made afresh on every call (not cached) pass as cached ones do?"""
    fn = as_student_code(uncached_groups)
    assert "passed" in check_hierarchical_sums(fn, layouts=((4, 2), (6, 3)))
    assert "passed" in check_hierarchical_pattern(fn, layouts=((6, 2),))


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(n, marks=pytest.mark.deadlocks) if n == "groups_of_its_own" else n
        for n in sorted(HIERARCHIES)
    ],
)
def test_wrong_hierarchy_fails_with_the_reason(name: str) -> None:
    """Does each wrong hierarchy fail its check with a message naming the mistake?"""
    fn, check, words = HIERARCHIES[name]
    with pytest.raises(AssertionError) as failure:
        CHECKS[check](as_student_code(fn), layouts=((6, 2),))
    message = str(failure.value)
    assert all(w in message for w in words), message


def test_the_whole_tensor_across_nodes_earns_the_sums() -> None:
    """Is a right sum with too many bytes across nodes given the sums (partial credit)?"""
    fn = as_student_code(HIERARCHIES["whole_across"][0])
    assert "passed" in check_hierarchical_sums(fn, layouts=((4, 2),))


def test_the_emulated_time_decides_alone() -> None:
    """Is a record that keeps every structural rule but is no faster than the flat ring
    (a shard all-reduce across nodes run many times over) failed on its time, which is said?"""
    numel, n, r = 8, 4, 2
    shard = Call("all_reduce", (0, 2), (32, 32))
    calls = [shard] * 40
    assert emulated_time(calls, n, r) >= flat_ring_time(n, numel * 8)
    found = [v.text for v in hierarchy_violations(calls, n, r, numel, 8)]
    assert any("emulated slow link" in t and "alpha-beta" in t for t in found), found


def test_a_run_that_skips_a_level_fails() -> None:
    """Is a record with no call at all (nothing crosses, so it is "fast") failed, and one
    with the cross-node all-reduce but nothing inside a node?"""
    found = [v.text for v in hierarchy_violations([], 4, 2, 8, 8)]
    assert any("made no call inside its node" in t for t in found), found
    across_only = [Call("all_reduce", (0, 2), (32, 32)), Call("all_reduce", (1, 3), (32, 32))]
    found = [v.text for v in hierarchy_violations(across_only, 4, 2, 8, 8)]
    assert any("rank 0 made no call inside its node" in t for t in found), found
    inside_only = [Call("all_reduce", (0, 1), (64, 64)), Call("all_reduce", (2, 3), (64, 64))]
    found = [v.text for v in hierarchy_violations(inside_only, 4, 2, 8, 8)]
    assert any("rank 0 all-reduced 0 elements across nodes" in t for t in found), found
