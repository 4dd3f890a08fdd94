"""Graded checks for the DDP assignment: an averaging comm hook, and a loss for uneven batches.

Each check runs the student's function on fresh gloo ranks (fresh random data each call),
compares with an oracle (DDP's own averaging; a single-process run on the pooled data), and
fails with an ``AssertionError`` that says what was wrong and what to try. The diagnosis runs
in the caller on plain data the ranks send back; a crash or a deadlock in the student's code
comes back as the student's own traceback.
"""

# No "from __future__ import annotations": the hook wrapper below is handed to DDP, which
# compares annotations as objects.

import copy
import inspect
import random
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from course.checks import teaching
from course.checks.teaching import teaches

__all__ = ["check_average_hook", "check_weighted_loss", "guard_hook"]

TIMEOUT = 30.0  # seconds per launch; DDP's first construction on a rank imports torch._dynamo
RTOL, ATOL = 1e-4, 1e-5


# --- helpers shared with course.checks.buckets ------------------------------------


def on_ranks(name: str, fn: Callable[..., Any], world_size: int, *args: Any) -> list[Any]:
    """Run ``fn`` on fresh ranks with this module's deadline (``course.checks.teaching``)."""
    return teaching.on_ranks(name, fn, world_size, *args, timeout=TIMEOUT)


def user_traceback(exc: BaseException) -> str:
    """The traceback of an exception raised by student code, without the checker's frame."""
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__.tb_next))


def fresh_seed(seed: int | None) -> int:
    """A new random seed unless one is given (failure messages print it to replay a case)."""
    return random.randrange(2**31) if seed is None else seed


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two gradients agree to float32 tolerance."""
    return a.shape == b.shape and torch.allclose(a, b, rtol=RTOL, atol=ATOL)


def ratio(got: torch.Tensor, want: torch.Tensor) -> float | None:
    """The constant factor ``got / want``, if there is one (else None)."""
    mask = want.abs() > 1e-3
    if got.shape != want.shape or not mask.any():
        return None
    r = got[mask] / want[mask]
    return r.median().item() if torch.allclose(r, r.median(), rtol=1e-3) else None


def near(x: float | None, target: float) -> bool:
    return x is not None and abs(x - target) <= 1e-3 * max(1.0, abs(target))


# --- exercise (a): an averaging comm hook -----------------------------------------


def _hook_signature_problem(hook: Any) -> str | None:
    """What DDP.register_comm_hook would reject in the hook's signature, said plainly."""
    if not callable(hook):
        return f"average_hook should be a function, but it is {type(hook).__name__}."
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    if hook is default_hooks.allreduce_hook:
        return "that is PyTorch's own allreduce_hook: write your own average_hook above."
    try:
        params = inspect.signature(hook).parameters
    except (TypeError, ValueError):
        return None
    if list(params)[:2] != ["state", "bucket"]:
        return (
            f"average_hook's parameters are {list(params)}; DDP calls hook(state, bucket) and "
            "looks the second one up by its name, so define it as "
            "def average_hook(state, bucket: dist.GradBucket)."
        )
    note = params["bucket"].annotation
    if note not in (inspect.Parameter.empty, dist.GradBucket):
        return f"annotate bucket as dist.GradBucket (not {note!r}): DDP rejects other annotations."
    return None


def guard_hook(hook: Any, problems: list[str]) -> Any:
    """Wrap the student's hook: record anything DDP would choke on and keep the run alive."""

    def guarded(state, bucket):  # no annotations: DDP inspects them
        buffer = bucket.buffer()
        shape, local = buffer.shape, buffer.clone()
        fut = hook(state, bucket)  # an exception here fails the rank with the student's traceback
        if not isinstance(fut, torch._C.Future):  # work.get_future() gives the C++ base class
            problems.append(
                f"average_hook returned {type(fut).__name__}, not a torch.futures.Future. "
                "Return the future of the all-reduce: dist.all_reduce(..., async_op=True)"
                ".get_future(), then .then(...) to turn its value into one tensor."
            )
            return _done(local)

        def value(f: torch.futures.Future) -> torch.Tensor:
            try:
                v = f.value()
            except Exception as exc:
                text = user_traceback(exc)
                hint = teaching.hint_for(text)
                problems.append(
                    f"average_hook's future failed{': ' + hint if hint else ''}\n{text}"
                )
                return local
            if isinstance(v, list | tuple):
                problems.append(
                    "average_hook's future holds a list of tensors (that is what "
                    "work.get_future() gives); DDP needs a future of ONE tensor. Return "
                    "fut.then(lambda f: f.value()[0]) instead."
                )
                return local
            if not isinstance(v, torch.Tensor) or v.shape != shape:
                is_tensor = isinstance(v, torch.Tensor)
                what = f"shape {tuple(v.shape)}" if is_tensor else type(v).__name__
                problems.append(
                    f"average_hook's future holds a {what}, but DDP needs a tensor shaped like "
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


def _hook_model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 8), nn.Tanh(), nn.Linear(8, 3))


def _hook_trial(hook: Any, seed: int, steps: int) -> dict[str, Any]:
    """On each rank: the student's hook and DDP's default side by side, for ``steps`` steps."""
    rank = dist.get_rank()
    model = _hook_model(seed)
    plain = copy.deepcopy(model)  # local gradients, no DDP
    student = DDP(model, bucket_cap_mb=0.0005)  # ~500 bytes: several buckets from step 2 on
    default = DDP(copy.deepcopy(model), bucket_cap_mb=0.0005)
    problems: list[str] = []
    student.register_comm_hook(None, guard_hook(hook, problems))
    gen = torch.Generator().manual_seed(seed * 1009 + rank)
    out = []
    for _ in range(steps):
        x = torch.randn(1 + rank, 6, generator=gen)
        grads = []
        for m in (student, default, plain):
            m.zero_grad()
            m(x).square().sum().backward()
            grads.append([p.grad.detach().clone() for p in m.parameters()])
        out.append(dict(zip(("student", "default", "local"), grads, strict=True)))
        if problems:
            break
    return {"rank": rank, "problems": problems, "steps": out}


@teaches
def check_average_hook(
    average_hook: Callable[..., Any], world_sizes: Sequence[int] = (2, 3), seed: int | None = None
) -> str:
    """Check a comm hook on fresh ranks: .grad must equal what DDP's default gives."""
    problem = _hook_signature_problem(average_hook)
    if problem:
        raise AssertionError(problem)
    for world_size in world_sizes:
        s = fresh_seed(seed)
        results = on_ranks("average_hook", _hook_trial, world_size, average_hook, s, 2)
        for r in results:
            if r["problems"]:
                raise AssertionError(f"On rank {r['rank']} of {world_size}: {r['problems'][0]}")
        for r in results:
            for step, grads in enumerate(r["steps"]):
                _diagnose_hook(grads, r["rank"], world_size, step, s)
    return f"average_hook matches DDP's averaged gradients on {list(world_sizes)} ranks."


def _diagnose_hook(
    grads: dict[str, list], rank: int, world_size: int, step: int, seed: int
) -> None:
    where = f"rank {rank} of {world_size}, step {step + 1} (seed {seed})"
    for i, (got, want, local) in enumerate(
        zip(grads["student"], grads["default"], grads["local"], strict=True)
    ):
        if close(got, want):
            continue
        r = ratio(got, want)
        if near(r, world_size):
            hint = (
                f"it is world_size ({world_size}) times too large: that is the SUM over ranks. "
                "Divide by dist.get_world_size() to get the average, as DDP does."
            )
        elif near(r, 1 / world_size):
            hint = f"it is world_size ({world_size}) times too small: you divided twice."
        elif close(got, local):
            hint = (
                "it is this rank's own local gradient, not synced: the hook must all-reduce "
                "bucket.buffer() and return a future of the result."
            )
        else:
            hint = f"expected {_show(want)}, got {_show(got)}."
        raise AssertionError(f"parameter {i} ({tuple(want.shape)}) on {where}: {hint}")


def _show(t: torch.Tensor, n: int = 4) -> str:
    flat = t.flatten()[:n].tolist()
    return "[" + ", ".join(f"{v:.4g}" for v in flat) + (", ...]" if t.numel() > n else "]")


# --- exercise (b): a loss whose synced gradient is the pooled per-sample mean ------


def _local_batch_sizes(world_size: int, seed: int) -> list[int]:
    """Unequal local batch sizes: at least two different sizes among the ranks."""
    rng = random.Random(seed)
    sizes = [rng.randint(1, 5) for _ in range(world_size)]
    if len(set(sizes)) == 1:
        sizes[0] = sizes[0] % 5 + 1
    return sizes


def _weighted_trial(weighted_loss: Any, sizes: list[int], seed: int) -> dict[str, Any]:
    """On each rank: DDP step with the student's loss on ``sizes[rank]`` samples, and oracles."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    gen = torch.Generator().manual_seed(seed)
    n = sum(sizes)
    x, y = torch.randn(n, 4, generator=gen), torch.randn(n, 2, generator=gen)
    lo = sum(sizes[:rank])
    torch.manual_seed(seed)
    model = nn.Linear(4, 2)
    oracle = copy.deepcopy(model)
    ddp = DDP(model)

    def per_sample(m: nn.Module, xs: torch.Tensor, ys: torch.Tensor) -> torch.Tensor:
        return (m(xs) - ys).square().mean(dim=1)

    result: dict[str, Any] = {"rank": rank, "sizes": sizes, "problem": None}
    losses = per_sample(ddp, x[lo : lo + sizes[rank]], y[lo : lo + sizes[rank]])
    try:
        loss = weighted_loss(losses)
    except Exception as exc:
        result["problem"] = f"weighted_loss raised an exception:\n{user_traceback(exc)}"
        return result
    result["problem"] = _loss_problem(loss, sizes[rank])
    if result["problem"]:
        return result
    loss.backward()
    result["student"] = [p.grad.clone() for p in model.parameters()]

    def grad_of(loss_value: torch.Tensor) -> list[torch.Tensor]:
        oracle.zero_grad()
        loss_value.backward()
        return [p.grad.clone() for p in oracle.parameters()]

    result["pooled"] = grad_of(per_sample(oracle, x, y).mean())
    bounds = [(sum(sizes[:r]), sum(sizes[: r + 1])) for r in range(world_size)]
    means = [grad_of(per_sample(oracle, x[a:b], y[a:b]).mean()) for a, b in bounds]
    result["flat"] = [sum(g) / world_size for g in zip(*means, strict=True)]
    return result


def _loss_problem(loss: Any, count: int) -> str | None:
    if loss is None:
        return "weighted_loss returned None: implement it above and return the loss tensor."
    if not isinstance(loss, torch.Tensor):
        return f"weighted_loss should return a tensor, but it returned {type(loss).__name__}."
    if loss.numel() != 1:
        return (
            f"weighted_loss returned a tensor of shape {tuple(loss.shape)} for {count} samples; "
            "return one number (a 0-d tensor) that backward() can start from."
        )
    if not loss.requires_grad:
        return (
            "weighted_loss returned a tensor that does not require grad: compute it from "
            "loss_per_sample (not from .item() or a new tensor), so backward reaches the model."
        )
    return None


@teaches
def check_weighted_loss(
    weighted_loss: Callable[[torch.Tensor], torch.Tensor],
    world_sizes: Sequence[int] = (2, 3),
    seed: int | None = None,
) -> str:
    """Check on ranks with unequal batches that .grad after DDP equals the pooled mean gradient."""
    for world_size in world_sizes:
        s = fresh_seed(seed)
        sizes = _local_batch_sizes(world_size, s)
        results = on_ranks("weighted_loss", _weighted_trial, world_size, weighted_loss, sizes, s)
        for r in results:
            if r["problem"]:
                raise AssertionError(f"On rank {r['rank']} of {world_size}: {r['problem']}")
        for r in results:
            _diagnose_weighted(r, world_size, s)
    return f"weighted_loss gives the pooled per-sample mean gradient on {list(world_sizes)} ranks."


def _diagnose_weighted(r: dict[str, Any], world_size: int, seed: int) -> None:
    sizes, n = r["sizes"], sum(r["sizes"])
    where = f"rank {r['rank']} of {world_size}, local batch sizes {sizes} (seed {seed})"
    for got, want, flat in zip(r["student"], r["pooled"], r["flat"], strict=True):
        if close(got, want):
            continue
        k = ratio(got, want)
        if close(got, flat):
            hint = (
                "this is DDP's flat average of the ranks' local means (what "
                "loss_per_sample.mean() gives): every rank counts the same whatever its batch "
                "size. Weight each rank by its share of all the samples instead: all-reduce the "
                "sample count."
            )
        elif near(k, 1 / world_size):
            hint = (
                f"it is world_size ({world_size}) times too small: DDP still divides the summed "
                "gradients by world_size after your loss; multiply by dist.get_world_size()."
            )
        elif near(k, world_size):
            hint = f"it is world_size ({world_size}) times too large."
        elif near(k, n / world_size) or near(k, n):
            hint = (
                f"it is off by a factor {k:.3g}, the batch ratio ({n} samples over "
                f"{world_size} ranks): divide the summed loss by the total sample count."
            )
        else:
            hint = f"expected {_show(want)}, got {_show(got)}."
        raise AssertionError(f".grad does not equal the pooled per-sample mean on {where}: {hint}")
