"""Sharded data parallelism measured: bytes held per rank, bytes sent per step, equivalence.

ZeRO (Rajbhandari et al. 2020, "ZeRO: Memory optimizations toward training trillion
parameter models") keeps one replica of the parameters per rank but shards what the
optimizer needs: stage 1 the optimizer state, stage 2 the gradients too, stage 3 the
parameters as well (FSDP). With fp32 Adam (4 bytes per parameter, 4 per gradient, 8 for
Adam's two moments) :data:`FORMULAS` gives what a rank holds per parameter, stage by stage,
for the memory figure's lines.

Every experiment takes the sharded code to measure as an argument (the reduce_scatter,
all_gather and ZeRO optimizer you write in the notebook): the package holds none. The only
sharded training it runs is torch's own (``ZeroRedundancyOptimizer``, ``fully_shard``). Each is a
plain torch.distributed program, e.g. ``torchrun --nproc-per-node 4`` on a rank function.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from course.models import toy_model
from course.ranks import relay

__all__ = [
    "FORMULAS",
    "Batches",
    "equivalence",
    "final_params",
    "held_objects",
    "inner_optimizers",
    "make_batches",
    "memory_after_backward",
    "memory_breakdown",
    "memory_during_backward",
    "memory_on_ranks",
    "single_process_params",
    "sum_then_divide",
    "torch_zero_state_bytes",
    "toy_model",
]

# bytes per parameter held by each rank, with fp32 Adam: (params, grads, optimizer state)
FORMULAS: dict[str, Callable[[int], tuple[float, float, float]]] = {
    "DDP": lambda _n: (4, 4, 8),
    "ZeRO-1": lambda n: (4, 4, 8 / n),
    "ZeRO-2": lambda n: (4, 4 / n, 8 / n),
    "ZeRO-3": lambda n: (4 / n, 4 / n, 8 / n),
}


def memory_breakdown(model: nn.Module, optimizer: Any) -> dict[str, int]:
    """Bytes this rank holds in parameters, gradients and optimizer state (tensor sizes).

    Gradients are the model's ``.grad`` plus those of any parameter an inner optimizer
    updates (a ZeRO shard); the state is every tensor in the optimizers' ``state``.
    """
    params = list(model.parameters())
    optimizers = inner_optimizers(optimizer)
    state = [
        v
        for opt in optimizers
        for s in opt.state.values()
        for v in s.values()
        if isinstance(v, torch.Tensor)
    ]
    grads = {id(p.grad): p.grad for p in params if p.grad is not None}
    for opt in optimizers:
        for group in opt.param_groups:
            grads.update({id(q.grad): q.grad for q in group["params"] if q.grad is not None})
    return {
        "params": sum(p.nbytes for p in params),
        "grads": sum(g.nbytes for g in grads.values()),
        "state": sum(v.nbytes for v in state),
    }


def inner_optimizers(root: Any) -> list[torch.optim.Optimizer]:
    """The ``torch.optim`` optimizers that hold the state: ``root`` itself, torch's
    ``ZeroRedundancyOptimizer.optim``, or those a wrapper keeps in its attributes."""
    inner = getattr(root, "optim", None)
    if isinstance(inner, torch.optim.Optimizer):
        return [inner]
    if isinstance(root, torch.optim.Optimizer):
        return [root]
    return [t for t in held_objects(root) if isinstance(t, torch.optim.Optimizer)]


def held_objects(root: Any) -> list[Any]:
    """Objects reachable from ``root`` through attributes and containers (not modules)."""
    found, stack, seen = [], [root], set()
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, (str, bytes, int, float, torch.Tensor, nn.Module)):
            continue
        seen.add(id(obj))
        found.append(obj)
        if isinstance(obj, dict):
            stack += list(obj.values())
        elif isinstance(obj, (list, tuple, set)):
            stack += list(obj)
        elif hasattr(obj, "__dict__") and not isinstance(obj, type):
            stack += list(vars(obj).values())
    return found


Batches = list[tuple[torch.Tensor, torch.Tensor]]


def make_batches(steps: int, generator: torch.Generator, width: int = 64) -> Batches:
    """One rank's data: ``steps`` (input, target) batches of 16 samples drawn from ``generator``,
    for a :func:`toy_model` of ``width``."""
    return [
        (torch.randn(16, width, generator=generator), torch.randn(16, width, generator=generator))
        for _ in range(steps)
    ]


def _own_batches(steps: int, seed: int, rank: int) -> Batches:
    """Rank ``rank``'s batches when none are given: the same on the rank and in the oracle."""
    return make_batches(steps, torch.Generator().manual_seed(seed + 100 + rank))


def _train(
    kind: str,
    zero_class: Any,
    steps: int,
    seed: int = 0,
    batches: Batches | None = None,
    snapshots: bool = False,
) -> tuple[nn.Module, Any]:
    """Adam on this rank's batches: DDP, torch's ZeroRedundancyOptimizer, or ``zero_class``.

    The model is ``toy_model(seed)``, as wide as the batches; the batches
    are ``batches`` if given (a grader's, made for this rank), else ``steps`` of them made
    here from ``seed`` and the rank. With ``snapshots`` the relay measures every rank's
    memory once the model is built and again after each step (``relay.snapshot``, tags 0,
    1, 2, ...).
    """
    if batches is None:
        batches = _own_batches(steps, seed, dist.get_rank())
    if snapshots:
        _warm_up()
    model = toy_model(seed, width=batches[0][0].shape[1])
    if snapshots:
        relay.snapshot(0)
    net, optimizer = _wrapped(kind, zero_class, model)
    for i, (x, y) in enumerate(batches):
        if i:
            optimizer.zero_grad()
        nn.functional.mse_loss(net(x), y).backward()
        optimizer.step()
        if snapshots:
            relay.snapshot(i + 1)
    return model, optimizer


def sum_then_divide(_state, bucket):  # noqa: ANN001, ANN201 - DDP inspects a hook's annotations
    """A DDP comm hook that all-reduces the bucket's sum and divides it by the world size
    afterwards, where DDP's own scales every rank's gradient by 1/N before the sum."""
    future = dist.all_reduce(bucket.buffer(), async_op=True).get_future()
    return future.then(lambda fut: fut.value()[0].div_(dist.get_world_size()))


def _wrapped(kind: str, zero_class: Any, model: nn.Module) -> tuple[nn.Module, Any]:
    """The module to call and the optimizer to step, for ``model`` trained the ``kind`` way:
    DDP + Adam ("DDP", or "DDP, divided after the sum" with :func:`sum_then_divide`), DDP +
    torch's ZeroRedundancyOptimizer, or ``zero_class`` + Adam."""
    if kind in ("DDP", "DDP, divided after the sum"):
        net = nn.parallel.DistributedDataParallel(model)
        if kind != "DDP":
            net.register_comm_hook(None, sum_then_divide)
        return net, torch.optim.Adam(model.parameters(), lr=1e-2)
    if kind == "torch ZeRO-1":
        from torch.distributed.optim import ZeroRedundancyOptimizer

        net = nn.parallel.DistributedDataParallel(model)
        optimizer = ZeroRedundancyOptimizer(
            model.parameters(), optimizer_class=torch.optim.Adam, lr=1e-2
        )
        return net, optimizer
    return model, zero_class(model.parameters(), torch.optim.Adam, lr=1e-2)


def _warm_up() -> None:
    """One Adam step on four numbers: what its first step imports is not counted as held."""
    w = torch.zeros(4, requires_grad=True)
    optimizer = torch.optim.Adam([w], lr=1e-2)
    w.sum().backward()
    optimizer.step()


def memory_on_ranks(
    kind: str,
    zero_class: Any = None,
    steps: int = 2,
    batches: Batches | None = None,
    snapshots: bool = False,
) -> dict[str, Any]:
    """Rank side: train ``steps`` steps the ``kind`` way (on ``batches`` if given); the bytes
    this rank then holds. ``snapshots``: see :func:`_train`; then this rank's own slice of
    the flattened parameters (``tensor_split``) comes back too, as ``mine``."""
    model, optimizer = _train(kind, zero_class, steps, 0, batches, snapshots)
    held: dict[str, Any] = memory_breakdown(model, optimizer)
    if snapshots:
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        held["mine"] = flat.tensor_split(dist.get_world_size())[dist.get_rank()].clone()
    return held


def final_params(
    kind: str,
    zero_class: Any = None,
    steps: int = 20,
    seed: int = 0,
    batches: Batches | None = None,
) -> torch.Tensor:
    """Rank side: the parameters, flattened, after ``steps`` steps of training ``kind`` (on
    ``batches`` if given)."""
    model, _ = _train(kind, zero_class, steps, seed, batches)
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def single_process_params(
    world_size: int, steps: int = 20, seed: int = 0, batches: list[Batches] | None = None
) -> torch.Tensor:
    """What DDP + Adam computes, in one process: each step, Adam on the average over ranks of
    the gradients of each rank's batch (the oracle for a sharded optimizer's training).

    ``batches[r]`` are rank r's batches, as :func:`final_params` was given them; by default
    those the ranks make from ``seed``.
    """
    if batches is None:
        batches = [_own_batches(steps, seed, r) for r in range(world_size)]
    model = toy_model(seed, width=batches[0][0][0].shape[1])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for step in zip(*batches, strict=True):  # one batch per rank
        grads = []
        for x, y in step:
            model.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            grads.append([p.grad.clone() for p in model.parameters()])
        for p, *gs in zip(model.parameters(), *grads, strict=True):
            p.grad = torch.stack(gs).mean(0)
        optimizer.step()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def equivalence(zero_class: Any, steps: int = 20, reference: str = "DDP") -> dict[str, Any]:
    """Rank side: DDP + Adam (``reference``: "DDP", or "DDP, divided after the sum") and
    ``zero_class`` + Adam from the same weights on the same data; the largest difference in
    the final parameters, absolute and relative."""
    a, b = final_params(reference, None, steps), final_params("zero", zero_class, steps)
    diff = (a - b).abs().max().item()
    return {"identical": torch.equal(a, b), "max_abs": diff, "max_rel": diff / a.abs().max().item()}


def memory_after_backward(kind: str, zero_class: Any = None, steps: int = 2) -> dict[str, int]:
    """Rank side: train ``steps - 1`` steps the ``kind`` way, then run the last step's forward
    and backward only; the bytes this rank holds then, before ``step()``."""
    batches = _own_batches(steps, 0, dist.get_rank())
    model, optimizer = _train(kind, zero_class, steps - 1, 0, batches[:-1])
    optimizer.zero_grad()
    x, y = batches[-1]
    nn.functional.mse_loss(model(x), y).backward()
    return memory_breakdown(model, optimizer)


def memory_during_backward(kind: str, zero_class: Any = None, steps: int = 2) -> dict[str, int]:
    """Rank side: the most this rank holds during the last of ``steps`` steps' backward.

    Train ``steps - 1`` steps the ``kind`` way, then run the last forward and backward,
    counting (:func:`memory_breakdown`) each time backward has accumulated a parameter's
    gradient: a hook registered on every parameter before the optimizer is built, so it runs
    before any hook the optimizer registers there. The largest count comes back."""
    batches = _own_batches(steps, 0, dist.get_rank())
    model = toy_model(0)
    counts: list[dict[str, int]] = []
    on: dict[str, Any] = {"counting": False}

    def count(_: torch.Tensor) -> None:
        if on["counting"]:
            counts.append(memory_breakdown(model, on["optimizer"]))

    for p in model.parameters():
        p.register_post_accumulate_grad_hook(count)
    net, on["optimizer"] = _wrapped(kind, zero_class, model)
    for i, (x, y) in enumerate(batches):
        if i:
            on["optimizer"].zero_grad()
        on["counting"] = i == len(batches) - 1
        nn.functional.mse_loss(net(x), y).backward()
        if not on["counting"]:
            on["optimizer"].step()
    return max(counts, key=lambda held: sum(held.values()))


def torch_zero_state_bytes(numels: list[int]) -> dict[str, Any]:
    """Rank side: bytes of Adam state this rank holds under torch's
    ``ZeroRedundancyOptimizer`` after one step, for flat parameters of ``numels`` elements,
    the sizes of the parameters it updates, and their places in ``numels``."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    params = [nn.Parameter(torch.zeros(n)) for n in numels]
    optimizer = ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.Adam, lr=0.01)
    for p in params:
        p.grad = torch.ones_like(p)
    optimizer.step()
    owned = [p for group in optimizer.optim.param_groups for p in group["params"]]
    place = {id(p): i for i, p in enumerate(params)}
    state = optimizer.optim.state.values()
    return {
        "numels": sorted((p.numel() for p in owned), reverse=True),
        "owned": sorted(place[id(p)] for p in owned),
        "nbytes": sum(v.nbytes for s in state for v in s.values() if torch.is_tensor(v)),
    }
