"""The relay backend: every route to a collective ends in the caller, which records it."""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import time

import pytest
import torch
import torch.distributed as dist

from course.ranks import launch, relay
from course.ranks.frames import DEADLOCK, Event

pytestmark = [pytest.mark.ranks, pytest.mark.slow]


def every_route() -> dict:
    """Each way torch.distributed offers to a collective or a message, with its result."""
    import torch.distributed._functional_collectives as fc

    rank, n = dist.get_rank(), dist.get_world_size()
    out: dict = {"backend": dist.get_backend()}
    t = torch.full((4,), float(rank + 1))
    dist.all_reduce(t)
    out["all_reduce"] = t.tolist()
    buf = torch.empty(2)
    recv = dist.irecv(buf, (rank - 1) % n)  # receive posted before the send: no deadlock
    dist.isend(torch.full((2,), float(rank)), (rank + 1) % n).wait()
    recv.wait()
    out["ring"] = buf.tolist()
    pieces = [torch.empty(2) for _ in range(n)]
    dist.all_gather(pieces, torch.full((2,), float(rank)))
    out["all_gather"] = [p.tolist() for p in pieces]
    flat = torch.empty(2 * n)
    dist.all_gather_into_tensor(flat, torch.full((2,), float(rank)))
    out["all_gather_into_tensor"] = flat.tolist()
    mine = torch.empty(2)
    dist.reduce_scatter_tensor(mine, torch.arange(2.0 * n) + rank)
    out["reduce_scatter_tensor"] = mine.tolist()
    root = torch.tensor([float(rank)])
    dist.broadcast(root, n - 1)
    out["broadcast"] = root.tolist()
    pair = dist.new_group([0, 1])
    if rank in (0, 1):
        one = torch.ones(1)
        dist.all_reduce(one, group=pair)
        out["subgroup"] = one.tolist()
    out["functional"] = fc.all_reduce(torch.ones(2), "sum", dist.group.WORLD).tolist()
    op = torch.ops._c10d_functional  # noqa: SLF001 - the dispatcher's route, which skips dist.*
    raw = op.wait_tensor(op.all_reduce(torch.ones(3), "sum", dist.group.WORLD.group_name))
    out["dispatcher"] = raw.tolist()
    dist.barrier()
    return out


def test_every_route_goes_through_the_relay_and_is_recorded() -> None:
    """Do p2p, every collective, subgroups, functional and dispatcher collectives give gloo's
    results on the relay, and does the caller's record hold each, with its bytes?"""
    result = launch(every_route, 3, backend="relay", timeout=60)
    assert result.ok, result.failures
    for rank, out in enumerate(result.results):
        assert out["backend"] == "relay"
        assert out["all_reduce"] == [6.0] * 4
        assert out["ring"] == [float((rank - 1) % 3)] * 2
        assert out["all_gather"] == [[0.0, 0.0], [1.0, 1.0], [2.0, 2.0]]
        assert out["all_gather_into_tensor"] == [0.0, 0.0, 1.0, 1.0, 2.0, 2.0]
        whole = sum(torch.arange(6.0) + r for r in range(3))
        assert out["reduce_scatter_tensor"] == whole[2 * rank : 2 * rank + 2].tolist()
        assert out["broadcast"] == [2.0]
        assert out.get("subgroup") == ([2.0] if rank < 2 else None)
        assert out["functional"] == [3.0, 3.0] and out["dispatcher"] == [3.0] * 3
    sends = [e for e in result.relayed if e.kind == "send"]
    assert sorted((e.src, e.dst, e.nbytes) for e in sends) == [
        (0, 1, (8,)),
        (1, 2, (8,)),
        (2, 0, (8,)),
    ]
    recvs = [e for e in result.relayed if e.kind == "recv"]
    assert sorted((e.src, e.dst, e.nbytes) for e in recvs) == sorted(
        (e.src, e.dst, e.nbytes) for e in sends
    )
    kinds = [e.kind for e in result.relayed if e.kind not in ("send", "recv")]
    assert kinds == ["allreduce", "allgather", "allgather", "reduce_scatter", "broadcast",
                     "new_group", "allreduce", "allreduce", "allreduce", "barrier"]  # fmt: skip
    made = next(e for e in result.relayed if e.kind == "new_group")
    assert made.group == (0, 1)  # its members made it together, as on gloo
    assert Event("allreduce", (0, 1), nbytes=(4, 4), dtype="float32", op="SUM") in [
        Event(e.kind, e.group, nbytes=e.nbytes, dtype=e.dtype, op=e.op) for e in result.relayed
    ]


def ddp_grads() -> list[float]:
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))
    torch.manual_seed(dist.get_rank())
    model(torch.randn(8, 4)).sum().backward()
    return model.module.weight.grad.view(-1).tolist()


def test_ddp_on_the_relay_averages_as_on_gloo() -> None:
    """Does DDP (its C++ reducer calls the group itself) train on the relay, bit for bit as on
    gloo, and are its bucket all-reduces in the record?"""
    on_relay = launch(ddp_grads, 2, backend="relay", timeout=60)
    on_gloo = launch(ddp_grads, 2, timeout=60)
    assert on_relay.ok and on_gloo.ok, (on_relay.failures, on_gloo.failures)
    assert on_relay.results == on_gloo.results
    assert [e.kind for e in on_relay.relayed].count("allreduce") == 1  # one bucket, one step


def waits_forever() -> None:
    peer = (dist.get_rank() + 1) % dist.get_world_size()
    dist.recv(torch.empty(1), peer)


def test_a_deadlock_is_found_at_once_not_on_the_deadline() -> None:
    """Do two ranks that both receive first fail as a deadlock in their own line, with who was
    waited for, as soon as both wait: long before the relay's 60 s timeout, which they would
    otherwise take?"""
    result = launch(waits_forever, 2, backend="relay", timeout=120, pg_timeout=60)
    assert {f.kind for f in result.failures.values()} == {"deadlock"}, result.failures
    first = result.failures[0]
    assert first.where.startswith("dist.recv at test_relay.py")
    assert "the relay, finding no rank could go on, gave up waiting" in first.message
    assert DEADLOCK in first.traceback and "timed out" not in first.traceback
    assert "rank 0 waited for a message from rank 1 that never came" in first.traceback
    assert result.relayed == ()


def returns_or_waits() -> int:
    """Rank 0 returns at once; rank 1 waits in a broadcast from rank 0 that never comes."""
    if dist.get_rank() == 1:
        dist.broadcast(torch.zeros(1), 0)
    return dist.get_rank()


def test_a_wait_on_a_rank_that_returned_is_found_at_once() -> None:
    """Is a rank left waiting on a peer that already returned told so at once, blocked?"""
    result = launch(returns_or_waits, 2, backend="relay", timeout=120, pg_timeout=60)
    assert result.results[0] == 0 and list(result.failures) == [1], result.failures
    failure = result.failures[1]
    assert failure.kind == "blocked" and failure.where.startswith("dist.broadcast at")
    assert "rank 0 had already finished" in failure.message
    assert DEADLOCK in failure.traceback


def works_while_its_peer_waits(seconds: float) -> float:
    """Rank 1 waits in a receive and a barrier while rank 0 computes (sleeps) outside any call:
    no deadlock, however long the wait."""
    t = torch.zeros(1)
    if dist.get_rank() == 0:
        time.sleep(seconds)
        w = dist.isend(torch.ones(1), 1)
        time.sleep(seconds)  # its send is posted, not waited on: rank 1 takes it meanwhile
        w.wait()
    else:
        dist.recv(t, 0)
    dist.barrier()
    return t.item()


def test_a_rank_still_working_is_no_deadlock() -> None:
    """While one rank computes outside any call, are its peer's waits left to the deadline,
    and does the run end as it should?"""
    result = launch(works_while_its_peer_waits, 2, 0.5, backend="relay", timeout=60)
    assert result.ok, result.failures
    assert result.results == [0.0, 1.0]


def polls_a_receive() -> None:
    """A wait that never says it blocks: it polls the call instead of waiting on it."""
    if dist.get_rank() == 0:
        work = dist.irecv(torch.zeros(1), 1)
        while not work.is_completed():
            time.sleep(0.01)
        work.wait()  # answered by now: it raises what the relay said


def test_a_wait_the_relay_is_not_told_of_ends_on_the_deadline() -> None:
    """Does a rank that polls its receive (rank 1 returned) fail on the relay's own deadline,
    since it never said it waits, and not before?"""
    result = launch(polls_a_receive, 2, backend="relay", timeout=30, pg_timeout=2)
    assert list(result.failures) == [0], result.failures
    failure = result.failures[0]
    assert failure.kind == "blocked" and "rank 1 had already finished" in failure.message
    assert "timed out after 2 s: rank 0 waited for a message from rank 1" in failure.traceback


def mismatched() -> None:
    t = torch.ones(2)
    if dist.get_rank() == 0:
        dist.all_reduce(t)
    else:
        dist.broadcast(t, 0)


def test_ranks_that_call_different_collectives_are_told() -> None:
    """Do an all-reduce on one rank and a broadcast on the other fail both, saying so?"""
    result = launch(mismatched, 2, backend="relay", timeout=30, pg_timeout=5)
    assert len(result.failures) == 2
    for failure in result.failures.values():
        assert "ranks called different collectives (rank 0: allreduce, rank 1: broadcast)" in (
            failure.message
        )


def forges_frames() -> str:
    """Write to the relay's socket directly: a frame that is not JSON, then a send whose 3
    bytes claim to be 4 floats."""
    link = relay._LINK  # noqa: SLF001 - the rank's own link, as hostile code would find it
    assert link is not None
    sock: socket.socket = link.sock
    head = b'{"kind":"send","group":[0,1],"dst":1,"dtype":"float32","shape":[4],"req":999}'
    with link._lock:  # noqa: SLF001 - whole frames, not interleaved with the rank's own
        sock.sendall(struct.pack(">II", 5, 0) + b"[[[[[")  # not even JSON
        sock.sendall(struct.pack(">II", len(head), 3) + head + b"abc")  # 3 bytes for 16
    t = torch.ones(2)
    dist.all_reduce(t)  # the relay is still up, and still sums
    return str(t.tolist())


def test_a_forged_frame_fails_that_call_not_the_relay() -> None:
    """Does a frame whose bytes do not match its shape get refused, the relay carry on, and
    nothing unrecorded reach the peer?"""
    result = launch(forges_frames, 2, backend="relay", timeout=30, pg_timeout=5)
    assert result.ok, result.failures
    assert result.results == ["[2.0, 2.0]"] * 2
    assert [e.kind for e in result.relayed] == ["allreduce"]


def reaches_for_gloo() -> str:
    """Is there a gloo backend, or a store shared with a peer, to reach past the relay?"""
    group = dist.group.WORLD
    found = []
    for device in ("cpu", "cuda"):
        with contextlib.suppress(RuntimeError, AttributeError):
            found.append(type(group._get_backend(torch.device(device))).__name__)  # noqa: SLF001 - where gloo's object would be
    store = dist.distributed_c10d._get_default_store()  # noqa: SLF001 - the rendezvous store
    store.set(f"from-{dist.get_rank()}", "x")
    dist.barrier()
    peer = 1 - dist.get_rank()
    try:
        store.wait([f"from-{peer}"], __import__("datetime").timedelta(seconds=0.5))
        found.append("a shared store")
    except (RuntimeError, dist.DistStoreError):
        pass
    return ",".join(found) or "nothing"


def test_no_other_backend_or_store_joins_the_ranks() -> None:
    """On the relay, is there no gloo backend to call and no store a peer also sees?"""
    result = launch(reaches_for_gloo, 2, backend="relay", timeout=30)
    assert result.ok, result.failures
    assert "ProcessGroupGloo" not in "".join(result.results)
    assert all("a shared store" not in r for r in result.results), result.results


def test_gloo_runs_unchanged_and_records_nothing() -> None:
    """Is the default backend still gloo, with no relay record?"""
    result = launch(every_route, 3, timeout=60)
    assert result.ok, result.failures
    assert result.results[0]["backend"] == "gloo" and result.relayed == ()


def uneven_ddp() -> int:
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))
    for _ in range(2 + dist.get_rank()):  # rank 1 trains one step more: nobody joins its bucket
        model(torch.randn(8, 4)).sum().backward()
    return dist.get_rank()


def test_ddp_left_waiting_is_blocked_not_crashed() -> None:
    """Does a DDP rank whose bucket all-reduce no peer joins fail as blocked, where it waits
    (its C++ waits on the call, so the error cannot raise there), as soon as the relay sees
    no rank can go on (its reducer said it waits), not at the group's deadline?"""
    result = launch(uneven_ddp, 2, backend="relay", timeout=30, pg_timeout=120)
    assert result.results[0] == 0 and list(result.failures) == [1], result.failures
    failure = result.failures[1]
    assert failure.kind == "blocked" and failure.where.startswith("test_relay.py line")
    assert "finding no rank could go on, gave up waiting: rank 0 had already" in failure.message


def hooked_ddp(late: float) -> list[float]:
    """DDP with a comm hook: rank 0's hook first waits for a message nobody sends (``late``
    < 0), or rank 1's sleeps ``late`` seconds first (DDP's reducer on rank 0 waits meanwhile)."""

    def hook(state, bucket):  # unannotated: DDP checks the annotations, strings in this file
        if late < 0 and dist.get_rank() == 0:
            dist.recv(torch.empty(1), src=1)
        if late > 0 and dist.get_rank() == 1:
            time.sleep(late)
        work = dist.all_reduce(bucket.buffer().div_(dist.get_world_size()), async_op=True)
        return work.get_future().then(lambda fut: fut.value()[0])

    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))
    model.register_comm_hook(None, hook)
    model(torch.randn(8, 4) * (dist.get_rank() + 1)).sum().backward()
    return model.module.weight.grad.flatten().tolist()


def test_a_comm_hook_left_waiting_fails_at_once_and_a_slow_one_does_not() -> None:
    """Is a DDP step whose comm hook on rank 0 waits for a message nobody sends a deadlock as
    soon as the other rank's reducer waits on its bucket; and does a hook that is only slow
    (1.5 s asleep on rank 1, while rank 0's reducer waits) give gloo's gradients?"""
    stuck = launch(hooked_ddp, 2, -1.0, backend="relay", timeout=30, pg_timeout=120)
    assert sorted(stuck.failures) == [0, 1], stuck.failures
    assert "finding no rank could go on" in stuck.failures[1].message
    assert stuck.failures[1].where.startswith("test_relay.py line"), stuck.failures[1].where
    slow = launch(hooked_ddp, 2, 1.5, backend="relay", timeout=60, pg_timeout=120)
    assert slow.ok, slow.failures
    assert slow.results == launch(hooked_ddp, 2, 0.0, timeout=60).results


def first_come() -> list[int] | None:
    """Rank 0 receives from any source, twice: rank 2 sends at once, rank 1 only after it
    hears from rank 0; a subgroup's receive names the sender's rank in the group."""
    rank = dist.get_rank()
    if rank == 0:
        buf = torch.empty(1)
        first = dist.recv(buf)
        dist.send(torch.zeros(1), 1)
        second = dist.recv(buf)
        pair = dist.new_group([0, 2])
        third = dist.recv(buf, group=pair)  # the global rank, as dist.recv returns it
        return [first, second, third]
    if rank == 1:
        dist.recv(torch.empty(1), 0)
    dist.new_group([0, 2]) if rank == 1 else None
    dist.send(torch.full((1,), float(rank)), 0)
    if rank == 2:
        dist.send(torch.ones(1), 0, group=dist.new_group([0, 2]))
    return None


def test_a_receive_from_any_source_takes_the_first_message() -> None:
    """Does dist.recv without a source, on the relay, take whichever message reached the
    relay first and say whose (in a subgroup too), with each delivery in the record?"""
    result = launch(first_come, 3, backend="relay", timeout=30)
    assert result.ok, result.failures
    assert result.results[0] == [2, 1, 2]
    recvs = [(e.src, e.dst) for e in result.relayed if e.kind == "recv"]
    assert sorted(recvs) == [(0, 1), (1, 0), (2, 0), (2, 0)]


def waits_for_anyone() -> None:
    if dist.get_rank() == 0:
        dist.recv(torch.empty(1))


def test_a_receive_from_any_source_that_never_comes_says_so() -> None:
    """Does a receive from any source that no rank sends end on the deadline, saying it
    waited for any rank?"""
    result = launch(waits_for_anyone, 2, backend="relay", timeout=30, pg_timeout=2)
    assert result.failures[0].kind == "blocked", result.failures  # rank 1 had returned
    assert "waited for a message from any rank that never came" in result.failures[0].traceback


def test_a_rank_stopped_on_the_wire_is_placed_where_torch_was_called() -> None:
    """A rank the relay fails while it is telling the relay it waits (in DDP's backward) is
    stopped inside the course's wire: is it placed at the course's line that called torch,
    never at the wire's own ``sendall``?"""
    from course.ranks import link, report

    check = os.path.join(os.path.dirname(report.__file__), "..", "lessons", "check.py")
    frames = [
        (check, 72, "check", "student(x).square().sum().backward()"),
        (link.__file__, 95, "tell", 'self.sock.sendall(frame(header, b""))'),
    ]
    where, _ = report.locate(frames)
    assert where.startswith("check.py line 72"), where
