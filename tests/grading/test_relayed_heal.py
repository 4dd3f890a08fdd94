"""Graded through the relay, does check_heal give every right and wrong heal the verdict it
gets on gloo, its traffic read from the relay's record?"""

from __future__ import annotations

import inspect

import heal_impls
import pytest
from student_code import graded_cell

from course.checks.teaching import CheckFailed
from course.grading import sandbox
from course.grading.rankbox import RankBox
from course.grading.student import StudentCode
from course.lessons.fault_tolerance import check_heal

pytestmark = [
    pytest.mark.ranks,
    pytest.mark.slow,
    pytest.mark.skipif(not sandbox.available(), reason="needs bubblewrap, setpriv and prlimit"),
]

HEADER = "import torch, torch.distributed as dist\nfrom torch import nn\n"


def _code(fn) -> StudentCode:
    return graded_cell(fn, "heal", HEADER)


@pytest.fixture(scope="module")
def box():
    with RankBox() as rankbox:
        yield rankbox


@pytest.mark.parametrize("fn", heal_impls.RIGHT, ids=lambda f: f.__name__)
def test_right_heals_pass_through_the_relay(box, fn):
    assert "passed" in check_heal(_code(fn))


@pytest.mark.parametrize(
    ("fn", "hint"), list(heal_impls.WRONG.items()), ids=lambda x: getattr(x, "__name__", "")
)
def test_wrong_heals_fail_through_the_relay_with_their_hint(box, fn, hint):
    with pytest.raises(CheckFailed) as failed:
        check_heal(_code(fn))
    assert hint in str(failed.value)


STORAGE = '''
import course.ranks.relay as relay


def heal(model, step):
    """Every rank's step and parameters put in the relay's storage, the newest taken."""
    n, me = dist.get_world_size(), dist.get_rank()
    relay.put(f"p{me}", nn.utils.parameters_to_vector(model.parameters()).detach())
    relay.put(f"s{me}", torch.tensor([step]))
    dist.barrier()
    steps = [int(relay.get(f"s{r}")[0]) for r in range(n)]
    newest = relay.get(f"p{steps.index(max(steps))}")
    with torch.no_grad():
        nn.utils.vector_to_parameters(newest, model.parameters())
    return max(steps)
'''
# gathers_every_model, with a mark of the rank's own first, as if what follows were no part
# of heal's run
LATE_MARK = (
    "import course.ranks.relay as relay\n\n\n"
    + inspect.getsource(heal_impls.gathers_every_model)
    + """

def heal(model, step):
    relay.mark(1)
    relay.mark = lambda tag: None
    return gathers_every_model(model, step)
"""
)


@pytest.mark.parametrize(
    ("source", "said"),
    [(STORAGE, "to the relay's storage"), (LATE_MARK, "the parameters went through them")],
    ids=["storage", "late_mark"],
)
def test_the_whole_run_is_read_storage_and_marks_included(box, source, said):
    """The relay's storage is no way round the traffic verdict, nor a mark a rank sends: the
    verdict reads every call of the run, and the check's own ranks make none."""
    with pytest.raises(CheckFailed) as failed:
        check_heal(StudentCode((("heal", HEADER + source),), "heal"))
    assert said in str(failed.value)
