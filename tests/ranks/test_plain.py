"""Plain data and the rank's messages: what a graded rank can send its caller, and no more."""

from __future__ import annotations

import base64
import json
import pickle

import pytest
import torch

from course.ranks import messages, plain
from course.ranks.plain import PlainDataError


def test_plain_data_round_trips() -> None:
    value = {
        "n": 3,
        "x": 1.5,
        "s": "text",
        "none": None,
        "flag": True,
        "pair": (1, [2, 3]),
        7: [
            torch.arange(6, dtype=torch.int32).reshape(2, 3),
            torch.tensor(2.5, dtype=torch.bfloat16),
        ],
        "empty": torch.empty(0, 4),
        "mask": torch.tensor([True, False]),
    }
    back = plain.loads(plain.dumps(value))
    assert back.keys() == value.keys()
    assert back["pair"] == (1, [2, 3]) and isinstance(back["pair"], tuple)
    for got, want in zip(
        back[7] + [back["empty"], back["mask"]],
        value[7] + [value["empty"], value["mask"]],
        strict=True,
    ):
        assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want)


def test_a_tensor_subclass_travels_as_a_plain_tensor() -> None:
    class Sneaky(torch.Tensor):
        def __reduce_ex__(self, proto: int) -> tuple:
            raise AssertionError("never pickled")

    back = plain.loads(plain.dumps(torch.ones(3).as_subclass(Sneaky)))
    assert type(back) is torch.Tensor and torch.equal(back, torch.ones(3))


@pytest.mark.parametrize("value", [object(), {1.5: 2}, lambda: 0, b"bytes", {"a": {1, 2}}])
def test_what_is_not_plain_data_is_refused_on_the_rank(value: object) -> None:
    with pytest.raises(PlainDataError):
        plain.dumps(value)


def _tensor(dtype: str, shape: list, raw: bytes) -> bytes:
    return json.dumps({"$t": [dtype, shape, base64.b64encode(raw).decode()]}).encode()


@pytest.mark.parametrize(
    "reply",
    [
        b"\x80\x04K\x01.",  # a pickle
        b'{"__reduce__": 1}',
        b'{"$t": ["float32", [2], "AAAA"], "extra": 1}',
        _tensor("float32", [3], b"\0" * 8),  # the bytes do not match the shape
        _tensor("object", [1], b"\0" * 8),
        _tensor("float32", [-1], b""),
        b'{"$dict": [["a"]]}',
        b'{"$dict": [[1.5, 2]]}',
        b"[" * 100 + b"]" * 100,
    ],
)
def test_the_caller_accepts_plain_data_only(reply: bytes) -> None:
    with pytest.raises(PlainDataError):
        plain.loads(reply)


def test_messages_round_trip_and_anything_else_is_a_malformed_report() -> None:
    frames = [["<cell ring>", 3, "ring_allreduce", "dist.recv(x, 0)"]]
    raised = ("raised", {"type": "E", "text": "t", "frames": frames})
    for message in (("ok", b"\x00\x01"), raised, ("sys_exit", 2, frames), ("stack", frames)):
        got = messages.decode(messages.encode(message))
        assert json.dumps(got) == json.dumps(message) if message[0] != "ok" else got == message
    bad_frame = b'["stack", [["f", "one", "g", "h"]]]'
    for bad in (pickle.dumps(("ok", b"x")), b'["ok", 5]', b'["raised", {"type": 1}]', bad_frame,
                b'["shell", "rm -rf /"]', b"{}"):  # fmt: skip
        kind, info = messages.decode(bad)
        assert kind == "raised" and info["type"] == "ProtocolError"
        assert "malformed report" in info["text"]


def test_a_reply_that_would_cost_gigabytes_to_parse_is_refused_unparsed() -> None:
    """A few MB of empty lists would build tens of millions of objects: refused by count."""
    many = b"[" + b"[]," * 2_000_000 + b"[]]"
    with pytest.raises(PlainDataError, match="at most"):
        plain.loads(many)
    assert "malformed report" in messages.decode(many)[1]["text"]


def _over_the_cap() -> bytes:
    return b"x" * (messages.MAX_MESSAGE + 1)


@pytest.mark.ranks
def test_a_report_over_the_cap_fails_its_rank_with_the_reason() -> None:
    """Is a rank whose report is too large to read failed with that reason, not left
    blocked in its send until the deadline (a "deadlock" that did not say where)?"""
    from course.ranks import launch

    result = launch(_over_the_cap, 1, timeout=120)
    failure = result.failures[0]
    assert failure.kind == "raised", failure
    assert f"over the {messages.MAX_MESSAGE} a rank may send" in failure.message
