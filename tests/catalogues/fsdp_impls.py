"""The model solution of the FSDP exercise, written as a student would in a notebook cell.

``fully_shard(module, *, param_dtype=None, reduce_dtype=None)``: the managed parameters of
``module`` flattened into one padded float32 tensor, rank r keeping its slice as
``module.flat_shard``; a forward pre-hook all-gathers them and puts views of the gathered
tensor in place of every original parameter (tied names included), a forward hook frees
the gathered storage, a backward pre-hook gathers again, and a post-accumulate-grad hook on
the gathered leaf reduce-scatters its gradient (averaged) into ``flat_shard.grad`` and frees
it. Knobs (all off in the model solution) make the known-wrong ones of ``wrong_fsdp``.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import nn

KNOBS = {
    "average": True,  # divide the reduce-scattered gradient by world_size
    "tie_all_names": True,  # replace a tied weight under every name it has
    "skip_frozen": True,  # leave requires_grad=False parameters alone
    "free_after_forward": True,
    "regather": True,  # gather again before backward (else keep the forward's parameters)
    "dummy_gather": False,  # without regather: an all-gather before backward, its result unused
    "pad": True,  # shards of ceil(P / N); else floor, the remainder dropped
    "reduce_in_param_dtype": False,  # bf16 reduce-scatter under mixed precision
    "divide_in_param_dtype": False,  # under mixed precision, average in bf16, then reduce in fp32
    "master_in_param_dtype": False,  # the flat_shard itself in bf16 under mixed precision
    "hang_on_last_rank": False,  # the last rank waits for a message: a deadlock
    "free_after_backward": True,
    "honour_param_dtype": True,  # else gather and compute in float32 whatever is asked
    "count_tied_once": True,  # else a tied weight takes two slices of the flat parameters
}


def _modules(module):
    """``module`` and its submodules, none inside one already fully_shard'ed."""
    yield module
    for child in module.children():
        if not hasattr(child, "flat_shard"):
            yield from _modules(child)


def _managed(module):
    """(owner module, name, parameter) for every name of each managed parameter, and the
    distinct parameters in order of first appearance."""
    places, order = [], []
    for mod in _modules(module):
        for name, p in list(mod._parameters.items()):  # noqa: SLF001 - as FSDP does
            if p is None or (mod is module and name == "flat_shard"):
                continue
            if not p.requires_grad and KNOBS["skip_frozen"]:
                continue
            places.append((mod, name, p))
            if all(p is not q for q in order) or not KNOBS["count_tied_once"]:
                order.append(p)
    return places, order


def fully_shard(module, *, param_dtype=None, reduce_dtype=None):  # noqa: C901, PLR0915 - a student's cell: the hooks are closures over its state
    """Shard ``module``'s managed parameters over the default group (see the module doc)."""
    n, rank = dist.get_world_size(), dist.get_rank()
    places, order = _managed(module)
    if not KNOBS["tie_all_names"]:
        seen, kept = set(), []
        for mod, name, p in places:
            if id(p) not in seen:
                kept.append((mod, name, p))
                seen.add(id(p))
        places = kept
    total = sum(p.numel() for p in order)
    s = math.ceil(total / n)
    flat = torch.zeros(n * s)
    flat[:total] = torch.cat([p.detach().float().reshape(-1) for p in order])
    # Unpadded: uneven shards, the first total % n ranks one element more.
    mine = flat[rank * s : (rank + 1) * s] if KNOBS["pad"] else flat[:total].tensor_split(n)[rank]
    master = mine.clone()
    if KNOBS["master_in_param_dtype"] and param_dtype is not None:
        master = master.to(param_dtype)
    module.flat_shard = nn.Parameter(master)
    offsets, start = {}, 0
    for p in order:
        offsets[id(p)] = (start, p.numel(), p.shape)
        start += p.numel()
    # Keep where each view goes, never the original parameters (they would stay allocated).
    places = [(mod, name, *offsets[id(p)]) for mod, name, p in places]
    for mod, name, *_ in places:
        del mod._parameters[name]  # noqa: SLF001 - no longer a parameter of its module
    del order, offsets
    state = {"full": None}
    gather_dtype = (param_dtype if KNOBS["honour_param_dtype"] else None) or torch.float32

    def gather():
        if state["full"] is None:
            state["full"] = torch.empty(n * s, dtype=gather_dtype, requires_grad=True)
            state["full"].register_post_accumulate_grad_hook(reduce)
        full = state["full"]
        full.untyped_storage().resize_(n * s * full.element_size())
        shard = module.flat_shard.detach().to(gather_dtype)
        dist.all_gather_single(full.data, shard)
        for mod, name, lo, numel, shape in places:
            setattr(mod, name, full[lo : lo + numel].view(shape))

    def free():
        if state["full"] is not None:
            state["full"].untyped_storage().resize_(0)

    def reduce(full):
        grad = full.grad
        dtype = reduce_dtype or grad.dtype
        if KNOBS["reduce_in_param_dtype"]:
            dtype = grad.dtype
        if KNOBS["divide_in_param_dtype"]:
            grad = grad / n
        grad = grad.to(dtype)
        if KNOBS["average"] and not KNOBS["divide_in_param_dtype"]:
            grad = grad / n
        out = torch.empty(s, dtype=dtype)
        dist.reduce_scatter_single(out, grad.contiguous())
        out = out.float()
        shard = module.flat_shard
        shard.grad = out if shard.grad is None else shard.grad + out
        full.grad = None
        if KNOBS["free_after_backward"]:
            free()

    def pre_forward(_mod, _args):
        gather()
        if KNOBS["hang_on_last_rank"] and rank == n - 1:
            dist.recv(torch.empty(1), 0)  # rank 0 never sends: every rank waits

    def post_forward(_mod, _args, _out):
        if KNOBS["free_after_forward"]:
            free()

    def pre_backward(_mod, _grad_out):
        if KNOBS["regather"]:
            gather()
        elif KNOBS["dummy_gather"]:  # counted as the backward's gather, never computed with
            unused = torch.empty(n * s, dtype=gather_dtype)
            dist.all_gather_single(unused, module.flat_shard.detach().to(gather_dtype))

    module.register_forward_pre_hook(pre_forward)
    module.register_forward_hook(post_forward)
    module.register_full_backward_pre_hook(pre_backward)
    return module
