"""The relay's storage (course.ranks.objects): does a relay run's rank write whole objects,
read element ranges and list keys through it, is each put and get in the relay's record with
its bytes, does the caller hold what is stored, and is a bad request refused in words?"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from course.ranks import launch, relay
from course.ranks.frames import RelayError
from course.ranks.objects import MAX_STORED, Objects, Stored

pytestmark = [pytest.mark.ranks, pytest.mark.slow]


def writes_and_reads() -> tuple:
    rank = dist.get_rank()
    relay.put(f"x/{rank}", torch.arange(6, dtype=torch.float32) + 10 * rank)
    dist.barrier()
    return relay.keys(), relay.get(f"x/{1 - rank}", 2, 5), relay.get("start")


def test_puts_and_ranged_gets_are_recorded_and_stored_with_the_caller() -> None:
    start = {"start": Stored("int64", torch.arange(3).numpy().tobytes())}
    result = launch(writes_and_reads, 2, backend="relay", stored=start)
    assert result.ok, result.failures
    (keys0, got0, whole0), (_, got1, _) = result.results
    assert keys0 == ["start", "x/0", "x/1"]
    assert got0.tolist() == [12.0, 13.0, 14.0] and got1.tolist() == [2.0, 3.0, 4.0]
    assert whole0.tolist() == [0, 1, 2]
    moved = sorted((e.kind, e.src, e.nbytes[0], e.op) for e in result.relayed
                   if e.kind in ("put", "get"))  # fmt: skip
    assert moved == [
        ("get", 0, 12, "x/1"), ("get", 0, 24, "start"), ("get", 1, 12, "x/0"),
        ("get", 1, 24, "start"), ("put", 0, 24, "x/0"), ("put", 1, 24, "x/1"),
    ]  # fmt: skip
    assert result.stored["x/1"].tensor().tolist() == [10.0, 11.0, 12.0, 13.0, 14.0, 15.0]


def refused() -> list[str]:
    said = []
    for ask in (
        lambda: relay.get("missing"),
        lambda: relay.put("no spaces", torch.zeros(2)),
        lambda: relay.get("x", 3, 9),
        lambda: relay.get("x", -1, 2),
    ):
        try:
            ask()
            said.append("")
        except Exception as err:  # noqa: BLE001 - what each raised is the answer
            said.append(str(err))
    return said


def test_a_bad_request_fails_that_call_with_its_reason() -> None:
    start = {"x": Stored("float32", torch.zeros(4).numpy().tobytes())}
    result = launch(refused, 1, backend="relay", stored=start)
    assert result.ok, result.failures
    missing, key, past, negative = result.results[0]
    assert "holds no object of that key" in missing
    assert "a key must be a string" in key
    assert "0 <= start <= stop <= 4" in past and "0 <= start <= stop <= 4" in negative


def test_the_storage_holds_at_most_its_cap() -> None:
    full = Objects({"full": Stored("uint8", bytes(MAX_STORED))})
    with pytest.raises(RelayError, match="at most 64 MB"):
        full.put("more", {"dtype": "uint8", "shape": [1]}, b"\0")
    full.put("full", {"dtype": "uint8", "shape": [1]}, b"\0")  # a replaced object frees its bytes
    assert full.keys() == ["full"]


def test_only_the_relay_keeps_a_storage() -> None:
    with pytest.raises(ValueError, match="only the relay keeps a storage"):
        launch(writes_and_reads, 2, stored={})
