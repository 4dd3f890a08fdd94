"""Gradient buckets and overlap: why DDP packs gradients, and when their all-reduces start.

Experiments that run on every rank of an initialised gloo process group and return plain
data; DDP's own buckets are observed through a comm hook that reduces exactly as DDP's default
does (torch's ``allreduce_hook``) and records what it saw::

    torchrun --nproc-per-node 2 -m course.lessons.buckets.experiment

Li et al., "PyTorch Distributed: Experiences on Accelerating Data Parallel Training", VLDB 2020
(https://arxiv.org/abs/2006.15704), sections 3.2.3 (bucketing) and 3.2.4 (overlap).
"""

# No "from __future__ import annotations": DDP.register_comm_hook compares the hook's
# annotations with dist.GradBucket and Future[Tensor] as objects, not strings.

import statistics
import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel as DDP

__all__ = [
    "MB",
    "allreduce_timing",
    "ddp_buckets",
    "grad_storage",
    "many_params_model",
    "overlap_timeline",
    "reversed_stack",
    "reversed_stack_buckets",
    "timeline_figure",
]

MB = 1024 * 1024  # DDP's bucket_cap_mb counts mebibytes


def many_params_model(
    layers: int = 8, width: int = 256, seed: int = 0, bias: bool = True
) -> nn.Sequential:
    """A stack of ``layers`` Linear(width, width) layers with ReLU: 2 * layers parameters
    (``layers`` without the biases)."""
    torch.manual_seed(seed)
    mods: list[nn.Module] = []
    for _ in range(layers):
        mods += [nn.Linear(width, width, bias=bias), nn.ReLU()]
    return nn.Sequential(*mods[:-1])


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def allreduce_timing(
    params: int = 200, numel: int = 1000, buckets: Sequence[int] = (1, 8, 50, 200), repeats: int = 5
) -> dict[str, Any]:
    """Time averaging ``params`` gradients of ``numel`` floats in 1, 8, ... all-reduce calls.

    The same bytes every time, packed into ``b`` equal flat buffers for ``b`` calls (``b =
    params``: one call per gradient). Like DDP, the buffers are allocated once up front; the
    copy of each gradient into its buffer (which DDP does as gradients become ready) is left
    out of the timing. The median of ``repeats`` runs, per bucket count.
    """
    grads = [torch.randn(numel) for _ in range(params)]
    world_size = dist.get_world_size()

    def timed(tensors: list[torch.Tensor]) -> float:
        dist.barrier()
        start = time.perf_counter()
        for t in tensors:
            dist.all_reduce(t)
        return time.perf_counter() - start

    rows, averaged = [], []
    for b in buckets:
        flats = [torch.cat(grads[i::b]) for i in range(b)] if b < params else list(grads)
        flats = [f.clone() for f in flats]
        seconds = statistics.median(timed([f.clone() for f in flats]) for _ in range(repeats))
        for f in flats:
            dist.all_reduce(f)
        averaged.append(torch.sort(torch.cat(flats) / world_size).values)
        rows.append({"calls": len(flats), "seconds": seconds})
    same = all(torch.allclose(a, averaged[0], rtol=1e-5) for a in averaged)
    return {"params": params, "nbytes": sum(_nbytes(g) for g in grads), "rows": rows, "same": same}


def grad_storage(gradient_as_bucket_view: bool = False, layers: int = 4, width: int = 256) -> dict:
    """Where DDP keeps the gradients: its bucket buffers' bytes, and whether ``.grad`` lies
    inside them (``gradient_as_bucket_view=True``) or is a tensor of its own."""
    model = many_params_model(layers, width)
    ddp = DDP(model, gradient_as_bucket_view=gradient_as_bucket_view)
    spans: list[tuple[int, int]] = []

    def hook(state: object, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        buffer = bucket.buffer()
        spans.append((buffer.data_ptr(), buffer.data_ptr() + _nbytes(buffer)))
        return allreduce_hook(state, bucket)

    ddp.register_comm_hook(None, hook)
    for _ in range(2):  # the second step runs on the rebuilt buckets
        spans.clear()
        ddp.zero_grad()
        ddp(torch.randn(4, width)).sum().backward()
    grads = [p.grad for p in model.parameters()]
    inside = [any(lo <= g.data_ptr() < hi for lo, hi in spans) for g in grads]
    return {
        "gradient_as_bucket_view": gradient_as_bucket_view,
        "bucket_bytes": sum(hi - lo for lo, hi in spans),
        "grad_bytes": sum(_nbytes(g) for g in grads),
        "grads_in_buckets": sum(inside),
        "params": len(grads),
    }


def _recording_hook(log: list[dict[str, Any]], index: dict[int, int], t0: list[float]) -> Any:
    """DDP's default reduction (torch's ``allreduce_hook``), logging each bucket's start and
    finish."""

    def hook(state: object, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        entry = {
            "bucket": bucket.index(),
            "nbytes": _nbytes(bucket.buffer()),
            "params": [index[id(p)] for p in bucket.parameters()],
            "start": time.perf_counter() - t0[0],
        }
        log.append(entry)

        def done(fut: torch.futures.Future) -> torch.Tensor:
            entry["done"] = time.perf_counter() - t0[0]
            return fut.value()

        return allreduce_hook(state, bucket).then(done)

    return hook


def ddp_buckets(
    bucket_cap_mb: float | None = None,
    iterations: int = 3,
    layers: int = 8,
    width: int = 256,
    bias: bool = True,
    **ddp_options: bool,
) -> list[list[dict[str, Any]]]:
    """DDP's buckets, as its comm hook sees them, in each of the first ``iterations`` steps.

    Each bucket is ``{"bucket", "nbytes", "params", "start", "done"}``; ``params`` are indices
    in ``model.parameters()`` (registration) order; times are seconds from backward's start.
    """
    model = many_params_model(layers, width, bias=bias)
    return _buckets_seen(model, width, bucket_cap_mb, iterations, **ddp_options)


class _ReversedStack(nn.Module):
    """``layers`` Linear(width, width) layers registered 0 to layers - 1 in a ModuleList,
    whose forward runs them from the last registered to the first."""

    def __init__(self, layers: int, width: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in reversed(self.layers):
            x = torch.relu(layer(x))
        return x


def reversed_stack(layers: int = 8, width: int = 256, seed: int = 0) -> nn.Module:
    """A stack whose forward runs its layers in the reverse of their registration order."""
    torch.manual_seed(seed)
    return _ReversedStack(layers, width)


def reversed_stack_buckets(
    bucket_cap_mb: float | None = None, iterations: int = 3, layers: int = 8, width: int = 256
) -> list[list[dict[str, Any]]]:
    """:func:`ddp_buckets` for :func:`reversed_stack`: parameter ``2 i`` is layer ``i``'s
    weight and ``2 i + 1`` its bias, in registration order."""
    return _buckets_seen(reversed_stack(layers, width), width, bucket_cap_mb, iterations)


def _buckets_seen(
    model: nn.Module,
    width: int,
    bucket_cap_mb: float | None,
    iterations: int,
    **ddp_options: bool,
) -> list[list[dict[str, Any]]]:
    """The buckets a recording comm hook sees in each of the first ``iterations`` steps."""
    kwargs = {} if bucket_cap_mb is None else {"bucket_cap_mb": bucket_cap_mb}
    ddp = DDP(model, **kwargs, **ddp_options)
    log: list[dict[str, Any]] = []
    t0 = [0.0]
    ddp.register_comm_hook(None, _recording_hook(log, _param_index(model), t0))
    steps = []
    for _ in range(iterations):
        log.clear()
        loss = ddp(torch.randn(4, width)).sum()
        t0[0] = time.perf_counter()
        loss.backward()
        steps.append([dict(e) for e in log])
    return steps


def _param_index(model: nn.Module) -> dict[int, int]:
    return {id(p): i for i, p in enumerate(model.parameters())}


def overlap_timeline(
    bucket_cap_mb: float = 1.0, layers: int = 8, width: int = 512, batch: int = 256
) -> dict[str, Any]:
    """When each gradient became ready and when each bucket's all-reduce ran, in one DDP step.

    The step measured is the second one: the first builds DDP's buckets (question buckets_3
    measures how).
    """
    model = many_params_model(layers, width)
    ddp = DDP(model, bucket_cap_mb=bucket_cap_mb)
    log: list[dict[str, Any]] = []
    ready: list[tuple[int, float]] = []
    t0 = [0.0]
    index = _param_index(model)
    ddp.register_comm_hook(None, _recording_hook(log, index, t0))
    for p in model.parameters():
        p.register_post_accumulate_grad_hook(
            lambda p: ready.append((index[id(p)], time.perf_counter() - t0[0]))
        )
    x = torch.randn(batch, width)
    for _ in range(2):  # the first step only builds the buckets
        log.clear()
        ready.clear()
        ddp.zero_grad()
        loss = ddp(x).square().mean()
        t0[0] = time.perf_counter()
        loss.backward()
        returned = time.perf_counter() - t0[0]
    return {
        "grad_ready": ready,
        "buckets": log,
        "backward_returned": returned,
        "nbytes": [_nbytes(p) for p in model.parameters()],
    }


def timeline_figure(timeline: dict[str, Any], title: str = "Backward against communication") -> Any:
    """A plotly timeline: gradient-ready ticks for backward, one row per bucket's all-reduce.

    Each row is split where the bucket before it finished: the light part is time the bucket
    spent queued while an earlier bucket's all-reduce was still in flight, the solid part the
    rest, up to done. Two lines mark the last gradient ready and backward's return, which
    comes later because DDP's backward waits for every bucket before it writes ``.grad``.
    The rows name the buckets, each in its own colour (both parts); the legend says only what
    light and solid mean, so it stays short beside the plot however many buckets there are.
    """
    import plotly.graph_objects as go

    ms = 1000.0
    ready = timeline["grad_ready"]
    fig = go.Figure()
    fig.add_scatter(
        x=[t * ms for _, t in ready],
        y=["backward"] * len(ready),
        mode="markers",
        marker={"symbol": "line-ns-open", "size": 18},
        text=[f"param {i} grad ready" for i, _ in ready],
        name="gradient ready",
    )
    for segment in _bucket_segments(timeline["buckets"]):
        fig.add_bar(orientation="h", showlegend=False, hoverinfo="text", **segment)
    for name, opacity in (("all-reduce in flight", 1.0), ("queued behind the previous one", 0.35)):
        fig.add_bar(x=[None], y=[None], orientation="h", name=name, opacity=opacity,
                    marker_color="#777")  # fmt: skip
    last = max((t for _, t in ready), default=0.0) * ms
    returned = timeline["backward_returned"] * ms
    fig.add_vline(
        x=last,
        line_dash="dash",
        annotation_text="last gradient ready",
        annotation_position="top left",
    )
    fig.add_vline(
        x=returned,
        line_dash="dot",
        annotation_text="backward() returned: DDP waited for every bucket",
        annotation_position="bottom right",
    )
    fig.update_layout(
        title=title,
        xaxis_title="ms since backward started",
        barmode="overlay",
        legend={"orientation": "h", "y": -0.25},
    )
    return fig


def _bucket_segments(log: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Bar segments per bucket: queued behind the previous bucket (light), then the rest."""
    from plotly.colors import sample_colorscale

    ms, previous_done, out = 1000.0, 0.0, []
    ordered = sorted(log, key=lambda b: b["start"])
    colours = sample_colorscale(
        "Viridis", [i / max(len(log) - 1, 1) * 0.85 for i in range(len(log))]
    )
    by_bucket = dict(zip(sorted(b["bucket"] for b in log), colours, strict=True))
    for b in ordered:
        start, done = b["start"], b.get("done", b["start"])
        own = max(start, min(previous_done, done))
        row, colour = [f"bucket {b['bucket']}"], by_bucket[b["bucket"]]
        label = f"bucket {b['bucket']}: params {b['params']}, {b['nbytes'] / MB:.2f} MiB"
        if own > start:
            out.append(
                {"base": [start * ms], "x": [(own - start) * ms], "y": row, "opacity": 0.35,
                 "marker_color": colour,
                 "hovertext": f"{label}, queued while the previous bucket was in flight"}
            )  # fmt: skip
        out.append(
            {"base": [own * ms], "x": [(done - own) * ms], "y": row, "marker_color": colour,
             "hovertext": f"{label}, all-reduce in flight until done"}
        )  # fmt: skip
        previous_done = max(previous_done, done)
    return out


if __name__ == "__main__":  # torchrun --nproc-per-node 2 -m course.lessons.buckets.experiment
    dist.init_process_group("gloo")
    print(allreduce_timing())
    dist.barrier()  # no rank closes its connections while a peer still uses them
    dist.destroy_process_group()
