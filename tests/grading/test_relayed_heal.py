"""Graded through the relay, does check_heal give every right and wrong heal the verdict it
gets on gloo, its traffic read from the relay's record?"""

from __future__ import annotations

import inspect

import heal_impls
import pytest

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
    source = inspect.getsource(fn).replace(f"def {fn.__name__}(", "def heal(")
    return StudentCode((("heal", HEADER + source),), "heal")


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
