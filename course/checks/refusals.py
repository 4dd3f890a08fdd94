"""What a grading rank refuses: the torch built-ins that would do an exercise's job.

    launch(trial, n, fn, before=refusing(SAMPLER))   # refused before the job is unpickled

An exercise that asks for ``DistributedSampler``'s indices, DDP's reduction as a comm hook or
DDP's buckets earns nothing when torch computes them. Each :class:`Refusal` makes its built-ins
raise ``AssertionError`` with a message that says what the exercise asks instead, however they
are reached: a Python function's code, a method's too, is swapped in place, so a name imported
earlier, an alias, a wrapper around it, a subclass and a reference found later all reach the
refusal; a function or class method of torch's C++ core is replaced in the modules and the
class that export it. The launcher runs :func:`refusing`'s step on each rank before it
unpickles the job, so before any cell of the student's has run: nothing of theirs holds a
built-in from before. On graded ranks the files the refused code was read from (its source and
bytecode, :func:`refuse`'s return value) are then unreadable (:mod:`course.ranks.isolation`),
so a second copy of a module cannot be imported, nor its source read and run.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
import os
import types
from collections.abc import Callable
from dataclasses import dataclass

__all__ = [
    "DDP_HOOKS",
    "DDP_ITSELF",
    "DDP_RULE",
    "JOIN",
    "SAMPLER",
    "TORCH_ZERO",
    "Refusal",
    "refuse",
    "refusing",
]


@dataclass(frozen=True)
class Refusal:
    """Built-ins to refuse, as ``module:attribute`` (``module:Class.method`` for a method)."""

    names: tuple[str, ...]
    message: str


def _refusing_code(fn: types.FunctionType, message: str) -> types.CodeType:
    """A code object with ``fn``'s free variables that raises ``AssertionError(message)``."""
    free = fn.__code__.co_freevars
    cells = "".join(f"    {name} = None\n" for name in free)
    uses = "".join(f"        {name}\n" for name in free)
    source = (
        f"def _outer():\n{cells}    def _refused(*args, **kwargs):\n{uses}"
        f"        raise AssertionError({message!r})\n    return _refused\n"
    )
    scope: dict[str, object] = {}
    exec(compile(source, __file__, "exec"), scope)  # noqa: S102 - a fixed body built here; a frame of the course's
    code = scope["_outer"]().__code__  # type: ignore[operator]
    assert code.co_freevars == free  # noqa: S101 - the swap below needs the same cells
    return code


def _refuse_one(target: str, message: str) -> list[str]:
    """Refuse one built-in; the files its Python code was read from (none for C++)."""
    module_name, _, path = target.partition(":")
    owner: object = importlib.import_module(module_name)
    *parents, attr = path.split(".")
    for name in parents:
        owner = getattr(owner, name)
    current = inspect.getattr_static(owner, attr, None)
    if current is None:  # not in this torch: nothing to refuse
        return []
    function = getattr(current, "__func__", current)  # a staticmethod's or classmethod's
    if isinstance(function, types.FunctionType):
        # In place: every reference to it, taken before or found later, reaches the refusal.
        files = _code_files(function)
        function.__code__ = _refusing_code(function, message)
        return files

    def refused(*_args: object, **_kwargs: object) -> None:
        raise AssertionError(message)

    setattr(owner, attr, refused)
    return []


def _code_files(function: types.FunctionType) -> list[str]:
    """The source and bytecode files a Python function was read from (none for one this
    module has refused already: its code is this module's)."""
    source = function.__code__.co_filename
    if source == __file__ or not os.path.isfile(source):
        return []
    cached = [importlib.util.cache_from_source(source, optimization=o) for o in ("", 1, 2)]
    return [source, *(c for c in cached if os.path.isfile(c))]


def refuse(*refusals: Refusal) -> list[str]:
    """On a rank: make every built-in named in ``refusals`` raise its message; the files
    their Python code was read from (for the grader to make unreadable there)."""
    files: list[str] = []
    for refusal in refusals:
        for target in refusal.names:
            files += _refuse_one(target, refusal.message)
    return sorted(set(files))


def refusing(*refusals: Refusal) -> Callable[[], list[str]]:
    """The step a launch runs on each rank before its job (``launch(..., before=...)``)."""
    return functools.partial(refuse, *refusals)


_HOOKS = "torch.distributed.algorithms.ddp_comm_hooks"
_FSDP_HOOKS = "torch.distributed.algorithms._comm_hooks.default_hooks"
_FSDP_HOOK_NAMES = (
    "allreduce_hook", "_low_precision_hook", "fp16_compress_hook", "bf16_compress_hook",
    "reduce_scatter_hook",
)  # fmt: skip

DDP_HOOKS = Refusal(
    (
        f"{_HOOKS}.default_hooks:allreduce_hook",
        f"{_HOOKS}.default_hooks:_allreduce_fut",
        f"{_HOOKS}.default_hooks:_compress_hook",
        f"{_HOOKS}.default_hooks:fp16_compress_hook",
        f"{_HOOKS}.default_hooks:bf16_compress_hook",
        f"{_HOOKS}.default_hooks:fp16_compress_wrapper",
        f"{_HOOKS}.default_hooks:bf16_compress_wrapper",
        f"{_HOOKS}.powerSGD_hook:powerSGD_hook",
        f"{_HOOKS}.powerSGD_hook:batched_powerSGD_hook",
        # FSDP's hooks, which all-reduce (or compress and all-reduce) a gradient too
        *(f"{_FSDP_HOOKS}:{name}" for name in _FSDP_HOOK_NAMES),
        # The reducer's own all-reduce of a bucket, which a hook could return as its future.
        "torch._C._distributed_c10d:Reducer._run_allreduce_hook",
        "torch._C._distributed_c10d:Reducer._run_comm_hook",
    ),
    "this calls one of torch's ready-made comm hooks (torch.distributed.algorithms."
    "ddp_comm_hooks): the exercise is to write the hook's communication and arithmetic "
    "yourself, with dist.all_reduce(..., async_op=True) and a future, so it earns none of its "
    "points",
)
DDP_RULE = Refusal(
    (
        "torch.distributed:_compute_bucket_assignment_by_size",
        "torch._C._distributed_c10d:_compute_bucket_assignment_by_size",
        # DDP and its C++ reducer, which apply the rule (and report the buckets it made)
        "torch.nn.parallel:DistributedDataParallel.__init__",
        "torch._C._distributed_c10d:Reducer.__init__",
    ),
    "this asks torch for DDP's bucket assignment (dist._compute_bucket_assignment_by_size): the "
    "exercise is to group the gradients yourself, by the rule you measured",
)
DDP_ITSELF = Refusal(
    (
        "torch.nn.parallel:DistributedDataParallel.__init__",
        # DDP's C++ core, which buckets and all-reduces from autograd hooks on its own
        "torch._C._distributed_c10d:Reducer.__init__",
    ),
    "this wraps the module in torch's DistributedDataParallel: OverlappingDDP is the exercise of "
    "doing DDP's bucketing and overlap yourself, with gradient hooks and async all-reduces",
)
SAMPLER = Refusal(
    (
        "torch.utils.data:DistributedSampler.__init__",
        "torch.utils.data:DistributedSampler.__iter__",
    ),
    "this uses torch's DistributedSampler: the exercise is to compute its indices yourself "
    "(padding, dealing round robin, the shuffle's seed), so it earns none of its points",
)
TORCH_ZERO = Refusal(
    (
        "torch.distributed.optim:ZeroRedundancyOptimizer.__init__",
        "torch.distributed.optim:ZeroRedundancyOptimizer.step",
    ),
    "this builds torch's ZeroRedundancyOptimizer: the exercise is a ZeRO-2 optimizer of your own, "
    "on your reduce_scatter and all_gather",
)
_DDP = "torch.nn.parallel.distributed"
JOIN = Refusal(
    (
        # Join itself: a subclass with an __init__ of its own still inherits the rest
        *(
            f"torch.distributed.algorithms.join:Join.{method}"
            for method in ("__init__", "__enter__", "__exit__", "_get_num_nonjoined_procs")
        ),
        # DDP's join hook, which shadows the collectives of a rank that ran out of data
        *(f"{_DDP}:_DDPJoinHook.{method}" for method in ("__init__", "main_hook", "post_hook")),
        *(
            f"{_DDP}:DistributedDataParallel.{method}"
            for method in (
                "join",
                "join_hook",
                "_match_all_reduce_for_bwd_pass",
                "_check_global_requires_backward_grad_sync",
                "_sync_final_model",
            )
        ),
    ),
    "this exercise asks for the loop without Join: agree each step, with one small collective "
    "(an all-reduce of a 'have I a batch?' flag), whether any rank still has data; a rank that "
    "has run out still runs a forward and backward with its loss multiplied by 0 and steps its "
    "optimizer, until no rank has data (question accumulation_6 shows what Join does)",
)
