"""Does the wire meter count what a rank really sent, to whom, from the kernel's counters?"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from course.ranks import run
from course.ring.traffic import collective_traffic
from course.ring.wire import WireMeter

pytestmark = pytest.mark.ranks


def _send_one_way(numel: int) -> dict[str, dict[int, int]]:
    t = torch.ones(numel)
    with WireMeter() as wire:
        if dist.get_rank() == 0:
            dist.send(t, 1)
        elif dist.get_rank() == 1:
            dist.recv(t, 0)
    return {"sent": wire.sent, "received": wire.received}


def test_a_send_is_counted_once_to_its_peer_with_its_header_only() -> None:
    """Does a 1 MB send from rank 0 to rank 1 count 1 MB and a header on that connection, and
    nothing on the others?"""
    r0, r1, r2 = run(_send_one_way, 3, 250_000)
    assert 1_000_000 <= r0["sent"][1] < 1_000_000 + 1024
    assert r0["sent"][2] == 0 and r2["sent"] == {0: 0, 1: 0}
    assert r1["received"][0] >= 1_000_000


def test_gloo_collectives_send_what_their_algorithms_do() -> None:
    """On 4 ranks, does the all-gather send (N-1)/N of the tensor, the all-reduce 2(N-1)/N to
    one neighbour, the broadcast's root more than the leaves?"""
    numel = 2**18
    share = {}
    for name in ("all_reduce", "all_gather_into_tensor", "broadcast"):
        share[name] = [r["sent"] / r["nbytes"] for r in run(collective_traffic, 4, name, numel)]
    assert all(1.5 <= s < 1.52 for s in share["all_reduce"])
    assert all(0.75 <= s < 0.77 for s in share["all_gather_into_tensor"])
    assert share["broadcast"][0] > 1.0 > share["broadcast"][3]
    for r in run(collective_traffic, 4, "all_reduce", numel):
        assert [p for p, n in r["to"].items() if n > numel * 4 / 100] == [(r["rank"] - 1) % 4]
