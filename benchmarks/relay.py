"""Benchmark: what the relay (every message through the caller) costs against gloo.

    .venv/bin/python benchmarks/relay.py                 # 4 ranks; median of 3 runs
    .venv/bin/python benchmarks/relay.py --ranks 2 --repeat 5

The same launches on both backends, from a warm forkserver, unconfined: a launch that does
nothing (start-up: gloo's rendezvous against the relay's sockets), then inside one launch
the time per call of an all-reduce at 1 KB, 1 MB and 16 MB, a ring's 2(N-1) point-to-point
steps on 1 MB, and one DDP step of a 1M-parameter model. Then the ring check
(``check_ring_allreduce``, world sizes 2 to 6) on a ring written with isend/irecv, as
grading runs it: confined, on the relay (needs root and bubblewrap; skipped otherwise).
Figures only; no assertions: they depend on the machine and on whatever else it is doing.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist

from course import ranks

SIZES = {"1 KB": 256, "1 MB": 2**18, "16 MB": 2**22}  # float32 elements

RING = """
import torch, torch.distributed as dist

def ring_allreduce(tensor):
    n, r = dist.get_world_size(), dist.get_rank()
    flat = tensor.view(-1) if tensor.is_contiguous() else tensor.contiguous().view(-1)
    chunks = list(flat.tensor_split(n))
    for phase in (0, 1):
        for s in range(n - 1):
            out, into = chunks[(r - s + phase) % n], chunks[(r - s - 1 + phase) % n]
            buf = torch.empty_like(into)
            sent = dist.isend(out.clone(), (r + 1) % n)
            dist.irecv(buf, (r - 1) % n).wait()
            sent.wait()
            into.add_(buf) if phase == 0 else into.copy_(buf)
    if flat.data_ptr() != tensor.data_ptr():
        tensor.copy_(flat.view(tensor.shape))
"""


def nothing() -> None:
    """A launch's start-up alone."""


def per_call(repeat: int) -> dict[str, float]:
    """Seconds per call, median of ``repeat``, of each operation (on every rank alike)."""
    rank, n = dist.get_rank(), dist.get_world_size()
    out: dict[str, float] = {}

    def timed(name: str, op: object) -> None:
        times = []
        for _ in range(repeat):
            dist.barrier()
            start = time.perf_counter()
            op()  # type: ignore[operator]
            times.append(time.perf_counter() - start)
        out[name] = statistics.median(times)

    for label, numel in SIZES.items():
        t = torch.ones(numel)
        timed(f"all_reduce {label}", lambda t=t: dist.all_reduce(t))
    chunk = torch.ones(2**18 // n)

    def p2p_ring() -> None:
        buf = torch.empty_like(chunk)
        for _ in range(2 * (n - 1)):
            sent = dist.isend(chunk, (rank + 1) % n)
            dist.irecv(buf, (rank - 1) % n).wait()
            sent.wait()

    timed("ring of isend/irecv, 1 MB", p2p_ring)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(1000, 1000))
    x = torch.randn(16, 1000)
    timed("DDP step, 1M parameters", lambda: model(x).sum().backward())
    return out


def median_launch(backend: str, world_size: int, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        ranks.launch(nothing, world_size, backend=backend, timeout=60).check()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def ring_check_seconds() -> float | None:
    """The ring check as grading runs it (confined, so on the relay), or None if it cannot."""
    from course.checks import check_ring_allreduce
    from course.grading import sandbox
    from course.grading.rankbox import RankBox
    from course.grading.student import StudentCode

    if not sandbox.available():
        return None
    start = time.perf_counter()
    with RankBox():
        check_ring_allreduce(StudentCode((("ring", RING),), "ring_allreduce"))
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    ranks.warm_up()
    print(f"{args.ranks} ranks, median of {args.repeat}")
    print(f"{'':34} {'gloo':>10} {'relay':>10} {'ratio':>7}")
    row = {b: median_launch(b, args.ranks, args.repeat) for b in ("gloo", "relay")}
    rows = {"launch (start-up)": row}
    calls = {
        b: ranks.launch(per_call, args.ranks, args.repeat, backend=b, timeout=300).check()[0]
        for b in ("gloo", "relay")
    }
    rows |= {name: {b: calls[b][name] for b in calls} for name in calls["gloo"]}
    for name, row in rows.items():
        g, r = row["gloo"], row["relay"]
        print(f"{name:34} {g * 1e3:8.1f} ms {r * 1e3:8.1f} ms {r / g:6.1f}x")
    seconds = ring_check_seconds()
    if seconds is None:
        print("ring check on graded ranks: skipped (needs bubblewrap, setpriv and prlimit)")
    else:
        print(f"ring check on graded ranks (relay, world sizes 2-6): {seconds:.1f} s")


if __name__ == "__main__":
    main()
