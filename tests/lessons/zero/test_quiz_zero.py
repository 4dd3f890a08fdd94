"""Do the measurements support each keyed answer of the zero quiz, and no other?

Keys are read from the source notebook's hidden checks. The sharded code measured is the
model solution, kept in tests/catalogues/halves_impls.py (the package holds none).
"""

from __future__ import annotations

import itertools

import halves_impls  # the model solution, as the notebook's cells define it
import pytest
import torch
from quiz import keys, supported

from course.lessons.zero import compression
from course.lessons.zero import experiment as zero
from course.lessons.zero import traffic as zero_traffic

pytestmark = pytest.mark.ranks

KEYS = keys("zero")


def _near(x: float, y: float, rel: float = 0.02) -> bool:
    return abs(x - y) <= rel * abs(y)


def _own_and_rest(n: int, numel: int, own: int) -> list[tuple[int, int]]:
    """Shards of ``numel`` elements on ``n`` ranks: ``own`` for rank 0, the rest equally."""
    rest = (numel - own) // (n - 1)
    assert own + (n - 1) * rest == numel
    edges = [0, own] + [own + rest * k for k in range(1, n)]
    return list(itertools.pairwise(edges))


def test_zero_1_least_the_busiest_rank_sends_with_uneven_shards(run_ranks) -> None:
    """On 8 ranks, rank 0's shard 40% of the tensor and the others 3/35 each: does each chunk
    of rank 0's tensor, and of rank 1's, reach its owner's shard and no other (so all but a
    rank's own shard must leave it), and does a ring cut at those shards send exactly that
    from every rank, where gloo's reduce_scatter_tensor sends an all-reduce's 7/4? Then the
    busiest rank sends 32/35 at best (0.91 GB of 1 GB), from the small shards, not rank 0."""
    from functools import partial

    from course.ring.traffic import collective_traffic

    n, numel = 8, 2800
    bounds = _own_and_rest(n, numel, own=numel * 2 // 5)
    sizes = [hi - lo for lo, hi in bounds]
    assert sizes[1:] == [numel * 3 // 35] * (n - 1)
    rs = partial(halves_impls.reduce_scatter_over, bounds=bounds)
    must_leave = {}
    for source in (0, 1):  # ranks 2 to 7 hold shards of rank 1's size
        seen = run_ranks(zero_traffic.shard_dependence, n, rs, numel, source, bounds)
        assert all(seen[r] == [c == r for c in range(n)] for r in range(n))  # chunk c -> rank c
        must_leave[source] = sum(sizes[c] for c in range(n) if c != source and seen[c][c]) / numel
    assert must_leave[0] == 0.6 and must_leave[1] == 32 / 35
    ring = run_ranks(zero_traffic.halves_sent, n, rs, numel)
    assert ring == [must_leave[0]] + [must_leave[1]] * (n - 1)  # every rank at its bound
    gloo = run_ranks(collective_traffic, n, "reduce_scatter_tensor", 2_000_000)
    assert all(_near(r["sent"] / r["nbytes"], 1.75, 0.01) for r in gloo)  # b's figure
    even = run_ranks(zero_traffic.halves_sent, n, halves_impls.reduce_scatter, numel)
    assert all(_near(x, 7 / 8, 0.001) for x in even)  # c's figure: a ring on even shards
    least = max(ring)  # GB of 1 GB; no algorithm's busiest rank sends less than this
    assert least == max(must_leave.values()) and ring.index(least) == 1
    claims = {"a": (0.6, [0]), "b": (1.75, range(n)), "c": (0.88, range(n))}
    claims["d"] = (0.91, range(1, n))
    options = {
        k: _near(least, v, 0.005) and [r for r in range(n) if ring[r] == least] == list(who)
        for k, (v, who) in claims.items()
    }
    assert supported(options) == KEYS["zero_1"]


def test_zero_2_zero3_traffic_on_64_ranks() -> None:
    """ZeRO-3 from ring halves: two all-gathers and one reduce-scatter per unit (fully_shard's
    calls), each half (N-1)/N (measured on 8 ranks): 2.95 GB of a 1 GB model on 64 ranks?"""
    n = 8
    t = zero_traffic.traffic_on_ranks(halves_impls.reduce_scatter, halves_impls.all_gather, n)
    layers = t["layers"]
    assert t["FSDP calls"] == {
        "all_gather_into_tensor": 2 * layers,
        "reduce_scatter_tensor": layers,
    }
    half = {"all_gather": t["all_gather"], "reduce_scatter": t["reduce_scatter"]}
    assert all(_near(x, (n - 1) / n) for x in half.values())  # a ring half: (N-1)/N
    assert _near(t["DDP"], 2 * (n - 1) / n) and _near(t["ZeRO-1/2"], t["DDP"])
    gathers = t["FSDP calls"]["all_gather_into_tensor"] / layers
    scatters = t["FSDP calls"]["reduce_scatter_tensor"] / layers
    law = 63 / 64 / ((n - 1) / n)  # a half's (N-1)/N, carried from 8 ranks to 64
    gather, scatter = half["all_gather"] * law, half["reduce_scatter"] * law  # GB of 1 GB
    zero3 = gathers * gather + scatters * scatter
    gloo_rs = (t["FSDP forward"] + t["FSDP backward"] - 2 * t["all_gather"]) / t["reduce_scatter"]
    assert _near(gloo_rs, 2)  # gloo's reduce_scatter_tensor: an all-reduce's bytes
    assert _near(t["FSDP forward"] + t["FSDP backward"], 3.5)  # 0.875 + 0.875 + 1.75
    stated = {"a": 0.98, "b": 2.95, "c": 1.97, "d": 3.94}
    distractors = {"a": gather, "c": t["DDP"] * law, "d": gathers * gather + 2 * scatter}
    assert all(_near(v, stated[k], 0.01) for k, v in distractors.items())
    options = {k: round(zero3, 2) == v for k, v in stated.items()}
    assert supported(options) == KEYS["zero_2"]


def _totals(held: list[dict[str, int]]) -> list[float]:
    """Each rank's bytes of parameters, gradients and optimizer state, in units of P."""
    psi = sum(p.numel() for p in zero.toy_model().parameters())
    return [sum(h.values()) / psi for h in held]


def test_zero_3_memory_with_the_reduce_scatter_in_backward(run_ranks) -> None:
    """ZeRO-2 with a hook per parameter that reduce-scatters its gradient during backward (the
    model solution's halves) on 8 ranks: 5.83P at most during the second backward, counted at
    every hook, and 5.5P after step(); and does it train to DDP's weights, where the
    notebook's ZeroOptimizer design holds 9P at most (a's figure)?"""
    n, hooked = 8, halves_impls.HookedZero
    same = run_ranks(zero.equivalence, 3, hooked, timeout=60)[0]
    assert same["max_rel"] < 1e-5  # a ZeRO-2 that trains: its memory is worth measuring
    during = _totals(run_ranks(zero.memory_during_backward, n, "zero", hooked, timeout=60))
    after = _totals(run_ranks(zero.memory_on_ranks, n, "zero", hooked, timeout=60))
    yours = run_ranks(
        zero.memory_during_backward, n, "zero", halves_impls.ZeroOptimizer, timeout=60
    )
    assert all(_near(t, 9, 0.001) for t in _totals(yours))
    peak, held = max(during), max(after)
    assert min(during) == peak and round(peak, 2) == 5.83  # every rank alike, as explained
    claims = {"a": (9, 5.5), "b": (5.5, 5.5), "c": (2.33, 2), "d": (5.83, 5.5)}
    options = {k: _near(peak, c[0], 0.005) and _near(held, c[1], 0.005) for k, c in claims.items()}
    assert supported(options) == KEYS["zero_3"]


def test_zero_4_same_weights_as_ddp_on_2_and_4_ranks(run_ranks) -> None:
    """Is ZeRO-2 from ring halves bit for bit DDP's on 2 ranks, and within 1e-5 but not
    identical on 4?"""
    runs = {
        n: run_ranks(zero.equivalence, n, halves_impls.ZeroOptimizer, timeout=60)[0] for n in (2, 4)
    }
    same = {n: r["identical"] for n, r in runs.items()}
    apart = {n: not r["identical"] and r["max_rel"] < 1e-5 for n, r in runs.items()}
    options = {
        "a": same[2] and same[4],
        "b": apart[2] and apart[4],
        "c": same[2] and apart[4],
        "d": apart[2] and same[4],
    }
    assert supported(options) == KEYS["zero_4"]


def test_zero_4_the_order_of_the_sums_alone_sets_them_apart(run_ranks) -> None:
    """Against a DDP that divides after its sum (as the notebook's optimizer does), is the
    3-rank gap (about 2e-6) cut to less than half but not closed, and the 4-rank gap (a few
    millionths) exactly the same against either DDP, as the explanation says? The figures
    depend on the CPU's order of sums (2.3e-6, 6.3e-7 and 2.5e-6 on one Xeon, 1.9e-6,
    8.4e-7 and 3.5e-6 on an AVX-512 one): the bands hold both."""
    gaps = {
        (n, reference): run_ranks(
            zero.equivalence, n, halves_impls.ZeroOptimizer, 20, reference, timeout=60
        )[0]["max_rel"]
        for n in (3, 4)
        for reference in ("DDP", "DDP, divided after the sum")
    }
    assert 1.5e-6 < gaps[3, "DDP"] < 3e-6
    assert 1e-7 < gaps[3, "DDP, divided after the sum"] < gaps[3, "DDP"] / 2
    assert gaps[4, "DDP"] == gaps[4, "DDP, divided after the sum"]
    assert 1e-6 < gaps[4, "DDP"] < 1e-5


def test_zero_5_torch_zero_busiest_rank(run_ranks) -> None:
    """ZeroRedundancyOptimizer on 8 ranks, parameters of 50,000 and 24 x 1,000 elements (the
    question's at a thousandth): does the busiest rank hold the big one's state alone, 400,004
    bytes, and the others 3 or 4 small ones? And whole parameters on the default models?"""
    held = run_ranks(zero.torch_zero_state_bytes, 8, [50_000] + [1_000] * 24, timeout=60)
    busiest = max(held, key=lambda h: h["nbytes"])
    assert busiest["numels"] == [50_000] and busiest["nbytes"] == 400_004
    others = sorted(h["nbytes"] for h in held if h is not busiest)
    assert others == [24_012] * 4 + [32_016] * 3
    mb = (busiest["nbytes"] - 4) * 1000 / 1e6  # back to the question's size, in MB
    assert round(mb / 74, 1) == 5.4
    claims = {"a": 400, "b": 424, "c": 592, "d": 74}
    options = {k: _near(mb, v, 0.01) for k, v in claims.items()}
    assert supported(options) == KEYS["zero_5"]
    assert busiest["owned"] == [0]  # the embedding, alone: no matrix dealt to its rank


def test_zero_5_default_measurement_cannot_tell_the_rules_apart(run_ranks) -> None:
    """On the measuring cell's parameters of equal size (3 on 2 ranks, 4 on 3), does torch deal
    them exactly as round robin in order would, each rank owning whole ones (so the default
    output rules out c and d but leaves a and b to the student)?"""
    for n, count in ((2, 3), (3, 4)):
        held = run_ranks(zero.torch_zero_state_bytes, n, [10_000] * count, timeout=60)
        assert [h["owned"] for h in held] == [list(range(r, count, n)) for r in range(n)]
        assert [h["nbytes"] for h in held] == [80_004 * len(h["owned"]) for h in held]


def test_zero_6_fp16_hook_on_8_ranks(run_ranks) -> None:
    """Every one of 8 ranks holds 2e4 and 2e-7: does the hook give back about 2e4 (19984) and
    0, where 2 ranks keep 2e-7 (as 2.38e-7) and a sum before the division would overflow?"""
    got = run_ranks(compression.fp16_hook_grads, 8, [2e4, 2e-7], timeout=90)[0]
    x, y = got["fp16 hook"]
    near_x, inf_x = _near(x, 2e4, 0.005), x == float("inf")
    zero_y, near_y = y == 0.0, _near(y, 2e-7, 0.15)
    options = {
        "a": inf_x and zero_y,
        "b": near_x and zero_y,
        "c": near_x and near_y,
        "d": inf_x and near_y,
    }
    assert supported(options) == KEYS["zero_6"]
    assert x == 19984.0 and _near(got["fp32"][0], 2e4, 1e-6)
    assert torch.tensor(8 * 2e4, dtype=torch.float16).item() == float("inf")  # a sum first
    assert _near(torch.tensor(2e-7, dtype=torch.float16).item(), 1.79e-7, 0.01)
    small = torch.finfo(torch.float16).smallest_normal * 2**-10  # the smallest subnormal
    assert _near(small, 5.96e-8, 0.01)
    two = run_ranks(compression.fp16_hook_grads, 2, [2e-7], timeout=60)[0]["fp16 hook"]
    assert _near(two[0], 2.38e-7, 0.01)
    values = [3.0, 0.1, 1e-3, 1e-5]  # the measuring cell's default: away from both ends
    default = run_ranks(compression.fp16_hook_grads, 2, values, timeout=60)[0]["fp16 hook"]
    cast = torch.tensor(values).to(torch.float16).float().tolist()
    assert default == cast  # the cast's rounding only: it cannot tell the order
    halves = (torch.tensor(values).to(torch.float16) / 2).float() * 2
    assert halves.tolist() == cast  # halving is exact at these values


def test_zero_7_powersgd_rank_and_sides(run_ranks) -> None:
    """512 x 128, r = 8, batches of 4 on 2 ranks: 20 KiB per step from step 3 and the exact
    average (error below 1e-5); r = 4 or batches of 8 leave about 0.6; a square 256 x 256 layer
    sends 16 KiB at r = 8 and is exact at r = 16 with batches of 8, where the measuring
    cell's r = 1, 2 and 4 all miss part of the average?"""
    rows = run_ranks(zero_traffic.powersgd_traffic, 2, 8, 2, (512, 128), 4, 3, timeout=60)[0]
    assert [r["bytes"] for r in rows[:2]] == [262144, 262144]  # plain all-reduces first
    sent, error = rows[-1]["bytes"], rows[-1]["error"]
    exact, lossy = error < 1e-5, error > 1e-2
    options = {
        "a": sent == 20 * 1024 and exact,
        "b": sent == 16 * 1024 and exact,
        "c": sent == 20 * 1024 and lossy,
        "d": sent == 16 * 1024 and lossy,
    }
    assert supported(options) == KEYS["zero_7"]
    r4 = run_ranks(zero_traffic.powersgd_traffic, 2, 4, 2, (512, 128), 4, 3, timeout=60)[0]
    b8 = run_ranks(zero_traffic.powersgd_traffic, 2, 8, 2, (512, 128), 8, 3, timeout=60)[0]
    assert round(r4[-1]["error"], 2) == 0.66 and round(b8[-1]["error"], 2) == 0.60
    square = run_ranks(zero_traffic.powersgd_traffic, 2, 8, 2, (256, 256), 8, 3, timeout=60)
    assert square[0][-1]["bytes"] == 16 * 1024  # the same 256 KiB, square
    full = run_ranks(zero_traffic.powersgd_traffic, 2, 16, 2, (256, 256), 8, 3, timeout=60)
    assert full[0][-1]["error"] < 1e-5
    for r in (1, 2, 4):  # the measuring cell's default: every r lossy, none exact
        rows = run_ranks(zero_traffic.powersgd_traffic, 2, r, 3, (256, 256), 8, 4, timeout=60)
        assert rows[0][-1]["error"] > 0.5 and rows[0][-1]["bytes"] == 2048 * r
