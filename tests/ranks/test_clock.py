"""course.ranks.clock: a deadline a busy machine does not run down, that a deadlock still meets."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from course.ranks import clock, launch

SCHEDSTAT = os.path.exists("/proc/self/schedstat")


def test_time_waiting_for_a_cpu_is_not_charged(monkeypatch: pytest.MonkeyPatch) -> None:
    """Is the longest any rank waited for a CPU taken off the wall time, and does a rank that
    exited keep what it had waited?"""
    waits = {1: 0.0, 2: 0.0}
    monkeypatch.setattr(clock, "waited", lambda pid: waits[pid])
    run = clock.RunClock([1, 2])
    waits.update({1: 0.3, 2: 0.1})
    time.sleep(0.5)
    assert 0.15 < run.elapsed() < 0.35
    waits[1] = 0.0  # gone: /proc has nothing to say any more
    assert run.elapsed() < 0.4


def test_a_run_ends_at_the_wall_bound_however_starved(monkeypatch: pytest.MonkeyPatch) -> None:
    """However long the ranks wait for a CPU, is a run over at WALL_FACTOR times its deadline?"""
    monkeypatch.setattr(clock, "waited", lambda _pid: 10 * time.monotonic())
    run = clock.RunClock([1])
    run.started -= clock.WALL_FACTOR * 1.0
    assert run.past(1.0)


def test_a_start_up_wait_charges_only_the_time_its_processes_could_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Is what the processes a start-up waits for waited for a CPU taken off (summed over
    them; one that appears later counted from zero), and is the wait over at its deadline when
    they did not wait (a stopped server), or at WALL_FACTOR times it however starved?"""
    waits = {1: 5.0, 2: 0.0}
    present = [1]
    monkeypatch.setattr(clock, "waited", lambda pid: waits[pid])
    deadline = clock.Deadline(2.0, lambda: present)
    waits[1] = 7.0  # 2 s kept from a CPU since the wait began
    present.append(2)  # a server's Python, started meanwhile
    waits[2] = 1.5
    time.sleep(0.6)
    wall = time.monotonic() - deadline.started
    assert abs(deadline.charged() - (wall - 3.5)) < 0.05
    assert not deadline.past()  # 3.5 s waited for a CPU: not even 2 s charged yet
    stopped = clock.Deadline(0.2, lambda: [1])  # nothing waited for a CPU: wall time
    time.sleep(0.25)
    assert stopped.past()
    starved = clock.Deadline(0.1, lambda: [1])
    starved.started -= clock.WALL_FACTOR * 0.1
    waits[1] = 1e6
    assert starved.past()


def test_every_thread_of_a_process_is_counted() -> None:
    """Is a process's wait for a CPU its threads' summed (at least its main thread's)?"""
    assert clock.waited(os.getpid()) >= clock.run_delay(os.getpid()) >= 0.0
    assert clock.waited(2**22 + 1) == 0.0  # no such process


@pytest.fixture
def hogs() -> Iterator[None]:
    """A spinning process per core, at our own priority."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
             for _ in range(os.cpu_count() or 2)]  # fmt: skip
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


@pytest.mark.skipif(not SCHEDSTAT, reason="this kernel has no /proc/<pid>/schedstat")
def test_a_busy_process_is_seen_waiting_for_a_cpu(hogs) -> None:
    """Beside a hog on every core, does a spinning process's run_delay grow?"""
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        before = clock.run_delay(spinner.pid)
        time.sleep(1.5)
        assert clock.run_delay(spinner.pid) - before > 0.2
    finally:
        spinner.kill()
        spinner.wait()


def _deadlock() -> None:
    import torch
    import torch.distributed as dist

    dist.recv(torch.empty(1), src=(dist.get_rank() + 1) % dist.get_world_size())


@pytest.fixture
def warm() -> None:
    """The launcher's forkserver started while the machine is quiet."""
    launch(int, 1)


@pytest.mark.ranks
def test_a_deadlock_still_ends_at_its_deadline_on_a_busy_machine(warm, hogs) -> None:
    """Beside a hog on every core, does a deadlock (ranks asleep) stop near its deadline?"""
    started = time.monotonic()
    result = launch(_deadlock, 2, timeout=3.0, pg_timeout=60.0)
    took = time.monotonic() - started
    assert not result.ok
    assert 3.0 <= took < 3.0 * 2.5, took
