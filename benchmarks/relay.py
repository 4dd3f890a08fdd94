"""Benchmark: what the relay (every message through the caller) costs against gloo.

    .venv/bin/python benchmarks/relay.py                 # 4 ranks; median of 3 runs
    .venv/bin/python benchmarks/relay.py --ranks 2 --repeat 5

The same launches on both backends, from a warm forkserver, unconfined: a launch that does
nothing (start-up: gloo's rendezvous against the relay's sockets), then inside one launch
the time per call of an all-reduce at 1 KB, 1 MB and 16 MB, a ring's 2(N-1) point-to-point
steps on 1 MB, and one DDP step of a 1M-parameter model. Then three checks on a model
solution, in a notebook (gloo) and as grading runs them (confined, on the relay, needs root
and bubblewrap; skipped otherwise): the ring check (world sizes 2 to 6), and the ZeRO and
FSDP memory checks, which graded train a larger model and measure it from outside.
Figures only; no assertions: they depend on the machine and on whatever else it is doing.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import time
from pathlib import Path

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


TESTS = Path(__file__).resolve().parent.parent / "tests" / "catalogues"
# label: (the check, as lesson.name, the code it grades, the name it is handed)
CHECKS = {
    "ring check (world sizes 2-6)": (
        "ring_allreduce.check_ring_allreduce",
        lambda: RING,
        "ring_allreduce",
    ),
    "ZeRO memory check (4 ranks)": (
        "zero.check_zero_memory",
        lambda: (TESTS / "halves_impls.py").read_text().split("\nclass FullStateZero")[0],
        "ZeroOptimizer",
    ),
    "FSDP memory check (2 ranks)": (
        "fsdp.check_fsdp_memory",
        (TESTS / "fsdp_impls.py").read_text,
        "fully_shard",
    ),
}


def check_seconds(check: str, source: str, name: str) -> tuple[float, float | None]:
    """A check on the model solution: in a notebook (gloo), and as grading runs it
    (confined, so on the relay, its memory measured from outside), or None if it cannot."""
    from course.grading import sandbox
    from course.grading.rankbox import RankBox
    from course.grading.student import StudentCode

    lesson, _, check_name = check.partition(".")
    check_fn = getattr(importlib.import_module(f"course.lessons.{lesson}"), check_name)
    namespace: dict = {"__name__": "__main__"}
    exec(source, namespace)  # noqa: S102 - the course's own model solution
    start = time.perf_counter()
    check_fn(namespace[name])
    notebook = time.perf_counter() - start
    if not sandbox.available():
        return notebook, None
    with RankBox():
        start = time.perf_counter()
        check_fn(StudentCode(((name, source),), name))
    return notebook, time.perf_counter() - start


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
    print(f"\n{'':34} {'notebook':>10} {'graded':>10} {'ratio':>7}")
    for label, (check, source, name) in CHECKS.items():
        notebook, graded = check_seconds(check, source(), name)
        if graded is None:
            print(f"{label:34} {notebook:8.1f} s   graded: skipped (needs bubblewrap)")
        else:
            print(f"{label:34} {notebook:8.1f} s {graded:8.1f} s {graded / notebook:6.1f}x")


if __name__ == "__main__":
    main()
