"""What a grading rank refuses: the torch built-ins that would do an exercise's job.

    refuse(SAMPLER)          # on the rank, before the student's code is called

An exercise that asks for ``DistributedSampler``'s indices, DDP's reduction as a comm hook or
DDP's buckets earns nothing when torch computes them. Each :class:`Refusal` makes its built-ins
raise ``AssertionError`` with a message that says what the exercise asks instead, however they
are reached: a Python function's code is swapped in place, so a name imported earlier, an alias
or a wrapper around it all reach the refusal; a class's methods are replaced on the class, so a
subclass inherits the refusal; a function of torch's C++ core is replaced in the modules that
export it. What a refusal does not stop is said in the README ("Not defended"): code that
copied a built-in's code or source before it ran.
"""

from __future__ import annotations

import importlib
import types
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


def _refuse_one(target: str, message: str) -> None:
    module_name, _, path = target.partition(":")
    owner: object = importlib.import_module(module_name)
    *parents, attr = path.split(".")
    for name in parents:
        owner = getattr(owner, name)
    current = getattr(owner, attr, None)
    if current is None:  # not in this torch: nothing to refuse
        return
    if isinstance(current, types.FunctionType) and not isinstance(owner, type):
        current.__code__ = _refusing_code(current, message)
        return

    def refused(*_args: object, **_kwargs: object) -> None:
        raise AssertionError(message)

    setattr(owner, attr, refused)


def refuse(*refusals: Refusal) -> None:
    """On a grading rank: make every built-in named in ``refusals`` raise its message."""
    for refusal in refusals:
        for target in refusal.names:
            _refuse_one(target, refusal.message)


_HOOKS = "torch.distributed.algorithms.ddp_comm_hooks"

DDP_HOOKS = Refusal(
    (
        f"{_HOOKS}.default_hooks:allreduce_hook",
        f"{_HOOKS}.default_hooks:_allreduce_fut",
        f"{_HOOKS}.default_hooks:fp16_compress_hook",
        f"{_HOOKS}.default_hooks:bf16_compress_hook",
        f"{_HOOKS}.default_hooks:fp16_compress_wrapper",
        f"{_HOOKS}.default_hooks:bf16_compress_wrapper",
        f"{_HOOKS}.powerSGD_hook:powerSGD_hook",
        f"{_HOOKS}.powerSGD_hook:batched_powerSGD_hook",
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
    ),
    "this asks torch for DDP's bucket assignment (dist._compute_bucket_assignment_by_size): the "
    "exercise is to group the gradients yourself, by the rule you measured",
)
DDP_ITSELF = Refusal(
    ("torch.nn.parallel:DistributedDataParallel.__init__",),
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
    ("torch.distributed.optim:ZeroRedundancyOptimizer.__init__",),
    "this builds torch's ZeroRedundancyOptimizer: the exercise is a ZeRO-2 optimizer of your own, "
    "on your reduce_scatter and all_gather",
)
JOIN = Refusal(
    (
        "torch.distributed.algorithms.join:Join.__init__",
        "torch.distributed.algorithms.join:Join.__enter__",
    ),
    "this exercise asks for the loop without Join: agree each step, with one small collective "
    "(an all-reduce of a 'have I a batch?' flag), whether any rank still has data; a rank that "
    "has run out still runs a forward and backward with its loss multiplied by 0 and steps its "
    "optimizer, until no rank has data (question accumulation_6 shows what Join does)",
)
