"""Graded, does a torch built-in that an exercise forbids stay out of reach however it is held?

A check's refusals (``course.checks.refusals``) run on each rank before the job is unpickled,
so before any cell of the student's; on graded ranks the files of the refused code are then
unreadable. Each attack here did the exercise's job with the built-in when the refusal came
after the student's cells (a reference kept from the cell's top level, a subclass that brings
its own ``__init__``, DDP's join hook called by hand) or when the module could be loaded a
second time from its file. Each is shown doing the job where nothing is refused, and earning
nothing graded.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from course.checks.refusals import JOIN, refusing
from course.grading import sandbox
from course.grading.rankbox import RankBox
from course.grading.student import StudentCode
from course.lessons.accumulation import check_sampler_indices, check_train_uneven
from course.lessons.buckets import check_overlapping_ddp
from course.ranks import PerRank, launch

pytestmark = [
    pytest.mark.ranks,
    pytest.mark.slow,
    pytest.mark.skipif(not sandbox.available(), reason="needs bubblewrap, setpriv and prlimit"),
]

HONEST_LOOP = """
import torch, torch.distributed as dist
from torch import nn

def train_uneven(ddp, optimizer, batches):
    step = 0
    while True:
        anyone = torch.tensor(float(step < len(batches)))
        dist.all_reduce(anyone)
        if anyone.item() == 0:
            return
        x, y = batches[min(step, len(batches) - 1)]
        optimizer.zero_grad()
        (nn.functional.mse_loss(ddp(x), y) * float(step < len(batches))).backward()
        optimizer.step()
        step += 1
"""

# Join's class, copied whole at the cell's top level (before a refusal made inside the check).
JOIN_COPIED = """
import torch
from torch.distributed.algorithms.join import Join

JoinKept = type("JoinKept", (), dict(vars(Join)))

def train_uneven(ddp, optimizer, batches):
    with JoinKept([ddp]):
        for x, y in batches:
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(ddp(x), y).backward()
            optimizer.step()
"""

# A subclass with an __init__ and __enter__ of its own: Join's __exit__ does the shadowing.
JOIN_SUBCLASSED = """
import torch
from torch.distributed.algorithms.join import Join, _JoinConfig

class Mine(Join):
    def __init__(self, joinables):
        self._joinables = joinables
        self._join_hooks = [j.join_hook() for j in joinables]
        self._enable, self._throw_on_early_termination = True, False
        for i, j in enumerate(joinables):
            j._join_config = _JoinConfig(True, False, i == 0)
        self._extract_dist_info()

    def __enter__(self):
        pass

def train_uneven(ddp, optimizer, batches):
    with Mine([ddp]):
        for x, y in batches:
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(ddp(x), y).backward()
            optimizer.step()
"""

# DistributedSampler's module loaded a second time from its file, after the refusal.
SAMPLER_AGAIN = """
import importlib.util
import torch.utils.data.distributed as original

def sampler_indices(n, replicas, rank, shuffle=True, seed=0, epoch=0, drop_last=False):
    spec = importlib.util.spec_from_file_location("sampler_again", original.__file__)
    again = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(again)
    sampler = again.DistributedSampler(range(n), replicas, rank, shuffle, seed, drop_last)
    sampler.set_epoch(epoch)
    return list(sampler)
"""

# DDP's own C++ reducer, which buckets and all-reduces from autograd hooks by itself.
REDUCER = """
import torch.distributed as dist

class OverlappingDDP:
    def __init__(self, module, bucket_cap_mb):
        self.module = module
        params = list(module.parameters())
        cap = int(bucket_cap_mb * 2**20)
        self.reducer = dist.Reducer(params, [list(range(len(params)))], [cap], dist.group.WORLD)

    def __call__(self, *inputs):
        return self.module(*inputs)

    def finish(self):
        pass
"""


def _code(source: str, name: str) -> StudentCode:
    return StudentCode(((name, source),), name)


def _defined(source: str, name: str) -> Any:
    namespace: dict = {}
    exec(source, namespace)  # noqa: S102 - the attack, run where nothing refuses it
    return namespace[name]


def _unrefused_weights(train: Any, batches: list) -> torch.Tensor:
    """On each rank: the loop on DDP with nothing refused; the final weights."""
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    ddp = DDP(model)
    train(ddp, torch.optim.SGD(ddp.parameters(), lr=0.1), batches)
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def _join_weights(batches: list) -> torch.Tensor:
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    for t in range(max(map(len, batches))):
        model.zero_grad()
        losses = [nn.functional.mse_loss(model(b[t][0]), b[t][1]) for b in batches if t < len(b)]
        (sum(losses) / len(batches)).backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.1 * p.grad  # noqa: PLW2901 - in place: p is the parameter itself
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def test_an_honest_loop_passes_graded() -> None:
    """Does a loop written without Join pass graded, Join refused before its cells ran?"""
    with RankBox():
        assert "without Join" in check_train_uneven(_code(HONEST_LOOP, "train_uneven"))


@pytest.mark.parametrize("attack", [JOIN_COPIED, JOIN_SUBCLASSED], ids=["copied", "subclassed"])
def test_join_held_before_the_refusal_earns_nothing(attack: str) -> None:
    """Does Join, kept from the cell's top level or subclassed around its refused __init__,
    do the loop's job where nothing is refused, and fail graded with Join's refusal?"""
    g = torch.Generator().manual_seed(1)
    batches = [
        [(torch.randn(2, 3, generator=g), torch.randn(2, 1, generator=g))] * n for n in (3, 1)
    ]
    weights = launch(_unrefused_weights, 2, _defined(attack, "train_uneven"), PerRank(batches))
    assert weights.ok, weights.failures
    assert all(torch.allclose(w, _join_weights(batches)) for w in weights.results)
    with RankBox(), pytest.raises(AssertionError, match="asks for the loop without Join"):
        check_train_uneven(_code(attack, "train_uneven"))


def test_a_second_copy_of_a_refused_module_is_not_on_graded_ranks() -> None:
    """Does DistributedSampler's module, loaded again from its file, pass in a notebook (where
    the file is there) and fail graded, where the file reads as empty?"""
    assert "in order" in check_sampler_indices(_defined(SAMPLER_AGAIN, "sampler_indices"))
    with RankBox(), pytest.raises(AssertionError, match="has no attribute 'DistributedSampler'"):
        check_sampler_indices(_code(SAMPLER_AGAIN, "sampler_indices"))


def test_ddps_reducer_is_refused_to_overlapping_ddp() -> None:
    """Is DDP's C++ reducer, which would bucket and overlap on its own, refused graded?"""
    with RankBox(), pytest.raises(AssertionError, match="torch's DistributedDataParallel"):
        check_overlapping_ddp(_code(REDUCER, "OverlappingDDP"))


def _reach_join_join_hook() -> str:
    """On a rank: DDP's join hook, reached by hand."""
    ddp = DDP(nn.Linear(2, 1))
    try:
        ddp.join_hook().main_hook()
    except AssertionError as err:
        return str(err)
    return "ran"


def test_ddps_join_hook_is_refused_with_join() -> None:
    """Is DDP's join hook (the shadowing Join calls) refused with Join, before the job?"""
    told = launch(_reach_join_join_hook, 2, before=refusing(JOIN)).check()
    assert all(t == JOIN.message for t in told), told
