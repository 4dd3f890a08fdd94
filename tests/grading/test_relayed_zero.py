"""Under grading, what a ZeRO step holds is measured from outside its ranks.

``check_zero_memory`` counts the tensors the student's optimizer holds, on the rank. Each
attack below keeps a replica of Adam's state where that count does not look (a global, a
process of its own, the relay's mailbox, a file in its tmpfs, socket buffers) and passes
the count; graded (a ``RankBox``, the
relay's snapshots, the sandbox's cgroup), each fails, and an honest optimizer passes. So
does a replica made room for by ballast: memory the cells take when they run and the
optimizer frees as it makes the replica, which the rank's growth from the model alone hid.
"""

from __future__ import annotations

import inspect

import halves_impls
import pytest

from course.grading import cgroups, sandbox
from course.grading.rankbox import RankBox
from course.grading.student import StudentCode
from course.lessons.zero import check_zero_memory

pytestmark = [
    pytest.mark.ranks,
    pytest.mark.slow,
    pytest.mark.skipif(not sandbox.available(), reason="needs bubblewrap, setpriv and prlimit"),
]

# The model solution (reduce_scatter, all_gather, ZeroOptimizer), as submitted code.
HONEST = inspect.getsource(halves_impls).split("\nclass FullStateZero")[0]

# ZeRO-2's shards for the count, and a whole replica of Adam kept beside them in a global.
REPLICATED = """
REPLICA = {}


class Replicated(ZeroOptimizer):
    def __init__(self, params, optimizer_class=torch.optim.Adam, **defaults):
        super().__init__(params, optimizer_class, **defaults)
        REPLICA["adam"] = optimizer_class(self.params, **defaults)

    def step(self):
        grads = [p.grad.clone() for p in self.params]
        super().step()
        for p, g in zip(self.params, grads):
            p.grad = g
        REPLICA["adam"].step()
        for p in self.params:
            p.grad = None
"""
IN_A_GLOBAL = HONEST + REPLICATED

# The replica moved, after each step, into a child process: the rank's own memory drops.
IN_A_CHILD = HONEST + REPLICATED.replace(
    """        for p in self.params:
            p.grad = None
""",
    """        for p in self.params:
            p.grad = None
        import os, time
        if os.fork() == 0:  # the child keeps the replica's pages, and waits
            time.sleep(600)
            os._exit(0)
        REPLICA["adam"] = torch.optim.Adam(self.params, lr=1e-2)  # empty: its state is gone
""",
)

# Part of the replica sent to the next rank and never received: the relay holds it.
IN_THE_RELAY = HONEST + REPLICATED.replace(
    """        for p in self.params:
            p.grad = None
""",
    """        for p in self.params:
            p.grad = None
        moments = next(iter(REPLICA["adam"].state.values()))["exp_avg_sq"]  # a layer's
        n = dist.get_world_size()
        REPLICA["sent"] = dist.isend(moments, (dist.get_rank() + 1) % n, tag=7)
        REPLICA["adam"] = torch.optim.Adam(self.params, lr=1e-2)  # empty: the moments are sent
""",
)


# The replica in a global, and 256 MiB of ballast made when the cells run (before the check's
# first snapshot of its own), freed as the replica is made: the rank's growth from the model
# built to the step is then below nothing.
BALLASTED = (
    HONEST
    + "\nBALLAST = [torch.ones(64 * 2**20)]\n"
    + REPLICATED.replace(
        "        super().__init__(params, optimizer_class, **defaults)\n",
        "        BALLAST.clear()\n        super().__init__(params, optimizer_class, **defaults)\n",
    )
)


# 60 MiB a rank kept in a file of its own tmpfs after each step: under what a rank may grow
# by itself, and charged to the submission's cgroup as shared memory.
IN_A_FILE = (
    HONEST
    + """

class Replicated(ZeroOptimizer):
    def step(self):
        super().step()
        with open("/tmp/kept", "wb") as kept:
            kept.write(bytes(60 * 2**20))
"""
)


# 48 MiB a rank kept in the buffers of unix sockets no one reads, after each step: the
# kernel's memory, not the rank's, charged to the submission's cgroup all the same.
IN_SOCKETS = (
    HONEST
    + """
import socket

KEPT = []


class Replicated(ZeroOptimizer):
    def step(self):
        super().step()
        while sum(n for _, _, n in KEPT) < 48 * 2**20 and len(KEPT) < 400:
            a, b = socket.socketpair()
            a.setblocking(False)
            n = 0
            try:
                while True:
                    n += a.send(bytes(2**16))
            except BlockingIOError:
                pass
            KEPT.append((a, b, n))
"""
)


# Not ZeRO at all (every gradient all-reduced, a whole Adam on every rank), with the check's
# snapshots after the steps taken by the optimizer before it has made anything, the check's
# own then dropped: measured then, it holds nothing.
SNAPSHOTS_TAKEN_EARLY = """
import torch, torch.distributed as dist
import course.ranks.relay as _relay

_snapshot, _taken = _relay.snapshot, set()


def _once(tag):
    if tag not in _taken:
        _taken.add(tag)
        _snapshot(tag)


_relay.snapshot = _once
FULL = {}  # out of the rank's own count's reach


class Replicated:
    def __init__(self, params, optimizer_class=torch.optim.Adam, **defaults):
        _once(1)
        _once(2)
        self.params = list(params)
        FULL["adam"] = optimizer_class(self.params, **defaults)
        x = torch.zeros(1, requires_grad=True)
        self.optimizer = optimizer_class([x], **defaults)  # all the rank's own count sees
        x.grad = torch.zeros(1)
        self.optimizer.step()

    def step(self):
        for p in self.params:
            dist.all_reduce(p.grad)
            p.grad.div_(dist.get_world_size())
        FULL["adam"].step()
        for p in self.params:
            p.grad = None

    def zero_grad(self):
        pass
"""

# ZeRO-2 that forgets Adam's moments after each step, in place: it holds what ZeRO-2 holds
# at every measure, and trains wrong.
MOMENTS_DROPPED = (
    HONEST
    + """

class Replicated(ZeroOptimizer):
    def step(self):
        super().step()
        for state in self.optimizer.state.values():
            state["exp_avg"].zero_()
            state["exp_avg_sq"].zero_()
"""
)


def _code(source: str, name: str) -> StudentCode:
    return StudentCode(((name, source),), name)


@pytest.mark.parametrize(
    ("attack", "told"),
    [
        (IN_A_GLOBAL, "rank 0 of 4 held"),
        pytest.param(
            IN_A_CHILD,
            "the sandbox of your 4 ranks",
            marks=pytest.mark.skipif(
                cgroups.unavailable() is not None, reason=str(cgroups.unavailable())
            ),
        ),
        (IN_THE_RELAY, "were not yet received"),
        (BALLASTED, "than when its run began"),
        pytest.param(
            IN_SOCKETS,
            "the sandbox of your 4 ranks",
            marks=pytest.mark.skipif(
                cgroups.unavailable() is not None, reason=str(cgroups.unavailable())
            ),
        ),
        pytest.param(
            IN_A_FILE,
            "the sandbox of your 4 ranks",
            marks=pytest.mark.skipif(
                cgroups.unavailable() is not None, reason=str(cgroups.unavailable())
            ),
        ),
    ],
    ids=["global", "child", "relay", "ballast", "file", "sockets"],
)
def test_a_replica_hidden_from_the_count_fails_the_memory_check(attack: str, told: str) -> None:
    """Does each hidden replica pass the count on the notebook's path, and fail graded?"""
    namespace: dict = {}
    exec(attack, namespace)  # noqa: S102 - the attack, run where the count alone decides
    assert "1/4" in check_zero_memory(namespace["Replicated"])
    with RankBox(), pytest.raises(AssertionError, match=told):
        check_zero_memory(_code(attack, "Replicated"))


def test_an_honest_zero_optimizer_passes_measured_from_outside() -> None:
    """Does the model solution pass graded, on the model wide enough to measure?"""
    with RankBox():
        assert "1/4" in check_zero_memory(_code(HONEST, "ZeroOptimizer"))


@pytest.mark.parametrize(
    ("attack", "told"),
    [
        (SNAPSHOTS_TAKEN_EARLY, "the check measures memory between steps"),
        (MOMENTS_DROPPED, "the steps whose memory is measured must train"),
    ],
    ids=["snapshots_early", "moments_dropped"],
)
def test_the_measured_steps_are_real_steps(attack: str, told: str) -> None:
    """Do snapshots the optimizer takes itself before its steps (the check's own dropped), and
    steps that train wrong while holding what ZeRO-2 holds, fail graded: each measure pinned
    between two steps' traffic as the relay recorded it, the measured steps' weights checked?"""
    with RankBox(), pytest.raises(AssertionError, match=told):
        check_zero_memory(_code(attack, "Replicated"))
