"""What DDP does to your gradients: experiments that run on real gloo ranks.

Each function named ``*_step`` or ``train`` runs on every rank of an initialised default
process group and returns plain data (lists of floats), so the same code runs from a notebook
(``course.ranks.run(seed_step, 2)``), from a test, or under ``torchrun``::

    torchrun --nproc-per-node 2 -m course.lessons.ddp_gradients.experiment

PyTorch docs: https://pytorch.org/docs/stable/notes/ddp.html (what DDP does during backward)
and https://pytorch.org/docs/stable/ddp_comm_hooks.html (comm hooks).
"""

# No "from __future__ import annotations": DDP.register_comm_hook compares the hook's
# annotations with dist.GradBucket and Future[Tensor] as objects, not strings.

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

__all__ = [
    "CommHook",
    "construction_step",
    "loss_figure",
    "offset_run",
    "regression_data",
    "scaling_order",
    "seed_step",
    "sum_hook",
    "train",
    "train_single",
    "uneven_fit",
    "uneven_step",
]

CommHook = Callable[[Any, dist.GradBucket], torch.futures.Future]


def sum_hook(state: object, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:  # noqa: ARG001 - DDP's comm hook signature
    """A comm hook that all-reduces the bucket with SUM and returns the result."""
    buffer = bucket.buffer()
    dist.all_reduce(buffer, op=dist.ReduceOp.SUM)
    done: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    done.set_result(buffer)
    return done


def seed_step(hook: CommHook | None = None) -> dict[str, Any]:
    """One DDP step of ``nn.Linear(2, 1)`` on input ``rank + 1``: local, all-reduced and .grad."""
    rank = dist.get_rank()
    torch.manual_seed(0)
    m = nn.Linear(2, 1, bias=False)
    ddp = DDP(m)
    if hook is not None:
        ddp.register_comm_hook(None, hook)
    x = torch.full((1, 2), float(rank + 1))
    ddp(x).sum().backward()
    local = x.sum(dim=0)  # d(sum(w . x))/dw: what this rank alone would hold
    summed = local.clone()
    dist.all_reduce(summed, op=dist.ReduceOp.SUM)
    return {
        "rank": rank,
        "local": local.tolist(),
        "all_reduce_sum": summed.tolist(),
        "grad": m.weight.grad.flatten().tolist(),
        "torch": torch.__version__,
        "backend": dist.get_backend(),
    }


def scaling_order(numel: int = 20_000, seed: int = 5) -> dict[str, int]:
    """Which order of sum and scaling DDP's ``.grad`` matches: the elements off each one.

    Rank r's gradient is random data of its own; ``.grad`` is compared, bit for bit, with
    ``all_reduce(g * (1 / N))`` (scale, then sum) and with ``all_reduce(g) / N`` (sum, then
    divide).
    """
    torch.manual_seed(0)
    m = nn.Linear(numel, 1, bias=False)
    ddp = DDP(m)
    g = torch.Generator().manual_seed(seed + dist.get_rank())
    x = torch.randn(1, numel, generator=g)
    ddp(x).sum().backward()  # the local gradient of sum(w . x) is x
    grad, n = m.weight.grad.reshape(-1), dist.get_world_size()
    scaled, summed = x.reshape(-1) * (1.0 / n), x.reshape(-1).clone()
    dist.all_reduce(scaled)
    dist.all_reduce(summed)
    return {
        "numel": numel,
        "scale_then_sum": int((grad != scaled).sum()),
        "sum_then_divide": int((grad != summed / n).sum()),
    }


def construction_step() -> dict[str, list[float]]:
    """Build a differently seeded model on each rank; its weights before and after ``DDP(m)``."""
    torch.manual_seed(1000 + dist.get_rank())
    m = nn.Linear(2, 1, bias=False)
    before = m.weight.flatten().tolist()
    DDP(m)
    return {"before": before, "after": m.weight.flatten().tolist()}


def regression_data(
    samples: int = 64, features: int = 8, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """A fixed linear-regression data set ``(X, y)``, the same on every rank."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, features, generator=g)
    w = torch.randn(features, 1, generator=g)
    return x, x @ w + 0.1 * torch.randn(samples, 1, generator=g)


def _model(features: int, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Linear(features, 1)


def train(
    lr: float,
    hook: CommHook | None = None,
    steps: int = 30,
    seed: int = 0,
    optimizer: str = "sgd",
) -> list[float]:
    """Full-batch training under DDP, each rank on its shard; the pooled loss before each step.

    ``optimizer`` is ``"sgd"`` (``torch.optim.SGD``) or ``"adam"`` (``torch.optim.Adam``), both
    with torch's defaults but the learning rate.
    """
    rank, world_size = dist.get_rank(), dist.get_world_size()
    x, y = regression_data(seed=seed)
    x, y = x.tensor_split(world_size)[rank], y.tensor_split(world_size)[rank]
    ddp = DDP(_model(x.shape[1], seed))
    if hook is not None:
        ddp.register_comm_hook(None, hook)
    opt = _optimizer(optimizer, ddp.parameters(), lr)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        pooled = loss.detach().clone()
        dist.all_reduce(pooled)  # equal shards: the mean of the shard means is the pooled mean
        losses.append(pooled.item() / world_size)
        opt.step()
    return losses


def _optimizer(name: str, params: Any, lr: float) -> torch.optim.Optimizer:
    optimizers = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam}
    if name not in optimizers:
        raise ValueError(f"optimizer is one of {sorted(optimizers)}, got {name!r}")
    return optimizers[name](params, lr=lr)


def train_single(lr: float, steps: int = 30, seed: int = 0) -> list[float]:
    """The same run in one process on the whole data set: the single-GPU baseline."""
    x, y = regression_data(seed=seed)
    model = _model(x.shape[1], seed)
    losses = []
    for _ in range(steps):
        model.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        losses.append(loss.item())
        # torch.optim.SGD's own update, written out: this runs in the notebook's kernel, and
        # building an optimizer there imports torch._dynamo (80 MB) for as long as it lives.
        with torch.no_grad():
            for p in model.parameters():
                p.add_(p.grad, alpha=-lr)
    return losses


def _split(sizes: Sequence[int]) -> list[slice]:
    """Consecutive slices of the given sizes."""
    ends = torch.tensor(list(sizes)).cumsum(0).tolist()
    return [slice(end - size, end) for size, end in zip(sizes, ends, strict=True)]


def _mean_grad(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> list[float]:
    """The gradient of the per-sample-mean loss on ``(x, y)``, in one process."""
    model.zero_grad()
    nn.functional.mse_loss(model(x), y).backward()
    return model.weight.grad.flatten().tolist()


def _uneven_data(
    local_batch_sizes: Sequence[int], seed: int
) -> tuple[torch.Tensor, torch.Tensor, list[slice], nn.Module]:
    """The samples, each rank's slice of them, and a seeded bias-free linear model."""
    if len(local_batch_sizes) != dist.get_world_size():
        raise ValueError(f"need one local batch size per rank, got {list(local_batch_sizes)}")
    x, y = regression_data(samples=sum(local_batch_sizes), features=3, seed=seed)
    model = nn.Linear(3, 1, bias=False)
    torch.manual_seed(seed)
    nn.init.normal_(model.weight)
    return x, y, _split(local_batch_sizes), model


def uneven_step(
    local_batch_sizes: Sequence[int] = (1, 3), seed: int = 0, reduction: str = "mean"
) -> dict[str, Any]:
    """One DDP step where rank r holds ``local_batch_sizes[r]`` samples.

    Each rank's loss is the squared error over its own samples, reduced by ``reduction``
    (``"mean"`` or ``"sum"``, as in ``nn.functional.mse_loss``). Returns the synced ``.grad``
    beside what every rank computes in one process on the whole data: each rank's local mean
    gradient and the pooled per-sample mean.
    """
    rank = dist.get_rank()
    x, y, shards, model = _uneven_data(local_batch_sizes, seed)
    oracle = nn.Linear(3, 1, bias=False)
    oracle.load_state_dict(model.state_dict())
    ddp = DDP(model)
    nn.functional.mse_loss(ddp(x[shards[rank]]), y[shards[rank]], reduction=reduction).backward()
    local_means = [_mean_grad(oracle, x[s], y[s]) for s in shards]
    return {
        "rank": rank,
        "local_batch_sizes": list(local_batch_sizes),
        "grad": model.weight.grad.flatten().tolist(),
        "pooled_mean": _mean_grad(oracle, x, y),
        "local_means": local_means,
    }


def uneven_fit(
    local_batch_sizes: Sequence[int] = (2, 6), lr: float = 0.1, steps: int = 400, seed: int = 1
) -> dict[str, Any]:
    """Full-batch SGD under DDP on a fixed uneven split, mean loss per rank: where it ends.

    Rank r always holds the same ``local_batch_sizes[r]`` samples. Returns the weights after
    ``steps`` steps, the last step's ``.grad``, and the whole data set (``x``, ``y``) with each
    rank's slice, so that any fit of the same samples can be compared with where DDP ended.
    """
    rank = dist.get_rank()
    x, y, shards, model = _uneven_data(local_batch_sizes, seed)
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=lr)
    for _ in range(steps):
        opt.zero_grad()
        nn.functional.mse_loss(ddp(x[shards[rank]]), y[shards[rank]]).backward()
        opt.step()
    return {
        "rank": rank,
        "weight": model.weight.detach().flatten().tolist(),
        "last_grad": model.weight.grad.flatten().tolist(),
        "x": x.tolist(),
        "y": y.flatten().tolist(),
        "shards": [(s.start, s.stop) for s in shards],
    }


def _own_batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Eight random samples of two features and their random targets, drawn from ``seed``."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(8, 2, generator=g), torch.randn(8, 1, generator=g)


def offset_run(
    offset: float = 0.0, offset_rank: int = 1, steps: int = 10, lr: float = 0.1
) -> dict[str, Any]:
    """DDP(m) on every rank, then ``offset`` added to rank ``offset_rank``'s parameters alone,
    then plain SGD steps, each rank on data of its own.

    Returns, after construction and after each step, this rank's parameters minus rank 0's
    (element by element), and this rank's parameters themselves.
    """
    rank = dist.get_rank()
    torch.manual_seed(0)
    m = nn.Linear(2, 1)
    ddp = DDP(m)
    if rank == offset_rank:
        with torch.no_grad():
            for p in m.parameters():
                p.add_(offset)
    x, y = _own_batch(seed=100 + rank)
    opt = torch.optim.SGD(ddp.parameters(), lr=lr)

    def flat() -> torch.Tensor:
        return torch.cat([p.detach().reshape(-1) for p in m.parameters()])

    def gap() -> list[float]:
        mine = flat()
        theirs = mine.clone()
        dist.broadcast(theirs, src=0)
        return (mine - theirs).tolist()

    gaps, params = [gap()], [flat().tolist()]
    for _ in range(steps):
        opt.zero_grad()
        nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
        gaps.append(gap())
        params.append(flat().tolist())
    return {"rank": rank, "gaps": gaps, "params": params}


def loss_figure(curves: dict[str, Sequence[float]], title: str = "Loss per step") -> Any:
    """A plotly figure of loss curves on a log axis, one line per run. Curves that coincide
    stay visible: each has its own dash, marker and width, the first drawn widest."""
    import plotly.graph_objects as go

    fig = go.Figure()
    dashes = ("solid", "dash", "dot", "dashdot")
    symbols = ("circle-open", "x-thin-open", "square-open", "diamond-open")
    for i, (name, losses) in enumerate(curves.items()):
        fig.add_scatter(
            y=list(losses),
            mode="lines+markers",
            name=name,
            line={"dash": dashes[i % 4], "width": max(5 - 1.3 * i, 1.5)},
            marker={"symbol": symbols[i % 4], "size": 9 - i, "line": {"width": 1.5}},
        )
    fig.update_layout(title=title, xaxis_title="step", yaxis_title="loss (pooled mean)")
    fig.update_yaxes(type="log", exponentformat="power")  # 10^12 and 10^16 alike, never "1T"
    return fig


if __name__ == "__main__":  # torchrun --nproc-per-node 2 -m course.lessons.ddp_gradients.experiment
    dist.init_process_group("gloo")
    print(seed_step())
    dist.barrier()  # no rank closes its connections while a peer still uses them
    dist.destroy_process_group()
