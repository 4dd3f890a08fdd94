"""Right and known-wrong ``reduce_scatter``/``all_gather`` for testing the checks.

The right ones are the model solution of the zero assignment; they live in tests/, never in
the package students get.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from course.ring.schedule import chunk_bounds


def reduce_scatter(tensor: torch.Tensor) -> torch.Tensor:
    """Rank r gets the sum over ranks of chunk r; ``tensor`` is scratch."""
    return reduce_scatter_over(tensor, chunk_bounds(tensor.numel(), dist.get_world_size()))


def reduce_scatter_over(tensor: torch.Tensor, bounds: list[tuple[int, int]]) -> torch.Tensor:
    """The same ring, cut at ``bounds`` (shards of any sizes): rank r gets the sum of chunk r."""
    rank, n = dist.get_rank(), dist.get_world_size()
    flat = tensor.reshape(-1)
    chunks = [flat[lo:hi] for lo, hi in bounds]
    buffer = torch.empty(max(c.numel() for c in chunks), dtype=flat.dtype)
    for s in range(n - 1):
        out, into = chunks[(rank - s - 1) % n], chunks[(rank - s - 2) % n]
        incoming = buffer[: into.numel()]
        request = dist.isend(out, (rank + 1) % n)
        dist.recv(incoming, (rank - 1) % n)
        request.wait()
        into.add_(incoming)
    return chunks[rank].clone()


def all_gather(shard: torch.Tensor, out: torch.Tensor) -> None:
    """Chunk c of ``out`` becomes rank c's shard, on every rank."""
    rank, n = dist.get_rank(), dist.get_world_size()
    flat = out.view(-1)
    chunks = [flat[lo:hi] for lo, hi in chunk_bounds(flat.numel(), n)]
    chunks[rank].copy_(shard.reshape(-1))
    for s in range(n - 1):
        request = dist.isend(chunks[(rank - s) % n], (rank + 1) % n)
        dist.recv(chunks[(rank - s - 1) % n], (rank - 1) % n)
        request.wait()


def rs_collective(tensor: torch.Tensor) -> torch.Tensor:
    """Right shards, but through gloo's own collective."""
    rank, n = dist.get_rank(), dist.get_world_size()
    dist.all_reduce(tensor)
    lo, hi = chunk_bounds(tensor.numel(), n)[rank]
    return tensor.reshape(-1)[lo:hi].clone()


def rs_wrong_chunk(tensor: torch.Tensor) -> torch.Tensor:
    """The ring's own reduce-scatter unshifted: rank r ends with chunk r + 1."""
    rank, n = dist.get_rank(), dist.get_world_size()
    flat = tensor.reshape(-1)
    chunks = [flat[lo:hi] for lo, hi in chunk_bounds(flat.numel(), n)]
    for s in range(n - 1):
        out, into = chunks[(rank - s) % n], chunks[(rank - s - 1) % n]
        incoming = torch.empty_like(into)
        request = dist.isend(out, (rank + 1) % n)
        dist.recv(incoming, (rank - 1) % n)
        request.wait()
        into.add_(incoming)
    return chunks[(rank + 1) % n].clone()


def rs_deadlock(tensor: torch.Tensor) -> torch.Tensor:
    """Every rank receives first: nobody ever sends."""
    rank, n = dist.get_rank(), dist.get_world_size()
    incoming = torch.empty_like(tensor)
    dist.recv(incoming, (rank - 1) % n)
    return tensor


def ag_naive(shard: torch.Tensor, out: torch.Tensor) -> None:
    """Right result, but every rank sends its shard to every other rank."""
    rank, n = dist.get_rank(), dist.get_world_size()
    flat = out.view(-1)
    bounds = chunk_bounds(flat.numel(), n)
    flat[bounds[rank][0] : bounds[rank][1]].copy_(shard)
    sends = [dist.isend(shard, p) for p in range(n) if p != rank]
    for p in range(n):
        if p != rank:
            dist.recv(flat[bounds[p][0] : bounds[p][1]], p)
    for request in sends:
        request.wait()


def ag_forgets_own(shard: torch.Tensor, out: torch.Tensor) -> None:
    """A ring all-gather that never copies its own shard into ``out``."""
    rank, n = dist.get_rank(), dist.get_world_size()
    flat = out.view(-1)
    chunks = [flat[lo:hi] for lo, hi in chunk_bounds(flat.numel(), n)]
    first = shard.reshape(-1)
    for s in range(n - 1):
        request = dist.isend(first if s == 0 else chunks[(rank - s) % n], (rank + 1) % n)
        dist.recv(chunks[(rank - s - 1) % n], (rank - 1) % n)
        request.wait()


class ZeroOptimizer:
    """ZeRO-2 (Rajbhandari et al. 2020): each rank keeps optimizer state and gradients for
    its own shard of the flattened parameters only; the parameters stay whole on every rank."""

    def __init__(self, params, optimizer_class=torch.optim.Adam, **defaults) -> None:
        self.params = list(params)
        rank, n = dist.get_rank(), dist.get_world_size()
        self.flat = torch.cat([p.detach().reshape(-1) for p in self.params])
        offset = 0
        for p in self.params:  # the parameters become views into one flat buffer
            p.data = self.flat[offset : offset + p.numel()].view_as(p)
            offset += p.numel()
        lo, hi = chunk_bounds(self.flat.numel(), n)[rank]
        self.shard = self.flat[lo:hi]  # a view: this rank's parameters, no copy
        self.optimizer = optimizer_class([self.shard], **defaults)

    def step(self) -> None:
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        flat_grad = torch.cat([g.reshape(-1) for g in grads])
        self.shard.grad = reduce_scatter(flat_grad).div_(dist.get_world_size())
        for p in self.params:
            p.grad = None  # ZeRO-2: only this rank's shard of the gradient stays
        self.optimizer.step()
        all_gather(self.shard, self.flat)

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None
        self.shard.grad = None


class FullStateZero(ZeroOptimizer):
    """Trains like DDP, but every rank keeps Adam's state for every parameter."""

    def __init__(self, params, optimizer_class=torch.optim.Adam, **defaults) -> None:
        self.params = list(params)
        self.optimizer = optimizer_class(self.params, **defaults)

    def step(self) -> None:
        for p in self.params:
            dist.all_reduce(p.grad)
            p.grad /= dist.get_world_size()
        self.optimizer.step()

    def zero_grad(self) -> None:
        self.optimizer.zero_grad()


class SummingZero(ZeroOptimizer):
    """Forgets to divide the reduce-scattered gradient by the world size."""

    def step(self) -> None:
        flat_grad = torch.cat([p.grad.reshape(-1) for p in self.params])
        self.shard.grad = reduce_scatter(flat_grad)
        for p in self.params:
            p.grad = None
        self.optimizer.step()
        all_gather(self.shard, self.flat)


class Zero1(ZeroOptimizer):
    """ZeRO-1: right training, but the full gradients stay."""

    def step(self) -> None:
        flat_grad = torch.cat([p.grad.reshape(-1) for p in self.params])
        self.shard.grad = reduce_scatter(flat_grad.clone()).div_(dist.get_world_size())
        self.optimizer.step()
        all_gather(self.shard, self.flat)


def ef_fp16_hook(state, bucket):  # no annotations: DDP compares them as objects
    """fp16 compression with error feedback: the residual joins the next step's gradient."""
    buffer = bucket.buffer()
    corrected = buffer + state.get(bucket.index(), 0)
    compressed = corrected.to(torch.float16)
    state[bucket.index()] = corrected - compressed.to(buffer.dtype)
    future = dist.all_reduce(compressed, async_op=True).get_future()

    def average(fut: torch.futures.Future) -> torch.Tensor:
        buffer.copy_(fut.value()[0].to(buffer.dtype).div_(dist.get_world_size()))
        return buffer

    return future.then(average)


def fp16_no_feedback(state, bucket):  # no annotations: DDP compares them as objects
    """Plain fp16 compression: what error feedback is there to fix."""
    buffer = bucket.buffer()
    future = dist.all_reduce(buffer.to(torch.float16), async_op=True).get_future()

    def average(fut: torch.futures.Future) -> torch.Tensor:
        buffer.copy_(fut.value()[0].to(buffer.dtype).div_(dist.get_world_size()))
        return buffer

    return future.then(average)


class HookedZero:
    """ZeRO-2 with the reduce-scatter inside backward (DeepSpeed's way, a bucket per
    parameter): a hook on each parameter reduce-scatters its gradient as soon as backward has
    accumulated it, writes this rank's shard, averaged, into a buffer allocated up front and
    frees the gradient; ``step()`` updates the shards and all-gathers each parameter."""

    def __init__(self, params, optimizer_class=torch.optim.Adam, **defaults) -> None:
        self.params = list(params)
        rank, n = dist.get_rank(), dist.get_world_size()
        bounds = [chunk_bounds(p.numel(), n)[rank] for p in self.params]
        self.grads = torch.zeros(sum(hi - lo for lo, hi in bounds))  # this rank's shards
        self.shards, offset = {}, 0
        for p, (lo, hi) in zip(self.params, bounds, strict=True):
            shard = p.detach().view(-1)[lo:hi]  # a view: Adam updates the parameter itself
            shard.grad = self.grads[offset : offset + hi - lo]
            self.shards[p] = shard
            offset += hi - lo
            p.register_post_accumulate_grad_hook(self._reduce)
        self.optimizer = optimizer_class(list(self.shards.values()), **defaults)

    def _reduce(self, p: torch.Tensor) -> None:
        shard = reduce_scatter(p.grad).div_(dist.get_world_size())
        self.shards[p].grad.copy_(shard)
        p.grad = None  # only this rank's shard of the gradient stays

    def step(self) -> None:
        self.optimizer.step()
        for p, shard in self.shards.items():
            all_gather(shard, p.detach())

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None
        self.grads.zero_()
