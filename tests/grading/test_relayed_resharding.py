"""Graded through the relay, does check_resharding give every right and wrong sharded
checkpoint the verdict it gets on gloo, the storage, each rank's reads and the calls between
ranks read from the relay's own record?"""

from __future__ import annotations

import inspect

import pytest
import resharding_impls
from student_code import graded_cell

from course.checks.teaching import CheckFailed
from course.grading import sandbox
from course.grading.rankbox import RankBox
from course.grading.student import StudentCode
from course.lessons.fault_tolerance import check_resharding

pytestmark = [
    pytest.mark.ranks,
    pytest.mark.slow,
    pytest.mark.skipif(not sandbox.available(), reason="needs bubblewrap, setpriv and prlimit"),
]

HEADER = (
    "import torch, torch.distributed as dist\n"
    "from course.lessons.fault_tolerance import chunk_bounds\n"
)
# Under grading a launch's ranks start with an empty /tmp of their own, so the files a save
# kept there are gone when the load looks for them: it fails on reading them, not on values.
RELAYED = {(resharding_impls.save_and_keep, resharding_impls.load_kept): "load_resharded failed on"}


def _code(fn, name: str) -> StudentCode:
    return graded_cell(fn, name, HEADER)


def _pair(save, load) -> tuple[StudentCode, StudentCode]:
    return _code(save, "save_sharded"), _code(load, "load_resharded")


@pytest.fixture(scope="module")
def box():
    with RankBox() as rankbox:
        yield rankbox


@pytest.mark.parametrize(("save", "load"), resharding_impls.RIGHT, ids=lambda f: f.__name__)
def test_right_checkpoints_pass_through_the_relay(box, save, load):
    assert "passed" in check_resharding(*_pair(save, load))


@pytest.mark.parametrize(
    ("pair", "hint"), resharding_impls.WRONG.items(), ids=lambda x: getattr(x, "__name__", "")
)
def test_wrong_checkpoints_fail_through_the_relay_with_their_hint(box, pair, hint):
    with pytest.raises(CheckFailed) as failed:
        check_resharding(*_pair(*pair))
    assert RELAYED.get(pair, hint) in str(failed.value)


def test_a_deadlocked_load_fails_through_the_relay(box):
    with pytest.raises(CheckFailed) as failed:
        check_resharding(
            *_pair(resharding_impls.save_sharded, resharding_impls.load_deadlock),
            loaded_on=(2,),
        )
    assert "load_resharded failed on 2 ranks" in str(failed.value)


HONEST_LOAD = inspect.getsource(resharding_impls.load_resharded)
FORGED = {
    "an int": "_R._on_rank = lambda fn, args, storage: (5, [], [])",
    "strings for tensors": (
        "_R._on_rank = lambda fn, args, storage: ({n: 'x' for n in _R.NAMES}, [], [])"
    ),
    "2-D tensors": (
        "_R._on_rank = lambda fn, args, storage: "
        "({n: torch.zeros(15, 1) for n in _R.NAMES}, [], [])"
    ),
    "four things": "_R._on_rank = lambda fn, args, storage: (None, [], [], 1)",
}


@pytest.mark.parametrize("forged", FORGED.values(), ids=list(FORGED))
def test_a_forged_reply_fails_the_cell_not_the_grader(box, forged):
    """Student code that replaces the check's rank-side code, so that the rank replies with
    something the check's code never returns: the check fails in words (CheckFailed), and
    nothing raises inside the grader."""
    source = (
        HONEST_LOAD + "\nimport course.lessons.fault_tolerance.resharding as _R\n" + forged + "\n"
    )
    load = StudentCode((("load_resharded", HEADER + source),), "load_resharded")
    with pytest.raises(CheckFailed):
        check_resharding(_code(resharding_impls.save_sharded, "save_sharded"), load,
                         loaded_on=(2,))  # fmt: skip
