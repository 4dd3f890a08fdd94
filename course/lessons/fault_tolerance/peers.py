"""What a gloo collective does when a peer fails: a rank killed, or a rank that stops calling.

    from course.ranks import launch
    launch(after_failure, 4, "killed", pg_timeout=2.0).results   # one record per survivor

Every rank all-reduces once with the others; then the last rank fails, the way ``how`` says,
and each survivor times its next all-reduce and one more on the same group, and says how
each ended: ``"ok"``, ``"timed out"`` (gloo waited its whole timeout for the peer) or
``"peer closed"`` (a socket to a peer was reset or closed under it). gloo's ranks hold one TCP
connection to each other rank (a full mesh, made in ``init_process_group``);
:func:`connections` counts them on a rank. Runs under torchrun too:

    torchrun --nproc-per-node 3 -m course.lessons.fault_tolerance.peers hangs
"""

from __future__ import annotations

import os
import re
import signal
import sys
import time
from datetime import timedelta

import psutil
import torch
import torch.distributed as dist

from course.ranks.wording import count

__all__ = ["HOW", "after_failure", "connections", "ended", "report"]

HOW = ("killed", "hangs")  # SIGKILL (a segfault, the OOM killer), or alive and silent
NUMEL = 2**16
STALL = 6.0  # seconds a rank that hangs stays silent: longer than the timeouts used here


def ended(exc: BaseException | None) -> str:
    """How a call ended, from gloo's own words: ok, timed out, peer closed, or other."""
    if exc is None:
        return "ok"
    text = str(exc)
    if re.search(r"Timed out waiting|timeout", text, re.IGNORECASE):
        return "timed out"
    if re.search(r"Connection reset|Connection closed|closed by peer|Broken pipe|Read error", text):
        return "peer closed"
    return "other"


def _timed(tensor: torch.Tensor) -> tuple[str, float, str, float]:
    """One all-reduce: how it ended, after how many seconds, gloo's message's head, and when
    it ended on this machine's monotonic clock (the ranks share it: one machine)."""
    start = time.monotonic()
    try:
        dist.all_reduce(tensor)
    except RuntimeError as exc:
        head = re.sub(r"^\[[^\]]*\]\s*", "", str(exc).splitlines()[0])
        head = head.split(". This is typically")[0][:80]
        return ended(exc), time.monotonic() - start, head, time.monotonic()
    return "ok", time.monotonic() - start, "", time.monotonic()


def connections() -> int:
    """TCP connections this process holds to other processes on loopback (gloo's pairs)."""
    ours = [c for c in psutil.Process().net_connections("tcp") if c.raddr]
    return len([c for c in ours if c.status == psutil.CONN_ESTABLISHED])


def _wait_for_death(pid: int | None, limit: float = 10.0) -> None:
    """Until process ``pid`` is gone (or a zombie: the kernel has closed its sockets)."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return
        except psutil.NoSuchProcess:
            return
        time.sleep(0.01)


def after_failure(how: str, numel: int = NUMEL, stall: float = STALL) -> dict | None:
    """On every rank: all-reduce together, then the last rank fails (``how``); each survivor
    (once a killed rank is gone) returns how its next two all-reduces on the same group
    ended, and its open connections.
    A rank that ``hangs`` sleeps ``stall`` seconds, then returns."""
    if how not in HOW:
        raise ValueError(f"how must be one of {HOW}, got {how!r}")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    pids: list[int | None] = [None] * world_size
    dist.all_gather_object(pids, os.getpid())
    tensor = torch.ones(numel)
    dist.all_reduce(tensor)
    mesh = connections()
    if rank == world_size - 1:
        if how == "killed":
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(stall)
        return None
    if how == "killed":
        _wait_for_death(pids[-1])  # every survivor calls once the victim is gone
    first = _timed(tensor)
    again = _timed(tensor)
    return {"rank": rank, "connections": mesh, "first": first, "again": again}


def report(how: str, world_size: int, pg_timeout: float = 2.0, numel: int = NUMEL) -> str:
    """Run :func:`after_failure` on ``world_size`` ranks with gloo's ``pg_timeout``; say how
    each survivor's two calls ended (every rank is given time to end on its own)."""
    from course.ranks import launch

    result = launch(
        after_failure, world_size, how, numel, pg_timeout=pg_timeout, grace=STALL, timeout=60
    )
    victim = world_size - 1
    done = "killed (SIGKILL)" if how == "killed" else f"silent for {STALL:g} s"
    head = f"{world_size} ranks, gloo's timeout {pg_timeout:g} s, {numel:,} float32 elements"
    lines = [f"{head}; rank {victim} {done} after the first all-reduce:"]
    for got in result.results:
        if got is None:
            continue
        calls = [
            f"all-reduce {i} {kind} after {seconds:.2f} s" + (f" ({said})" if said else "")
            for i, (kind, seconds, said, _) in ((2, got["first"]), (3, got["again"]))
        ]
        lines.append(f"  rank {got['rank']} ({count(got['connections'], 'TCP connection')}):")
        lines += [f"    {c}" for c in calls]
    return "\n".join(lines)


def main() -> None:
    """Under torchrun: ``how`` from the command line, a 3 s timeout; each survivor prints."""
    how = sys.argv[1] if len(sys.argv) > 1 else "hangs"
    dist.init_process_group("gloo", timeout=timedelta(seconds=3))
    print(after_failure(how), flush=True)


if __name__ == "__main__":
    main()
