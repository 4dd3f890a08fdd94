"""Do the measurements of torch's ``fully_shard`` on gloo ranks support each keyed answer of
the fsdp quiz, and no other?

Keys are read from the source notebook's hidden checks (``source/fsdp/fsdp.ipynb``). Every
sharded step measured is torch's own (FSDP2); the package holds no FSDP.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import nbformat
import pytest
from quiz import SOURCE, keys, supported

from course.experiments import fsdp, fsdp_precision, fsdp_timeline
from course.experiments.zero import toy_model
from course.instructor import bank

pytestmark = pytest.mark.ranks

NOTEBOOK = SOURCE / "fsdp" / "fsdp.ipynb"
PACKAGE = Path(fsdp.__file__).parent


def _source() -> nbformat.NotebookNode:
    return nbformat.read(NOTEBOOK, as_version=4)


KEYS = keys("fsdp")


def _near(x: float, y: float, rel: float = 0.03) -> bool:
    return abs(x - y) <= rel * abs(y)


def test_fsdp_1_rows_of_an_uneven_weight(run_ranks) -> None:
    """Is a (7, 5) weight on 3 ranks cut into 3, 3 and 1 rows (Shard(0)), each rank's storage
    padded to 3 rows, and a (2, 3) one on 3 ranks into 1, 1 and 0?"""
    layout = run_ranks(fsdp.shard_layout, 3, (7, 5))
    assert all(r["placements"] == ["S(0)"] for r in layout)
    rows = [r["local"][0] for r in layout]
    claims = {
        "a": [r["local"] for r in layout] == [(12,), (12,), (11,)],
        "b": rows == [3, 3, 1] and all(r["storage"] == 3 * 5 * 4 for r in layout),
        "c": rows == [3, 2, 2],
        "d": rows == [7, 7, 7],
    }
    assert supported(claims) == KEYS["fsdp_1"]
    assert [r["local"] for r in run_ranks(fsdp.shard_layout, 3, (2, 3))] == [(1, 3), (1, 3), (0, 3)]


@pytest.fixture(scope="module")
def memory() -> dict[str, list[dict[str, int]]]:
    """What a rank of 4 holds and gathers: a unit per layer, one unit, no resharding (every
    unit, the root too, sharded with ``reshard_after_forward=True`` unless said otherwise)."""
    return {
        "per layer": fsdp.memory_on_ranks(4, per_layer=True),
        "one unit": fsdp.memory_on_ranks(4, per_layer=False),
        "kept": fsdp.memory_on_ranks(4, per_layer=True, reshard_after_forward=False),
    }


def test_fsdp_2_held_bytes_do_not_depend_on_the_units(memory) -> None:
    """Does a rank of 4 hold 4 bytes per parameter (1 + 1 + 2) between steps, per-layer units
    or one unit alike, and not the 1 + 4 + 2 = 7 of a whole gradient kept?"""

    def per_param(r: dict[str, int]) -> float:
        return (r["params"] + r["grads"] + r["state"]) / (r["model"] / 4)

    layer = [per_param(r) for r in memory["per layer"]]
    whole = [per_param(r) for r in memory["one unit"]]
    options = {"a": (4, 16), "b": (4, 7), "c": (16, 16), "d": (4, 4)}
    claims = {
        k: all(_near(x, a) for x in layer) and all(_near(x, b) for x in whole)
        for k, (a, b) in options.items()
    }
    assert supported(claims) == KEYS["fsdp_2"]
    r = memory["per layer"][0]
    assert r["params"] == r["grads"] == r["state"] // 2 == r["model"] // 4


def test_fsdp_3_one_unit_peaks_at_twice_the_model(memory) -> None:
    """Does one unit wrapping the model, ``fully_shard(model, reshard_after_forward=True)``,
    peak at 2 M of unsharded bytes, and a unit per layer at 2 layers?"""
    peaks = [r["peak unsharded"] / r["model"] for r in memory["one unit"]]
    options = {"a": 0.25, "b": 1.0, "c": 2.0, "d": 4.0}
    claims = {k: all(_near(p, m, 0.01) for p in peaks) for k, m in options.items()}
    assert supported(claims) == KEYS["fsdp_3"]
    assert all(r["peak unsharded"] == 2 * r["layer"] for r in memory["per layer"])


@pytest.fixture(scope="module")
def traffic() -> dict[bool, dict]:
    """Model sizes a rank of 4 sends per forward and backward, with and without resharding."""
    return {
        keep: fsdp.traffic_on_ranks(4, reshard_after_forward=not keep) for keep in (True, False)
    }


def test_fsdp_4_no_reshard_sends_one_gather_and_gloos_reduce_scatter(traffic) -> None:
    """Without resharding, 4 layers on 4 gloo ranks: 0.75 + 1.5 = 2.25 model sizes, one gather
    per layer; with it 3.0, two gathers per layer?"""
    kept, resharded = traffic[True], traffic[False]
    total = kept["forward"] + kept["backward"]
    options = {"a": 2.25, "b": 1.5, "c": 3.0, "d": 0.75}
    assert supported({k: _near(total, v) for k, v in options.items()}) == KEYS["fsdp_4"]
    assert kept["calls"] == {"all_gather_into_tensor": 4, "reduce_scatter_tensor": 4}
    assert resharded["calls"] == {"all_gather_into_tensor": 8, "reduce_scatter_tensor": 4}
    assert _near(resharded["forward"] + resharded["backward"], 3.0)


def test_fsdp_5_kept_layers_and_one_buffer(memory) -> None:
    """Without resharding, 8 layers: a peak of 9 layers of unsharded bytes?"""
    layers = [r["peak unsharded"] / r["layer"] for r in memory["kept"]]
    options = {"a": 1, "b": 2, "c": 8, "d": 9}
    claims = {k: all(_near(x, n, 0.01) for x in layers) for k, n in options.items()}
    assert supported(claims) == KEYS["fsdp_5"]


@pytest.fixture(scope="module")
def timelines() -> dict[bool, list[dict]]:
    """Timelines of 6 layers on 2 ranks, with and without explicit forward prefetch."""
    return {fp: fsdp_timeline.prefetch_on_ranks(2, forward_prefetch=fp) for fp in (False, True)}


def _orders(timeline: dict) -> tuple[list[str], list[str]]:
    events = timeline["events"]
    start = min(e[2] for e in events if e[0] == "pre_backward")
    forward = fsdp_timeline.gather_order(events, start)
    backward = fsdp_timeline.gather_order([e for e in events if e[2] >= start], float("inf"))
    return forward, backward


def test_fsdp_6_forward_prefetch_holds_a_third_layer(timelines) -> None:
    """With forward prefetch, a forward peak of 3 layers (2 without) and a backward peak of 2
    either way, on CPU ranks, the next gather issued before each layer computes?"""
    peaks = [r["peak"]["forward"] / r["layer"] for r in timelines[True]]
    without = [r["peak"]["forward"] / r["layer"] for r in timelines[False]]
    assert all(_near(p, 2, 0.01) for p in without)
    backward = [r["peak"]["backward"] / r["layer"] for fp in (False, True) for r in timelines[fp]]
    assert all(_near(p, 2, 0.01) for p in backward)
    options = {"a": 1, "b": 3, "c": 6, "d": 2}
    claims = {k: all(_near(p, n, 0.01) for p in peaks) for k, n in options.items()}
    assert supported(claims) == KEYS["fsdp_6"]
    forward, _ = _orders(timelines[True][0])
    assert forward.index("gather 2") < forward.index("compute 0")


def test_fsdp_7_backward_prefetches_by_itself(timelines) -> None:
    """Without any backward prefetch set, is the next layer's gather issued before the
    current layer's backward computes (and in forward, only when set)?"""
    forward, backward = _orders(timelines[False][0])
    assert forward.index("compute 0") < forward.index("gather 2")  # no forward prefetch
    units = [label.split()[1] for label in backward if label.startswith("compute")]
    pairs = list(itertools.pairwise(units))
    gathers = [label for label in backward if label.startswith("gather")]
    claims = {
        "a": all(backward.index(f"gather {n}") < backward.index(f"compute {u}") for u, n in pairs),
        "b": all(backward.index(f"gather {n}") > backward.index(f"compute {u}") for u, n in pairs),
        "c": all(backward.index(g) < backward.index(f"compute {units[0]}") for g in gathers),
        "d": not gathers,
    }
    assert len(pairs) == 5 and len(gathers) >= 5
    assert supported(claims) == KEYS["fsdp_7"]


def test_fsdp_8_mixed_precision_holds_fp32_shards_only() -> None:
    """Under bf16 params and fp32 reduce, does a rank of 4 hold 1 + 1 + 2 = 4 bytes per
    parameter, all fp32, and gather half the bytes it gathers in fp32?"""
    mixed = fsdp_precision.held_on_ranks(4, param_dtype="bf16")
    plain = fsdp_precision.held_on_ranks(4, param_dtype=None)
    totals = [r["params"] + r["grads"] + r["state"] for r in mixed]
    assert all(r["dtypes"] == ["torch.float32"] for r in mixed)
    options = {"a": 6, "b": 4.5, "c": 4, "d": 3.5}
    claims = {k: all(_near(t, v, 0.01) for t in totals) for k, v in options.items()}
    assert supported(claims) == KEYS["fsdp_8"]
    assert all(
        _near(m["peak unsharded"], p["peak unsharded"] / 2, 0.01)
        for m, p in zip(mixed, plain, strict=True)
    )


def test_fsdp_9_bf16_reduce_rounds_fp32_does_not() -> None:
    """On 4 ranks: a relative error of 1e-3 to 1e-2 reducing in bf16, under 1e-8 in fp32?"""
    low = fsdp_precision.reduce_on_ranks(4, reduce_dtype="bf16")
    high = fsdp_precision.reduce_on_ranks(4, reduce_dtype="fp32")
    print(f"bf16 {low:.2e}, fp32 {high:.2e}")
    claims = {
        "a": 1e-3 <= low <= 1e-2 and high < 1e-8,
        "b": 1e-3 <= low <= 1e-2 and 1e-3 <= high <= 1e-2,
        "c": low < 1e-6 and high < 1e-6,
        "d": 1e-5 <= low < 1e-4 and high < 1e-8,
    }
    assert supported(claims) == KEYS["fsdp_9"]


def test_fsdp_10_bf16_flushes_nothing_fp16_a_fifth() -> None:
    """Does the small model's fp16 gradient lose 10 to 40% of its elements to 0 unscaled and
    under 1% scaled by 1024, bf16's none, and a scale of 2^16 (above fp16's 65504) leave every
    fp16 gradient element NaN or infinite, where 2^15 leaves none?"""
    fp16 = fsdp_precision.underflow(1.0, "fp16")["zeroed"]
    bf16 = fsdp_precision.underflow(1.0, "bf16")["zeroed"]
    assert 0.1 <= fp16 <= 0.4
    assert fsdp_precision.underflow(1024.0, "fp16")["zeroed"] < 0.01
    elements = sum(p.numel() for p in toy_model(0, width=64, depth=6).parameters())
    assert fsdp_precision.underflow(2.0**16, "fp16")["inf"] == elements
    assert fsdp_precision.underflow(2.0**15, "fp16")["inf"] == 0
    claims = {"a": bf16 > fp16, "b": abs(bf16 - fp16) < 0.2 * fp16, "c": bf16 == 0, "d": bf16 == 1}
    assert supported(claims) == KEYS["fsdp_10"]


def _release(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """The cells as a student gets them: hidden tests and solutions cut out."""
    cut = re.compile(r"### BEGIN (HIDDEN TESTS|SOLUTION).*?### END \1", re.DOTALL)
    for cell in nb.cells:
        cell.source = cut.sub("", cell.source)
    return nb


def test_fsdp_items_keep_the_house_form() -> None:
    """Do the items keep the bank's form limits, and no give-away show in the cells a student
    gets or in the experiments' prose?"""
    items = bank.items_of(NOTEBOOK)
    assert len(items) >= 8 and {i.item_id for i in items} == set(KEYS)
    assert all(2 <= len(i.giveaways) <= 3 for i in items)
    difficulty = {
        cell.metadata["nbgrader"]["grade_id"].removesuffix("_question"): int(found.group(1))
        for cell in _source().cells
        if (found := re.search(r"\*Difficulty (\d)/3\*", cell.source))
    }
    assert {i.item_id: int(i.points) for i in items} == difficulty
    assert bank.form_problems(bank.form(items)) == []
    assert bank.giveaway_leaks(_release(_source()), items) == []
    for path in sorted(PACKAGE.glob("fsdp*.py")):
        text = bank.prose(path.read_text())
        leaks = [g for i in items for g in i.giveaways if re.search(g, text, re.IGNORECASE)]
        assert leaks == [], f"{path.name}: {leaks}"
