"""Under grading, the FSDP checks run through the relay, and the traffic verdict is its record.

The model solution passes every FSDP check confined, its collectives carried by the relay.
An all-reduce of the whole gradient, disguised in the rank's own recorder as the
reduce-scatter FSDP makes, passes the traffic check on the notebook's path (which reads
what the ranks recorded) and fails it under grading (the relay saw the all-reduce); a copy of
every gathered unit kept in a global passes the memory count and fails graded (measured from
outside the ranks), and so do units kept through the backward with the count patched. A
backward that keeps the forward's parameters loses the same checks on both paths, with or
without a dummy all-gather for the traffic to count: the relay (graded) or the rank's process
groups (in a notebook) scale what one step's backward gathers bring, and the gradients must
follow.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from course.grading import sandbox
from course.grading.rankbox import RankBox
from course.grading.student import StudentCode
from course.lessons.fsdp import (
    check_fsdp_memory,
    check_fsdp_mixed_precision,
    check_fsdp_traffic,
    check_fully_shard,
)

pytestmark = [
    pytest.mark.ranks,
    pytest.mark.slow,
    pytest.mark.skipif(not sandbox.available(), reason="needs bubblewrap, setpriv and prlimit"),
]

CATALOGUE = Path(__file__).resolve().parents[1] / "catalogues"
from wrong_fsdp import KEPT_FOR_BACKWARD, LOST_BY_KEEPING, WRONG, source  # noqa: E402 - beside its tests

IMPLS = (CATALOGUE / "fsdp_impls.py").read_text()

# The gradient all-reduced whole, then the rank's own record of that call rewritten as the
# reduce-scatter of the padded unit that FSDP makes.
FORGED = """
import course.ring.recorder as _recorder
from course.ring.collectives import Collective as _Collective

def _forged_reduce_scatter(out, grad, *args, **kwargs):
    n, r = dist.get_world_size(), dist.get_rank()
    dist.all_reduce(grad)
    out.copy_(grad.view(n, -1)[r])
    numel, size = grad.numel() + out.numel(), grad.element_size()
    for seen in _recorder._active:
        seen.collectives[-1] = _Collective(
            "reduce_scatter_tensor", numel, numel * size, False, 0.0, tuple(range(n)),
            grad.numel() * size,
        )

dist.reduce_scatter_single = _forged_reduce_scatter
"""


# Every gathered unit, before it is freed, copied into a global that no count walks to (on
# the ranks, from the first call of fully_shard).
KEPT = """
_KEPT = []
_honest = fully_shard


def fully_shard(module, **kwargs):
    if not hasattr(torch.UntypedStorage.resize_, "keeping"):
        resize = torch.UntypedStorage.resize_

        def keeping(self, size):
            if size == 0 and self.nbytes():
                _KEPT.append(self.clone())
            return resize(self, size)

        keeping.keeping = True
        torch.UntypedStorage.resize_ = keeping
    return _honest(module, **kwargs)
"""


# KEPT, with 160 MiB of ballast made when the cells run and freed at the forward's first
# free: what the kept units add to the forward is then below nothing.
BALLASTED = KEPT.replace(
    "_KEPT = []\n", "_KEPT = []\nBALLAST = [torch.ones(40 * 2**20)]\n"
).replace(
    "            if size == 0 and self.nbytes():\n",
    "            if size == 0 and self.nbytes():\n                BALLAST.clear()\n",
)


def test_the_model_solution_passes_through_the_relay() -> None:
    """Does the model solution pass values, traffic, memory and mixed precision confined?"""
    fn = StudentCode((("impls", IMPLS),), "fully_shard")
    with RankBox():
        assert "largest difference" in check_fully_shard(fn, world_sizes=(3,), repeats=1)
        assert "what its all-gathers bring" in check_fsdp_traffic(fn, world_sizes=(2,))
        assert "in the backward" in check_fsdp_memory(fn)
        assert "bf16 all-gathers" in check_fsdp_mixed_precision(fn, world_sizes=(2,))


def test_a_bf16_average_fails_mixed_precision_on_both_paths() -> None:
    """Does a fully_shard that divides its bf16 gradient by world_size before the fp32
    reduce-scatter fail the mixed-precision check on 3 ranks, on the notebook's path and
    confined through the relay, with the same hint?"""
    source = IMPLS + "\nKNOBS['divide_in_param_dtype'] = True\n"
    namespace: dict = {"__name__": "__main__"}
    exec(source, namespace)  # noqa: S102 - a student's cell
    said = []
    for fn, box in (
        (namespace["fully_shard"], None),
        (StudentCode((("impls", source),), "fully_shard"), RankBox()),
    ):
        with box or contextlib.nullcontext(), pytest.raises(AssertionError) as failure:
            check_fsdp_mixed_precision(fn, world_sizes=(3,))
        said.append(str(failure.value))
    assert all("before anything else" in s and "rank 0 of 3" in s for s in said), said


def test_a_forged_record_earns_no_traffic_points() -> None:
    """Does an all-reduce the rank rewrites in its own record as a reduce-scatter pass the
    traffic on the notebook's path, and fail it under grading (the relay's record)?"""
    namespace: dict = {"__name__": "__main__"}
    exec(IMPLS + FORGED, namespace)  # noqa: S102 - the attack, run where it still works
    assert "nothing else" in check_fsdp_traffic(namespace["fully_shard"], world_sizes=(2,))
    forged = StudentCode((("impls", IMPLS + FORGED),), "fully_shard")
    with RankBox(), pytest.raises(AssertionError, match="it called all_reduce"):
        check_fsdp_traffic(forged, world_sizes=(2,))


def test_gathered_units_hidden_from_the_count_fail_the_memory_check() -> None:
    """Does a fully_shard that keeps a copy of every gathered unit in a global pass the
    rank's count on the notebook's path, and fail graded, measured from outside?"""
    namespace: dict = {"__name__": "__main__"}
    exec(IMPLS + KEPT, namespace)  # noqa: S102 - the attack, run where the count alone decides
    assert "counted on the ranks" in check_fsdp_memory(namespace["fully_shard"])
    kept = StudentCode((("impls", IMPLS + KEPT),), "fully_shard")
    with RankBox(), pytest.raises(AssertionError, match="measured from outside the rank"):
        check_fsdp_memory(kept)


def test_ballast_made_early_hides_no_gathered_unit() -> None:
    """Do the kept units, made room for by ballast the cells took when they ran and freed in
    the forward, fail graded (memory counts from the start of the run)?"""
    assert "BALLAST.clear()" in BALLASTED
    kept = StudentCode((("impls", IMPLS + BALLASTED),), "fully_shard")
    with RankBox(), pytest.raises(AssertionError, match="than when its run began"):
        check_fsdp_memory(kept)


def test_a_deadlock_says_where_each_rank_waited_through_the_relay() -> None:
    """Does a fully_shard whose last rank waits for a message no rank sends fail, confined,
    within the deadline, naming the call each rank was blocked in?"""
    fn = StudentCode((("impls", IMPLS + "\nKNOBS['hang_on_last_rank'] = True\n"),), "fully_shard")
    with RankBox(), pytest.raises(AssertionError) as failure:
        check_fully_shard(fn, world_sizes=(2,), repeats=1, timeout=10.0)
    message = str(failure.value)
    assert "rank 0 deadlocked in dist.all_gather_single" in message, message
    assert "rank 1 deadlocked in dist.recv" in message, message


# Units never freed after their reduce-scatter (held through the backward), and the rank's
# own count of gathered bytes patched to nothing, from the first call of fully_shard.
UNCOUNTED = """
_counted_fully_shard = fully_shard


def fully_shard(module, **kwargs):
    import course.lessons.fsdp.rank

    course.lessons.fsdp.rank._held = lambda model, skip: 0
    return _counted_fully_shard(module, **kwargs)
"""


def _cell(name: str) -> tuple[Callable[..., Any], StudentCode]:
    """Catalogue entry ``name`` (or "honest"), run as a notebook runs it and as graded."""
    text = IMPLS if name == "honest" else source(name)
    namespace: dict = {"__name__": "__main__"}
    exec(text, namespace)  # noqa: S102 - a student's cell
    return namespace["fully_shard"], StudentCode((("impls", text),), "fully_shard")


CHECKS = {
    "values": lambda fn: check_fully_shard(fn, world_sizes=(2,), repeats=1),
    "traffic": lambda fn: check_fsdp_traffic(fn, world_sizes=(2,)),
    "memory": check_fsdp_memory,
    "mixed": lambda fn: check_fsdp_mixed_precision(fn, world_sizes=(2,)),
}


def _verdicts(fn: Callable[..., Any]) -> dict[str, str | None]:
    """Each check's failure message, None where it passed."""
    said: dict[str, str | None] = {}
    for check, run in CHECKS.items():
        try:
            run(fn)
            said[check] = None
        except AssertionError as failure:
            said[check] = str(failure)
    return said


@pytest.mark.parametrize("name", KEPT_FOR_BACKWARD)
def test_keeping_the_forwards_parameters_gets_the_same_verdict_on_both_paths(name: str) -> None:
    """Does a backward that computes with the forward's parameters lose the same checks in a
    notebook (gloo) and graded (the relay), with or without a dummy all-gather, with the
    catalogue's hint on its traffic?"""
    in_notebook, graded = _cell(name)
    mine = _verdicts(in_notebook)
    with RankBox():
        theirs = _verdicts(graded)
    for said in (mine, theirs):
        assert {check: bool(why) for check, why in said.items()} == LOST_BY_KEEPING, said
        assert all(w in said["traffic"] for w in WRONG[name][2]), said["traffic"]


def test_units_held_through_the_backward_fail_graded_from_outside() -> None:
    """Does a fully_shard that frees its units after the forward but never after their
    reduce-scatter fail the memory check on both paths: in a notebook by the rank's count,
    graded by the judge's own measure of the backward?"""
    in_notebook, graded = _cell("no_free_after_backward")
    words = WRONG["no_free_after_backward"][2]
    with pytest.raises(AssertionError) as counted:
        check_fsdp_memory(in_notebook)
    with RankBox(), pytest.raises(AssertionError) as measured:
        check_fsdp_memory(graded)
    assert all(w in str(counted.value) for w in words), str(counted.value)
    assert all(w in str(measured.value) for w in words), str(measured.value)
    assert "during the backward" in str(measured.value), str(measured.value)


def test_a_patched_count_hides_no_unit_held_through_the_backward() -> None:
    """Does the same fully_shard with the rank's count of gathered bytes patched to nothing
    pass the count in a notebook, and fail graded, measured from outside in the backward?"""
    cell = source("no_free_after_backward") + UNCOUNTED
    namespace: dict = {"__name__": "__main__"}
    exec(cell, namespace)  # noqa: S102 - the attack, run where the count alone decides
    assert "counted on the ranks" in check_fsdp_memory(namespace["fully_shard"])
    uncounted = StudentCode((("impls", cell),), "fully_shard")
    with RankBox(), pytest.raises(AssertionError, match="during the backward than after sharding"):
        check_fsdp_memory(uncounted)


# Looks, at every fully_shard, through everything alive on the rank for the grader's choice
# of the gathers to scale (its seed), and stops the run if it finds it.
SNOOP = """
_honest_fully_shard = fully_shard


def fully_shard(module, **kwargs):
    import gc

    for o in gc.get_objects():
        found = isinstance(o, dict) and isinstance(o.get("seed"), int) and "skip" in o
        if found or type(o).__name__ in ("Rescale", "GlooGathers"):
            raise RuntimeError("the choice of the scaled gathers is in reach")
    return _honest_fully_shard(module, **kwargs)
"""


def test_no_graded_rank_can_reach_the_choice_of_scaled_gathers() -> None:
    """Is the seed of the scaled gathers within a rank's reach in a notebook (where the
    check's rank code scales them), and nowhere on a graded rank (the relay scales them)?"""
    namespace: dict = {"__name__": "__main__"}
    exec(IMPLS + SNOOP, namespace)  # noqa: S102 - the search, run where it finds the choice
    with pytest.raises(AssertionError, match="in reach"):
        check_fsdp_traffic(namespace["fully_shard"], world_sizes=(2,))
    snoop = StudentCode((("impls", IMPLS + SNOOP),), "fully_shard")
    with RankBox():
        assert "what its all-gathers bring" in check_fsdp_traffic(snoop, world_sizes=(2,))
