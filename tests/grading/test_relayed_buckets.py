"""Under grading, the bucket checks count the all-reduces the relay carried, not the rank's.

Each attack below all-reduces one gradient at a time through the dispatcher, which the
rank's recorder does not see, and writes into that recorder the calls DDP's buckets would
make: it passes on the notebook's path, and graded (the relay's record) it fails, while an
honest bucketed all-reduce and an honest OverlappingDDP pass.
"""

from __future__ import annotations

import pytest

from course.grading import sandbox
from course.grading.rankbox import RankBox
from course.grading.student import StudentCode
from course.lessons.buckets import check_bucketed_allreduce, check_overlapping_ddp

pytestmark = [
    pytest.mark.ranks,
    pytest.mark.slow,
    pytest.mark.skipif(not sandbox.available(), reason="needs bubblewrap, setpriv and prlimit"),
]

# What both attacks share: DDP's bucket rule on sizes alone, a hidden all-reduce, and the
# recorder's list written to.
FORGERY = """
import gc, time
import torch, torch.distributed as dist
from course.ring.collectives import Collective
from course.ring.recorder import Recorder


def rule(sizes, cap):
    out, bucket, held = [], [], 0
    for i in reversed(range(len(sizes))):
        bucket.append(i)
        held += sizes[i]
        if held >= cap * 2**20:
            out.append(bucket)
            bucket, held = [], 0
    return out + ([bucket] if bucket else [])


def hidden_average(t):
    op = torch.ops._c10d_functional
    summed = op.wait_tensor(op.all_reduce(t.detach().clone(), "sum", dist.group.WORLD.group_name))
    t.copy_(summed / dist.get_world_size())


def forge(numel):
    recorder = next(o for o in gc.get_objects() if isinstance(o, Recorder))
    call = Collective("all_reduce", numel, 4 * numel, True, time.perf_counter())
    recorder.collectives.append(call)
"""

BUCKETED = (
    FORGERY
    + """
def bucketed_allreduce(grads, bucket_cap_mb):
    for g in grads:
        hidden_average(g)
    for bucket in rule([g.numel() * g.element_size() for g in grads], bucket_cap_mb):
        forge(sum(grads[i].numel() for i in bucket))
"""
)

HONEST_BUCKETED = """
import torch, torch.distributed as dist


def bucketed_allreduce(grads, bucket_cap_mb):
    bucket, held = [], 0
    for i in reversed(range(len(grads))):
        bucket.append(grads[i])
        held += grads[i].numel() * grads[i].element_size()
        if held >= bucket_cap_mb * 2**20 or i == 0:
            flat = torch.cat([g.reshape(-1) for g in bucket])
            dist.all_reduce(flat)
            flat /= dist.get_world_size()
            at = 0
            for g in bucket:
                g.copy_(flat[at : at + g.numel()].view_as(g))
                at += g.numel()
            bucket, held = [], 0
"""

OVERLAPPING = (
    FORGERY
    + """
class OverlappingDDP:
    def __init__(self, module, bucket_cap_mb):
        self.params = list(module.parameters())
        sizes = [p.numel() * p.element_size() for p in self.params]
        self.buckets = rule(sizes, bucket_cap_mb)
        self.ready = 0
        for p in self.params:
            p.register_post_accumulate_grad_hook(self._ready)

    def _ready(self, p):
        self.ready += 1
        done = 0
        for bucket in self.buckets:
            done += len(bucket)
            if done == self.ready:  # a bucket full: "its all-reduce starts now"
                forge(sum(self.params[i].numel() for i in bucket))

    def finish(self):
        for p in self.params:
            hidden_average(p.grad)
        self.ready = 0
"""
)

HONEST_OVERLAPPING = """
import torch, torch.distributed as dist


class OverlappingDDP:
    def __init__(self, module, bucket_cap_mb):
        self.params = list(module.parameters())
        self.cap = bucket_cap_mb * 2**20
        self.bucket, self.held, self.works = [], 0, []
        for p in self.params:
            p.register_post_accumulate_grad_hook(self._ready)

    def _ready(self, p):
        self.bucket.append(p)
        self.held += p.numel() * p.element_size()
        if self.held >= self.cap or len(self.bucket) + self._done() == len(self.params):
            flat = torch.cat([q.grad.reshape(-1) for q in self.bucket])
            self.works.append((dist.all_reduce(flat, async_op=True), flat, self.bucket))
            self.bucket, self.held = [], 0

    def _done(self):
        return sum(len(b) for _, _, b in self.works)

    def finish(self):
        for work, flat, bucket in self.works:
            work.wait()
            flat /= dist.get_world_size()
            at = 0
            for q in bucket:
                q.grad.copy_(flat[at : at + q.numel()].view_as(q.grad))
                at += q.numel()
        self.works = []
"""


def _code(source: str, name: str) -> StudentCode:
    return StudentCode(((name, source),), name)


def test_forged_bucket_calls_pass_in_a_notebook_and_fail_graded() -> None:
    """Does a per-gradient all-reduce with a forged record of buckets pass the notebook's
    check and fail graded, where an honest bucketed all-reduce passes?"""
    namespace: dict = {}
    exec(BUCKETED, namespace)  # noqa: S102 - the attack, run where the rank's record decides
    assert "right averages and buckets" in check_bucketed_allreduce(
        namespace["bucketed_allreduce"], world_sizes=(2,)
    )
    with RankBox():
        honest = _code(HONEST_BUCKETED, "bucketed_allreduce")
        assert "right averages and buckets" in check_bucketed_allreduce(honest, world_sizes=(2,))
        with pytest.raises(AssertionError, match="one all-reduce per gradient"):
            check_bucketed_allreduce(_code(BUCKETED, "bucketed_allreduce"), world_sizes=(2,))


def test_forged_overlap_calls_pass_in_a_notebook_and_fail_graded() -> None:
    """Does an OverlappingDDP that averages after backward, one parameter at a time, with a
    forged record of bucket all-reduces in backward, pass the notebook's check and fail
    graded, where an honest one passes?"""
    namespace: dict = {}
    exec(OVERLAPPING, namespace)  # noqa: S102 - the attack, run where the rank's record decides
    assert "overlapping backward" in check_overlapping_ddp(namespace["OverlappingDDP"])
    with RankBox():
        assert "overlapping backward" in check_overlapping_ddp(
            _code(HONEST_OVERLAPPING, "OverlappingDDP")
        )
        with pytest.raises(AssertionError, match="the relay carried all-reduces of"):
            check_overlapping_ddp(_code(OVERLAPPING, "OverlappingDDP"))
