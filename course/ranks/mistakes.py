"""The mistakes students make most, recognised in an error's text, each with the hint that fits.

Pure text, no torch: ``course.ranks.failures`` adds the hint under a failed ``%%ranks`` cell
or ``run()``, and ``course.checks.teaching`` under a failed check. A hint is given only when
its pattern is the error itself, never for a guess. A native crash's dump on a rank's stderr
(gloo's C++ abort, faulthandler's stacks) is cut off and said in one line (:func:`native_crash`).
"""

from __future__ import annotations

import re

__all__ = [
    "ABORT_HINT", "COMMON_MISTAKES", "FUTURE_LIST_HINT", "hint_for", "native_crash", "plain_gloo",
]  # fmt: skip

FUTURE_LIST_HINT = (
    "A future from dist.all_reduce(..., async_op=True).get_future() holds a *list* of "
    "tensors (one per tensor reduced), not a tensor: take fut.value()[0] before dividing, "
    "e.g. fut.then(lambda f: f.value()[0] / world_size)."
)
CELL_NAMES_HINT = (
    "`rank` and `world_size` are ready in a %%ranks cell only, not inside a function you "
    "defined in another cell: ask the process group there, rank = dist.get_rank() and "
    "world_size = dist.get_world_size()."
)
TUPLE_HINT = (
    "torch.tensor_split (and torch.chunk) return a tuple of views: the tuple cannot be "
    "assigned to, but each view can be written in place, e.g. chunks[i].add_(received) or "
    "chunks[i].copy_(received), which changes the tensor it views."
)
ABORT_HINT = (
    "gloo aborts a rank when a message does not fit the buffer posted to receive it: check "
    "that each send and the peer's receive use the same number of elements and dtype."
)
COMMON_MISTAKES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"unsupported operand type\(s\) for \S+: 'list' and"), FUTURE_LIST_HINT),
    (re.compile(r"'list' object has no attribute '(div|mul|add|sub)_?'"), FUTURE_LIST_HINT),
    (re.compile(r"NameError: name '(rank|world_size)' is not defined"), CELL_NAMES_HINT),
    (re.compile(r"'tuple' object does not support item assignment"), TUPLE_HINT),
    (re.compile(r"a message of \d+ bytes arrived for a receive of \d+"), ABORT_HINT),
)

# gloo's own words, with the C++ file they come from: "[/.../unbound_buffer.cc:78] Timed out
# waiting 5000ms for recv operation to complete".
_GLOO_TIMEOUT = re.compile(
    r"\[[^\]]*gloo[^\]]*\]\s*Timed out waiting (\d+)ms for (send|recv) operation to complete"
)
_GLOO_PLACE = re.compile(r"\[[^\]]*(?:gloo|c10d)[^\]]*\.(?:cc|cpp|h):\d+\]\s*")


def hint_for(text: str) -> str | None:
    """The hint for a common mistake recognised in an error's text, if any."""
    for pattern, hint in COMMON_MISTAKES:
        if pattern.search(text):
            return hint
    return None


def plain_gloo(text: str) -> str:
    """gloo's error text in a student's words: no C++ file, a timeout said in seconds."""

    def timeout(match: re.Match[str]) -> str:
        seconds = int(match.group(1)) / 1000
        what = (
            "a receive got no message from"
            if match.group(2) == "recv"
            else "a send was never taken by"
        )
        return f"gloo gave up after {seconds:g} s: {what} its peer"

    return _GLOO_PLACE.sub("", _GLOO_TIMEOUT.sub(timeout, text))


# A native crash's dump on a rank's stderr, from its first line on: the C++ runtime's
# "terminate called ...", then faulthandler's "Fatal Python error: Aborted", every thread's
# stack (the launcher's frames) and the list of extension modules.
_CRASH_DUMP = re.compile(r"^(terminate called|Fatal Python error: )", re.MULTILINE)
_ENFORCE = re.compile(r"what\(\):\s*\[enforce fail at [^\]]*\]\s*(.+)")
_TOO_BIG = re.compile(r"op\.preamble\.length <= op\.nbytes\. (\d+) vs (\d+)")
_FATAL = re.compile(r"^Fatal Python error: (\w[\w ]*)", re.MULTILINE)


def native_crash(stderr: str) -> tuple[str, str | None]:
    """A rank's stderr cut where a native crash's dump begins, and the crash in a student's
    words ("gloo aborted it: a message of 12 bytes arrived for a receive of 8 bytes"); the
    text whole and None when it holds no dump."""
    start = _CRASH_DUMP.search(stderr)
    if start is None:
        return stderr, None
    dump = stderr[start.start() :]
    if too_big := _TOO_BIG.search(dump):
        sent, posted = too_big.groups()
        cause = f"gloo aborted it: a message of {sent} bytes arrived for a receive of {posted}"
        cause += " bytes"
    elif enforce := _ENFORCE.search(dump):
        cause = f"gloo aborted it: {enforce.group(1).strip()}"
    elif fatal := _FATAL.search(dump):
        cause = f"it crashed in native code ({fatal.group(1).strip()})"
    else:
        cause = "it crashed in native code"
    return stderr[: start.start()], cause
