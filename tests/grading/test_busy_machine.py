"""A busy machine costs a submission time, not grades: its ranks' start-up included.

A submission's forkserver starts cold (it imports torch and the checks before it forks its
first rank), and its ranks then unpickle their job and take namespaces of their own before
they run a line of it. On a machine kept busy by other work (another grading run's
submissions, a build), all of that waits for a CPU. Those waits are charged as the run's own
deadlines are (:mod:`course.ranks.clock`): wall time less the time the processes waited on were
runnable without a CPU, so only a server or a rank that does not get on (stopped, blocked)
fails its launch at the deadline.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator

import cloudpickle
import pytest
from marks import CONFINED

from course.grading import template
from course.grading.rankbox import RankBox
from course.grading.slots import lease_uid
from course.ranks import clock, forkserver, launch

pytestmark = [
    pytest.mark.ranks,
    pytest.mark.slow,
    CONFINED,
    pytest.mark.skipif(
        not os.path.exists("/proc/self/schedstat"),
        reason="this kernel has no /proc/<pid>/schedstat: time waiting for a CPU is not seen",
    ),
]

CPU = min(os.sched_getaffinity(0))  # the one CPU the hogs and the box's processes share
HOGS = 6  # spinning processes on it, each in a session (a scheduling group) of its own
START_WAIT = 5.0  # the start-up deadline, short: a cold start alone takes seconds of CPU
# The wall-time cap (WALL_FACTOR times a deadline: 25 s here) is set out of reach, at 60 s: the
# other test worker shares this CPU too (a launch took 25 s in CI), and the cap has tests of its
# own (tests/ranks/test_clock.py). What this test asks is what is charged below the cap.
WALL_FACTOR = 12.0
SPIN = f"import os\nos.sched_setaffinity(0, {{{CPU}}})\nwhile True:\n    pass\n"
# Graded ranks see only Python and the course package: send this module's functions by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture
def busy_cpu() -> Iterator[None]:
    """``HOGS`` processes spinning on CPU ``CPU``, as other work on a loaded machine would.

    Each has a session of its own, so that the kernel's autogroups do not lump them together
    as one task; they stop with the test."""
    hogs = [
        subprocess.Popen([sys.executable, "-c", SPIN], start_new_session=True) for _ in range(HOGS)
    ]
    try:
        time.sleep(0.5)  # every hog on its CPU
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank()


def test_a_starved_forkserver_starts_its_ranks(
    busy_cpu: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cold forkserver (started in the sandbox, as where no template can fork one) and its
    ranks that share one CPU with six spinning processes take longer than the start-up
    deadline in wall time (9.7 to 11 s alone, against 5 s), yet the launch runs: what they
    waited for a CPU is not charged (before, it failed: "the forkserver started no rank in
    5 s")."""
    monkeypatch.setattr(template, "template", lambda: None)
    monkeypatch.setattr(forkserver, "START_WAIT", START_WAIT)
    monkeypatch.setattr(clock, "WALL_FACTOR", WALL_FACTOR)
    everywhere = os.sched_getaffinity(0)
    with lease_uid() as lease:
        os.sched_setaffinity(0, {CPU})  # this thread: the box's forkserver inherits it
        try:
            started = time.monotonic()
            box = RankBox(uid=lease.uid, ddp=False).__enter__()
        finally:
            os.sched_setaffinity(0, everywhere)  # the grader itself runs free
        try:
            result = launch(_rank, 2, timeout=60)
        finally:
            box.__exit__(None, None, None)
        took = time.monotonic() - started
    assert result.ok, result.failures
    assert result.results == [0, 1]
    # The starvation was real: the launch took longer than its start-up deadline in wall time.
    assert took > START_WAIT, took
