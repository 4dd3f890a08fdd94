"""What do the measurements on real gloo ranks say about the cost of synchrony?

One test per quiz claim, each asserting what this machine measures (2 cores, loopback TCP,
other tests running beside it), with margins that hold under that load. The trees and the
two-level all-reduce measured are the model solutions, kept in tests/checks/synchrony_impls.py
(the package holds none). Timings that must not depend on the machine's load use emulated
compute (sleeps); the communication timings keep the fastest of several repeats.
"""

from __future__ import annotations

import datetime as dt
import functools
import statistics
import sys
from pathlib import Path

import pytest
import torch
from quiz import keys, supported

from course.experiments import batch_size, hierarchy, latency, stragglers
from course.instructor.reference import ring_allreduce
from course.ring.cost import crossover_size, fit_alpha_beta

sys.path.insert(0, str(Path(__file__).parent / "checks"))
import synchrony_impls  # the model solutions, as the notebook's cells define them

pytestmark = pytest.mark.ranks

KEYS = keys("synchrony")

MB = 2**20


@pytest.fixture(scope="module")
def fit() -> tuple[dict[int, float], float, float]:
    """One-way message times, 1 KB .. 64 MB, and the alpha-beta fit over them."""
    times = latency.pingpong()
    alpha, beta = fit_alpha_beta(list(times), list(times.values()))
    print(f"alpha = {alpha * 1e6:.0f} us, 1/beta = {1 / beta / 1e9:.2f} GB/s")
    return times, alpha, beta


def test_synchrony_1_alpha_over_beta_reaches_half_the_peak(fit) -> None:
    """Does a message of alpha/beta bytes move at about half of 1/beta, while the largest
    message comes near 1/beta itself?"""
    times, alpha, beta = fit
    assert 10e-6 < alpha < 5e-3 and 0.2e9 < 1 / beta < 50e9
    size = int(alpha / beta)
    half = (size / latency.pingpong([size], repeats=21)[size]) * beta
    peak = (64 * MB / times[64 * MB]) * beta
    print(f"alpha/beta = {size} B: {half:.2f} of 1/beta; 64 MB: {peak:.2f}")
    assert 0.3 <= peak <= 1.5  # large messages near the peak (under load, 0.5 of it or so)
    small = (1024 / times[1024]) * beta
    claims = {
        "a": 0.25 <= half <= 0.8,  # measured at alpha / beta
        "b": False,  # 2 alpha / beta: 2/3 of the peak in the model the measurement fits
        "c": 0.25 <= small <= 0.8,  # 1 KB
        "d": all(size / times[size] * beta < 0.5 for size in times if size <= MB),  # 32 MB
    }
    assert supported(claims) == KEYS["synchrony_1"]


def test_synchrony_2_tiny_all_reduce_costs_many_latencies(fit) -> None:
    """Does a 4-rank gloo all_reduce of 256 B take at least 2(N-1) = 6 one-way latencies
    (alpha), far more than one message or log2 N of them?"""
    _, alpha, _ = fit
    tiny = latency.allreduce_times([64], repeats=21, world_size=4)[64]
    two = latency.allreduce_times([64], repeats=21, world_size=2)[64]
    print(f"256 B: 4 ranks {tiny / alpha:.1f} alpha, 2 ranks {two / alpha:.1f} alpha")
    assert tiny > 1.5 * two  # more ranks, more steps one after another
    assert two > 2 * alpha  # above the model's 2(N-1) alpha on 2 ranks too
    ratio = tiny / alpha
    claims = {"a": ratio < 1.5, "b": 1.5 <= ratio < 4, "c": 4 <= ratio < 12, "d": ratio > 15}
    assert supported(claims) == KEYS["synchrony_2"]


def _tree_and_ring(numels: list[int], repeats: int) -> dict[str, dict[int, list[float]]]:
    return {
        "tree": latency.allreduce_rank(synchrony_impls.tree_allreduce, numels, repeats),
        "ring": latency.allreduce_rank(ring_allreduce, numels, repeats),
    }


def test_synchrony_3_tree_wins_small_ring_wins_large(run_ranks, fit) -> None:
    """On 4 ranks, is recursive doubling faster than the ring for small tensors (the median
    over 1 to 64 KB: one size alone is noisy, a call's fixed cost dominating there) and the
    ring faster at 16 and 32 MB (both point-to-point code of ours), crossing over at or
    above a quarter of the model's S*?"""
    _, alpha, beta = fit
    numels = [2**e for e in range(8, 23, 2)] + [8 * MB]  # 1 KB .. 16 MB, 32 MB
    per_rank = run_ranks(_tree_and_ring, 4, numels, 5)
    seconds = {
        name: {
            n * 4: min(map(max, zip(*(r[name][n] for r in per_rank), strict=True))) for n in numels
        }
        for name in ("tree", "ring")
    }
    ratios = {s: seconds["ring"][s] / seconds["tree"][s] for s in seconds["ring"]}
    ring_from = min(s for s in ratios if all(ratios[t] < 1 for t in ratios if t >= s))
    print("ring/tree:", {s: round(r, 2) for s, r in ratios.items()})
    print(f"ring wins from {ring_from} B; predicted S* = {crossover_size(alpha, beta, 4):.3g} B")
    assert 64 * 1024 <= ring_from <= 32 * MB
    small = statistics.median(ratios[s] for s in ratios if s <= 64 * 1024)
    large = max(ratios[16 * MB], ratios[32 * MB])
    predicted = crossover_size(alpha, beta, 4)
    assert predicted == pytest.approx(8 * alpha / beta)  # the model's tie: 4 alpha = 0.5 S beta
    claims = {  # the model decides; the measurement shows the regime change it predicts
        "a": predicted == pytest.approx(alpha / beta),
        "b": small > 1.2 and large < 1 and ring_from >= predicted / 4,
        "c": predicted == pytest.approx(2 * alpha / beta),
        "d": all(r > 1 for r in ratios.values()),
    }
    assert supported(claims) == KEYS["synchrony_3"]


def _flat(tensor: torch.Tensor) -> None:
    torch.distributed.all_reduce(tensor)


PHASES = ("reduce-scatter", "across", "all-gather")


def _phase_traffic(numel: int, ranks_per_node: int) -> dict[str, dict[int, int]]:
    """Rank side: the bytes to each peer of each phase of the two-level all-reduce, run alone
    (the model solution's three calls, on the same groups)."""
    import torch.distributed as dist

    world, rank, r = dist.get_world_size(), dist.get_rank(), ranks_per_node
    nodes = [dist.new_group(list(range(k * r, (k + 1) * r))) for k in range(world // r)]
    crosses = [dist.new_group(list(range(j, world, r))) for j in range(r)]
    node, cross = nodes[rank // r], crosses[rank % r]
    shard = torch.empty(numel // r)
    calls = (
        (lambda t: dist.reduce_scatter_single(shard, t, group=node), numel),
        (lambda t: dist.all_reduce(t, group=cross), numel // r),
        (lambda t: dist.all_gather_single(t, shard, group=node), numel),
    )
    return {name: hierarchy.peer_traffic(*call) for name, call in zip(PHASES, calls, strict=True)}


def _model_ratio(world_size: int, ranks_per_node: int, size: int) -> float:
    """The flat ring's time over the two-level scheme's in ``course.ring.hierarchy``'s model
    (every collective a ring over its group, 10 us a step, links across 10x slower)."""
    from course.ring import hierarchy as model

    r, m = ranks_per_node, world_size // ranks_per_node
    nodes = [tuple(range(k * r, (k + 1) * r)) for k in range(m)]
    crosses = [tuple(range(j, world_size, r)) for j in range(r)]
    calls = [model.Call("reduce_scatter", g, (size,) * r, 4) for g in nodes]
    calls += [model.Call("all_reduce", g, (size // r,) * m, 4) for g in crosses]
    calls += [model.Call("all_gather", g, (size // r,) * r, 4) for g in nodes]
    return model.flat_ring_time(world_size, size) / model.emulated_time(calls, world_size, r)


@pytest.mark.parametrize(("world_size", "ranks_per_node"), [(4, 2), (8, 4)])
def test_synchrony_4_bytes_across_nodes(run_ranks, world_size, ranks_per_node) -> None:
    """Does gloo's flat ring send 2(N-1)/N S over the one link into each node (and only its
    small notes to rank + 1 over the link back), and the two-level all-reduce 2(M-1)/M
    S/ranks_per_node from every rank, so that over 10x slower links between nodes, the three
    phases in turn, the flat ring takes 3.7 times as long on 8 ranks with gloo's bytes (4.3 in
    the ring model of ``course.ring.hierarchy``)?"""
    numel = 2**18
    size, nodes = numel * 4, world_size // ranks_per_node
    two_level = functools.partial(
        synchrony_impls.hierarchical_allreduce, ranks_per_node=ranks_per_node
    )
    flat = run_ranks(hierarchy.peer_traffic, world_size, _flat, numel)
    tiered = run_ranks(hierarchy.peer_traffic, world_size, two_level, numel)
    crossing = hierarchy.crossing_bytes(flat, ranks_per_node)
    flat_across = [b for b in crossing if b > size / 100]
    notes = {rank: b for rank, b in enumerate(crossing) if 0 < b <= size / 100}
    tiered_across = hierarchy.crossing_bytes(tiered, ranks_per_node)
    print(world_size, [b / size for b in flat_across], notes, [b / size for b in tiered_across])
    assert len(flat_across) == nodes  # one ring link into each node
    firsts = {r for r in range(world_size) if r % ranks_per_node == 0}
    assert {r for r, b in enumerate(crossing) if b > size / 100} == firsts  # to rank - 1
    assert set(notes) == {r + ranks_per_node - 1 for r in firsts}  # gloo's notes, to rank + 1
    ring_bytes = 2 * (world_size - 1) / world_size * size
    assert all(ring_bytes <= b < 1.01 * ring_bytes for b in flat_across)
    shard_bytes = 2 * (nodes - 1) / nodes * size / ranks_per_node
    assert all(shard_bytes <= b < 1.01 * shard_bytes for b in tiered_across)
    phases = run_ranks(_phase_traffic, world_size, numel, ranks_per_node)
    in_turn = sum(
        hierarchy.link_seconds([r[name] for r in phases], ranks_per_node) for name in PHASES
    )
    slower = hierarchy.link_seconds(flat, ranks_per_node) / in_turn
    r = ranks_per_node
    inside = 2 * (r - 1) / r + (r - 1) / r  # gloo's reduce-scatter (an all-reduce's), all-gather
    expected = (ring_bytes / size) / (shard_bytes / size + inside / 10)
    print(f"flat / two-level, phases in turn: {slower:.2f} (gloo's bytes), {expected:.2f} formula")
    assert slower == pytest.approx(expected, rel=0.02)
    if world_size == 8:  # the question's layout
        assert round(slower, 1) == 3.7
        ring_inside = 2 * (r - 1) / r  # a ring reduce-scatter's (r-1)/r and the all-gather's
        assert round((ring_bytes / size) / (shard_bytes / size + ring_inside / 10), 1) == 4.4
        assert round(_model_ratio(world_size, ranks_per_node, size), 1) == 4.3
        flat_max, tiered_max = max(flat_across) / size, max(tiered_across) / size
        claims = {
            "a": abs(flat_max - 1.75) < 0.02 and abs(tiered_max - 0.25) < 0.01,
            "b": abs(flat_max - 0.25) < 0.01 and abs(tiered_max - 1.75) < 0.02,
            "c": abs(flat_max - 1.75) < 0.02 and abs(tiered_max - 1.75) < 0.02,
            "d": abs(sum(flat_across) / size - 7) < 0.1,
        }
        assert supported(claims) == KEYS["synchrony_4"]


@pytest.fixture(scope="module")
def straggler() -> dict[float, list]:
    """DDP steps on 4 ranks, compute emulated as a 30 ms sleep: all equal, and rank 3 at 2x."""
    return {s: stragglers.straggler_run(4, slow_rank=3, slowdown=s) for s in (1.0, 2.0)}


def test_synchrony_5_every_rank_steps_at_the_straggler_s_pace(straggler) -> None:
    """With rank 3 computing 2x as long, does every rank's step take about rank 3's time,
    the fast ranks spending the difference waiting in the all-reduce?"""
    even, slow = (stragglers.step_seconds(straggler[s]) for s in (1.0, 2.0))
    waits = stragglers.waiting_seconds(straggler[2.0])
    print("steps ms", [round(t * 1e3) for t in even], [round(t * 1e3) for t in slow])
    print("waiting ms", [round(t * 1e3) for t in waits])
    assert all(waits[r] >= 0.02 for r in range(3)) and waits[3] < 0.5 * min(waits[:3])
    assert torch.distributed.default_pg_timeout == dt.timedelta(minutes=30)  # gloo's
    mean_even = statistics.mean(even)
    claims = {
        "a": all(slow[r] < 1.2 * even[r] for r in range(3)),  # the fast ones unchanged
        "b": all(abs(t - 1.25 * mean_even) < 0.1 * mean_even for t in slow),  # (3 + 2) / 4
        "c": False,  # DDP has no deadline of its own: every step above kept all 4 gradients
        "d": all(t >= 0.85 * slow[3] for t in slow)
        and all(slow[r] >= 1.4 * even[r] for r in range(3)),
    }
    assert supported(claims) == KEYS["synchrony_5"]


def test_synchrony_6_one_backup_steps_at_the_third_arrival(straggler) -> None:
    """Dropping b = 1 of 4 gradients, does the step go on at the third-fastest arrival (the
    straggler's left out), averaging over the 3 ranks kept, in about half the time?"""
    steps = stragglers.arrivals(straggler[2.0])
    backed = [stragglers.backup_step(ready, 1) for ready in steps]
    assert all(b["dropped"] == [3] and b["divide_by"] == 3 for b in backed)
    assert all(b["seconds"] == sorted(ready)[2] for b, ready in zip(backed, steps, strict=True))
    with_backup = statistics.median(b["seconds"] for b in backed)
    measured = statistics.median(stragglers.step_seconds(straggler[2.0]))
    print(f"step {measured * 1e3:.0f} ms, with one backup {with_backup * 1e3:.0f} ms")
    assert with_backup < 0.7 * measured
    claims = {
        "a": with_backup < 0.7 * measured and all(b["divide_by"] == 3 for b in backed),
        "b": with_backup > 0.9 * measured,
        "c": any(b["divide_by"] == 4 for b in backed),
        "d": all(b["seconds"] == min(ready) for b, ready in zip(backed, steps, strict=True)),
    }
    assert supported(claims) == KEYS["synchrony_6"]


def _late_start(straggler: int, delay: float) -> tuple[list[int], list[float], float]:
    """The model backup step on a rank, the straggler starting ``delay`` s late: whom it
    kept, its mean, and when its step ended."""
    import time

    import torch.distributed as dist

    start = time.monotonic()
    if dist.get_rank() == straggler:
        time.sleep(delay)
    grad = torch.full((3,), float(dist.get_rank()))
    kept = synchrony_impls.step_with_backups(grad, 1)
    ended = time.monotonic() - start
    dist.barrier()
    return kept, grad.tolist(), ended


def test_synchrony_6_a_real_backup_step_leaves_the_straggler_behind(run_ranks) -> None:
    """Run for real (the model step of exercise 3), does one backup on 4 ranks keep the three
    on time, give every rank their mean, and end their steps long before the straggler's?"""
    out = run_ranks(_late_start, 4, 3, 0.5)
    assert all(kept == [0, 1, 2] and mean == [1.0] * 3 for kept, mean, _ in out)
    assert all(ended < 0.25 for _, _, ended in out[:3]) and out[3][2] >= 0.5


def test_synchrony_7_fixed_batch_per_rank_and_the_learning_rate() -> None:
    """With the per-rank batch fixed (a 2-layer MLP, lr 0.2 at N = 1), do more ranks end the
    same epochs at a higher loss under the same lr, and does lr x N bring it back near
    N = 1's?"""
    curves = batch_size.sweep(world_sizes=(1, 2, 4))
    final = {key: losses[-1] for key, losses in curves.items()}
    print({key: [round(x, 3) for x in losses] for key, losses in curves.items()})
    base = final[1, "same lr"]
    assert base < final[2, "same lr"] < final[4, "same lr"]
    assert final[2, "lr x N"] < 1.25 * base and final[4, "lr x N"] < 1.25 * base
    assert final[4, "lr x N, warmup"] < 1.5 * base  # no harm here, no help needed
    four = final[4, "same lr"]
    claims = {
        "a": abs(four - base) < 0.1 * base,
        "b": four < 0.9 * base,
        "c": four > 2 * base and final[4, "lr x N"] < 1.25 * base,
        "d": not four < 10 * curves[1, "same lr"][0],  # not finite and below the start
    }
    assert supported(claims) == KEYS["synchrony_7"]


def test_synchrony_8_warmup_avoids_the_spike_of_a_large_scaled_lr() -> None:
    """From lr 0.5 at N = 1, does lr x N on 4 ranks spike above the starting loss in the first
    epoch and end far above N = 1, while a one-epoch linear warmup does neither?"""
    rules = ("lr x N", "lr x N, warmup")
    curves = batch_size.sweep(world_sizes=(1, 4), rules=rules, lr=0.5)
    print({key: [round(x, 3) for x in losses] for key, losses in curves.items()})
    start, base = curves[1, "lr x N"][0], curves[1, "lr x N"][-1]
    cold, warm = curves[4, "lr x N"], curves[4, "lr x N, warmup"]
    claims = {
        "a": abs(warm[-1] - cold[-1]) < 0.2 * cold[-1],
        "b": warm[-1] > 1.2 * cold[-1],
        "c": max(warm) > 2 * start,  # the same batch, warmed up, spikes too
        "d": max(cold) > 2 * start
        and cold[-1] > 5 * base
        and max(warm[1:]) < start
        and warm[-1] < 2 * base,
    }
    assert supported(claims) == KEYS["synchrony_8"]


def test_synchrony_9_algbw_falls_with_n_busbw_corrects_the_ring_s_factor() -> None:
    """For a 4 MB all_reduce on 2, 3 and 4 ranks, does algbw fall as N grows, and busbw
    (algbw x 2(N-1)/N) fall less, though on 2 cores not stay flat?"""
    rows = latency.bandwidth_by_world_size(MB, (2, 3, 4), repeats=5)
    print(
        {n: {k: round(v / 1e9, 2) for k, v in r.items() if k != "seconds"} for n, r in rows.items()}
    )
    alg = rows[4]["algbw"] / rows[2]["algbw"]
    bus = rows[4]["busbw"] / rows[2]["busbw"]
    assert alg < 0.8
    assert bus == pytest.approx(1.5 * alg)


def test_synchrony_9_busbw_is_what_each_rank_s_link_carried(run_ranks) -> None:
    """Is busbw what each rank's link really carried per second: on 8 ranks (800 MB scaled
    down 100 times), do the kernel's TCP counters give 1.75 times the tensor per rank, so
    that 800 MB in 2.0 s prints 0.7 GB/s?"""
    from course.experiments.ring import collective_traffic

    numel = 2_000_000
    sent = [r["sent"] / (numel * 4) for r in run_ranks(collective_traffic, 8, "all_reduce", numel)]
    assert all(abs(f - 1.75) < 0.01 for f in sent), sent
    algbw = 800e6 / 2.0
    claims = {"a": 0.7e9, "b": 0.4e9, "c": 3.2e9, "d": 0.8e9}
    options = {k: abs(algbw * statistics.mean(sent) - v) < 0.01e9 for k, v in claims.items()}
    assert supported(options) == KEYS["synchrony_9"]
