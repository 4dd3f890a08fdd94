"""The FSDP checks' model and its single-process oracle: what sharded training must match.

    model = tiny_lm(seed=0)                        # blocks, then the root: embedding, tied head
    units(model)                                   # [Unit("block 0", ...), ..., Unit("the root")]
    oracle(per_rank_batches, "sgd")                # each unit's flat parameters after STEPS

A small language-model-like net with the cases an FSDP gets wrong first: the
embedding's weight is the output head's (tied: one parameter under two names), a frozen
positional table (``requires_grad=False``), and units whose numel 2, 3 and 4 do not divide.
The oracle trains the same model in one process, each step's gradient the mean of the
per-rank gradients (what DDP leaves in ``.grad``); :func:`oracle` with ``mixed=True`` runs the
forward and backward on bf16 copies of the fp32 masters, casts each gradient to fp32,
averages, and steps the fp32 masters (FSDP's ``MixedPrecisionPolicy(param_dtype=bf16,
reduce_dtype=fp32)``). With ``backward=``, each step's backward computes with other values of the
parameters than its forward did (what an FSDP's backward computes with when its all-gather
brings them: the checks have the judge scale them, :mod:`course.ranks.rescale`). Nothing here
shards, gathers or reduce-scatters: that is the exercise.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import nn

__all__ = [
    "AVERAGES",
    "LR",
    "STEPS",
    "Batch",
    "Block",
    "TinyLM",
    "Unit",
    "make_batches",
    "oracle",
    "tiny_lm",
    "unit_flats",
    "units",
]

STEPS = 5
LR = {"sgd": 0.2, "adam": 1e-2}
Batch = tuple[torch.Tensor, torch.Tensor]  # (tokens, next tokens), int64, (batch, seq)
Backward = Callable[[int], torch.Tensor]  # a unit's numel -> what its backward's values are times
Backwards = Sequence[Backward | None]  # step by step: a step's Backward, or None (none changed)


def _odd_gain(numel: int) -> int:
    """The length of a gain vector that makes ``numel`` + it prime to 2 and 3 (so 2, 3, 4
    ranks never divide a unit)."""
    return next(g for g in range(1, 7) if (numel + g) % 2 and (numel + g) % 3)


def _probe(probe: Callable[[], None] | None, h: torch.Tensor) -> None:
    """Call ``probe`` now and again when the backward reaches ``h`` (the memory check's)."""
    if probe is not None:
        probe()
        if h.requires_grad:
            h.register_hook(lambda _g: probe())


class Block(nn.Module):
    """A residual MLP block; its gain vector makes its numel prime to 2 and 3."""

    probe: Callable[[], None] | None = None  # called inside the block, forward and backward

    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.fc = nn.Linear(width, hidden)
        self.proj = nn.Linear(hidden, width)
        base = 2 * width * hidden + width + hidden
        self.gain = nn.Parameter(torch.ones(_odd_gain(base)))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """``h`` plus the MLP of ``h``, computed in the dtype of this block's weights."""
        h = h.to(self.fc.weight.dtype)
        inner = self.fc(h)
        _probe(self.probe, inner)
        return h + self.proj(torch.tanh(inner)) * self.gain.mean()


class TinyLM(nn.Module):
    """Embedding (tied to the head) + frozen positions, blocks, a final scale, the head."""

    probe: Callable[[], None] | None = None  # called between blocks, forward and backward

    def __init__(self, vocab: int, width: int, hidden: int, depth: int, seq: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.pos = nn.Parameter(torch.randn(seq, width) * 0.1, requires_grad=False)
        self.blocks = nn.ModuleList(Block(width, hidden) for _ in range(depth))
        self.norm = nn.Parameter(torch.ones(width))
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.embed.weight  # tied: one parameter, two names
        self.gain = nn.Parameter(torch.ones(_odd_gain(vocab * width + width)))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits (float32) for every position of ``tokens``."""
        dtype = self.embed.weight.dtype
        h = self.embed(tokens) + self.pos[: tokens.shape[1]].to(dtype)
        for block in self.blocks:
            h = block(h)
            _probe(self.probe, h)
        h = h.to(dtype) * self.norm.to(dtype) * self.gain.mean().to(dtype)
        return self.head(h).float()

    def set_probe(self, probe: Callable[[], None] | None) -> None:
        """Have ``probe`` called between blocks and inside each, forward and backward."""
        self.probe = probe
        for block in self.blocks:
            block.probe = probe


def tiny_lm(
    seed: int = 0, *, vocab: int = 13, width: int = 8, hidden: int = 16, depth: int = 3,
    seq: int = 6,
) -> TinyLM:  # fmt: skip
    """The check's model from ``seed``; larger ``width``/``hidden``/``depth`` make it bigger."""
    torch.manual_seed(seed)
    return TinyLM(vocab, width, hidden, depth, seq)


@dataclass(frozen=True)
class Unit:
    """One unit of the model: its name, its module's path, what it manages, in order."""

    name: str
    path: str  # "" for the root
    params: tuple[str, ...]  # names (under the model) of its managed parameters, first names
    numel: int

    def padded(self, world_size: int) -> int:
        """Elements per rank's shard: ceil(numel / world_size)."""
        return -(-self.numel // world_size)


def units(model: TinyLM) -> list[Unit]:
    """The units fully_shard is applied to (each block, then the root), with the trainable
    parameters each manages: first appearances only, none a block already manages."""
    found, taken = [], set()
    for path, module in [*((f"blocks.{i}", b) for i, b in enumerate(model.blocks)), ("", model)]:
        prefix = f"{path}." if path else ""
        mine = [
            (f"{prefix}{n}", p)
            for n, p in module.named_parameters()
            if p.requires_grad and id(p) not in taken
        ]
        taken |= {id(p) for _, p in mine}
        name = f"block {path.rsplit('.', 1)[-1]}" if path else "the root"
        found.append(Unit(name, path, tuple(n for n, _ in mine), sum(p.numel() for _, p in mine)))
    return found


def unit_flats(model: TinyLM) -> list[torch.Tensor]:
    """Each unit's managed parameters, flattened and concatenated (float32), in unit order."""
    named = dict(model.named_parameters())
    return [
        torch.cat([named[n].detach().float().reshape(-1) for n in u.params]) for u in units(model)
    ]


def make_batches(steps: int, generator: torch.Generator, batch: int = 4, **shape: int) -> list:
    """One rank's data: ``steps`` (tokens, next tokens) batches drawn from ``generator``."""
    vocab, seq = shape.get("vocab", 13), shape.get("seq", 6)
    out = []
    for _ in range(steps):
        tokens = torch.randint(0, vocab, (batch, seq + 1), generator=generator)
        out.append((tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()))
    return out


def loss_of(model: nn.Module, batch: Batch) -> torch.Tensor:
    """The next-token cross-entropy of ``model`` on ``batch`` (float32)."""
    tokens, targets = batch
    logits = model(tokens)
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def make_optimizer(kind: str, params: object) -> torch.optim.Optimizer:
    """The check's optimizer: SGD or Adam at the check's learning rate."""
    if kind == "sgd":
        return torch.optim.SGD(params, lr=LR["sgd"])
    return torch.optim.Adam(params, lr=LR["adam"])


def _rescale(net: TinyLM, backward: Backward) -> None:
    """Multiply each unit's managed parameters, flattened in unit order, by ``backward`` of its
    numel, in place and unseen by autograd, between the forward and the backward: what FSDP's
    backward computes with when its all-gather fills the storage of the views autograd saved.
    Only the saved parameters change anything: a Linear's weight (for its input's gradient;
    its own weight's gradient uses the input saved in the forward), the tied head's weight,
    the final ``norm`` (for its input's gradient); the embedding saves only its indices and
    ``gain.mean()`` nothing. So the gradients flowing back through a unit change, and with
    them the weight gradients of every unit before it, the embedding's included; the
    activations, computed in the forward, do not."""
    named = dict(net.named_parameters())
    with torch.no_grad():
        for u in units(net):
            params = [named[name] for name in u.params]
            pieces = backward(u.numel).split([p.numel() for p in params])
            for p, piece in zip(params, pieces, strict=True):
                p.data.mul_(piece.view_as(p).to(p.dtype))


def _grads(
    model: TinyLM, batch: Batch, dtype: torch.dtype | None, backward: Backward | None = None
) -> list[torch.Tensor]:
    """``model``'s float32 gradient on ``batch``, computed on a ``dtype`` copy if given, the
    backward with its parameters rescaled by ``backward`` if given (on a copy)."""
    net = model
    if dtype is not None or backward is not None:
        net = copy.deepcopy(model).to(dtype or torch.float32)
    net.zero_grad(set_to_none=True)
    loss = loss_of(net, batch)
    if backward is not None:
        _rescale(net, backward)
    loss.backward()
    return [
        p.grad.float() if p.grad is not None else torch.zeros_like(p, dtype=torch.float32)
        for p in net.parameters()
        if p.requires_grad
    ]


@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    """Within: torch computes on one thread (a tiny model on a shared machine: more threads
    only wait for each other), as it was after."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _mean(grads: list[torch.Tensor]) -> torch.Tensor:
    return torch.stack(grads).mean(0)


Average = Callable[[list[torch.Tensor]], torch.Tensor]
# Right ways to average the ranks' float32 gradients. They round differently, and under bf16
# compute a master one way puts on a bf16 rounding boundary's other side from the other's
# trains on another bf16 value from then on (measured, 5 SGD steps on 3 ranks: in 6 cases of
# 150 summed-then-divided and divided-then-summed ended 4e-6 to 1.3e-4 of the largest update
# apart, the rest within 2e-7; on 2 ranks, all 150 within 2e-7).
AVERAGES: dict[str, Average] = {
    "summed, then divided": _mean,
    "divided, then summed": lambda gs: torch.stack([g / len(gs) for g in gs]).sum(0),
    "summed, then times 1/N": lambda gs: torch.stack(gs).sum(0) * (1 / len(gs)),
    "times 1/N, then summed": lambda gs: torch.stack([g * (1 / len(gs)) for g in gs]).sum(0),
}


def oracle(
    batches: Sequence[Sequence[Batch]], kind: str, *, mixed: bool = False, scale: float = 1.0,
    seed: int = 0, backward: Backwards = (), average: Average = _mean, **size: int,
) -> list[list[torch.Tensor]]:  # fmt: skip
    """After each step, each unit's flat parameters, training in one process with the mean
    over ranks of the per-rank gradients (times ``scale``: N gives the sum, a wrong answer's
    hint; ``average``: how the mean is rounded, one of :data:`AVERAGES`); ``batches[r][k]``
    is rank r's k-th batch; ``backward[k]``: how step k's backward sees the parameters
    (:func:`_rescale`; none changed in a step past its end)."""
    with _one_thread():
        return _trained(batches, kind, mixed, scale, tiny_lm(seed, **size), backward, average)


def _trained(
    batches: Sequence[Sequence[Batch]], kind: str, mixed: bool, scale: float, model: TinyLM,
    backward: Backwards = (), average: Average = _mean,
) -> list[list[torch.Tensor]]:  # fmt: skip
    """:func:`oracle`'s loop: each step's flat units after stepping on the mean gradient."""
    trained = [p for p in model.parameters() if p.requires_grad]
    optimizer = make_optimizer(kind, trained)
    after, seen = [], [*backward, *[None] * len(batches[0])]
    for step in range(len(batches[0])):
        per_rank = [
            _grads(model, mine[step], torch.bfloat16 if mixed else None, seen[step])
            for mine in batches
        ]
        for i, p in enumerate(trained):
            p.grad = average([g[i] for g in per_rank]) * scale
        optimizer.step()
        after.append(unit_flats(model))
    return after
