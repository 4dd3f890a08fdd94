"""Benchmark: course.ranks (cold and warm) against torch.multiprocessing.spawn.

    .venv/bin/python benchmarks/launch.py            # N = 2, 4, 8; median of 5 runs
    .venv/bin/python benchmarks/launch.py --repeat 3 --sizes 2 8

The same work on both sides: start N gloo ranks (FileStore rendezvous), one all_reduce,
return a value to the caller. "cold" restarts our forkserver before every run (so it
includes importing torch once); "warm" is every later run in the same process. Then the
total PSS of 8 live ranks (plus our forkserver) on both sides. Figures only; no
assertions: they depend on the machine and on whatever else it is doing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable

os.environ["OMP_NUM_THREADS"] = "1"  # the spawned ranks get the same thread limit as ours

import psutil
import torch
import torch.distributed as dist
import torch.multiprocessing as tmp

from course import ranks
from course.ranks import forkserver

TARGETS = {"warm 2": 0.15, "warm 8": 0.5, "speedup": 20.0, "pss 8 MB": 400.0}


def work() -> float:
    """The per-rank job: one all_reduce of this rank's number, returned to the caller."""
    t = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(t)
    return t.item()


def spawn_worker(rank: int, world_size: int, store: str, queue: object, hold: str) -> None:
    """One torch.multiprocessing.spawn rank doing the same job as ours."""
    torch.set_num_threads(1)
    store_ = dist.FileStore(store, world_size)
    dist.init_process_group("gloo", store=store_, rank=rank, world_size=world_size)
    queue.put((rank, work()))
    while hold and not os.path.exists(hold):  # stay alive while memory is measured
        time.sleep(0.05)
    dist.destroy_process_group()


def run_spawn(world_size: int, hold: str = "", on_start: Callable | None = None) -> list:
    """Start N ranks with mp.spawn, collect their values in rank order."""
    queue = tmp.get_context("spawn").SimpleQueue()
    with tempfile.TemporaryDirectory() as d:
        args = (world_size, os.path.join(d, "store"), queue, hold)
        context = tmp.spawn(spawn_worker, args=args, nprocs=world_size, join=False)
        values = dict(queue.get() for _ in range(world_size))
        if on_start:
            on_start([p.pid for p in context.processes])
        while not context.join():
            pass
    return [values[r] for r in range(world_size)]


def timed(fn: Callable[[], object], repeat: int, before: Callable | None = None) -> float:
    """Median wall time of ``repeat`` calls, calling ``before`` untimed each time."""
    times = []
    for _ in range(repeat):
        if before:
            before()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def pss_mb(pids: list[int]) -> float:
    """Total proportional set size of these processes, in MB."""
    return sum(psutil.Process(p).memory_full_info().pss for p in pids) / 2**20


def ours_pss(world_size: int) -> float:
    """PSS of N of our ranks held alive (plus the forkserver)."""
    with tempfile.TemporaryDirectory() as d:
        hold = os.path.join(d, "go")
        job = threading.Thread(target=ranks.run, args=(hold_until, world_size, hold))
        job.start()
        server = psutil.Process(forkserver.SERVER.pid())
        while len(server.children()) < world_size:
            time.sleep(0.05)
        time.sleep(1.0)  # let every rank get through init_process_group
        pids = [server.pid] + [c.pid for c in server.children()]
        total = pss_mb(pids)
        open(hold, "w").close()
        job.join()
    return total


def hold_until(path: str) -> float:
    """Do the work, then stay alive until ``path`` exists."""
    value = work()
    while not os.path.exists(path):
        time.sleep(0.05)
    return value


def spawn_pss(world_size: int) -> float:
    """PSS of N mp.spawn ranks held alive after their work."""
    found: list[float] = []
    with tempfile.TemporaryDirectory() as d:
        hold = os.path.join(d, "go")

        def measure(pids: list[int]) -> None:
            found.append(pss_mb(pids))
            open(hold, "w").close()

        run_spawn(world_size, hold, measure)
    return found[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="runs per measurement (median)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[2, 4, 8], help="world sizes")
    args = parser.parse_args()
    expected = [float(sum(range(n))) for n in args.sizes]
    print(f"{os.cpu_count()} cores, torch {torch.__version__}, median of {args.repeat} runs\n")
    print(f"{'N':>3} {'cold (s)':>9} {'warm (s)':>9} {'mp.spawn (s)':>13} {'spawn/warm':>11}")
    rows = {}
    for n, want in zip(args.sizes, expected, strict=True):
        assert ranks.run(work, n) == [want] * n
        assert run_spawn(n) == [want] * n
        cold = timed(lambda n=n: ranks.run(work, n), args.repeat, before=ranks.shutdown)
        ranks.run(work, n)
        warm = timed(lambda n=n: ranks.run(work, n), args.repeat)
        spawn = timed(lambda n=n: run_spawn(n), args.repeat)
        rows[n] = (cold, warm, spawn)
        print(f"{n:>3} {cold:>9.3f} {warm:>9.3f} {spawn:>13.3f} {spawn / warm:>10.0f}x", flush=True)
    ours, theirs = ours_pss(8), spawn_pss(8)
    print(f"\nPSS of 8 live ranks: ours {ours:.0f} MB (incl. forkserver), mp.spawn {theirs:.0f} MB")
    print(f"memory ratio: {theirs / ours:.1f}x")
    print(f"targets: {TARGETS}")
    ranks.shutdown()


if __name__ == "__main__":
    sys.exit(main())
