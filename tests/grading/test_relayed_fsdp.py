"""Under grading, the FSDP checks run through the relay, and the traffic verdict is its record.

The model solution passes every FSDP check confined, its collectives carried by the relay.
An all-reduce of the whole gradient, disguised in the rank's own recorder as the
reduce-scatter FSDP makes, passes the traffic check on the notebook's path (which reads
what the ranks recorded) and fails it under grading (the relay saw the all-reduce); a copy of
every gathered unit kept in a global passes the memory count and fails graded (measured from
outside the ranks).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from course.checks import (
    check_fsdp_memory,
    check_fsdp_mixed_precision,
    check_fsdp_traffic,
    check_fully_shard,
)
from course.grading import sandbox
from course.grading.rankbox import RankBox
from course.grading.student import StudentCode

pytestmark = [
    pytest.mark.ranks,
    pytest.mark.slow,
    pytest.mark.skipif(not sandbox.available(), reason="needs bubblewrap, setpriv and prlimit"),
]

IMPLS = (Path(__file__).resolve().parent.parent / "checks" / "fsdp_impls.py").read_text()

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
        assert "nothing else" in check_fsdp_traffic(fn, world_sizes=(2,))
        assert "Measured from outside" in check_fsdp_memory(fn)
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
