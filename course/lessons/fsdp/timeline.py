"""When torch's ``fully_shard`` gathers and computes, and what prefetching changes, measured.

Each rank runs a forward and a backward of ``toy_model`` (each layer a unit) under a
``TorchDispatchMode`` that stamps, with ``time.perf_counter``, every op the rank dispatches:
FSDP2's own ranges (``FSDP::all_gather``, ``FSDP::all_gather_copy_out``, ... opened with
``record_function``, named after their unit), the all-gathers' ``c10d`` ops and the layers'
matmuls, and the bytes of unsharded parameters then alive (``fsdp.unsharded_bytes``).

On gloo a collective is queued to gloo's own threads and the rank waits for it in FSDP2's
``wait_for_unshard`` (inside ``all_gather_copy_out``'s turn): a gather issued early (a prefetch)
can run on those threads while the rank computes, but on a machine whose cores the ranks share
there is little spare CPU to run it on; :func:`overlap` says how much of the gathers' time
the rank spent computing instead of waiting.
"""

from __future__ import annotations

import re
import time
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from course.lessons.fsdp.experiment import shard, units, unsharded_bytes
from course.models import toy_model

__all__ = [
    "Timeline",
    "gather_order",
    "overlap",
    "prefetch_on_ranks",
    "prefetch_step",
    "step_seconds",
]

_UNIT = re.compile(r"\((.*)\)$")
_COMPUTE = {"aten.addmm.default", "aten.mm.default"}


class Timeline(TorchDispatchMode):
    """Records ``(what, unit, start, end)`` for FSDP2's ranges and each matmul, and the peak
    of unsharded bytes in the forward and in the backward."""

    def __init__(self, model: nn.Module, memory: bool = True) -> None:
        super().__init__()
        self.model, self.memory, self.events, self.phase = model, memory, [], "forward"
        self.peak = {"forward": 0, "backward": 0}
        self._open: list[tuple[str, str, float] | None] = []  # record_function ranges nest
        self._unit = ""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        if self.memory:
            self.peak[self.phase] = max(self.peak[self.phase], unsharded_bytes(self.model))
        name, start = str(func), time.perf_counter()
        out = func(*args, **(kwargs or {}))
        if name.startswith("profiler._record_function_enter"):
            self._open.append(self._enter(str(args[0]), start))
        elif name.startswith("profiler._record_function_exit") and self._open:
            opened = self._open.pop()
            if opened is not None:
                self.events.append((*opened, time.perf_counter()))
        elif name in _COMPUTE:
            self.events.append(("compute", self._unit, start, time.perf_counter()))
        return out

    def _enter(self, label: str, start: float) -> tuple[str, str, float] | None:
        if not label.startswith("FSDP::"):
            return None
        what, _, rest = label.removeprefix("FSDP::").partition(" ")
        match = _UNIT.search(rest)
        unit = match.group(1) if match else ""
        if what in ("pre_forward", "pre_backward"):
            self._unit = unit
        return what, unit, start


def _model(forward_prefetch: bool | int, width: int) -> nn.Module:
    model = shard(toy_model(width=width, depth=6))
    layers = units(model)
    ahead = int(forward_prefetch)  # True: the next unit; k: the next k units
    for i, layer in enumerate(layers[:-1] if ahead else []):
        layer.set_modules_to_forward_prefetch(layers[i + 1 : i + 1 + ahead])
    return model


def prefetch_step(
    forward_prefetch: bool | int = False, width: int = 256, memory: bool = True
) -> dict[str, Any]:
    """Rank side: the timeline of one forward and backward of torch's ``fully_shard`` on 6
    layers (each a unit), with or without FSDP2's explicit forward prefetch of the next unit
    (``set_modules_to_forward_prefetch``; an int k: of the next k units); backward with no
    switch set. Without ``memory`` no bytes are sampled (the sampling is slower than the ops
    it samples)."""
    model = _model(forward_prefetch, width)
    x = torch.randn(64, width)
    nn.functional.mse_loss(model(x), x).backward()  # once first: FSDP sets itself up
    torch.distributed.barrier()
    timeline = Timeline(model, memory)
    with timeline:
        loss = nn.functional.mse_loss(model(x), x)
        timeline.phase = "backward"
        loss.backward()
    t0 = min(e[2] for e in timeline.events)
    return {
        "events": [(w, u, a - t0, b - t0) for w, u, a, b in timeline.events],
        "peak": timeline.peak,
        "layer": width * width * 4,
    }


def step_seconds(forward_prefetch: bool = False, width: int = 512, repeats: int = 7) -> float:
    """Rank side: the fastest of ``repeats`` forward-and-backward steps, not instrumented,
    each started together on every rank (a barrier) and timed to its end on the slowest."""
    model = _model(forward_prefetch, width)
    x = torch.randn(256, width)
    best = float("inf")
    for _ in range(repeats + 1):  # the first sets FSDP up
        torch.distributed.barrier()
        start = time.perf_counter()
        nn.functional.mse_loss(model(x), x).backward()
        took = torch.tensor([time.perf_counter() - start])
        torch.distributed.all_reduce(took, op=torch.distributed.ReduceOp.MAX)
        best = min(best, float(took))
    return best


def prefetch_on_ranks(world_size: int = 2, **options: Any) -> list[dict[str, Any]]:
    """:func:`prefetch_step` on fresh ranks, one result per rank."""
    from course.ranks import run

    return run(prefetch_step, world_size, timeout=60, **options)


def gather_order(events: list[tuple[str, str, float, float]], phase_end: float) -> list[str]:
    """The order of all-gather issues and compute starts before ``phase_end``, as
    ``"gather <unit>"`` / ``"compute <unit>"`` (consecutive matmuls of a unit once)."""
    order: list[str] = []
    for what, unit, start, _ in sorted(events, key=lambda e: e[2]):
        if start > phase_end or what not in ("all_gather", "compute"):
            continue
        label = f"{'gather' if what == 'all_gather' else 'compute'} {unit}"
        if not order or order[-1] != label:
            order.append(label)
    return order


def overlap(events: list[tuple[str, str, float, float]]) -> dict[str, float]:
    """Seconds the rank spent, summed over units: between issuing each all-gather and copying
    its output out (``window``), in matmuls within those windows (``computing``), and waiting
    in the copy-out's turn, where gloo's gather is waited for (``waiting``)."""
    issued = [(u, a) for w, u, a, _ in events if w == "all_gather"]
    copies = [(u, a, b) for w, u, a, b in events if w == "all_gather_copy_out"]
    window = computing = waiting = 0.0
    used: set[int] = set()
    for unit, start in issued:
        match = next(
            (i for i, c in enumerate(copies) if c[0] == unit and c[1] >= start and i not in used),
            None,
        )
        if match is None:
            continue
        used.add(match)
        _, copy_start, copy_end = copies[match]
        window += copy_start - start
        waiting += copy_end - copy_start
        computing += sum(
            max(0.0, min(b, copy_start) - max(a, start)) for w, _, a, b in events if w == "compute"
        )
    return {"window": window, "computing": computing, "waiting": waiting}
