"""What do the measurements on real gloo ranks say about the cost of synchrony?

One test per quiz claim, each asserting what this machine measures (2 cores, loopback TCP,
other tests running beside it). No key rests on a timing: counts, bytes, kept ranks and
values decide, and the models of questions 1 to 6 are evaluated on the laws those measure.
The trees, the two-level all-reduce and the backup step measured are the model solutions,
kept in tests/catalogues/synchrony_impls.py (the package holds none). The stragglers' compute is
emulated (sleeps), and what is read from their clocks is the order of events.
"""

from __future__ import annotations

import functools
import itertools
import math
import statistics

import pytest
import synchrony_impls  # the model solutions, as the notebook's cells define them
import torch
from quiz import keys, supported

from course.instructor.reference import ring_allreduce
from course.lessons.synchrony import batch_size, latency, stragglers
from course.lessons.synchrony import links as hierarchy
from course.ring.recorder import record
from course.ring.trace import bytes_sent, steps

pytestmark = pytest.mark.ranks

KEYS = keys("synchrony")

MB = 2**20


@pytest.fixture(scope="module")
def counts() -> dict[str, dict[int, tuple[int, float]]]:
    """Recorded on 2, 4 and 8 real ranks: per rank, the sends one after another and the bytes
    sent in tensors, of the reference ring and of the model recursive doubling."""
    algorithms = {"ring": ring_allreduce, "tree": synchrony_impls.tree_allreduce}
    out: dict[str, dict[int, tuple[int, float]]] = {}
    for name, fn in algorithms.items():
        out[name] = {}
        for n in (2, 4, 8):
            trace = record(fn, n, numel=64)
            sent = {b / (trace.numel * trace.itemsize) for b in bytes_sent(trace)}
            assert len(sent) == 1, (name, n, sent)  # every rank sends the same
            if name == "ring":  # every message one N-th of the tensor
                assert {m.nbytes for m in trace.messages if m.op == "send"} == {
                    trace.numel * trace.itemsize // n
                }
            out[name][n] = (steps(trace), sent.pop())
    print(out)
    return out


def _model(steps: int, sent: float, size: float, alpha: float, beta: float) -> float:
    """The alpha-beta model's time: ``steps`` messages in turn, ``sent`` tensors of bytes."""
    return steps * alpha + sent * size * beta


# The network of questions synchrony_1 and synchrony_2: InfiniBand, 2 us and 25 GB/s.
IB_ALPHA, IB_BETA = 2e-6, 1 / 25e9


def test_synchrony_1_a_ring_reaches_half_the_peak_at_n_times_alpha_over_beta(counts) -> None:
    """Does a recorded ring on 8 ranks send 14 messages of S/8 per rank, so that on links of
    alpha = 2 us and 1/beta = 25 GB/s its bus bandwidth (each link's bytes over the time) is
    half of 1/beta for a tensor of 8 alpha / beta = 400 KB, and not at 50 KB, 700 KB or 6 KB?"""
    sends, sent = counts["ring"][8]
    assert (sends, sent) == (14, pytest.approx(1.75))
    assert round(IB_ALPHA / IB_BETA) == 50_000

    def share(size: float) -> float:  # each link's rate over 1/beta
        return sent * size / _model(sends, sent, size, IB_ALPHA, IB_BETA) * IB_BETA

    sizes = {"a": 50e3, "b": 700e3, "c": 6.25e3, "d": 400e3}
    shares = {k: share(s) for k, s in sizes.items()}
    print({k: round(v, 3) for k, v in shares.items()})
    assert [round(shares[k], 3) for k in "abcd"] == [0.111, 0.636, 0.015, 0.5]
    assert _model(sends, sent, 400e3, IB_ALPHA, IB_BETA) == pytest.approx(56e-6)
    claims = {k: abs(v - 0.5) < 0.05 for k, v in shares.items()}
    assert supported(claims) == KEYS["synchrony_1"]


def test_synchrony_2_a_1_mb_ring_grows_with_both_terms(counts, run_ranks) -> None:
    """Does gloo's ring put 2(N-1)/N of a 1 MiB tensor on each rank's wire on 2, 3 and 4 ranks,
    and for a 256 B one mostly headers of a fixed size per step (the cell); does a recorded
    ring make 2(N-1) sends of S/N per rank, so that from 8 ranks to 64 the model's time of a
    1 MB all-reduce on links of 2 us and 25 GB/s grows about 3.4-fold: neither the steps' 9
    nor the bytes' 1.125?"""
    from course.ring.traffic import collective_traffic

    per_message = []  # a 256 B tensor: what each rank sends beyond its bytes, per ring step
    for n in (2, 3, 4):
        sent = [r["sent"] / MB for r in run_ranks(collective_traffic, n, "all_reduce", MB // 4)]
        assert all(2 * (n - 1) / n <= s < 1.01 * 2 * (n - 1) / n for s in sent), (n, sent)
        tiny = max(r["sent"] for r in run_ranks(collective_traffic, n, "all_reduce", 64))
        extra = tiny - 2 * (n - 1) / n * 256
        assert extra > 256  # mostly headers
        per_message.append(extra / (2 * (n - 1)))
    print("beyond the tensor, per step:", per_message)
    assert max(per_message) < 1.05 * min(per_message)  # a fixed size per message
    ring = counts["ring"]
    for n, (sends, sent) in ring.items():
        assert sends == 2 * (n - 1) and sent == pytest.approx(2 * (n - 1) / n)
    at64 = (2 * 63, 2 * 63 / 64)  # the law the counts follow, where no cell can run
    assert (at64[0] / ring[8][0], at64[1] / ring[8][1]) == (9, pytest.approx(1.125))
    size = 1e6
    t8, t64 = (_model(*c, size, IB_ALPHA, IB_BETA) for c in (ring[8], at64))
    latency64 = at64[0] * IB_ALPHA
    print(f"8 ranks {t8 * 1e6:.1f} us, 64 ranks {t64 * 1e6:.1f} us: {t64 / t8:.3f} times")
    assert (round(t8 * 1e6), round(t64 * 1e6), round(t64 / t8, 2)) == (98, 331, 3.38)
    assert latency64 > t64 - latency64  # at 64 ranks the alphas cost more than the bytes
    assert (round(ring[8][0] * IB_ALPHA / t8, 3), round(latency64 / t64, 3)) == (0.286, 0.762)
    assert round(size / 64 / (IB_ALPHA / IB_BETA), 2) == 0.31  # a message on 64 ranks
    for regime, (s, factor) in {"steps": (256, 9), "bytes": (1e9, 1.125)}.items():
        at8, at64s = (_model(*c, s, IB_ALPHA, IB_BETA) for c in (ring[8], at64))
        assert abs(at64s / at8 - factor) < 0.01, regime  # a) and b) at their own sizes
    grow = t64 / t8
    claims = {
        "a": abs(grow - 9) < 0.4,
        "b": abs(grow - 1.1) < 0.1,
        "c": abs(grow - 3.4) < 0.2,
        "d": abs(grow - 8) < 0.4,
    }
    assert supported(claims) == KEYS["synchrony_2"]


def _tie(ring: tuple[int, float], tree: tuple[int, float]) -> float:
    """The size, in units of alpha / beta, below which the tree is faster in the model: the
    steps it saves over the bytes it adds (no tie if it adds none)."""
    return (ring[0] - tree[0]) / (tree[1] - ring[1]) if tree[1] > ring[1] else math.inf


def test_synchrony_3_the_tie_moves_up_with_the_ranks(counts) -> None:
    """Do the recorded counts (the tree: log2 N sends of the whole tensor; the ring: 2(N-1) of
    S/N) put the model's tie at 8 alpha / beta on 4 ranks, 8.8 on 8, and, by the same laws,
    at about 30 on 64 ranks?"""
    ring, tree = counts["ring"], counts["tree"]
    for n in ring:
        assert tree[n] == (n.bit_length() - 1, n.bit_length() - 1)
        assert ring[n][0] == 2 * (n - 1) and ring[n][1] == pytest.approx(2 * (n - 1) / n)
    assert _tie(ring[4], tree[4]) == pytest.approx(8) and _tie(ring[8], tree[8]) == 8.8
    ring64, tree64 = (2 * 63, 2 * 63 / 64), (6, 6.0)
    assert (ring64[0] - tree64[0], round(tree64[1] - ring64[1], 2)) == (120, 4.03)
    assert round(tree64[1] / ring64[1], 2) == 3.05  # at 1 GB, the tree's bytes against the ring's
    tie = _tie(ring64, tree64)
    print(f"tie on 64 ranks: {tie:.2f} alpha / beta")
    assert round(tie, 1) == 29.8
    claims = {
        "a": abs(tie - 8) < 1,
        "b": abs(tie - 30) < 1,
        "c": abs(tie - 20) < 1,
        "d": tie == math.inf,
    }
    assert supported(claims) == KEYS["synchrony_3"]


def _flat(tensor: torch.Tensor) -> None:
    torch.distributed.all_reduce(tensor)


def _two_level(nodes: int, ranks_per_node: int) -> float:
    """Bytes per rank to other nodes, in units of S, of the two-level all-reduce: the law
    measured below, an all-reduce of the shard S/R among the M nodes."""
    return 2 * (nodes - 1) / nodes / ranks_per_node


def test_synchrony_4_bytes_across_nodes_in_two_layouts(run_ranks) -> None:
    """On 2 nodes of 2, 2 of 4 and 4 of 2, does gloo's flat ring send 2(N-1)/N S over each link
    between nodes, and the two-level all-reduce 2(M-1)/M x S/R from every rank (R ranks per
    node, M nodes), so that of 64 ranks, 4 nodes of 16 send 5 times fewer bytes across per
    rank than 16 nodes of 4 (0.094 S against 0.47 S)?"""
    numel = 2**18
    size = numel * 4
    for world_size, r in ((4, 2), (8, 4), (8, 2)):
        nodes = world_size // r
        two_level = functools.partial(synchrony_impls.hierarchical_allreduce, ranks_per_node=r)
        flat = run_ranks(hierarchy.peer_traffic, world_size, _flat, numel)
        tiered = run_ranks(hierarchy.peer_traffic, world_size, two_level, numel)
        crossing = hierarchy.crossing_bytes(flat, r)
        flat_across = [b for b in crossing if b > size / 100]
        tiered_across = hierarchy.crossing_bytes(tiered, r)
        print(world_size, r, [b / size for b in flat_across], [b / size for b in tiered_across])
        assert len(flat_across) == nodes  # one ring link into each node
        ring_bytes = 2 * (world_size - 1) / world_size * size
        assert all(ring_bytes <= b < 1.01 * ring_bytes for b in flat_across)
        shard_bytes = _two_level(nodes, r) * size
        assert all(shard_bytes <= b < 1.01 * shard_bytes for b in tiered_across)
    big, small = _two_level(4, 16), _two_level(16, 4)  # the law measured, where no cell runs
    assert (round(big, 3), round(small, 2), small / big) == (0.094, 0.47, 5)
    node_sums = (2 * 3 / 4, 2 * 15 / 16)  # what d's all-reduce of the whole node sum sends
    print(f"4 x 16: {big:.4f} S, 16 x 4: {small:.4f} S; node sums {node_sums}")
    fewer = small / big
    claims = {
        "a": abs(fewer - 5) < 0.3,
        "b": abs(fewer - 4) < 0.3,
        "c": abs(fewer - 1) < 0.05 and abs(big - 2 * 63 / 64) < 0.01,
        "d": abs(fewer - node_sums[1] / node_sums[0]) < 0.05,
    }
    assert supported(claims) == KEYS["synchrony_4"]


def test_synchrony_5_any_one_pause_sets_every_step() -> None:
    """With rank 3 computing twice as long (DDP, compute emulated as a sleep), does no rank's
    backward, which ends with DDP's all-reduce, end before rank 3's gradient is ready, step
    after step: every rank's step lasts at least the slowest rank's compute; so that with a
    1-in-64 chance of such a pause on each of 64 ranks, the mean step is about 1.6 times a
    clean one? (An order of events on one clock, not a comparison of durations.)"""
    spans = stragglers.straggler_run(4, slow_rank=3, slowdown=2.0)
    print("waiting ms", [round(t * 1e3) for t in stragglers.waiting_seconds(spans)])
    for k, ready in enumerate(stragglers.arrivals(spans)):
        assert all(s[k]["forward_end"] <= s[k]["backward_end"] for s in spans)
        slowest = max(range(4), key=ready.__getitem__)
        last_ready = spans[slowest][k]["forward_end"]
        assert all(s[k]["backward_end"] >= last_ready for s in spans)  # all wait for it
    clean = (63 / 64) ** 64
    mean = clean * 1 + (1 - clean) * 2  # a step is the slowest rank's, measured above
    assert (round(clean, 3), round(mean, 3)) == (0.365, 1.635)
    claims = {
        "a": abs(mean - (1 + 1 / 64)) < 0.05,
        "b": abs(mean - 1.6) < 0.05,
        "c": abs(mean - 2) < 0.05,
        "d": abs(mean - 1.5) < 0.05,
    }
    assert supported(claims) == KEYS["synchrony_5"]


def _late(late: tuple[int, ...], backups: int, delay: float = 0.5) -> tuple[list[int], list]:
    """The model backup step on a rank, the ``late`` ranks starting ``delay`` s late: whom it
    kept and the mean it ended with (every rank's gradient is its rank)."""
    import time

    import torch.distributed as dist

    if dist.get_rank() in late:
        time.sleep(delay)
    grad = torch.full((3,), float(dist.get_rank()))
    kept = synchrony_impls.step_with_backups(grad, backups)
    dist.barrier()
    return kept, grad.tolist()


def test_synchrony_6_one_backup_absorbs_one_late_rank_not_two(run_ranks) -> None:
    """Run for real (the model step of exercise 3) on 4 ranks, does the step keep a late
    rank's gradient exactly when more ranks are late than there are backups, so that with one
    backup on 64 ranks, each pausing with a chance of 1 in 64, a step is slow only when two or
    more pause: 1.26 times a clean step on average?"""
    took_a_late_one = {}
    for late, b in (((3,), 0), ((3,), 1), ((2, 3), 1), ((2, 3), 2)):
        out = run_ranks(_late, 4, late, b)
        kept = out[0][0]
        mean = sum(kept) / len(kept)
        print(late, b, kept)
        assert len(kept) == 4 - b and all(k == kept for k, _ in out)
        assert all(g == pytest.approx([mean] * 3) for _, g in out)
        took_a_late_one[len(late), b] = bool(set(kept) & set(late))
    # with 3 others and 2 late, b = 1 must keep a late gradient: only rank 1's comes early
    assert took_a_late_one == {(1, 0): True, (1, 1): False, (2, 1): True, (2, 2): False}
    assert all(took == (k > b) for (k, b), took in took_a_late_one.items())  # the law
    p, n = 1 / 64, 64
    chance = [math.comb(n, k) * p**k * (1 - p) ** (n - k) for k in range(n + 1)]
    slow = sum(c for k, c in enumerate(chance) if k > 1)  # with b = 1, by the law above
    assert [round(c, 3) for c in chance[:2]] == [0.365, 0.371] and round(slow, 3) == 0.264
    mean = 1 + slow  # a slow step takes twice a clean one
    claims = {
        "a": abs(mean - 1.0) < 0.03,
        "b": abs(mean - 1.63) < 0.03,
        "c": abs(mean - 1.37) < 0.03,
        "d": abs(mean - 1.26) < 0.03,
    }
    assert supported(claims) == KEYS["synchrony_6"]


def test_synchrony_7_the_same_global_batch_is_the_same_training() -> None:
    """On 4 ranks with a batch of 4 each (lr 0.2), is the loss after each epoch 1 rank's with
    a batch of 16, to 5 decimals: the same batches, the same number of steps?"""
    one = batch_size.sweep(world_sizes=(1,), rules=("same lr",))[1, "same lr"]
    four = batch_size.sweep(world_sizes=(4,), rules=("same lr",), batch_per_rank=4)
    four = four[4, "same lr"]
    print([round(x, 5) for x in one], [round(x, 5) for x in four])
    assert [round(x, 5) for x in one] == [0.83371, 0.0985, 0.06031, 0.0376, 0.02663]
    samples, steps_one, steps_four = 1024, 1024 // 16, (1024 // 4) // 4
    assert steps_one == steps_four == 64 and samples // 4 == 256
    quarter = batch_size.sweep(world_sizes=(1,), rules=("same lr",), lr=0.05)[1, "same lr"]
    end = one[-1]
    claims = {
        "a": four[-1] > 1.05 * end,  # noisier, so higher
        "b": four[-1] < 0.95 * end,
        "c": all(abs(a - b) < 1e-5 for a, b in zip(one, four, strict=True)),
        "d": all(abs(a - b) < 1e-3 for a, b in zip(quarter, four, strict=True)),  # lr / 4
    }
    assert supported(claims) == KEYS["synchrony_7"]


def _first_epoch(curve: list[float]) -> float:
    return curve[1]


def test_synchrony_8_warmup_works_because_the_start_is_the_danger() -> None:
    """From lr 0.5 at N = 1, does lr x N = 2.0 on 4 ranks climb above the start in the first
    epoch while a one-epoch warmup to 2.0 does not and then falls at 2.0; and do a batch of
    64 on 1 rank (no DDP), the whole data set as one batch (no noise) and a constant 1.82
    (warmup's mean rate) all climb above the start too?"""
    rules = ("lr x N", "lr x N, warmup")
    curves = batch_size.sweep(world_sizes=(1, 4), rules=rules, lr=0.5)
    start, base = curves[1, "lr x N"][0], curves[1, "lr x N"][-1]
    cold, warm = curves[4, "lr x N"], curves[4, "lr x N, warmup"]
    alone = batch_size.sweep((1,), ("same lr",), lr=2.0, batch_per_rank=64)[1, "same lr"]
    whole = batch_size.sweep((1,), ("same lr",), lr=2.0, batch_per_rank=1024, epochs=1)
    whole = whole[1, "same lr"]
    rates = [0.5 * (1 + 3 * min(1.0, (step + 1) / 16)) for step in range(64)]  # 4 x 16 steps
    mean = statistics.mean(rates)
    flat = batch_size.sweep((4,), ("same lr",), lr=mean)[4, "same lr"]
    eight = batch_size.sweep((1, 8), ("lr x N, warmup",), lr=0.5)
    shown = {"cold": cold, "warm": warm, "1 rank b64": alone, "whole": whole, "flat": flat}
    print({k: [round(x, 3) for x in v] for k, v in shown.items()}, f"mean lr {mean:.4f}")
    print({k: [round(x, 3) for x in v] for k, v in eight.items()})
    assert (round(start, 3), round(cold[1], 1)) == (0.834, 14.5)  # then 0.804 or 0.156 by CPU
    assert [round(x, 3) for x in warm] == [0.834, 0.163, 0.09, 0.055, 0.034]
    assert (round(whole[1], 2), round(alone[1], 1), round(mean, 2)) == (7.42, 14.5, 1.82)
    assert round(flat[1], 2) == 0.97 and flat[-1] > warm[-1]  # 0.048 or 0.042 by CPU
    assert eight[8, "lr x N, warmup"][-1] > 10 * eight[1, "lr x N, warmup"][-1]  # 4.0: no cure
    climbs = {name: _first_epoch(c) > start for name, c in shown.items()}
    claims = {
        "a": not climbs["whole"],  # noise: without any, no climb
        "b": not climbs["1 rank b64"],  # DDP: without it, no climb
        "c": climbs["cold"]
        and not climbs["warm"]
        and all(b < a for a, b in itertools.pairwise(warm[1:]))  # at 2.0 from epoch 1 on: falling
        and warm[-1] < 2 * base,
        "d": not climbs["flat"] and flat[-1] <= warm[-1],
    }
    assert supported(claims) == KEYS["synchrony_8"]


def test_synchrony_9_the_measuring_cell_reports_busbw_as_nccl_tests_does() -> None:
    """Does the cell's bandwidth_by_world_size report, for a 4 MB all_reduce on 2 and 4 ranks,
    algbw = S/t and busbw = algbw x 2(N-1)/N from one measured time each? (Which way the
    times go on 2 shared cores is the machine's, not the key's: the key is decided by the
    kernel's byte counters below.)"""
    rows = latency.bandwidth_by_world_size(MB, (2, 4), repeats=3)
    for n, row in rows.items():
        assert row["seconds"] > 0
        assert row["algbw"] == pytest.approx(4 * MB / row["seconds"])
        assert row["busbw"] == pytest.approx(row["algbw"] * 2 * (n - 1) / n)


def test_synchrony_9_busbw_stays_with_the_links(run_ranks, counts) -> None:
    """Is busbw what each rank's link really carried per second: on 8 ranks (800 MB scaled
    down 100 times) do the kernel's TCP counters give 1.75 times the tensor per rank, 0.7 GB/s
    for 800 MB in 2.0 s; and with a ring's 2(N-1)/N on 64 ranks at the same link rate, does
    800 MB take 2.25 s, algbw 0.36 GB/s and busbw 0.7 GB/s?"""
    from course.ring.traffic import collective_traffic

    numel = 2_000_000
    sent = [r["sent"] / (numel * 4) for r in run_ranks(collective_traffic, 8, "all_reduce", numel)]
    assert all(abs(f - 1.75) < 0.01 for f in sent), sent
    for n, (_, per_rank) in counts["ring"].items():  # the ring's bytes per rank, recorded
        assert per_rank == pytest.approx(2 * (n - 1) / n)
    link = statistics.mean(sent) * 800e6 / 2.0  # bytes per second each link moved
    at64 = 2 * 63 / 64
    seconds = at64 * 800e6 / link
    algbw = 800e6 / seconds
    busbw = algbw * at64
    print(f"link {link:.4g} B/s; 64 ranks: {seconds:.3f} s, algbw {algbw:.4g}, busbw {busbw:.4g}")
    assert (round(link / 1e9, 2), round(at64 * 800), round(seconds, 2)) == (0.7, 1575, 2.25)
    shown = {"a": (0.36, 0.7), "b": (0.4, 0.79), "c": (0.05, 0.1), "d": (0.4, 0.7)}
    claims = {
        k: abs(algbw / 1e9 - a) < 0.01 and abs(busbw / 1e9 - b) < 0.01
        for k, (a, b) in shown.items()
    }
    assert supported(claims) == KEYS["synchrony_9"]
