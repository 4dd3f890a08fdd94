"""A student's comm hook, kept from crashing DDP: what DDP would reject, said plainly.

DDP hands a hook's future straight to C++: a hook that returns ``None``, a future of a list
or of the wrong shape fails there with an internal assert (or, for ``None``, a segfault).
:func:`guard_hook` wraps the hook so the rank keeps running and the check, or the try-it
cell, can say what was wrong.
"""

# No "from __future__ import annotations": the wrapper is handed to DDP, which compares
# annotations as objects.

import inspect
from typing import Any

import torch
import torch.distributed as dist

from course.checks import teaching
from course.checks.teaching import user_traceback

__all__ = ["guard_hook", "hook_signature_problem"]


def hook_signature_problem(hook: Any) -> str | None:
    """What DDP.register_comm_hook would reject in the hook's signature, said plainly."""
    if not callable(hook):
        return f"reduce_hook should be a function, but it is {type(hook).__name__}."
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    if hook is default_hooks.allreduce_hook:
        return "that is PyTorch's own allreduce_hook: write your own reduce_hook above."
    try:
        params = inspect.signature(hook).parameters
    except (TypeError, ValueError):
        return None
    if list(params)[:2] != ["state", "bucket"]:
        return (
            f"reduce_hook's parameters are {list(params)}; DDP calls hook(state, bucket) and "
            "looks the second one up by its name, so define it as "
            "def reduce_hook(state, bucket: dist.GradBucket)."
        )
    note = params["bucket"].annotation
    if note not in (inspect.Parameter.empty, dist.GradBucket):
        return f"annotate bucket as dist.GradBucket (not {note!r}): DDP rejects other annotations."
    return None


def guard_hook(hook: Any, problems: list[str]) -> Any:
    """Wrap the student's hook: record anything DDP would choke on and keep the run alive."""

    def guarded(state, bucket):  # noqa: ANN001, ANN202 - DDP inspects a hook's annotations
        buffer = bucket.buffer()
        shape, local = buffer.shape, buffer.clone()
        fut = hook(state, bucket)  # an exception here fails the rank with the student's traceback
        if not isinstance(fut, torch._C.Future):  # noqa: SLF001 - work.get_future() gives the C++ base class
            problems.append(
                f"reduce_hook returned {type(fut).__name__}, not a torch.futures.Future. "
                "Return the future of the all-reduce: dist.all_reduce(..., async_op=True)"
                ".get_future(), then .then(...) to turn its value into one tensor."
            )
            return _done(local)

        def value(f: torch.futures.Future) -> torch.Tensor:
            try:
                v = f.value()
            except Exception as exc:  # noqa: BLE001 - the student's code may raise anything
                text = user_traceback(exc)
                hint = teaching.hint_for(text)
                problems.append(f"reduce_hook's future failed{': ' + hint if hint else ''}\n{text}")
                return local
            if isinstance(v, list | tuple):
                problems.append(
                    "reduce_hook's future holds a list of tensors (that is what "
                    "work.get_future() gives); DDP needs a future of ONE tensor. Return "
                    "fut.then(lambda f: f.value()[0]) instead."
                )
                return local
            if not isinstance(v, torch.Tensor) or v.shape != shape:
                is_tensor = isinstance(v, torch.Tensor)
                what = f"shape {tuple(v.shape)}" if is_tensor else type(v).__name__
                problems.append(
                    f"reduce_hook's future holds a {what}, but DDP needs a tensor shaped like "
                    f"bucket.buffer(), {tuple(shape)}."
                )
                return local
            return v

        return fut.then(value)

    return guarded


def _done(t: torch.Tensor) -> torch.futures.Future:
    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result(t)
    return fut
