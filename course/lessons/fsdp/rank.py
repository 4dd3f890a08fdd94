"""The FSDP checks' rank side: shard the check's model with the student's fully_shard, train,
send back plain data (shards after each step, the frozen table, what each step's recorder
saw, held bytes).

Every rank builds ``tiny_lm(MODEL_SEED)``, applies ``fully_shard`` to each block then the
root, and trains :data:`~course.lessons.fsdp.model.STEPS` steps on the batches the check
made for it. Under grading :func:`course.ranks.relay.mark` marks in the relay's own record
where each run's set-up and each step begin (part ``run * (STEPS + 1)`` is run ``run``'s
set-up, the next STEPS parts its steps, a last mark closes the run); the recorder's lists
are the notebook path's only. The bytes of gathered parameters held (``peak``) are counted
here, on the rank, from the tensors the model and its hooks reach: the notebook path's
measure; under grading every probe is a snapshot in the relay instead
(``course.ranks.relay.snapshot``: tag 0 before the first step, then one per probe, forward
and backward), at which the grader measures each rank from outside. Where the check chose
all-gathers whose results are scaled (:mod:`course.ranks.rescale`: the backward's, judged by
their use), the relay scales them under grading; in a notebook the check sends its choice and
seed here, and this rank's process groups scale them themselves.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import types
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

from course.checks.compare import MODEL_SEED
from course.lessons.fsdp.model import STEPS, loss_of, make_optimizer, tiny_lm
from course.ranks import relay
from course.ranks.rescale import GlooGathers, Rescale
from course.ring.recorder import Recorder

__all__ = ["DTYPES", "part", "shard_units", "train_sharded"]

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, None: None}


def part(run: int, step: int | None) -> int:
    """The relay mark of run ``run``'s set-up (``step`` None) or of its step ``step``."""
    return run * (STEPS + 1) + (0 if step is None else 1 + step)


def _children(obj: Any) -> list[Any]:  # noqa: PLR0911 - one return per kind of object
    """What the walk of :func:`_reachable` goes on to from ``obj``."""
    if isinstance(obj, dict):
        return list(obj.values())
    if isinstance(obj, (list, tuple, set)):
        return list(obj)
    if isinstance(obj, types.FunctionType):
        return list(obj.__closure__ or ())
    if isinstance(obj, types.MethodType):
        return [obj.__self__]
    if isinstance(obj, functools.partial):
        return [obj.func, *obj.args, *obj.keywords.values()]
    if isinstance(obj, types.CellType):
        return [obj.cell_contents] if _filled(obj) else []
    if hasattr(obj, "__dict__") and not isinstance(obj, type):
        return list(vars(obj).values())
    return []


def _reachable(root: Any, limit: int = 20000) -> list[torch.Tensor]:
    """Tensors reachable from ``root`` through modules, containers, hook closures, cells."""
    stack, seen, found = [root], set(), []
    while stack and len(seen) < limit:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            found.append(obj)
        else:
            stack += _children(obj)
    return found


def _filled(cell: types.CellType) -> bool:
    try:
        cell.cell_contents  # noqa: B018 - an empty cell raises
    except ValueError:
        return False
    return True


def _held(model: torch.nn.Module, skip: set[int]) -> int:
    """Bytes of the distinct storages the model reaches (but ``skip``'s: shards, frozen)."""
    storages: dict[int, int] = {}
    for t in _reachable(model):
        if not t.is_floating_point():
            continue
        storage = t.untyped_storage()
        if storage.data_ptr() in skip or storage.nbytes() == 0:
            continue
        storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


def shard_units(fully_shard: Any, model: torch.nn.Module, **kw: Any) -> list[str]:
    """Apply ``fully_shard`` to each block then the root; problems as text."""
    said = []
    for i, unit in [*enumerate(model.blocks), ("root", model)]:
        back = fully_shard(unit, **kw)
        if back is not unit:
            said.append(f"fully_shard(block {i}) did not return the module it was given")
    for name, unit in [*((f"block {i}", b) for i, b in enumerate(model.blocks)), ("root", model)]:
        shard = getattr(unit, "flat_shard", None)
        if isinstance(shard, torch.Tensor) and shard.dtype != torch.float32:
            said.append(  # before training: torch's own dtype error would come first
                f"{name}'s flat_shard is {shard.dtype} after fully_shard(param_dtype="
                f"{kw.get('param_dtype')}): the flat_shard is the master copy the optimizer "
                "steps and stays float32; cast a copy of it to param_dtype when you gather"
            )
            break
    return said


def _shards(model: torch.nn.Module) -> list[Any]:
    """Each unit's flat_shard (a copy), or a word of what it was instead."""
    out: list[Any] = []
    for unit in [*model.blocks, model]:
        shard = getattr(unit, "flat_shard", None)
        if isinstance(shard, torch.Tensor):
            out.append(shard.detach().clone())
        else:
            out.append(f"missing: {type(shard).__name__}")
    return out


def _collectives(seen: Recorder) -> list[tuple[str, int, int]]:
    """(name, bytes contributed, bytes per element) of each call this step, as recorded."""
    calls = [(c.name, c.contributed, c.nbytes // max(c.numel, 1)) for c in seen.collectives]
    return calls + [("send", m.nbytes, 1) for m in seen.messages if m.op == "send"]


@contextlib.contextmanager
def _gathers(rescale: dict | None) -> Iterator[GlooGathers | None]:
    """Off the relay, with the check's choice: this rank's process groups scale the chosen
    all-gathers (:meth:`Rescale.on_gloo`); else nothing (under grading the relay does)."""
    if rescale is None or dist.get_backend() == relay.BACKEND:
        yield None
        return
    chosen = Rescale(int(rescale["seed"]), frozenset(rescale["parts"]), int(rescale["skip"]))
    with chosen.on_gloo() as gathers:
        yield gathers


def _train(
    model: torch.nn.Module, spec: dict, run: int, batches: list, rescale: dict | None
) -> tuple[list, list]:
    """Train run ``run``: each step's collectives as recorded, and (but in the memory run,
    whose larger model is not judged by its values) every unit's shard after each step."""
    optimizer = make_optimizer(spec["optimizer"], model.parameters())
    steps, after = [], []
    with _gathers(rescale) as gathers:
        for step, batch in enumerate(batches):
            relay.mark(part(run, step))
            if gathers is not None:
                gathers.mark(part(run, step))
            optimizer.zero_grad(set_to_none=True)
            with Recorder() as seen:
                loss_of(model, batch).backward()
                optimizer.step()
            steps.append(_collectives(seen))
            if not spec.get("memory"):
                after.append(_shards(model))
    return steps, after


def _one_run(
    fully_shard: Any, run: int, spec: dict, batches: list, rescale: dict | None = None
) -> dict[str, Any]:
    """One model sharded and trained with ``spec``'s optimizer and dtypes."""
    relay.mark(part(run, None))
    model = tiny_lm(MODEL_SEED, **spec.get("size", {}))
    table, start = model.pos, model.pos.detach().clone()  # the frozen parameter, as built
    kw = {"param_dtype": DTYPES[spec.get("param_dtype")]}
    kw["reduce_dtype"] = DTYPES[spec.get("reduce_dtype")]
    problems = shard_units(fully_shard, model, **kw)
    sizes = torch.tensor([s.numel() if isinstance(s, torch.Tensor) else -1 for s in _shards(model)])
    every = torch.zeros(dist.get_world_size() * sizes.numel(), dtype=sizes.dtype)
    dist.all_gather_single(every, sizes)  # the check's own: every rank's shard sizes
    out: dict[str, Any] = {"problems": problems, "sizes": every.tolist(), "steps": []}
    left = [n for n, p in model.named_parameters() if p.requires_grad and "flat_shard" not in n]
    out["left"] = left
    if (
        problems
        or -1 in sizes.tolist()
        or any(v != sizes.tolist() for v in every.view(-1, sizes.numel()).tolist())
    ):
        return out  # no flat_shard, or uneven shards: no training, the verdict says why
    skip = {p.untyped_storage().data_ptr() for p in model.parameters()}
    peak = [0]
    if spec.get("memory"):  # under grading the relay measures each probe from outside instead
        tags = itertools.count(1)
        counting = dist.get_backend() != relay.BACKEND  # the count is the notebook's measure

        def probe() -> None:
            if counting:
                peak[0] = max(peak[0], _held(model, skip))
            relay.snapshot(next(tags))

        model.set_probe(probe)
        relay.snapshot(0)  # the shards alone, before any step
    out["steps"], out["after"] = _train(model, spec, run, batches, rescale)
    model.set_probe(None)
    now = getattr(model, "pos", None)
    frozen = now.detach().clone() if now is table else None  # None: it was moved
    # The memory run's shards (a larger model) are not judged: only their sizes, sent above.
    out.update(shards=[] if spec.get("memory") else _shards(model), frozen=frozen, start=start)
    out["peak"] = peak[0]
    return out


def train_sharded(
    fully_shard: Any, specs: list[dict], batches: list, rescale: dict | None = None
) -> list[dict[str, Any]]:
    """On each rank: every run of ``specs`` on this rank's ``batches``; plain data back
    (``rescale``: the notebook path's choice of all-gathers to scale, with its seed)."""
    out = [_one_run(fully_shard, run, spec, batches, rescale) for run, spec in enumerate(specs)]
    relay.mark(part(len(specs), None))
    return out
