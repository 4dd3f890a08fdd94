"""The synchrony experiments' arithmetic: links between nodes, and what backups would keep."""

from __future__ import annotations

import pytest

from course.lessons.synchrony.links import crossing_bytes, link_seconds, node_of
from course.lessons.synchrony.stragglers import arrivals, backup_step, step_seconds, waiting_seconds

# gloo's ring on 4 ranks sends to rank - 1: ranks 0 and 2 cross between nodes {0, 1}, {2, 3}.
FLAT = [{3: 1500, 1: 5}, {0: 1500, 2: 5}, {1: 1500, 3: 5}, {2: 1500, 0: 5}]


def test_nodes_are_consecutive_blocks() -> None:
    """Are ranks 0-1 node 0 and ranks 2-3 node 1, with 2 ranks per node?"""
    assert [node_of(r, 2) for r in range(4)] == [0, 0, 1, 1]


def test_crossing_bytes_counts_only_peers_on_other_nodes() -> None:
    """Does each rank's count hold only what it sent to the other node?"""
    assert crossing_bytes(FLAT, 2) == [1500, 5, 1500, 5]
    assert crossing_bytes(FLAT, 4) == [0, 0, 0, 0]


def test_the_slowest_link_decides_the_time() -> None:
    """Is the predicted time the busiest link's bytes over its bandwidth, the links between
    nodes the slower ones?"""
    assert link_seconds(FLAT, 2, inter_node_bps=100, intra_node_bps=1000) == pytest.approx(15)
    assert link_seconds(FLAT, 4, inter_node_bps=100, intra_node_bps=1000) == pytest.approx(1.5)


def test_backup_step_goes_on_at_the_n_minus_b_th_arrival() -> None:
    """With b backups, does the step go on at the (N-b)-th arrival and average over N-b?"""
    ready = [0.031, 0.030, 0.062, 0.033]
    one = backup_step(ready, 1, allreduce_s=0.005)
    assert one == {"seconds": 0.038, "kept": [0, 1, 3], "dropped": [2], "divide_by": 3}
    assert backup_step(ready, 0)["seconds"] == 0.062
    assert backup_step(ready, 3)["kept"] == [1]
    with pytest.raises(ValueError, match="backups"):
        backup_step(ready, 4)


def test_span_summaries() -> None:
    """Do the per-rank summaries read the step, the wait and each step's arrivals?"""
    spans = [
        [{"start": 0.0, "forward_end": 0.03, "backward_end": 0.06, "end": 0.061}],
        [{"start": 0.001, "forward_end": 0.061, "backward_end": 0.062, "end": 0.063}],
    ]
    assert step_seconds(spans) == pytest.approx([0.061, 0.062])
    assert waiting_seconds(spans) == pytest.approx([0.03, 0.001])
    assert arrivals(spans) == [pytest.approx([0.03, 0.061])]
