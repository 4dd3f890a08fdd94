"""All-gathers whose results the judge scales: a gather judged by what its values are used for.

    rescale = Rescale.draw(parts=frozenset({1, 2, 3}), skip=4)   # in the judge, told to no rank
    launch(job, 2, ..., rescale=rescale)    # on the relay: the chosen gathers come back scaled
    with rescale.on_gloo() as gathers:      # on a rank, off the relay: the same, by the rank
        gathers.mark(1)                     # ...alongside course.ranks.relay.mark(1)
    factors(rescale.seed, numel)            # what element i of such a gather was multiplied by

In every part of a run the check marked (``course.ranks.relay.mark``) and named in ``parts``,
every all-gather of the whole world after the ``skip``-th counts as chosen: each element of
what it returns is multiplied by one of -2, -1/2, 1/2, 2, drawn from ``seed`` (exact in every
float dtype; integer gathers are left alone). The FSDP checks mark each training step and skip
the forward's gathers, one per unit, so what changes is what the backward's gathers bring; the
judge's oracle then computes the gradients a backward that computes with those values gives,
and a backward that kept the forward's parameters gives others, whatever it gathered. The
seed is drawn by the judge for each run and told to no rank: under grading the relay scales
(:mod:`course.ranks.router`); in a notebook, where the check's rank code is the student's own
process anyway, :meth:`Rescale.on_gloo` wraps the process group's all-gathers the same way
(waiting for a chosen gather when it is made: collectives keep their order, so no rank waits
for one that another has not made).
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import ProcessGroup

__all__ = ["FACTORS", "GlooGathers", "Rescale", "factors"]

FACTORS = (-2.0, -0.5, 0.5, 2.0)  # powers of two: a scaled float is exact, in bf16 too
Place = tuple[int | None, int]  # (the part a rank last marked, its all-gathers since then)


def factors(seed: int, numel: int) -> torch.Tensor:
    """The float64 factors of a chosen all-gather of ``numel`` elements (in its output order)."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + numel)
    index = torch.randint(0, len(FACTORS), (numel,), generator=generator)
    return torch.tensor(FACTORS, dtype=torch.float64)[index]


@dataclass(frozen=True)
class Rescale:
    """Which all-gathers are scaled (see the module docstring), and the secret ``seed``."""

    seed: int
    parts: frozenset[int]
    skip: int

    @classmethod
    def draw(cls, parts: frozenset[int], skip: int) -> Rescale:
        """A choice of ``parts`` and ``skip`` with a fresh seed from the system's randomness."""
        return cls(random.SystemRandom().randrange(2**31), frozenset(parts), skip)

    def chosen(self, places: Sequence[Place]) -> bool:
        """Whether an all-gather of the world, made by its members at ``places``, is scaled."""
        part, index = places[0]
        return all(p == places[0] for p in places) and part in self.parts and index >= self.skip

    def scaled(self, flat: torch.Tensor) -> torch.Tensor:
        """A chosen gather's whole result (flat, in member order), scaled; ints as they are."""
        if not flat.is_floating_point():
            return flat
        return flat * factors(self.seed, flat.numel()).to(flat.dtype)

    def scale_into(self, targets: Sequence[torch.Tensor]) -> None:
        """Scale, in place, the tensors a chosen gather filled, as one flat result."""
        flat = torch.cat([t.detach().reshape(-1) for t in targets])
        pieces = self.scaled(flat).split([t.numel() for t in targets])
        with torch.no_grad():
            for t, piece in zip(targets, pieces, strict=True):
                t.detach().copy_(piece.view_as(t))

    @contextlib.contextmanager
    def on_gloo(self) -> Iterator[GlooGathers]:
        """Within: this rank's process groups scale the chosen all-gathers themselves."""
        gathers = GlooGathers(self)
        with gathers.patched():
            yield gathers


def _outputs(method: str, args: tuple) -> list[list[torch.Tensor]]:
    """Each all-gather a process group method makes (one per output tensor of the coalesced
    ones, as the relay counts them): the tensors it fills, in order."""
    out = args[0]
    if method in ("allgather_into_tensor_coalesced", "all_gather_single_coalesced"):
        return [[t] for t in out]
    if method in ("allgather", "allgather_coalesced"):
        return [[t for per_rank in out for t in per_rank]]
    return [[out]]


GATHERS = (
    "_allgather_base",
    "all_gather_single",
    "allgather",
    "allgather_coalesced",
    "allgather_into_tensor_coalesced",
    "all_gather_single_coalesced",
)


class GlooGathers:
    """One rank's count of its all-gathers since its last mark, and the wrapped methods."""

    def __init__(self, rescale: Rescale) -> None:
        self.rescale = rescale
        self.place: Place = (None, 0)

    def mark(self, tag: int) -> None:
        """This rank starts part ``tag`` (what ``course.ranks.relay.mark`` tells the relay)."""
        self.place = (tag, 0)

    @contextlib.contextmanager
    def patched(self) -> Iterator[None]:
        """Within: every process group's all-gather methods go through :meth:`_wrap`."""
        saved = {name: vars(ProcessGroup)[name] for name in GATHERS if name in vars(ProcessGroup)}
        try:
            for name in saved:
                setattr(ProcessGroup, name, self._wrap(name, getattr(ProcessGroup, name)))
            yield
        finally:
            for name, raw in saved.items():
                setattr(ProcessGroup, name, raw)

    def _wrap(self, method: str, original: Callable) -> Callable:
        def gather(group: Any, *args: Any, **kwargs: Any) -> Any:
            work = original(group, *args, **kwargs)
            if _whole_world(group):
                for targets in _outputs(method, args):
                    part, index = self.place
                    self.place = (part, index + 1)
                    if self.rescale.chosen([(part, index)]):
                        work.wait()
                        self.rescale.scale_into(targets)
            return work

        return gather


def _whole_world(group: Any) -> bool:
    with contextlib.suppress(Exception):
        return list(dist.get_process_group_ranks(group)) == list(range(dist.get_world_size()))
    return False
