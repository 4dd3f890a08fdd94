"""Graded check for the accumulation assignment's first exercise: the sampler's indices.

The student's function runs on one fresh rank with torch's ``DistributedSampler`` refused
there (``course.checks.refusals``); its oracle is ``DistributedSampler`` itself, built here in
the checker, case by case and rank by rank.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch.utils.data import DistributedSampler

from course.checks.refusals import SAMPLER, refusing
from course.checks.teaching import on_ranks, teaches, user_traceback

__all__ = ["SAMPLER_CASES", "check_sampler_indices"]

# each case: dataset_len, num_replicas, shuffle, seed, epoch, drop_last
SAMPLER_CASES: dict[str, list[tuple[int, int, bool, int, int, bool]]] = {
    "in order": [
        (8, 2, False, 0, 0, False),
        (10, 4, False, 0, 0, False),  # does not divide
        (3, 4, False, 0, 0, False),  # fewer samples than ranks
        (1, 3, False, 0, 0, False),
        (10, 4, False, 0, 0, True),
        (7, 3, False, 0, 0, True),
    ],
    "shuffled": [
        (10, 2, True, 0, 0, False),
        (10, 4, True, 0, 3, False),
        (11, 3, True, 42, 1, False),
        (5, 8, True, 7, 2, False),
        (13, 4, True, 1, 5, True),
        (100, 7, True, 3, 0, True),
    ],
    "in order, hidden": [
        (2, 5, False, 0, 0, False),  # padded more than once: the list is shorter than the ranks
        (17, 5, False, 0, 0, False),
        (17, 5, False, 0, 0, True),
        (4, 4, False, 0, 0, True),  # divides: drop_last drops nothing
        (9, 2, False, 0, 0, True),
    ],
    "shuffled, hidden": [
        (2, 5, True, 11, 4, False),
        (23, 6, True, 5, 9, False),
        (23, 6, True, 5, 9, True),
        (12, 3, True, 0, 1, True),
        (50, 8, True, 123, 7, False),
    ],
}


def _call_sampler(fn: Callable[..., Any], cases: list[tuple]) -> list[Any]:
    """On a fresh rank: the student's indices for every (case, rank), or the error."""
    out = []
    for n, replicas, shuffle, seed, epoch, drop_last in cases:
        for rank in range(replicas):
            try:
                got = fn(
                    n, replicas, rank, shuffle=shuffle, seed=seed, epoch=epoch, drop_last=drop_last
                )
                if got is None:
                    out.append("it returned None: implement it above and return a list of indices.")
                    continue
                out.append([int(i) for i in got])
            except Exception as exc:  # noqa: BLE001 - the student's code may raise anything; each becomes a message
                out.append(f"sampler_indices raised an exception:\n{user_traceback(exc)}")
    return out


def _oracle_indices(
    n: int, replicas: int, rank: int, shuffle: bool, seed: int, epoch: int, drop_last: bool
) -> list[int]:
    sampler = DistributedSampler(range(n), replicas, rank, shuffle, seed, drop_last)
    sampler.set_epoch(epoch)
    return list(sampler)


@teaches
def check_sampler_indices(sampler_indices: Callable[..., Any], part: str = "in order") -> str:
    """Compare the student's indices with ``DistributedSampler``'s, rank by rank, case by case."""
    cases = SAMPLER_CASES[part]
    args = (sampler_indices, cases)
    results = on_ranks("sampler_indices", _call_sampler, 1, *args, before=refusing(SAMPLER))[0]
    i = 0
    for n, replicas, shuffle, seed, epoch, drop_last in cases:
        for rank in range(replicas):
            got, i = results[i], i + 1
            want = _oracle_indices(n, replicas, rank, shuffle, seed, epoch, drop_last)
            call = (
                f"sampler_indices({n}, {replicas}, {rank}, shuffle={shuffle}, seed={seed}, "
                f"epoch={epoch}, drop_last={drop_last})"
            )
            if isinstance(got, str):
                raise AssertionError(f"{call}: {got}")  # noqa: TRY004 - every failed check is an AssertionError
            if got != want:
                raise AssertionError(
                    f"{call} returned {got}, DistributedSampler gives {want}: "
                    + _sampler_hint(got, want, n, replicas, shuffle, drop_last)
                )
    count = sum(c[1] for c in cases)
    return f"sampler_indices matches DistributedSampler ({part}) in {count} (case, rank) pairs."


def _sampler_hint(
    got: list[int], want: list[int], n: int, replicas: int, shuffle: bool, drop_last: bool
) -> str:
    if len(got) != len(want):
        if drop_last:
            return (
                f"with drop_last every rank gets {n} // {replicas} = {len(want)} samples; "
                "the tail is dropped."
            )
        return (
            f"every rank gets the same number of samples, ceil({n} / {replicas}) = {len(want)}: "
            "pad the index list by repeating it from the start until it divides evenly."
        )
    if not shuffle or sorted(got) == sorted(want):
        return (
            "DistributedSampler deals the (shuffled) index list round robin: rank r takes the "
            "indices at positions r, r + num_replicas, r + 2 * num_replicas, ..."
        )
    return (
        "the ranks' samples differ: shuffle with torch.randperm(n, generator=g), g a "
        "torch.Generator seeded with seed + epoch (the same permutation on every rank)."
    )
