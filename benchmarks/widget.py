"""How long does one step of the ring widget take on the Python side?

    .venv/bin/python benchmarks/widget.py            # N = 4, 8, 16, 32

Times ``RingWidget.show(step)`` (compute the step's drawing data, then one ``batch_update``
of the FigureWidget plus the status and report panels) over every step, cold (first visit,
frame computed) and warm (frame cached). The target is at most 30 ms per step for N = 16.
No browser is attached, so this is the kernel's share of a frame, not the repaint.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

from course.pictures.widgets import RingWidget
from course.ring.trace import ring_trace


def per_step_ms(widget: RingWidget, clock: Callable[[], float] = time.process_time) -> list[float]:
    """Milliseconds of each ``show(step)`` call over the whole trace."""
    out = []
    for step in range(widget.view.last + 1):
        t0 = clock()
        widget.show(step)
        out.append((clock() - t0) * 1000)
    return out


def main() -> None:
    print("ms per step: CPU (process time) cold and warm; wall clock is noisy on a busy machine")
    head = ("N", "numel", "steps", "cold median", "cold p90", "warm median", "wall median")
    print("{:>3} {:>6} {:>5} {:>12} {:>9} {:>12} {:>12}".format(*head))
    for n in (4, 8, 16, 32):
        numel = 3 * n + 1
        widget = RingWidget(ring_trace(n, numel, 4))
        widget.show(0)  # first call pays for imports and validator set-up
        cold, warm = per_step_ms(widget), per_step_ms(widget)
        wall = per_step_ms(widget, time.perf_counter)
        p90 = statistics.quantiles(cold, n=10)[-1]
        print(
            f"{n:>3} {numel:>6} {widget.view.last:>5} {statistics.median(cold):>10.1f}ms"
            f" {p90:>7.1f}ms {statistics.median(warm):>10.1f}ms"
            f" {statistics.median(wall):>10.1f}ms"
        )


if __name__ == "__main__":
    main()
