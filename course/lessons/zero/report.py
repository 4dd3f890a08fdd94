"""What the zero notebook's measuring cells print and draw, from ``experiment`` and
``compression`` (this lesson's) run on fresh ranks.

Each function measures, then prints a short table (or returns a figure). Given a function
or class that is still the released stub, they say so and measure nothing (a stub hook would
crash DDP in native code). While nbgrader executes the notebook (``NBGRADER_EXECUTION`` is
set) they print one line and measure nothing: the measurements decide no points.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

from course.checks.teaching import not_implemented
from course.lessons.zero import compression
from course.lessons.zero import experiment as zero
from course.lessons.zero import traffic as zero_traffic
from course.ranks import run

__all__ = [
    "grading",
    "memory_figure",
    "memory_points",
    "report_ef_training",
    "report_equivalence",
    "report_fp16",
    "report_matches",
    "report_memory",
    "report_powersgd",
    "report_shards",
    "report_torch_zero",
    "report_traffic",
    "unwritten",
]

TIMEOUT = 60.0  # seconds per launch: DDP's first construction on a rank imports torch._dynamo


def grading() -> bool:
    """Whether nbgrader is executing this notebook (autograde or validate); says so if it is."""
    if os.environ.get("NBGRADER_EXECUTION"):
        print("(measurement skipped while nbgrader runs the notebook: it decides no points)")
        return True
    return False


def unwritten(*yours: Any) -> bool:
    """Whether any of ``yours`` is still the released stub; says so if it is."""
    for obj in yours:
        message = not_implemented(obj)
        if message:
            print(f"Note: {message}")
            return True
    return False


def report_traffic(
    reduce_scatter: Callable,
    all_gather: Callable,
    world_sizes: Sequence[int] = (2, 3, 4),
    calls: bool = False,
) -> None:
    """Bytes a rank sends per step, in model sizes: DDP and torch's ``fully_shard`` on the
    wire, your halves recorded, on each world size; with ``calls``, the collectives
    ``fully_shard`` called."""
    if grading() or unwritten(reduce_scatter, all_gather):
        return
    for n in world_sizes:
        t = zero_traffic.traffic_on_ranks(reduce_scatter, all_gather, n)
        called = ", ".join(f"{count} {name}" for name, count in t["FSDP calls"].items())
        print(
            f"N = {n}: DDP {t['DDP']:.2f}; your reduce_scatter {t['reduce_scatter']:.2f}, "
            f"all_gather {t['all_gather']:.2f}, ZeRO-1/2 step {t['ZeRO-1/2']:.2f}; torch's "
            f"fully_shard forward {t['FSDP forward']:.2f}, backward {t['FSDP backward']:.2f}"
            + (f" ({called} for {t['layers']} layers)" if calls else "")
        )


MEASURE_WHEN = {
    "after backward": zero.memory_after_backward,
    "during backward": zero.memory_during_backward,
    "after step": zero.memory_on_ranks,
}


def report_memory(
    zero_class: Any, world_size: int = 4, when: str | Sequence[str] = "after step"
) -> None:
    """Bytes held per rank in the second step, DDP + Adam against ``zero_class``, in units of
    P, at each moment in ``when``: "after backward" (before ``step()``), "during backward"
    (the most held as each gradient arrives) or "after step"."""
    if grading() or unwritten(zero_class):
        return
    moments = [when] if isinstance(when, str) else list(when)
    wrong = [m for m in moments if m not in MEASURE_WHEN]
    if wrong:
        print(f"when must be among {', '.join(map(repr, MEASURE_WHEN))}, not {wrong[0]!r}")
        return
    psi = sum(p.numel() for p in zero.toy_model().parameters())
    for moment in moments:
        print(f"{world_size} ranks, {moment}:")
        for kind in ("DDP", "zero"):
            held = run(MEASURE_WHEN[moment], world_size, kind, zero_class, timeout=TIMEOUT)[0]
            parts = ", ".join(f"{k} {v / psi:.2f}P" for k, v in held.items())
            print(f"{kind:5}: {parts}; total {sum(held.values()) / psi:.2f}P")


def report_matches(zero_class: Any, world_size: int = 2) -> None:
    """Whether ``zero_class`` trains to DDP + Adam's weights within 1e-4, after 20 steps."""
    if grading() or unwritten(zero_class):
        return
    same = run(zero.equivalence, world_size, zero_class, timeout=TIMEOUT)[0]
    print(f"N = {world_size}: within 1e-4 of DDP + Adam's weights: {same['max_rel'] < 1e-4}")


REFERENCES = {
    "DDP": "DDP + Adam (1/N before the sum)",
    "DDP, divided after the sum": "DDP + Adam, 1/N after the sum",
}


def report_equivalence(zero_class: Any, world_sizes: Sequence[int] = (3,)) -> None:
    """``zero_class`` against DDP + Adam after 20 steps, on each world size: against DDP as
    it is (each gradient scaled by 1/N before the sum) and against DDP with a comm hook that
    divides after the sum (``zero.sum_then_divide``), as the notebook's optimizer does."""
    if grading() or unwritten(zero_class):
        return
    for n in world_sizes:
        for reference, name in REFERENCES.items():
            same = run(zero.equivalence, n, zero_class, 20, reference, timeout=TIMEOUT)[0]
            print(
                f"N = {n}, against {name:31}: bit for bit identical: {same['identical']}, "
                f"largest difference {same['max_rel']:.1e} of the largest parameter"
            )


def report_shards(world_size: int = 4, numel: int = 1024, reduce_scatter: Any = None) -> None:
    """Which ranks' shards change when one chunk of rank 0's tensor changes (nothing else on
    any rank), through ``reduce_scatter`` (gloo's own ``reduce_scatter_tensor`` by default;
    your ``reduce_scatter(tensor) -> shard`` works too)."""
    if grading() or (reduce_scatter is not None and unwritten(reduce_scatter)):
        return
    rs = zero_traffic.gloo_reduce_scatter if reduce_scatter is None else reduce_scatter
    name = getattr(rs, "__name__", "reduce_scatter")
    if rs is zero_traffic.gloo_reduce_scatter:
        name = "gloo's reduce_scatter_tensor"
    seen = run(zero_traffic.shard_dependence, world_size, rs, numel, timeout=TIMEOUT)
    print(f"{world_size} ranks, {name}, {numel:,} elements, chunks of rank 0's tensor changed:")
    for c in range(world_size):
        changed = [r for r in range(world_size) if seen[r][c]]
        print(f"  chunk {c}: the shard changes on rank {', '.join(map(str, changed)) or 'none'}")


def report_torch_zero(models: Sequence[tuple[int, Sequence[int]]]) -> None:
    """Which parameters' Adam state each rank holds under torch's ZeroRedundancyOptimizer, for
    each (world size, parameter sizes) given: flat parameters of those many elements."""
    if grading():
        return
    for world_size, numels in models:
        print(f"{world_size} ranks, parameters of {', '.join(f'{n:,}' for n in numels)} elements:")
        for r, held in enumerate(
            run(zero.torch_zero_state_bytes, world_size, list(numels), timeout=TIMEOUT)
        ):
            owned = ", ".join(f"{i} ({numels[i]:,})" for i in held["owned"]) or "none"
            print(f"  rank {r}: state of parameters {owned}: {held['nbytes']:,} bytes")


def report_fp16(values: Sequence[float], world_size: int = 2) -> None:
    """float16's range, and what a cast alone does to ``values``; then DDP's averaged
    gradient, without and with fp16_compress_hook, every rank feeding ``values``, on
    ``world_size`` ranks."""
    if grading():
        return
    import torch

    f16 = torch.finfo(torch.float16)
    print(
        f"float16: largest finite {f16.max:.0f}, smallest normal {f16.smallest_normal:.3g}, "
        f"smallest subnormal {f16.smallest_normal * 2**-10:.3g}"
    )
    grads = run(compression.fp16_hook_grads, world_size, list(values), timeout=TIMEOUT)[0]
    cast = torch.tensor(list(values)).to(torch.float16).float().tolist()
    print(f"{world_size} ranks, each with the gradient {list(values)}:")
    for name, got in {"cast only": cast, **grads}.items():
        print(f"{name:9}: {got}")


def report_ef_training(hook: Any, scale: float = 1e-8) -> None:
    """Weights after 200 SGD steps with gradients of ``scale``: fp32, plain fp16, ``hook``."""
    from course.lessons.zero.feedback import runs

    if grading() or unwritten(hook):
        return
    weights = run(runs, 2, hook, scale, timeout=TIMEOUT)[0]
    for name, w in weights.items():
        print(f"{name:5}: first weights {[f'{v:.3g}' for v in w[:4].tolist()]}")


def report_powersgd(
    ranks: Sequence[int] = (1, 4, 16),
    start_iter: int = 2,
    shape: tuple[int, int] = (256, 256),
    batch: int = 8,
    world_size: int = 2,
) -> None:
    """Bytes all-reduced per step, and the gradient's error, for each PowerSGD rank, on one
    bias-free ``shape`` layer fed ``batch`` samples per rank."""
    if grading():
        return
    print(f"{world_size} ranks, a {shape[0]} x {shape[1]} layer, batches of {batch}:")
    for r in ranks:
        rows = run(
            zero_traffic.powersgd_traffic,
            world_size,
            r,
            start_iter,
            tuple(shape),
            batch,
            start_iter + 1,
            timeout=TIMEOUT,
        )[0]
        sent = ", ".join(f"{row['bytes']:,} B (error {row['error']:.2f})" for row in rows)
        print(f"r = {r:2}: {sent}")


def memory_points(zero_class: Any, world_sizes: tuple[int, ...] = (2, 3, 4)) -> dict[str, dict]:
    """Measured bytes per rank (the most any rank holds), in units of P, per scheme and N:
    DDP + Adam, torch's ``ZeroRedundancyOptimizer`` (ZeRO-1) and ``zero_class`` (ZeRO-2)."""
    psi = sum(p.numel() for p in zero.toy_model().parameters())
    kinds = {"DDP": "DDP", "ZeRO-1": "torch ZeRO-1", "ZeRO-2": "zero"}
    points: dict[str, dict] = {name: {} for name in kinds}
    for n in world_sizes:
        for name, kind in kinds.items():
            held = run(zero.memory_on_ranks, n, kind, zero_class, timeout=TIMEOUT)
            points[name][n] = max(sum(h.values()) for h in held) / psi
    return points


def memory_figure(zero_class: Any, world_sizes: tuple[int, ...] = (2, 3, 4)) -> Any:
    """Bytes per rank against world size: the formulas as lines, the measurements as points."""
    import plotly.graph_objects as go

    if grading() or unwritten(zero_class):
        return None
    points = memory_points(zero_class, world_sizes)
    xs = list(range(min(world_sizes), max(world_sizes) + 1))  # the measured range only
    fig = go.Figure()
    colours = {"DDP": "#4c72b0", "ZeRO-1": "#dd8452", "ZeRO-2": "#55a868"}
    for name, colour in colours.items():
        line = [sum(zero.FORMULAS[name](n)) for n in xs]
        fig.add_scatter(x=xs, y=line, mode="lines", name=f"{name} formula", line_color=colour)
        measured = points[name]
        fig.add_scatter(
            x=list(measured),
            y=list(measured.values()),
            mode="markers",
            name=f"{name} measured",
            marker={"color": colour, "size": 11, "symbol": "circle-open", "line_width": 3},
        )
    fig.add_hline(
        y=4,
        line={"dash": "dot", "color": "#555"},
        annotation_text="4P: the replicated fp32 parameters, the floor of ZeRO-1 and ZeRO-2",
        annotation_position="bottom right",
    )
    fig.update_layout(
        title="Bytes per rank for parameters, gradients and Adam state (fp32), in units of P",
        xaxis_title="world size N",
        yaxis_title="bytes per rank / P",
        yaxis_rangemode="tozero",
        height=420,
    )
    return fig
