"""The ring all-reduce schedule, as plain data: chunk bounds, who sends what at each step.

Pure Python (numpy for the large-N simulator), no torch: the instructor's reference ring
(``course.instructor.reference``), the simulator, the cost model and the widget all read the
same few functions, so the real runs and the simulation agree by construction. It states the
chunk formulas the ring exercise's plan states, and no more: no list of a rank's steps, no
communication.

The ring (Patarasuk & Yuan 2009, "Bandwidth optimal all-reduce algorithms for clusters of
workstations"; the Baidu/Horovod ring) splits the tensor into ``N`` chunks and runs a
reduce-scatter, then an all-gather (:func:`num_steps` steps in all). At every step each rank
sends one chunk to ``(rank + 1) % N`` and receives one from ``(rank - 1) % N``:

- reduce-scatter, steps ``s = 0 .. N-2``: rank ``r`` sends chunk ``(r - s) % N`` and receives
  chunk ``(r - s - 1) % N``, which it *adds* to its own; afterwards rank ``r`` holds the fully
  reduced chunk ``(r + 1) % N``;
- all-gather, steps ``s = N-1 .. 2N-3`` with ``t = s - (N-1)``: rank ``r`` sends chunk
  ``(r + 1 - t) % N`` and receives chunk ``(r - t) % N``, which it *copies* over its own.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

import numpy as np

__all__ = [
    "Phase",
    "RingState",
    "chunk_bounds",
    "num_steps",
    "phase",
    "recv_chunk",
    "recv_peer",
    "ring_bytes_formula",
    "ring_bytes_per_rank",
    "send_chunk",
    "send_peer",
    "simulate",
]

Phase = Literal["reduce-scatter", "all-gather"]


def chunk_bounds(numel: int, world_size: int) -> list[tuple[int, int]]:
    """Split ``numel`` elements into ``world_size`` contiguous ``[lo, hi)`` chunks.

    The first ``numel % world_size`` chunks get one element more, as ``torch.tensor_split``
    does; with fewer elements than ranks the last chunks are empty.
    """
    if world_size < 1 or numel < 0:
        raise ValueError(f"need world_size >= 1 and numel >= 0, got {world_size} and {numel}")
    q, extra = divmod(numel, world_size)
    return [(c * q + min(c, extra), (c + 1) * q + min(c + 1, extra)) for c in range(world_size)]


def num_steps(world_size: int) -> int:
    """Steps of the ring, reduce-scatter then all-gather (none for one rank)."""
    _check_world_size(world_size)
    return 2 * (world_size - 1)


def phase(step: int, world_size: int) -> Phase:
    """Which phase ``step`` (0-based) belongs to: the first ``N-1`` steps reduce-scatter."""
    _check_step(step, world_size)
    return "reduce-scatter" if step < world_size - 1 else "all-gather"


def send_peer(rank: int, world_size: int) -> int:
    """The neighbour every send goes to: ``(rank + 1) % N``."""
    _check_rank(rank, world_size)
    return (rank + 1) % world_size


def recv_peer(rank: int, world_size: int) -> int:
    """The neighbour every receive comes from: ``(rank - 1) % N``."""
    _check_rank(rank, world_size)
    return (rank - 1) % world_size


def send_chunk(rank: int, step: int, world_size: int) -> int:
    """The chunk ``rank`` sends to ``(rank + 1) % N`` at ``step``."""
    _check_rank(rank, world_size)
    if phase(step, world_size) == "reduce-scatter":
        return (rank - step) % world_size
    return (rank + 1 - (step - (world_size - 1))) % world_size


def recv_chunk(rank: int, step: int, world_size: int) -> int:
    """The chunk ``rank`` receives from ``(rank - 1) % N`` at ``step`` (adds it, then copies)."""
    return send_chunk((rank - 1) % world_size, step, world_size)


def ring_bytes_per_rank(numel: int, world_size: int, itemsize: int = 4) -> list[int]:
    """Exact bytes each rank sends in the ring: the sizes of all the chunks it sends.

    Rank ``r`` sends every chunk but ``r + 1`` in reduce-scatter and every chunk but ``r + 2``
    in all-gather, so with uneven chunks the ranks differ by at most two elements.
    """
    sizes = [hi - lo for lo, hi in chunk_bounds(numel, world_size)]
    sent = [0] * world_size
    for r in range(world_size):
        for s in range(num_steps(world_size)):
            sent[r] += sizes[send_chunk(r, s, world_size)] * itemsize
    return sent


def ring_bytes_formula(size_bytes: float, world_size: int) -> float:
    """The textbook bytes each rank sends in the ring, for a tensor of ``size_bytes``."""
    _check_world_size(world_size)
    return 2 * (world_size - 1) / world_size * size_bytes


def expected_holds(rank: int, step: int, world_size: int, direction: int = 1) -> int:
    """The mask a ring's send carries at ``step``: the arc of ``step + 1`` ranks ending at
    ``rank`` in reduce-scatter, every rank in all-gather (Patarasuk & Yuan 2009)."""
    if step >= world_size - 1:
        return (1 << world_size) - 1
    return sum(1 << ((rank - j * direction) % world_size) for j in range(step + 1))


@dataclass(frozen=True, slots=True)
class RingState:
    """The ring after ``step`` steps: what every chunk on every rank holds, bytes sent so far.

    In a correct ring the contributions in chunk ``c`` of rank ``r`` are always an arc of the
    ring ending at ``r`` (a copy in all-gather is already complete), so ``counts[r, c]``, the
    arc's length, says it all. :func:`simulate` updates the arrays in place: these are
    read-only views, valid until the next step; keep a state with :meth:`snapshot`.
    """

    world_size: int
    numel: int
    itemsize: int
    step: int  # steps done: 0 (the initial state) .. num_steps(world_size)
    counts: np.ndarray  # (N, N): contributions chunk c holds on rank r
    bytes_sent: np.ndarray  # (N,): bytes rank r has sent so far

    @property
    def phase(self) -> Phase | None:
        """The phase of the step just played (``None`` before the first)."""
        return None if self.step == 0 else phase(self.step - 1, self.world_size)

    def holds(self, rank: int, chunk: int) -> frozenset[int]:
        """The ranks whose contributions chunk ``chunk`` on ``rank`` holds."""
        n = self.world_size
        return frozenset((rank - j) % n for j in range(int(self.counts[rank, chunk])))

    def mask(self, rank: int, chunk: int) -> int:
        """:meth:`holds` as a bitmask, as in ``course.ring.trace``."""
        return sum(1 << r for r in self.holds(rank, chunk))

    def masks(self) -> list[list[int]]:
        """``masks[rank][chunk]`` for every rank and chunk, like one ``chunk_states`` entry."""
        n = self.world_size
        return [[self.mask(r, c) for c in range(n)] for r in range(n)]

    def full_chunks(self, rank: int) -> list[int]:
        """The chunks ``rank`` holds fully reduced."""
        return np.flatnonzero(self.counts[rank] == self.world_size).tolist()

    def all_full(self) -> bool:
        """Whether every chunk on every rank holds every contribution (the all-reduce is done)."""
        return bool((self.counts == self.world_size).all())

    def snapshot(self) -> RingState:
        """A copy that later steps of the simulation do not change."""
        counts, sent = self.counts.copy(), self.bytes_sent.copy()
        counts.flags.writeable = sent.flags.writeable = False
        return RingState(self.world_size, self.numel, self.itemsize, self.step, counts, sent)


def simulate(world_size: int, numel: int, itemsize: int = 4) -> Iterator[RingState]:
    """Play the ring schedule: yield the initial state, then the state after every step.

    ``N`` fancy-index writes per step on an ``(N, N)`` array of arc lengths, so N = 1024
    (2046 steps over a million chunk copies) takes well under a second. The yielded state
    is a live view: call :meth:`RingState.snapshot` to keep one.
    """
    n = world_size
    sizes = np.array([hi - lo for lo, hi in chunk_bounds(numel, n)], dtype=np.int64)
    counts = np.ones((n, n), dtype=np.int32)
    sent = np.zeros(n, dtype=np.int64)
    ranks = np.arange(n)
    prev = (ranks - 1) % n
    counts_view, sent_view = counts.view(), sent.view()
    counts_view.flags.writeable = sent_view.flags.writeable = False
    yield RingState(n, numel, itemsize, 0, counts_view, sent_view)
    for s in range(num_steps(n)):
        t = s - (n - 1)
        sends = (ranks - s) % n if t < 0 else (ranks + 1 - t) % n  # send_chunk, vectorised
        recvs = sends[prev]  # each rank receives what its predecessor sends
        if t < 0:
            counts[ranks, recvs] += counts[prev, recvs]  # reduce-scatter: add
        else:
            counts[ranks, recvs] = counts[prev, recvs]  # all-gather: copy
        sent += sizes[sends] * itemsize
        yield RingState(n, numel, itemsize, s + 1, counts_view, sent_view)


def _check_world_size(world_size: int) -> None:
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")


def _check_rank(rank: int, world_size: int) -> None:
    _check_world_size(world_size)
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in 0..{world_size - 1} for world_size {world_size}")


def _check_step(step: int, world_size: int) -> None:
    total = num_steps(world_size)
    if total == 0:
        raise ValueError("a ring of one rank has no steps: there is nothing to exchange")
    if not 0 <= step < total:
        raise ValueError(
            f"the ring over {world_size} ranks has steps 0..{total - 1}"
            f" (2(N-1) = {total}); got step {step}"
        )
