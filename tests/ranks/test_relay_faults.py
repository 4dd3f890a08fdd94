"""The relay's fault plan and quorum (course.ranks.faults): does the planned rank die in its
all-reduce, told to no rank, its peers' all-reduce fail at once with their buffers partly
summed, every later call on a group that holds it fail, and the quorum answer the ranks left,
as gloo's closed connections and a torchft Lighthouse would?"""

from __future__ import annotations

import contextlib
import time

import pytest
import torch
import torch.distributed as dist

from course.ranks import launch, relay
from course.ranks.faults import Fault

pytestmark = [pytest.mark.ranks, pytest.mark.slow]


def loses_a_rank() -> dict:
    rank = dist.get_rank()
    relay.mark(0)
    t = torch.ones(4)
    dist.all_reduce(t)  # step 0: whole
    relay.mark(1)
    mine = torch.arange(4, dtype=torch.float32) + 10 * rank
    t = mine.clone()
    out: dict = {"step0": 4.0}
    try:
        dist.all_reduce(t)
    except RuntimeError as err:
        out["failed"] = str(err)
    out["left"] = t.tolist()
    for name, call in (("again", lambda: dist.all_reduce(mine.clone())),
                       ("barrier", dist.barrier),
                       ("recv", lambda: dist.recv(torch.zeros(1), src=1))):  # fmt: skip
        try:
            call()
            out[name] = "ok"
        except RuntimeError as err:
            out[name] = str(err)
    out["members"] = relay.quorum()
    group = dist.new_group(out["members"])
    t = mine.clone()
    dist.all_reduce(t, group=group)
    out["survivors"] = t.tolist()
    return out


def test_the_planned_rank_dies_in_its_all_reduce_and_the_others_go_on() -> None:
    result = launch(loses_a_rank, 3, backend="relay", fault=Fault(rank=1, step=1), grace=30)
    assert set(result.failures) == {1} and result.failures[1].kind == "killed"
    for rank in (0, 2):
        out = result.results[rank]
        assert "Connection closed by peer: rank 1's process ended" in out["failed"]
        mine = [10.0 * rank + i for i in range(4)]
        assert out["left"][:2] == [20.0 + 2 * i for i in range(2)]  # summed over 0 and 2
        assert out["left"][2:] == mine[2:]  # the rest as it was
        for name in ("again", "barrier", "recv"):
            assert "rank 1's process ended" in out[name], name
        assert out["members"] == [0, 2]
        assert out["survivors"] == [20.0 + 2 * i for i in range(4)]
    kinds = [e.kind for e in result.relayed if e.kind in ("killed", "quorum", "new_group")]
    assert kinds == ["killed", "quorum", "new_group"]
    killed = next(e for e in result.relayed if e.kind == "killed")
    assert killed.src == 1 and killed.tag == 1


def asks_twice_unless_rank_0() -> list:
    rounds = [relay.quorum()]
    if dist.get_rank() != 0:
        rounds.append(relay.quorum())
    return rounds


def test_a_quorum_round_waits_for_every_live_rank_and_names_the_one_that_never_asked() -> None:
    result = launch(asks_twice_unless_rank_0, 3, backend="relay", fault=Fault(9, 9), timeout=20,
                    pg_timeout=2)  # fmt: skip
    assert result.results[0] == [[0, 1, 2]]
    for rank in (1, 2):
        assert "quorum() waited for rank(s) 0, alive, which never asked" in str(
            result.failures[rank].traceback
        )


def test_a_fault_plan_needs_the_relay() -> None:
    with pytest.raises(ValueError, match="only the relay injects faults"):
        launch(asks_twice_unless_rank_0, 2, fault=Fault(0, 0))


def test_without_a_plan_a_rank_has_no_quorum_on_gloo() -> None:
    result = launch(relay.quorum, 2)
    assert "reached only from a relay run's ranks" in result.failures[0].message


def floods_the_quorum() -> str:
    """Rank 0 asks for a second round while its first waits, as no real quorum() call can."""
    if dist.get_rank() == 0:
        first = relay._LINK.request({"kind": "quorum", "group": [0]}, b"", lambda *_: None)  # noqa: SLF001 - a forged frame
        try:
            relay.quorum()
        except RuntimeError as err:
            return str(err)
        finally:
            dist.barrier()
        return str(first)
    dist.barrier()
    return "waited"


def test_a_second_quorum_request_while_one_waits_is_refused_to_its_rank_only() -> None:
    result = launch(floods_the_quorum, 2, backend="relay", fault=Fault(9, 9))
    assert result.ok, result.failures
    assert "quorum() called again while this rank's last call still waits" in result.results[0]


def waits_for_a_message_then_dies() -> list:
    """Rank 1 has a receive pending when the plan kills it; the relay must outlive its expiry."""
    rank = dist.get_rank()
    if rank == 1:
        dist.irecv(torch.zeros(1), src=0)
    relay.mark(0)
    with contextlib.suppress(RuntimeError):
        dist.all_reduce(torch.ones(1))
    time.sleep(2.5)  # past the relay's 1 s timeout: rank 1's receive expires, unread
    group = dist.new_group(relay.quorum())
    t = torch.ones(1)
    dist.all_reduce(t, group=group)
    return t.tolist()


def test_the_relay_outlives_a_dead_ranks_expired_wait() -> None:
    result = launch(waits_for_a_message_then_dies, 3, backend="relay", fault=Fault(1, 0),
                    pg_timeout=1, timeout=20, grace=20)  # fmt: skip
    assert set(result.failures) == {1}, result.failures
    assert result.results[0] == result.results[2] == [2.0]
