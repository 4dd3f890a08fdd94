"""All-gathers the judge scales: the relay and a rank's own process groups scale the same ones."""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.distributed as dist

from course.ranks import launch, relay
from course.ranks.rescale import FACTORS, Rescale, factors

pytestmark = [pytest.mark.ranks]

CHOSEN = Rescale(seed=1234, parts=frozenset({1}), skip=2)


def _gathers(told: dict | None) -> list[list[float]]:
    """In part 0 two all-gathers, in part 1 four by four routes (part 1's first two skipped),
    each of 0..5 + 10 * rank (two ranks); what each gave back. ``told``: the gloo path's
    choice, as the FSDP checks send it."""
    rank = dist.get_rank()
    mine = torch.arange(3, dtype=torch.float32) + 10 * rank
    chosen = Rescale(told["seed"], frozenset(told["parts"]), told["skip"]) if told else None
    out = []
    with chosen.on_gloo() if chosen else contextlib.nullcontext() as gathers:
        for tag, calls in ((0, 2), (1, 4)):
            relay.mark(tag)
            if gathers is not None:
                gathers.mark(tag)
            for call in range(calls):
                into = torch.empty(6)
                if call == 3:
                    pieces = list(into.view(2, 3).unbind())
                    dist.all_gather(pieces, mine)
                else:
                    dist.all_gather_into_tensor(into, mine)
                out.append(into.tolist())
        ints = torch.empty(2, dtype=torch.int64)
        dist.all_gather_into_tensor(ints, torch.tensor([rank]))  # in part 1, but not a float
        out.append(ints.tolist())
    return out


def test_the_relay_and_gloo_scale_the_same_gathers() -> None:
    """Are the gathers after the first ``skip`` of a chosen part, and those only, scaled by
    the seed's factors, on the relay (told nothing) and on gloo (told the choice) alike,
    whatever route the gather took, and an integer gather left alone?"""
    plain = torch.arange(3, dtype=torch.float32)
    gathered = torch.cat([plain, plain + 10])
    scaled = (gathered * factors(CHOSEN.seed, 6)).tolist()
    want = [gathered.tolist()] * 4 + [scaled, scaled, [0, 1]]
    told = {"seed": CHOSEN.seed, "parts": sorted(CHOSEN.parts), "skip": CHOSEN.skip}
    on_relay = launch(_gathers, 2, None, backend="relay", rescale=CHOSEN, timeout=20).check()
    on_gloo = launch(_gathers, 2, told, timeout=20).check()
    assert on_relay == on_gloo == [want, want]


def test_the_factors_are_exact_powers_of_two_drawn_from_the_seed() -> None:
    """Are the factors -2, -1/2, 1/2 or 2 (exact in bf16), the same for a seed and size, and
    different for another seed?"""
    f = factors(7, 1000)
    assert set(f.tolist()) == set(FACTORS)
    assert torch.equal(f, factors(7, 1000))
    assert not torch.equal(f, factors(8, 1000))
    x = torch.randn(1000).bfloat16()
    assert torch.equal((x * f.bfloat16()).float(), x.float() * f.float())


def test_rescale_is_for_the_relay_only_unless_the_rank_scales() -> None:
    """Is ``launch(rescale=...)`` refused off the relay, where no one would scale?"""
    with pytest.raises(ValueError, match="only the relay scales"):
        launch(_gathers, 2, None, rescale=CHOSEN)
