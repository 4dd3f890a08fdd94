"""The recorder's collectives: every import style, with elements, async_op and time."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from course.ranks import run

pytestmark = pytest.mark.ranks


def _calls() -> list[tuple[str, int, bool | None]]:
    from torch.distributed import all_reduce as imported_all_reduce

    from course.ring.recorder import Recorder

    with Recorder() as recorder:
        dist.all_reduce(torch.ones(3))
        imported_all_reduce(torch.ones(5), async_op=True).wait()
        dist.broadcast(torch.ones(2), src=0)
    times = [c.t for c in recorder.collectives]
    assert times == sorted(times)
    return [(c.name, c.numel, c.async_op) for c in recorder.collectives]


def test_collectives_are_recorded_whatever_the_import() -> None:
    """Does `from torch.distributed import all_reduce` count as surely as `dist.all_reduce`?"""
    want = [("all_reduce", 3, False), ("all_reduce", 5, True), ("broadcast", 2, False)]
    assert run(_calls, 2) == [want, want]


def _twice() -> list[float]:
    from course.ring.recorder import Recorder

    out = []
    for _ in range(2):
        with Recorder():
            t = torch.ones(2)
            dist.all_reduce(t)
        u = torch.ones(3)  # after the recorder: the process group's methods must work as before
        dist.all_reduce(u)
        dist.send(u, 1 - dist.get_rank()) if dist.get_rank() == 0 else dist.recv(u, 0)
        out.append(t.sum().item() + u.sum().item())
    return out


def test_the_process_group_works_after_a_recording() -> None:
    """After a Recorder exits, do all_reduce and send/recv work as if it had never been?"""
    assert run(_twice, 2) == [[10.0, 10.0], [10.0, 10.0]]
