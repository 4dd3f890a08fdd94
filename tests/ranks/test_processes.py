"""Processes across the launcher: a process's children as the kernel lists them (the same as
psutil finds by scanning), and a rank held by its pidfd, never signalled by a pid it left."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import threading
import time

import cloudpickle
import psutil
import pytest

from course.ranks.processes import RankStartError, child_pids, pin, still_held

# Ranks unpickle what they run: send this module's functions by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

# A parent with two children, one started from a second thread, the other with two of its
# own: every process sleeps until killed.
TREE = """
import os, subprocess, sys, threading, time
sleep = [sys.executable, "-c", "import time; time.sleep(600)"]
subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; s = sys.argv[1:]; "
                  "[subprocess.Popen(s) for _ in range(2)]; time.sleep(600)", *sleep])
threading.Thread(target=lambda: subprocess.Popen(sleep).wait(), daemon=True).start()
time.sleep(600)
"""


def test_children_are_those_psutil_finds() -> None:
    """In a tree of four processes, one started from a second thread (the kernel lists each
    thread's children apart), are a process's children, and all its descendants, those
    psutil finds by reading every process on the machine?"""
    root = subprocess.Popen([sys.executable, "-c", TREE])
    try:
        parent = psutil.Process(root.pid)
        deadline = time.monotonic() + 30
        while len(parent.children(recursive=True)) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        below = sorted(p.pid for p in parent.children(recursive=True))
        assert len(below) == 4
        assert sorted(child_pids(root.pid)) == sorted(p.pid for p in parent.children())
        assert len(child_pids(root.pid)) == 2
        assert sorted(child_pids(root.pid, recursive=True)) == below
    finally:
        for proc in [*psutil.Process(root.pid).children(recursive=True), root]:
            proc.kill()
        root.wait()
    with pytest.raises(ProcessLookupError):
        child_pids(root.pid)  # gone, and reaped


NS_LAST_PID = "/proc/sys/kernel/ns_last_pid"  # root may say which pid the next process gets


def test_a_pinned_process_is_its_parents_child_and_held_until_reaped() -> None:
    """Is a process pinned only as its parent's child, and held (its pid its own) until it
    is reaped, a zombie included?"""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    fd = pin(child.pid, os.getpid())
    assert fd is not None, "this kernel gives no pidfds"
    try:
        select.select([fd], [], [], 30)  # it ended: a zombie until reaped
        assert still_held(fd)
        child.wait()
        assert not still_held(fd)
    finally:
        os.close(fd)
    with pytest.raises(RankStartError):
        pin(os.getpid(), parent=os.getpid())  # this process is not its own child


def _exits_first(path: str) -> None:
    """Rank 0 notes its pid and ends; rank 1 waits to be stopped."""
    import os
    import time

    import torch.distributed as dist

    if dist.get_rank() == 0:
        with open(path + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.rename(path + ".tmp", path)
        os._exit(3)
    time.sleep(60)


def _take_pid(pid: int) -> subprocess.Popen | None:
    """A process that leads a group of its own, given ``pid`` (free now), or None if another
    process took it first."""
    for _ in range(5):
        with open(NS_LAST_PID, "w") as f:
            f.write(str(pid - 1))
        victim = subprocess.Popen(["sleep", "60"], start_new_session=True)
        if victim.pid == pid:
            return victim
        victim.kill()
        victim.wait()
    return None


@pytest.mark.ranks
@pytest.mark.skipif(
    not os.access(NS_LAST_PID, os.W_OK), reason=f"needs root, to write {NS_LAST_PID}"
)
def test_a_rank_once_reaped_is_never_signalled_by_its_old_pid(tmp_path) -> None:
    """Rank 0 ends at once; its forkserver reaps it, and its pid is free. A process that then
    takes that pid (on a machine busy with forks the pids come round in seconds) leads a
    group of its own, as a rank or a forkserver does. Is it alive after the launcher stopped
    the run, rank 0 included? (Before, the launcher sent SIGKILL to the pid and its group: as
    root, a grader could so kill any process of the machine.)"""
    from course.ranks import launch

    noted = tmp_path / "rank0.pid"
    victims: list[tuple[subprocess.Popen, float]] = []  # and when it took the pid

    def plant() -> None:
        while not noted.exists():
            time.sleep(0.01)
        pid = int(noted.read_text())
        while os.path.exists(f"/proc/{pid}"):  # until reaped
            time.sleep(0.01)
        victim = _take_pid(pid)
        victims.extend([(victim, time.monotonic())] if victim else [])

    planter = threading.Thread(target=plant, daemon=True)
    planter.start()
    result = launch(_exits_first, 2, str(noted), timeout=60, grace=5)
    stopped = time.monotonic()
    planter.join(10)
    assert "os._exit(3)" in str(result.failures[0])
    if not victims:
        pytest.skip("another process took the pid first")
    if victims[0][1] > stopped:
        victims[0][0].kill()
        pytest.skip("the pid was taken only after the run was stopped")
    victim = victims[0][0]
    time.sleep(0.2)
    try:
        assert victim.poll() is None, "the launcher killed a process that took a rank's pid"
    finally:
        victim.kill()
        victim.wait()
