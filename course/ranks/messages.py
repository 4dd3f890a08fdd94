"""What a rank tells its caller, as JSON: the one protocol on the pipe between them.

A rank sends ``["ok", value]`` (the return value, encoded: cloudpickle in a notebook's own
runs, plain data in graded ones, see :mod:`course.ranks.plain`), ``["raised", {type, text,
frames}]``, ``["sys_exit", code, frames]``, ``["os_exit", code, frames]`` or ``["stack",
frames]``; a frame is ``[file, line, function, source line]``. :func:`decode` checks every
field, so a rank that ran someone else's code cannot send the caller anything but these.
"""

from __future__ import annotations

import base64
import json
import os
import select
import struct
import time
from multiprocessing.connection import Connection
from typing import Any

from course.ranks.plain import too_many_values

__all__ = [
    "MAX_MESSAGE",
    "TooLongError",
    "decode",
    "encode",
    "malformed",
    "receive",
]

MAX_MESSAGE = 64 * 2**20
_TEXT = 20_000  # characters kept of any one string
_FRAMES = 200  # frames kept of any one stack


def encode(message: tuple) -> bytes:
    """A rank's message as bytes (a return value's bytes travel as base64)."""
    if message[0] == "ok":
        message = ("ok", base64.b64encode(message[1]).decode("ascii"))
    return json.dumps(message, separators=(",", ":")).encode()


class TooLongError(OSError):
    """A rank's message is over :data:`MAX_MESSAGE`: it is not read."""


def receive(conn: Connection, timeout: float) -> bytes:
    """One message from a rank's connection, whole within ``timeout`` seconds of its start.

    ``Connection.recv_bytes`` would wait forever for a message whose sender stopped halfway;
    this reads the same framing (a 4-byte length, or -1 and an 8-byte one) with a deadline.
    Raises EOFError, TimeoutError or TooLongError instead.
    """
    fd, deadline = conn.fileno(), time.monotonic() + timeout
    (size,) = struct.unpack("!i", _read(fd, 4, deadline))
    if size == -1:
        (size,) = struct.unpack("!Q", _read(fd, 8, deadline))
    if not 0 <= size <= MAX_MESSAGE:
        raise TooLongError(f"a message of {size} bytes, over the {MAX_MESSAGE} a rank may send")
    return _read(fd, size, deadline)


def _read(fd: int, n: int, deadline: float) -> bytes:
    chunks, got = [], 0
    while got < n:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            raise TimeoutError("a rank stopped sending halfway through a message")
        chunk = os.read(fd, min(n - got, 2**20))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def decode(data: bytes) -> tuple:
    """A validated message, or a ``raised`` one that says the rank's report was malformed."""
    if len(data) > MAX_MESSAGE or too_many_values(data):
        return malformed(f"a message of {len(data)} bytes is too large")
    try:
        return _validated(json.loads(data))
    except (ValueError, TypeError, KeyError, IndexError, RecursionError) as err:
        return malformed(str(err)[:200])


def malformed(why: str) -> tuple:
    text = f"ProtocolError: the rank sent its caller a malformed report ({why})"
    return ("raised", {"type": "ProtocolError", "text": text, "frames": []})


def _validated(m: Any) -> tuple:
    if not isinstance(m, list) or not m or not isinstance(m[0], str):
        raise TypeError("not a message")
    kind = m[0]
    if kind == "ok" and len(m) == 2 and isinstance(m[1], str):
        return ("ok", base64.b64decode(m[1], validate=True))
    if kind == "raised" and len(m) == 2 and isinstance(m[1], dict):
        info = m[1]
        return ("raised", {"type": _text(info["type"]), "text": _text(info["text"]),
                           "frames": _frames(info["frames"])})  # fmt: skip
    if kind in ("sys_exit", "os_exit") and len(m) == 3:
        return (kind, _int(m[1]), _frames(m[2]))
    if kind == "stack" and len(m) == 2:
        return ("stack", _frames(m[1]))
    raise TypeError(f"unknown message {kind[:40]!r}")


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError("a text field is not a string")
    return value[:_TEXT]


def _int(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or abs(value) > 2**31:
        raise TypeError("an exit code is not a small integer")
    return value


def _frames(value: Any) -> list:
    if not isinstance(value, list):
        raise TypeError("frames are not a list")
    frames = []
    for f in value[-_FRAMES:]:
        if not (isinstance(f, list) and len(f) == 4):
            raise TypeError("a frame is malformed")
        frames.append([_text(f[0])[:500], _int(f[1]), _text(f[2])[:200], _text(f[3])[:500]])
    return frames
