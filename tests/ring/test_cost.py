"""Tests for course.ring.cost: the alpha-beta predictions against the simulator's own counts, the
closed forms, and the orderings a student should be able to read off the figure."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from course.ring.cost import (
    ALGORITHMS,
    DEFAULT_ALPHA,
    DEFAULT_BETA,
    algbw,
    busbw,
    cost_figure,
    naive,
    parameter_server,
    predict_all,
    recursive_doubling,
    ring,
)
from course.ring.schedule import simulate
from course.ring.trace import bytes_sent, ring_trace, steps


@given(st.integers(1, 40), st.integers(0, 500), st.sampled_from([1, 4, 8]))
@settings(max_examples=50, deadline=None)
def test_ring_prediction_matches_the_simulator(world_size: int, numel: int, itemsize: int) -> None:
    """Are the ring's predicted steps exactly the simulator's, and its bytes per rank within
    two elements of what each simulated rank really sent?"""
    states = list(simulate(world_size, numel, itemsize))
    predicted = ring(numel * itemsize, world_size)
    assert predicted.steps == states[-1].step == len(states) - 1
    for sent in states[-1].bytes_sent.tolist():
        assert abs(sent - predicted.bytes_per_rank) <= 2 * itemsize


@pytest.mark.parametrize("world_size", [2, 3, 5, 8])
def test_ring_prediction_matches_the_reference_trace(world_size: int) -> None:
    """Do steps and bytes read off the reference ring's trace agree with the prediction?"""
    numel = 16 * world_size  # divides evenly: the formula is then exact
    trace = ring_trace(world_size, numel, itemsize=8)
    predicted = ring(numel * 8, world_size)
    assert steps(trace) == predicted.steps
    assert bytes_sent(trace) == [predicted.bytes_per_rank] * world_size


@pytest.mark.parametrize("size", [1.0, 1e3, 1e6, 1e9])
@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 7, 8, 16, 100, 1024])
def test_closed_forms(world_size: int, size: float) -> None:
    """Does each prediction follow its textbook formula (Thakur et al. 2005), with time
    alpha * steps + beta * bytes queued on the critical path?"""
    n, a, b = world_size, DEFAULT_ALPHA, DEFAULT_BETA
    r = ring(size, n)
    assert (r.steps, r.bytes_per_rank) == (2 * (n - 1), 2 * (n - 1) / n * size)
    assert math.isclose(r.seconds, 2 * (n - 1) * a + 2 * (n - 1) / n * size * b)
    nv = naive(size, n)
    assert (nv.steps, nv.bytes_per_rank) == (n - 1, (n - 1) * size)
    assert math.isclose(nv.seconds, (n - 1) * (a + size * b))
    lg = math.log2(n)
    rd = recursive_doubling(size, n)
    if lg.is_integer():
        assert (rd.steps, rd.bytes_per_rank) == (int(lg), lg * size)
    else:  # fold the extra ranks in and out: two more whole-tensor steps
        assert rd.steps == math.floor(lg) + 2
        assert rd.bytes_per_rank == (math.floor(lg) + 1) * size
    ps = parameter_server(size, n)
    if n > 1:
        assert (ps.steps, ps.bytes_per_rank, ps.bytes_busiest_link) == (2 * n, size, n * size)
        assert math.isclose(ps.seconds, 2 * n * (a + size * b))


def test_nothing_to_do_on_one_rank() -> None:
    """With one rank, does every algorithm predict no steps, no bytes and no time?"""
    for p in predict_all(1e6, 1):
        assert (p.steps, p.bytes_per_rank, p.bytes_busiest_link, p.seconds) == (0, 0, 0, 0)


def test_ring_bytes_per_rank_level_off_while_naive_grows_linearly() -> None:
    """Does the ring's traffic per rank approach 2x the size as N grows, while the naive
    exchange's grows in proportion to N and the server's link carries N copies?"""
    size = 1e6
    ring_bytes = [ring(size, n).bytes_per_rank for n in (2, 8, 64, 1024)]
    assert ring_bytes == sorted(ring_bytes) and ring_bytes[-1] < 2 * size
    assert math.isclose(ring_bytes[-1], 2 * size, rel_tol=1e-2)
    for n in (2, 8, 64):
        assert naive(size, 2 * n).bytes_per_rank / naive(size, n).bytes_per_rank > 2
        assert parameter_server(size, n).bytes_busiest_link == n * size


def test_who_wins_depends_on_message_size() -> None:
    """For large tensors is the ring fastest, and for tiny ones does recursive doubling beat it
    (log2 N latencies against 2(N-1))?"""
    big = {p.name: p.seconds for p in predict_all(1e9, 16)}
    assert min(big, key=big.get) == "ring"
    tiny = {p.name: p.seconds for p in predict_all(8, 16)}
    assert tiny["recursive doubling"] < tiny["ring"]


def test_busbw_is_the_nccl_tests_definition() -> None:
    """Is busbw = size / time * 2(N-1)/N, so a ring that saturates the link reports the
    link's bandwidth whatever N is?"""
    assert busbw(1e9, 8, 0.5) == pytest.approx(2e9 * 14 / 8)
    assert algbw(1e9, 0.5) == pytest.approx(2e9)
    for n in (2, 8, 128):
        pure_bandwidth = ring(1e9, n, alpha=0.0, beta=1 / 10e9)
        assert busbw(1e9, n, pure_bandwidth.seconds) == pytest.approx(10e9)
    with pytest.raises(ValueError, match="positive time"):
        busbw(1e9, 8, 0.0)


def test_cost_figure_has_every_algorithm_on_both_axes() -> None:
    """Does the figure plot each algorithm twice (against size and against N) on log axes,
    with y values equal to the predictions?"""
    fig = cost_figure(world_size=4, size_bytes=1e6, sizes=[1e3, 1e6], world_sizes=[2, 4])
    assert [t.name for t in fig.data] == [n for n in ALGORITHMS for _ in (0, 1)]
    assert fig.layout.xaxis.type == fig.layout.xaxis2.type == fig.layout.yaxis.type == "log"
    ring_by_n = fig.data[1]
    assert list(ring_by_n.y) == [ring(1e6, 2).seconds, ring(1e6, 4).seconds]


def test_cost_figure_by_size_alone_draws_no_world_size_axis() -> None:
    """With by_world_size=False, does the figure plot each algorithm once, against size at
    the one world size asked for, with no second axis to read other world sizes from?"""
    fig = cost_figure(world_size=4, sizes=[1e3, 1e6], by_world_size=False)
    assert [t.name for t in fig.data] == list(ALGORITHMS)
    assert "xaxis2" not in fig.layout and fig.layout.xaxis.type == "log"
    assert list(fig.data[0].y) == [ring(1e3, 4).seconds, ring(1e6, 4).seconds]


def test_bad_arguments_say_what_is_wrong() -> None:
    """Do a zero world size or a negative size raise a ValueError naming the problem?"""
    with pytest.raises(ValueError, match="world_size"):
        naive(1.0, 0)
    for f in ALGORITHMS.values():
        with pytest.raises(ValueError, match="size >= 0"):
            f(-1.0, 4)


def test_fit_alpha_beta_recovers_the_model_s_own_times() -> None:
    """Given times made by alpha + m beta, does the fit give back alpha and beta, and refuse
    a single size?"""
    from course.ring.cost import fit_alpha_beta

    sizes = [2.0**e for e in range(10, 27, 2)]
    alpha, beta = fit_alpha_beta(sizes, [40e-6 + s / 3e9 for s in sizes])
    assert alpha == pytest.approx(40e-6) and beta == pytest.approx(1 / 3e9)
    with pytest.raises(ValueError, match="two different sizes"):
        fit_alpha_beta([1024, 1024], [1e-5, 2e-5])


def test_fit_alpha_beta_lets_small_messages_decide_alpha() -> None:
    """With 10% noise on the largest message only, does alpha stay within 10% of the truth?"""
    from course.ring.cost import fit_alpha_beta

    sizes = [2.0**e for e in range(10, 27, 2)]
    times = [40e-6 + s / 3e9 for s in sizes]
    times[-1] *= 1.1
    alpha, _ = fit_alpha_beta(sizes, times)
    assert alpha == pytest.approx(40e-6, rel=0.1)


@pytest.mark.parametrize("world_size", [4, 8, 64])
def test_crossover_size_is_where_tree_and_ring_take_equal_time(world_size) -> None:
    """At S*, do the ring's and recursive doubling's predictions meet, the tree faster below?"""
    from course.ring.cost import crossover_size

    alpha, beta = 50e-6, 1 / 3e9
    s = crossover_size(alpha, beta, world_size)
    tree = recursive_doubling(s, world_size, alpha, beta).seconds
    assert ring(s, world_size, alpha, beta).seconds == pytest.approx(tree)
    small = s / 10
    assert (
        recursive_doubling(small, world_size, alpha, beta).seconds
        < ring(small, world_size, alpha, beta).seconds
    )
    with pytest.raises(ValueError, match="power of two"):
        crossover_size(alpha, beta, 6)
