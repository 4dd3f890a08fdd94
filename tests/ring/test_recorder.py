"""The recorder: does it see every message exactly once, and survive a rank that hangs?"""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
from torch.distributed import recv, send

from course.instructor.reference import ring_allreduce
from course.ring import recorder
from course.ring.encoding import decode_tensor, encoded_tensor
from course.ring.recorder import record
from course.ring.trace import decode, encoded_value, ring_trace

pytestmark = pytest.mark.ranks


def _key(m):
    return (m.rank, m.op, m.order)


@pytest.mark.parametrize(
    ("world_size", "numel"), [(2, 5), (3, 7), (3, 9), (4, 2), (4, 8), (5, 13), (6, 1)]
)
def test_recorded_reference_equals_the_simulator(by_value, world_size: int, numel: int) -> None:
    """Is the reference ring's recorded trace exactly the simulator's ring_trace?"""
    recorded = record(ring_allreduce, world_size, numel)
    expected = ring_trace(world_size, numel, 8)
    assert sorted(recorded.messages, key=_key) == sorted(expected.messages, key=_key)
    assert (recorded.collectives, recorded.unfinished) == ((), ())


def every_api(tensor: torch.Tensor) -> None:
    """One message of each kind to the neighbour, from both import styles."""
    r, n = dist.get_rank(), dist.get_world_size()
    right, left = (r + 1) % n, (r - 1) % n
    buf = torch.empty_like(tensor)
    if r % 2 == 0:
        send(tensor, right)  # from torch.distributed import send
        dist.recv(buf, left)
    else:
        recv(buf, left)
        dist.send(tensor, right)
    sent = dist.isend(tensor, right)  # gloo: a send completes once its receive is posted
    dist.irecv(buf, left).wait()
    sent.wait()
    ops = [dist.P2POp(dist.isend, tensor, right), dist.P2POp(dist.irecv, buf, left)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    dist.barrier()


def test_each_message_is_counted_once(by_value) -> None:
    """Do send/recv (both imports), isend/irecv and batch_isend_irecv each record one message?"""
    trace = record(every_api, 2, numel=4)
    for rank in (0, 1):
        for op in ("send", "recv"):
            mine = trace.of(rank, op)
            assert [m.order for m in mine] == [0, 1, 2]
            assert {(m.peer, m.numel, m.nbytes, m.offset, m.holds) for m in mine} == {
                (1 - rank, 4, 32, 0, 1 << (rank if op == "send" else 1 - rank))
            }
    assert trace.collectives == ((0, "barrier"), (1, "barrier"))


def patched_state(tensor: torch.Tensor) -> list[bool]:
    """Inside a recording: is the process group wrapped? After it, is it restored?"""
    from torch._C._distributed_c10d import ProcessGroup

    from course.ring.recorder import Recorder

    original = ProcessGroup.send
    with Recorder():
        inside = ProcessGroup.send is not original
    return [inside, ProcessGroup.send is original]


def test_recorder_restores_the_process_group(run_ranks) -> None:
    """Does the recorder put torch's own methods back when it exits?"""
    assert run_ranks(patched_state, 2, torch.zeros(1)) == [[True, True]] * 2


def receive_first(tensor: torch.Tensor) -> None:
    """Rank 1 sends once then waits forever; rank 0 receives, then waits forever too."""
    r = dist.get_rank()
    if r == 1:
        dist.send(tensor, 0)
    else:
        dist.recv(tensor, 1)
    dist.recv(tensor, 1 - r)


def test_a_deadlocked_run_leaves_a_partial_trace(by_value, monkeypatch) -> None:
    """Does a deadlock still give the messages so far, unfinished ranks and where they hung,
    and is the folder the ranks wrote it in gone after? (Only this run's folder is looked at:
    another test process may be recording at the same time.)"""
    made: list[str] = []
    real = recorder.rank_dir
    monkeypatch.setattr(recorder, "rank_dir", lambda prefix: made.append(real(prefix)) or made[-1])
    trace = record(receive_first, 2, numel=3, timeout=4)
    assert trace.unfinished == (0, 1)
    assert all("dist.recv" in trace.blocked[r] for r in (0, 1))
    assert trace.of(1, "send")[0].holds == 0b10
    assert trace.of(0, "recv")[0].holds == 0b10  # completed before the hang
    assert trace.of(0, "recv")[1].holds is None  # posted, never completed
    assert trace.of(1, "recv")[0].holds is None
    assert len(made) == 1 and not os.path.exists(made[0])


@pytest.mark.parametrize("world_size", [2, 5])
def test_decode_tensor_agrees_with_decode(world_size: int) -> None:
    """Does the vectorised decode read the same (offset, holds) as the pure one?"""
    g = torch.Generator().manual_seed(world_size)
    inputs = [encoded_tensor(r, 30, world_size) for r in range(world_size)]
    assert inputs[1][7].item() == encoded_value(1, 7, world_size)
    for _ in range(50):
        mask = int(torch.randint(0, 1 << world_size, (1,), generator=g))
        lo, hi = sorted(int(x) for x in torch.randint(0, 31, (2,), generator=g))
        payload = sum(
            (inputs[r][lo:hi] for r in range(world_size) if mask >> r & 1),
            torch.zeros(hi - lo, dtype=torch.float64),
        )
        for candidate in (payload, payload / 2, payload.float(), payload.flip(0)):
            assert decode_tensor(candidate, world_size) == decode(candidate.tolist(), world_size)
