"""Bus bandwidth of the reference ring against gloo's own all_reduce, and the simulator's speed.

    .venv/bin/python benchmarks/ring.py [--iters 5]

busbw = size x 2(N-1)/N / time, as nccl-tests reports it (see course.ring.bandwidth, which does
the timing). Ranks run one compute thread each (course.ranks), as in class.
"""

from __future__ import annotations

import argparse
import time

import torch.distributed as dist

from course.instructor.reference import ring_allreduce
from course.ring.bandwidth import measure_busbw
from course.ring.schedule import simulate

SIZES_MB = (1, 16, 64)
WORLD_SIZES = (2, 4)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=5)
    args = parser.parse_args()
    print(f"{'N':>2} {'size':>6} {'ring GB/s':>10} {'gloo GB/s':>10} {'ring/gloo':>9}")
    contenders = {"ring": ring_allreduce, "gloo": dist.all_reduce}
    for n in WORLD_SIZES:
        rows = measure_busbw(contenders, n, SIZES_MB, args.iters, timeout=600)
        for mb in SIZES_MB:
            ring, gloo = (r for r in rows if r.megabytes == mb)
            ratio = ring.gbps / gloo.gbps
            print(f"{n:>2} {mb:>4}MB {ring.gbps:>10.2f} {gloo.gbps:>10.2f} {ratio:>8.2f}x")
    start = time.perf_counter()
    for _state in simulate(1024, 2**20):
        pass
    print(f"simulator: N=1024, 1M elements, 2046 steps in {time.perf_counter() - start:.2f} s")


if __name__ == "__main__":
    main()
