"""Right and wrong bucketed all-reduces and OverlappingDDPs, as students write them.

Each is graded on both paths, the notebook's (gloo, ``tests/lessons/``) and the judge's;
the tests send this module to the ranks by value, as a notebook cell would be.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def _groups(tensors, bucket_cap_mb):
    cap, groups, current, size = bucket_cap_mb * 2**20, [], [], 0
    for t in reversed(tensors):
        current.append(t)
        size += t.numel() * t.element_size()
        if size >= cap:
            groups.append(current)
            current, size = [], 0
    return groups + ([current] if current else [])


def _reduce(group, divide=True, copy_back=True):
    flat = torch.cat([t.flatten() for t in group])
    work = dist.all_reduce(flat)
    if divide:
        flat /= dist.get_world_size()
    if copy_back:
        for t, part in zip(group, flat.split([t.numel() for t in group]), strict=True):
            t.copy_(part.view_as(t))
    return work


def bucketed_allreduce(grads, bucket_cap_mb):
    for group in _groups(grads, bucket_cap_mb):
        _reduce(group)


def per_parameter(grads, bucket_cap_mb):
    for g in grads:
        _reduce([g])


def forward_order(grads, bucket_cap_mb):
    for group in _groups(grads[::-1], bucket_cap_mb):
        _reduce(group)


def no_division(grads, bucket_cap_mb):
    for group in _groups(grads, bucket_cap_mb):
        _reduce(group, divide=False)


def no_copy_back(grads, bucket_cap_mb):
    for group in _groups(grads, bucket_cap_mb):
        _reduce(group, copy_back=False)


def replaces_list_items(grads, bucket_cap_mb):
    for i, g in enumerate(grads):
        grads[i] = g.clone()
    bucketed_allreduce(grads, bucket_cap_mb)


def stub(grads, bucket_cap_mb):
    """The released stub."""


class OverlappingDDP:
    """Reference: buckets by the rule, async all-reduce from the hook that fills a bucket."""

    def __init__(self, module, bucket_cap_mb):
        params = [p for p in module.parameters() if p.requires_grad]
        self.buckets = _groups(params, bucket_cap_mb)
        self.bucket_of = {id(p): i for i, b in enumerate(self.buckets) for p in b}
        self.ready, self.pending = [0] * len(self.buckets), []
        for p in params:
            p.register_post_accumulate_grad_hook(self.grad_ready)

    def grad_ready(self, p):
        i = self.bucket_of[id(p)]
        self.ready[i] += 1
        if self.ready[i] == len(self.buckets[i]):
            self.launch(i)

    def launch(self, i):
        flat = torch.cat([q.grad.flatten() for q in self.buckets[i]])
        self.pending.append((i, flat, dist.all_reduce(flat, async_op=True)))

    def finish(self):
        for i, flat, work in self.pending:
            work.wait()
            flat /= dist.get_world_size()  # noqa: PLW2901 - in place, as a student writes it
            sizes = [q.numel() for q in self.buckets[i]]
            for q, part in zip(self.buckets[i], flat.split(sizes), strict=True):
                q.grad.copy_(part.view_as(q.grad))
        self.pending, self.ready = [], [0] * len(self.buckets)


class Blocking(OverlappingDDP):
    def launch(self, i):
        flat = torch.cat([q.grad.flatten() for q in self.buckets[i]])
        dist.all_reduce(flat)
        self.pending.append((i, flat, dist.all_reduce(torch.zeros(1), async_op=True)))


class AllAtTheEnd(OverlappingDDP):
    def grad_ready(self, p):
        self.ready[self.bucket_of[id(p)]] += 1
        if sum(self.ready) == sum(len(b) for b in self.buckets):
            for i in range(len(self.buckets)):
                self.launch(i)


class InFinish(OverlappingDDP):
    def grad_ready(self, p):
        pass

    def finish(self):
        for i in range(len(self.buckets)):
            self.launch(i)
        super().finish()


class NoReset(OverlappingDDP):
    def finish(self):
        pending = self.pending
        super().finish()
        self.pending = pending[:0]
        self.ready = [len(b) for b in self.buckets]  # never launches again


class Stub:
    def __init__(self, module, bucket_cap_mb):
        """Released stub."""

    def finish(self):
        """Released stub."""
