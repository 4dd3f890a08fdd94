"""course.grading.slots: a leased uid per submission, and nothing of it left running after."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import psutil
import pytest

from course.grading import sandbox, slots

needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="starting a process as another uid needs root"
)


def gone(pid: int) -> bool:
    """Dead: no such process, or a zombie its parent has not reaped yet."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def start_as(uid: int) -> subprocess.Popen:
    """A process of ``uid`` started with setsid: no process group of ours holds it."""
    return subprocess.Popen(["sleep", "600"], user=uid, group=uid, start_new_session=True)


def test_each_lease_has_its_own_uid_from_the_pool() -> None:
    """Do leases held at once get distinct uids from the documented pool, never root or nobody?"""
    with slots.lease_uid() as a, slots.lease_uid() as b, slots.lease_uid() as c:
        uids = [a.uid, b.uid, c.uid]
    assert len(set(uids)) == 3
    assert all(sandbox.SLOT_UID_BASE <= u < sandbox.SLOT_UID_BASE + slots.POOL for u in uids)
    assert not {0, sandbox.SANDBOX_UID} & set(uids)


HOLD = """
import sys, time
from course.grading.slots import lease_uid
with lease_uid() as lease:
    print(lease.uid, flush=True)
    time.sleep(600)
"""


def test_another_process_never_gets_a_uid_held_here_and_gets_it_once_we_die() -> None:
    """Is a uid leased by one process refused to another (two runs on one machine), and free
    again once its holder is killed (no stale lease)?"""
    holder = subprocess.Popen([sys.executable, "-c", HOLD], stdout=subprocess.PIPE, text=True)
    try:
        held = int(holder.stdout.readline())
        with slots.lease_uid() as mine:
            assert mine.uid != held
        with pytest.raises(sandbox.SandboxUnavailable, match="leased"), slots.lease_uid([held]):
            pass
        holder.kill()
        holder.wait(timeout=10)
        with slots.lease_uid([held]) as again:
            assert again.uid == held
    finally:
        holder.kill()
        holder.wait()


def test_kill_uid_refuses_root_and_itself() -> None:
    """Does kill_uid refuse to kill every process of root or of the caller?"""
    for uid in {0, os.geteuid()}:
        with pytest.raises(ValueError, match="refusing"):
            slots.kill_uid(uid)


@needs_root
def test_kill_uid_stops_a_detached_process() -> None:
    """Is a process of the uid, started with setsid, killed by its uid?"""
    with slots.lease_uid() as lease:
        proc = start_as(lease.uid)
        try:
            assert slots.kill_uid(lease.uid) >= 1
            proc.wait(timeout=5)
            assert gone(proc.pid)
        finally:
            proc.kill()
            proc.wait()


@needs_root
def test_a_lent_uid_comes_back_empty_and_others_are_untouched() -> None:
    """When a slot's uid is given back, are its processes dead and another uid's alive?"""
    pool = slots.Slots(2)
    procs = []
    with slots.lease_uid() as other:  # another submission's uid, held meanwhile
        try:
            with pool.lend() as lease:
                procs.append(start_as(lease.uid))
                procs.append(start_as(other.uid))
            procs[0].wait(timeout=5)
            assert gone(procs[0].pid)
            assert not gone(procs[1].pid)
        finally:
            for proc in procs:
                proc.kill()
                proc.wait()


def test_lend_blocks_until_a_slot_is_free() -> None:
    """With every slot lent, does a third submission wait for one to come back?"""
    pool = slots.Slots(1)
    got: list[int] = []
    with pool.lend():
        waiter = threading.Thread(target=lambda: got.append(_lend_once(pool)))
        waiter.start()
        waiter.join(timeout=0.3)
        assert waiter.is_alive() and not got
    waiter.join(timeout=10)
    assert len(got) == 1


def _lend_once(pool: slots.Slots) -> int:
    with pool.lend() as lease:
        return lease.uid


@pytest.mark.parametrize("value", ["0", "-5", "nobody", "62000.5"])
def test_the_environment_cannot_name_root_or_garbage(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    """Is a $COURSE_SANDBOX_UID that is root or not a uid refused, naming the variable?"""
    monkeypatch.setenv(sandbox.UID_ENV, value)
    with pytest.raises(sandbox.SandboxUnavailable, match=sandbox.UID_ENV):
        sandbox.sandbox_uid()


def test_owned_among_given_pids_is_owned_by_the_uid_and_alive() -> None:
    """Looking only among given pids (a box's cgroups), are the live processes of the uid
    found, and a gone pid, a zombie and another uid's process left out?"""
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        while psutil.Process(zombie.pid).status() != psutil.STATUS_ZOMBIE:  # ended, not reaped
            time.sleep(0.01)
        gone = max(psutil.pids()) + 10_000
        pids = [alive.pid, zombie.pid, gone]
        me = os.geteuid()
        assert [p.pid for p in slots.owned_by(me, pids)] == [alive.pid]
        assert slots.owned_by(me + 1, pids) == []
    finally:
        alive.kill()
        alive.wait()
        zombie.wait()
