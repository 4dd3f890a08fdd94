"""Does every exercise refuse the torch built-in that would do its job, however it is reached?

Each refusal runs on a grading rank only (here: a fresh process, as a check's trial is); the
exercise checks are run with submissions that hand the work to torch, through an alias, a
wrapper or a subclass, and must fail saying so.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

from course.checks.refusals import DDP_HOOKS, SAMPLER, refuse
from course.checks.teaching import CheckFailed
from course.lessons.accumulation import check_sampler_indices
from course.lessons.buckets import check_bucketed_allreduce, check_overlapping_ddp
from course.lessons.ddp_gradients import check_reduce_hook
from course.lessons.zero import check_error_feedback_hook, check_zero_matches_ddp
from course.ranks import run

pytestmark = pytest.mark.ranks


def _reach_refused_builtins() -> dict[str, str]:
    """On a fresh rank: refuse, then reach each built-in through a name bound earlier, a
    wrapper and a subclass; what each raised."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook as early
    from torch.utils.data import DistributedSampler

    class Mine(DistributedSampler):
        pass

    def wrapper(state: object, bucket: object) -> object:
        return early(state, bucket)

    refuse(DDP_HOOKS, SAMPLER)
    out = {}
    for name, call in (
        ("alias", lambda: early(None, None)),
        ("wrapper", lambda: wrapper(None, None)),
        ("subclass", lambda: list(Mine(range(4), 2, 0))),
    ):
        try:
            call()
            out[name] = "ran"
        except AssertionError as err:
            out[name] = str(err)
    return out


def test_a_refused_builtin_is_refused_through_any_name_it_was_bound_to() -> None:
    """After the refusal, do a name imported before it, a wrapper and a subclass all reach the
    refusal's message?"""
    got = run(_reach_refused_builtins, 1)[0]
    assert got["alias"].startswith("this calls one of torch's ready-made comm hooks")
    assert got["wrapper"] == got["alias"]
    assert got["subclass"].startswith("this uses torch's DistributedSampler")


def _files_of_refused_code() -> list[str]:
    from course.checks.refusals import DDP_ITSELF, DDP_RULE

    return refuse(DDP_RULE, DDP_ITSELF)  # DDP's __init__ twice: the second time already refused


def test_a_refusal_names_the_files_of_torchs_code_only() -> None:
    """Are the files a refusal hands over for hiding torch's source and bytecode of what it
    refused (DDP's module), never this course's, even for a built-in refused twice?"""
    files = run(_files_of_refused_code, 1)[0]
    assert any(f.endswith("torch/nn/parallel/distributed.py") for f in files), files
    assert all("/torch/" in f for f in files), files


def torch_sampler(n, replicas, rank, shuffle=True, seed=0, epoch=0, drop_last=False):
    from torch.utils.data import DistributedSampler

    sampler = DistributedSampler(range(n), replicas, rank, shuffle, seed, drop_last)
    sampler.set_epoch(epoch)
    return list(sampler)


def torch_hook(state, bucket):  # no annotations: DDP compares them as objects
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    return default_hooks.allreduce_hook(state, bucket)


def torch_rule(grads: list[torch.Tensor], bucket_cap_mb: float) -> None:
    order = list(reversed(range(len(grads))))
    cap = [int(bucket_cap_mb * 2**20)]
    buckets, _ = dist._compute_bucket_assignment_by_size(  # noqa: SLF001 - the attack
        [grads[i] for i in order], cap, [False] * len(grads), order
    )
    for bucket in buckets:
        for i in bucket:
            dist.all_reduce(grads[i])
            grads[i] /= dist.get_world_size()


class TorchDDP:
    """OverlappingDDP handed to torch's DDP."""

    def __init__(self, module: nn.Module, bucket_cap_mb: float) -> None:
        self.ddp = nn.parallel.DistributedDataParallel(module, bucket_cap_mb=bucket_cap_mb)

    def finish(self) -> None:
        pass


class TorchZero:
    """ZeroOptimizer handed to torch's ZeroRedundancyOptimizer."""

    def __init__(self, params, optimizer_class=torch.optim.Adam, **defaults) -> None:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        self.inner = ZeroRedundancyOptimizer(
            list(params), optimizer_class=optimizer_class, **defaults
        )

    def step(self) -> None:
        self.inner.step()

    def zero_grad(self) -> None:
        self.inner.zero_grad()


def powersgd(state, bucket):  # no annotations: DDP compares them as objects
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

    if "psgd" not in state:
        state["psgd"] = powerSGD_hook.PowerSGDState(process_group=None, start_powerSGD_iter=2)
    return powerSGD_hook.powerSGD_hook(state["psgd"], bucket)


CASES = [
    ("sampler", lambda: check_sampler_indices(torch_sampler, "in order"), "DistributedSampler"),
    ("hook", lambda: check_reduce_hook(torch_hook, world_sizes=(2,)), "ready-made comm hooks"),
    (
        "buckets",
        lambda: check_bucketed_allreduce(torch_rule, world_sizes=(2,)),
        "bucket assignment",
    ),
    (
        "overlap",
        lambda: check_overlapping_ddp(TorchDDP, world_sizes=(2,)),
        "DistributedDataParallel",
    ),
    (
        "zero",
        lambda: check_zero_matches_ddp(TorchZero, world_sizes=(2,)),
        "ZeroRedundancyOptimizer",
    ),
    ("ef hook", lambda: check_error_feedback_hook(powersgd), "ready-made comm hooks"),
]


@pytest.mark.parametrize(("exercise", "check", "named"), CASES, ids=[c[0] for c in CASES])
def test_an_exercise_done_by_torch_fails_and_says_why(by_value, exercise, check, named) -> None:
    """Does each exercise's check fail a submission that hands its job to torch, naming the
    built-in it used?"""
    with pytest.raises(CheckFailed, match=named):
        check()
