"""What all-reduce costs: the alpha-beta model of four ways to sum a tensor over N ranks.

A message of ``m`` bytes takes ``alpha + m * beta`` seconds (Hockney's latency-bandwidth
model, as used by Thakur, Rabenseifner & Gropp 2005, "Optimization of collective
communication operations in MPICH"). Every rank can send one message and receive one at the
same time (full duplex, one port); messages through the same port queue. The time to add
numbers is left out: the comparison is about the network.

The predictions are closed forms; ``course.ring.schedule.simulate`` counts the ring's steps and
bytes independently, and the tests check the two against each other.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from course.ring.schedule import num_steps, ring_bytes_formula

if TYPE_CHECKING:
    import plotly.graph_objects as go

__all__ = [
    "ALGORITHMS",
    "DEFAULT_ALPHA",
    "DEFAULT_BETA",
    "Prediction",
    "algbw",
    "busbw",
    "cost_figure",
    "crossover_size",
    "fit_alpha_beta",
    "naive",
    "parameter_server",
    "predict_all",
    "recursive_doubling",
    "ring",
]

# Datacenter-ish defaults: ~5 us per message (a tuned TCP or RDMA stack between machines)
# and 100 Gbit/s links (12.5 GB/s). Two gloo ranks on one laptop see more like 20-50 us and
# a few GB/s; pass your own alpha and beta to compare.
DEFAULT_ALPHA = 5e-6  # seconds per message
DEFAULT_BETA = 1 / 12.5e9  # seconds per byte


@dataclass(frozen=True, slots=True)
class Prediction:
    """One algorithm's predicted cost for one all-reduce."""

    name: str
    steps: int  # messages one after another on the critical path
    bytes_per_rank: float  # bytes the busiest worker rank sends
    bytes_busiest_link: float  # bytes through the busiest port (a server's too), one way
    seconds: float  # alpha * steps + beta * (bytes queued one after another)


def ring(
    size_bytes: float, world_size: int, alpha: float = DEFAULT_ALPHA, beta: float = DEFAULT_BETA
) -> Prediction:
    """Ring all-reduce (Patarasuk & Yuan 2009): the schedule's steps, ``size/N`` bytes each."""
    _check(size_bytes, world_size)
    per_rank = ring_bytes_formula(size_bytes, world_size)
    steps = num_steps(world_size)
    return Prediction("ring", steps, per_rank, per_rank, steps * alpha + per_rank * beta)


def naive(
    size_bytes: float, world_size: int, alpha: float = DEFAULT_ALPHA, beta: float = DEFAULT_BETA
) -> Prediction:
    """Naive exchange: every rank sends its whole tensor to each of the ``N-1`` others."""
    _check(size_bytes, world_size)
    steps = world_size - 1
    return Prediction(
        "naive", steps, steps * size_bytes, steps * size_bytes, steps * (alpha + size_bytes * beta)
    )


def parameter_server(
    size_bytes: float, world_size: int, alpha: float = DEFAULT_ALPHA, beta: float = DEFAULT_BETA
) -> Prediction:
    """One parameter server, a machine apart from the ``N`` worker ranks (Li et al. 2014).

    Each worker pushes its tensor and pulls the sum: it sends ``size`` bytes. The server's
    one port takes ``N`` pushes, then sends ``N`` pulls, so its link is the bottleneck:
    ``2N`` messages and ``N * size`` bytes each way. One worker needs no server at all.
    """
    _check(size_bytes, world_size)
    if world_size == 1:
        return Prediction("parameter server", 0, 0.0, 0.0, 0.0)
    n = world_size
    seconds = 2 * n * (alpha + size_bytes * beta)
    return Prediction("parameter server", 2 * n, size_bytes, n * size_bytes, seconds)


def recursive_doubling(
    size_bytes: float, world_size: int, alpha: float = DEFAULT_ALPHA, beta: float = DEFAULT_BETA
) -> Prediction:
    """Recursive doubling (Thakur et al. 2005): ``log2 N`` exchanges of the whole tensor.

    At step ``k`` rank ``r`` swaps its partial sum with rank ``r XOR 2**k``. When N is not a
    power of two, the ``N - 2**floor(log2 N)`` extra ranks first send their tensor to a
    partner and get the result back at the end: two more steps of the whole tensor.
    """
    _check(size_bytes, world_size)
    k = world_size.bit_length() - 1  # floor(log2 N)
    even = world_size == 1 << k
    steps = k if even else k + 2
    busiest = (k if even else k + 1) * size_bytes  # a partner of an extra rank sends k + 1
    seconds = steps * (alpha + size_bytes * beta)
    return Prediction("recursive doubling", steps, busiest, busiest, seconds)


ALGORITHMS: dict[str, Callable[..., Prediction]] = {
    "ring": ring,
    "naive": naive,
    "parameter server": parameter_server,
    "recursive doubling": recursive_doubling,
}


def predict_all(
    size_bytes: float, world_size: int, alpha: float = DEFAULT_ALPHA, beta: float = DEFAULT_BETA
) -> list[Prediction]:
    """Every algorithm's prediction for one all-reduce of ``size_bytes`` over ``world_size``."""
    return [f(size_bytes, world_size, alpha, beta) for f in ALGORITHMS.values()]


def algbw(size_bytes: float, seconds: float) -> float:
    """Algorithm bandwidth as nccl-tests reports it: tensor size over time, bytes/s."""
    if seconds <= 0:
        raise ValueError(f"need a positive time, got {seconds} s")
    return size_bytes / seconds


def busbw(size_bytes: float, world_size: int, seconds: float) -> float:
    """Bus bandwidth of an all-reduce as nccl-tests defines it: ``algbw`` times the ring's factor.

    Comparable with a link's peak bandwidth whatever N is (nccl-tests, doc/PERFORMANCE.md).
    """
    return ring_bytes_formula(algbw(size_bytes, seconds), world_size)


def fit_alpha_beta(sizes: Sequence[float], seconds: Sequence[float]) -> tuple[float, float]:
    """The ``(alpha, beta)`` of ``t = alpha + size * beta`` that fits measured message times.

    Least squares on the relative error (each point weighted by ``1/t**2``), so that the
    microsecond times of small messages decide alpha as much as the milliseconds of large
    ones decide beta; a plain fit would let the largest message set both.
    """
    if len(sizes) != len(seconds) or len(sizes) < 2:
        raise ValueError("need at least two (size, time) pairs, as many sizes as times")
    weights = [1 / t**2 for t in seconds]
    sw = sum(weights)
    sx = sum(w * x for w, x in zip(weights, sizes, strict=True))
    sxx = sum(w * x * x for w, x in zip(weights, sizes, strict=True))
    sy = sum(w * y for w, y in zip(weights, seconds, strict=True))
    sxy = sum(w * x * y for w, x, y in zip(weights, sizes, seconds, strict=True))
    det = sw * sxx - sx * sx
    if det <= 0:
        raise ValueError("need at least two different sizes")
    return (sxx * sy - sx * sxy) / det, (sw * sxy - sx * sy) / det


def crossover_size(alpha: float, beta: float, world_size: int) -> float:
    """The tensor size in bytes where the alpha-beta costs of :func:`recursive_doubling` and
    :func:`ring` are equal, for N a power of two of at least 4 (on 2 ranks the two are the
    same exchange)."""
    if world_size < 4 or world_size & (world_size - 1):
        raise ValueError(f"need a power of two of at least 4 ranks, got {world_size}")
    steps = math.log2(world_size)
    ring_steps, ring_bytes = 2 * (world_size - 1), 2 * (world_size - 1) / world_size
    return alpha * (ring_steps - steps) / (beta * (steps - ring_bytes))


def cost_figure(
    world_size: int = 8,
    size_bytes: float = 100e6,
    sizes: Sequence[float] | None = None,
    world_sizes: Sequence[int] | None = None,
    alpha: float = DEFAULT_ALPHA,
    beta: float = DEFAULT_BETA,
    by_world_size: bool = True,
) -> go.Figure:
    """Predicted time of each algorithm against message size (at ``world_size``) and against
    N (at ``size_bytes``), both log-log; ``by_world_size=False`` draws the first panel only,
    for a page whose questions ask how the cost grows with N."""
    from plotly.subplots import make_subplots

    sizes = list(sizes or [2.0**e for e in range(4, 33)])  # 16 B .. 4 GiB
    world_sizes = list(world_sizes or [2**e for e in range(1, 11)])  # 2 .. 1024
    titles = [f"N = {world_size} ranks", f"tensor of {_human(size_bytes)}"]
    cols = 2 if by_world_size else 1
    fig = make_subplots(rows=1, cols=cols, subplot_titles=titles[:cols])
    for i, (name, f) in enumerate(ALGORITHMS.items()):
        style = {"name": name, "legendgroup": name, "line": {"color": _COLOURS[i]}}
        by_size = [f(s, world_size, alpha, beta).seconds for s in sizes]
        fig.add_scatter(x=sizes, y=by_size, row=1, col=1, **style)
        if by_world_size:
            by_n = [f(size_bytes, n, alpha, beta).seconds for n in world_sizes]
            fig.add_scatter(x=world_sizes, y=by_n, row=1, col=2, showlegend=False, **style)
    fig.update_xaxes(type="log", title_text="tensor size", row=1, col=1)
    if by_world_size:
        fig.update_xaxes(type="log", title_text="world_size N", row=1, col=2)
    # Seconds with SI prefixes on the axis (100μs, 10ms), as the title writes alpha.
    fig.update_yaxes(type="log", title_text="predicted time", exponentformat="SI", ticksuffix="s")
    fig.update_xaxes(exponentformat="SI", ticksuffix="B", row=1, col=1)
    fig.update_layout(
        title=f"alpha-beta model: alpha = {alpha * 1e6:g} μs, 1/beta = {_human(1 / beta)}/s",
        hovermode="x unified",
    )
    return fig


_COLOURS = ("#1f77b4", "#d62728", "#ff7f0e", "#2ca02c")


def _human(nbytes: float) -> str:
    """``1.5e9`` -> ``'1.5 GB'``: decimal units, as network bandwidth is quoted."""
    exponent = min(int(math.log10(max(nbytes, 1)) // 3), 4)
    unit = ("B", "kB", "MB", "GB", "TB")[exponent]
    return f"{nbytes / 1000**exponent:.3g} {unit}"


def _check(size_bytes: float, world_size: int) -> None:
    if world_size < 1 or size_bytes < 0:
        raise ValueError(f"need world_size >= 1 and size >= 0, got {world_size} and {size_bytes}")
