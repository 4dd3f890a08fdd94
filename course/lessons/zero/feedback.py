"""Grade a student's error-feedback fp16 comm hook: it trains like fp32 where plain fp16 fails.

    from course.checks import check_error_feedback_hook
    print(check_error_feedback_hook(ef_fp16_hook))

Error feedback (Seide et al. 2014, "1-bit SGD"; Karimireddy et al. 2019, "Error feedback
fixes SignSGD") adds what the last compression dropped to the next gradient before
compressing it. The check trains ``nn.Linear(8, 1)`` with SGD under DDP on 2 fresh ranks,
once without a hook, once with ``fp16_compress_hook``, once with the student's hook (its
``state`` is a dict it may keep residuals in), with gradients of about 1e-8, too small for
plain fp16 compression to move the weights. Each rank's input is made here from a
fresh seed, and each rank is sent its own only (the baselines train on the same inputs, on
ranks of their own). The weights come back; the verdict is made here. So is the hook's
traffic: in the whole run a rank may send no more than the fp16 gradient each step
(:data:`WIRE_BYTES` an element) and DDP's set-up, read from the relay's record under grading
(every message of the run, no mark the rank could move bounding it) and from the rank's
recorder in a notebook, so that an all-reduce in float32 earns nothing however closely it
trains.
"""

# No "from __future__ import annotations": the hook wrapper is handed to DDP, which
# compares annotations as objects.

import math
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from course.checks.compare import fresh_seed, rank_generators
from course.checks.refusals import DDP_HOOKS, refusing
from course.checks.teaching import TIMEOUT, need_function, on_ranks, on_recorded_ranks, teaches
from course.ranks import PerRank
from course.ring.recorder import Recorder
from course.ring.relayed import bytes_sent

__all__ = ["check_error_feedback_hook", "runs"]

STEPS = 200
TOLERANCE = 0.05  # of the fp32 run's displacement: one float16 quantum in 200 steps is ~1%
WIDTH = 8  # the model's weights: nn.Linear(WIDTH, 1, bias=False)
WIRE_BYTES = 2  # bytes a rank may send per gradient element per step: float16's
WIRE_SLACK = 256  # bytes beyond them in a whole run: DDP's set-up (88 B) and bucket order


def _inputs(seed: int, world_size: int = 2) -> list[torch.Tensor]:
    """Every rank's x, made by the checker: 8 values between 1 and 2, times 1 to 2, so the
    averaged gradients stay as small as in the notebook's run."""
    return [
        (1 + torch.rand(1, 8, generator=g)) * (1 + torch.rand(1, generator=g))
        for g in rank_generators(seed, world_size)
    ]


def _train(hook: Any, scale: float, steps: int, x: torch.Tensor | None = None) -> torch.Tensor:
    """On each rank: SGD on loss ``scale * (w . x)``, so every step's gradient is ``scale * x``.

    ``x`` is this rank's input as the checker sent it; by default ``linspace(1, 2)`` times
    ``1 + rank``.
    """
    if x is None:
        x = torch.linspace(1.0, 2.0, WIDTH).reshape(1, WIDTH) * (1 + dist.get_rank())
    model = nn.Linear(WIDTH, 1, bias=False)
    nn.init.zeros_(model.weight)
    ddp = nn.parallel.DistributedDataParallel(model)
    if hook is not None:
        ddp.register_comm_hook({} if hook != "fp16" else dist.group.WORLD, _pick(hook))
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    for _ in range(steps):
        optimizer.zero_grad()
        (scale * ddp(x).sum()).backward()
        optimizer.step()
    return model.weight.detach().reshape(-1).clone()


def _pick(hook: Any) -> Any:
    if hook == "fp16":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        return default_hooks.fp16_compress_hook
    return hook


def runs(hook: Any, scale: float = 1e-8, steps: int = STEPS) -> dict[str, torch.Tensor]:
    """On each rank: the weights after training without a hook, with fp16, with ``hook``."""
    return baselines(scale, steps) | {"yours": _train(hook, scale, steps)}


def baselines(
    scale: float = 1e-8, steps: int = STEPS, x: torch.Tensor | None = None
) -> dict[str, torch.Tensor]:
    """On each rank: the weights after training without a hook, and with plain fp16."""
    return {"fp32": _train(None, scale, steps, x), "fp16": _train("fp16", scale, steps, x)}


def _yours(hook: Any, scale: float, steps: int, x: torch.Tensor) -> dict[str, Any]:
    """On each rank: the weights after training with ``hook``, and the bytes of the
    collectives the run made, as the rank's recorder saw them (DDP's set-up included, as in
    the relay's record)."""
    with Recorder() as seen:
        yours = _train(hook, scale, steps, x)
    return {"yours": yours, "sent": sum(c.nbytes for c in seen.collectives if c.name != "barrier")}


@teaches
def check_error_feedback_hook(hook: Any, scale: float = 1e-8, seed: int | None = None) -> str:
    """The student's hook trains within TOLERANCE of fp32, at gradients plain fp16 loses."""
    need_function("ef_fp16_hook", hook)
    seed = fresh_seed(seed)
    xs = PerRank(_inputs(seed))
    # The baselines on ranks of their own, which never see the student's code.
    base = on_ranks("the fp32 and fp16 baselines", baselines, 2, scale, STEPS, xs)
    args = (hook, scale, STEPS, xs)
    results, relayed = on_recorded_ranks(
        "ef_fp16_hook", _yours, 2, *args, timeout=TIMEOUT, before=refusing(DDP_HOOKS)
    )
    _judge_wire(results, relayed)
    for rank, run in enumerate(r | b for r, b in zip(results, base, strict=True)):
        moved = run["fp32"].abs().max().item()
        err = (run["yours"] - run["fp32"]).abs().max().item() / moved
        if math.isnan(err):
            err = float("inf")
        if err > TOLERANCE:
            plain = (run["fp16"] - run["fp32"]).abs().max().item() / moved
            hint = (
                "keep the error, corrected - compressed.float(), in state (per bucket.index()) "
                "and add it to the next step's gradient before compressing; and make the "
                "future's value the average over ranks (the sum / world_size) as float32"
            )
            raise AssertionError(
                f"on rank {rank} (seed {seed}), after {STEPS} SGD steps with gradients of "
                f"about {scale:g}, your weights differ from fp32 training by {err:.1%} of how "
                "far fp32 moved them "
                f"(tolerance {TOLERANCE:.0%}; plain fp16 compression: {plain:.0%}): {hint}."
            )
    return (
        f"ef_fp16_hook trains within {TOLERANCE:.0%} of fp32 over {STEPS} steps with gradients "
        f"of {scale:g}, where plain fp16 compression does not move the weights at all."
    )


def _judge_wire(results: list[dict[str, Any]], relayed: tuple) -> None:
    """Fail unless every rank sent at most float16's bytes of its gradient each step, read
    from the relay's record under grading (from the rank's recorder in a notebook)."""
    allowed = WIRE_BYTES * WIDTH * STEPS + WIRE_SLACK
    for rank, run in enumerate(results):
        try:
            sent = bytes_sent(relayed, rank) if relayed else int(run["sent"])
        except (KeyError, TypeError, ValueError):
            raise AssertionError(f"rank {rank}'s traffic could not be read") from None
        if sent > allowed:
            raise AssertionError(
                f"on rank {rank}, your hook sent {sent} bytes in {STEPS} steps, "
                f"{sent / (WIDTH * STEPS):.1f} bytes a gradient element a step: the exercise "
                f"compresses to float16, {WIRE_BYTES} bytes an element (at most {allowed} "
                "bytes in all). All-reduce the compressed tensor (float16), not the gradient "
                "itself."
            )
