"""The FSDP experiments' own measuring: the unsharded bytes they read from FSDP2 against what
the modules themselves see in forward, and the timeline's order and overlap on known events."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from course.lessons.fsdp import experiment as fsdp
from course.lessons.fsdp import timeline as fsdp_timeline
from course.lessons.zero.experiment import toy_model


def _seen_by_modules(width: int) -> dict[str, list[int]]:
    """Rank side: in each layer's forward, the storage bytes of the parameters registered on
    it (FSDP2 swaps in the unsharded ones) and what ``unsharded_bytes`` reads; after the step,
    what ``unsharded_bytes`` reads."""
    model = fsdp.shard(toy_model(width=width, depth=3))
    seen: dict[str, list[int]] = {"module": [], "read": []}

    def look(module: nn.Module, _inputs: object) -> None:
        seen["module"].append(sum(p.untyped_storage().nbytes() for p in module.parameters()))
        seen["read"].append(fsdp.unsharded_bytes(model))

    for layer in fsdp.units(model):
        layer.register_forward_pre_hook(look)
    x = torch.randn(4, width)
    nn.functional.mse_loss(model(x), x).backward()
    seen["after"] = [fsdp.unsharded_bytes(model)]
    return seen


@pytest.mark.ranks
def test_unsharded_bytes_cover_what_each_layer_computes_with(run_ranks) -> None:
    """In every layer's forward the bytes read include that layer's own gathered parameters
    (its full, padded weight), at most the two layers' worth FSDP2 may hold; none after."""
    width = 30  # 30 rows over 4 ranks: padded to 32
    for seen in run_ranks(_seen_by_modules, 4, width):
        assert seen["module"] == [32 * width * 4] * 3
        assert all(m <= r <= 2 * m for m, r in zip(seen["module"], seen["read"], strict=True))
        assert seen["after"] == [0]


EVENTS = [  # (what, unit, start, end): unit 2 prefetched while unit 0 computes
    ("all_gather", "0", 0.0, 1.0),
    ("all_gather_copy_out", "0", 2.0, 3.0),
    ("all_gather", "2", 3.0, 3.5),
    ("compute", "0", 3.5, 5.5),
    ("all_gather_copy_out", "2", 6.0, 6.5),
    ("compute", "2", 6.5, 7.0),
    ("compute", "2", 7.0, 7.5),
]


def test_gather_order_lists_issues_and_computes_in_time_order() -> None:
    order = fsdp_timeline.gather_order(list(reversed(EVENTS)), phase_end=10.0)
    assert order == ["gather 0", "gather 2", "compute 0", "compute 2"]
    assert fsdp_timeline.gather_order(EVENTS, phase_end=3.2) == ["gather 0", "gather 2"]


def test_overlap_counts_compute_inside_each_gather_window() -> None:
    got = fsdp_timeline.overlap(EVENTS)
    assert got["window"] == pytest.approx(2.0 + 3.0)  # 0 -> 2 and 3 -> 6
    assert got["computing"] == pytest.approx(2.0)  # unit 0's compute, inside unit 2's window
    assert got["waiting"] == pytest.approx(1.0 + 0.5)
    unmatched = [e for e in EVENTS if e[0] != "all_gather_copy_out"]
    assert fsdp_timeline.overlap(unmatched) == {"window": 0.0, "computing": 0.0, "waiting": 0.0}
