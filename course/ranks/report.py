"""Turn what the ranks of a run reported into a :class:`course.ranks.RunResult`.

Pure bookkeeping, no processes: each rank's raw outcome (its final message, how its
process ended, or the stack it was stopped in) becomes a ``RankFailure`` whose kind
separates causes from consequences. A rank that raised, exited, was killed or spun
is a cause; a rank stuck in a ``dist`` call because of it is ``blocked``; when no rank
is a cause and all are stuck in ``dist`` calls, they are ``deadlock``.
"""

from __future__ import annotations

import linecache
import os
import pickle
import re
import signal
import sys
import sysconfig
from typing import Any

from course.ranks import confined
from course.ranks import plain as plain_data
from course.ranks.failures import CAUSES, PEER_GONE, RankFailure, RunResult
from course.ranks.frames import DEADLOCK
from course.ranks.mistakes import native_crash, plain_gloo
from course.ranks.processes import SERVER_GONE
from course.ranks.wording import ranks_text

# gloo's words for "my peer never answered" (the relay's too, and its word for a deadlock it
# found before the deadline); a message from gloo's own C++ code names it
_TIMED_OUT = re.compile(r"Timed out|timeout|deadlock", re.IGNORECASE)
_FROM_GLOO = re.compile(r"\bgloo\b", re.IGNORECASE)
_COURSE_DIR = os.path.dirname(os.path.dirname(os.path.realpath(__file__))) + os.sep
# A rank's end of the relay's wire: torch's calls go through it as through torch's own code, so
# a rank stopped there (telling the relay it waits) is placed where the course or the student
# called torch.
_WIRE = os.path.join(_COURSE_DIR, "ranks", "link.py")
_LIBRARY_DIRS = tuple(
    {os.path.realpath(sysconfig.get_paths()[k]) + os.sep for k in ("stdlib", "purelib", "platlib")}
)


def build_result(
    ranks: list, outputs: list, reason: str, timeout: float, elapsed: float, plain: bool = False
) -> RunResult:
    """Collect values and outputs, then classify every rank that did not return.

    With ``plain`` (confined ranks, not trusted) values are decoded as plain data only.
    """
    results: list[Any] = [None] * len(ranks)
    raw: dict[int, dict[str, Any]] = {}
    for r in ranks:
        outcome = r.outcome or ("stopped",)
        if outcome[0] == "ok":
            try:
                results[r.rank] = (
                    plain_data.loads(outcome[1]) if plain else pickle.loads(outcome[1])  # noqa: S301 - a notebook's own ranks, never a graded run's
                )
                continue
            except Exception as exc:  # noqa: BLE001 - any load failure is this rank's failure
                outcome = ("raised", _load_error(exc))
        raw[r.rank] = _observe(r, outcome, reason, timeout)
    stdout = [out for out, _ in outputs]
    stderr = [err for _, err in outputs]
    for rank, err in enumerate(stderr):  # a native crash: its dump goes, its cause is said
        stderr[rank], crash = native_crash(err)
        if crash and raw.get(rank, {}).get("kind") == "killed":
            raw[rank]["message"] = raw[rank]["message"].split(" (")[0] + f": {crash}"
    failures = _resolve(raw, [r.rank for r in ranks if r.rank not in raw])
    return RunResult(len(ranks), results, stdout, stderr, failures, elapsed)


def _observe(r: Any, outcome: tuple, reason: str, timeout: float) -> dict[str, Any]:
    """Describe one rank's raw outcome as kind, message, where and traceback."""
    kind = outcome[0]
    if kind == "raised":
        info = outcome[1]
        where, in_dist = locate(info["frames"])
        text = plain_gloo(info["text"])
        tb = format_traceback(info["frames"], text)
        comm = None
        relayed = info["type"].endswith("RelayError")  # the relay ended the wait
        waits = in_dist or relayed or bool(_FROM_GLOO.search(info["text"]))  # DDP's: no dist frame
        if waits and PEER_GONE.search(info["text"]):
            comm = "peer"
        elif waits and _TIMED_OUT.search(info["text"]):
            comm = "timeout"
        at = f" at {where}" if where else ""
        summary = text.splitlines()[-1] if text else info["type"]
        message = f"raised {summary}{at}"
        waiter = "gloo"
        if relayed:  # on its deadline, or at once when it found that no rank could go on
            found = DEADLOCK in info["text"]
            waiter = "the relay, finding no rank could go on," if found else "the relay"
        return {"kind": "raised", "comm": comm, "message": message, "where": where, "tb": tb,
                "waiter": waiter}  # fmt: skip
    if kind == "sys_exit":
        where, _ = locate(outcome[2])
        message = f"called sys.exit({outcome[1]}) at {where}" if where else "called sys.exit()"
        tb = format_traceback(outcome[2], f"SystemExit: {outcome[1]}")
        return {"kind": "exited", "message": message, "where": where, "tb": tb, "code": outcome[1]}
    if kind == "ended":
        return _ended(r, outcome[1])
    where, in_dist = locate(r.stack) if r.stack else (None, False)
    tb = format_traceback(r.stack, "(still running here when stopped)") if r.stack else ""
    return {"kind": "stopped", "reason": reason, "where": where, "in_dist": in_dist, "tb": tb,
            "answered": r.stack is not None, "timeout": timeout}  # fmt: skip


def _ended(r: Any, code: int | None) -> dict[str, Any]:
    """A rank whose process ended without reporting: os._exit, a signal, a crash, or with
    its forkserver (which took the exit status with it: ``SERVER_GONE``)."""
    if code == SERVER_GONE:
        message = (
            "ended after the forkserver that started it was killed, by the machine or by code "
            "this submission ran (its exit status went with the forkserver)"
        )
        return {"kind": "killed", "message": message, "where": None, "tb": "", "code": code}
    if code is not None and code < 0:
        name = signal.Signals(-code).name if -code in signal.valid_signals() else str(-code)
        message = f"was killed by {name} (a crash in native code, or out of memory?)"
        return {"kind": "killed", "message": message, "where": None, "tb": "", "code": code}
    if r.exit_note:
        exit_code, frames = r.exit_note
        where, _ = locate(frames)
        message = f"called os._exit({exit_code}) at {where}"
        tb = format_traceback(frames, f"(the process ended here with code {exit_code})")
        return {"kind": "exited", "message": message, "where": where, "tb": tb, "code": exit_code}
    message = f"exited with code {code} without reporting (os._exit, or a crash in native code?)"
    return {"kind": "exited", "message": message, "where": None, "tb": "", "code": code}


def _resolve(raw: dict[int, dict[str, Any]], done: list[int]) -> dict[int, RankFailure]:
    """Name causes and consequences now that every rank's outcome is known (``done``: the
    ranks that returned)."""
    for obs in raw.values():
        if obs["kind"] == "stopped" and obs["reason"] == "deadline" and not obs["in_dist"]:
            obs["kind"] = "spin" if obs["answered"] else "timeout"
    causes = sorted(r for r, obs in raw.items() if obs["kind"] in CAUSES and not obs.get("comm"))
    deadlocked = any(obs.get("comm") == "timeout" for obs in raw.values())
    failures = {}
    for rank, obs in sorted(raw.items()):
        kind, message = _final_kind(obs, causes, deadlocked, done)
        failures[rank] = RankFailure(rank, kind, message, obs["where"], obs["tb"], obs.get("code"))
    return failures


def _final_kind(  # noqa: PLR0911 - a decision table, one return per outcome
    obs: dict[str, Any], causes: list[int], deadlocked: bool, done: list[int]
) -> tuple[str, str]:
    """The failure kind and message of one rank, given which ranks caused the failure."""
    kind, where = obs["kind"], obs["where"] or "an unknown place"
    waiting = ranks_text(causes) if causes else ""
    if kind == "raised" and obs["comm"]:
        return _gave_up(obs["comm"], where, causes, deadlocked, done, obs["waiter"])
    if kind == "spin":
        late = f"after the {obs['timeout']:g} s deadline (an endless loop?)"
        return kind, f"was still running at {where}, outside any dist call, {late}"
    if kind == "timeout":
        return kind, f"did not finish within {obs['timeout']:g} s and did not say where it was"
    if kind != "stopped":
        return kind, obs["message"]
    if obs["in_dist"] and causes:
        return "blocked", f"was blocked in {where}, waiting on {waiting}, which failed"
    if obs["in_dist"]:
        return "deadlock", f"deadlocked in {where}: no rank could make progress before the deadline"
    return "aborted", f"was stopped at {where} after {waiting or 'another rank'} failed"


def _gave_up(
    comm: str, where: str, causes: list[int], deadlocked: bool, done: list[int], waiter: str
) -> tuple[str, str]:
    """A rank whose wait on a peer ended in an error from ``waiter`` (gloo, or the relay):
    who it was waiting on."""
    if causes:
        return "blocked", f"was blocked in {where}, waiting on {ranks_text(causes)}, which failed"
    if comm == "timeout" and done:
        return "blocked", (
            f"was blocked in {where} until {waiter} gave up waiting: {ranks_text(done)} had "
            "already finished, and the matching call it waited for never came"
        )
    if comm == "timeout":
        return "deadlock", f"deadlocked in {where}: {waiter} gave up waiting for its peer"
    if deadlocked:
        return "deadlock", f"deadlocked in {where}: its peer gave up first"
    return "blocked", f"was blocked in {where}, and its peer rank finished without answering"


def locate(frames: list | None) -> tuple[str | None, bool]:
    """Where in the user's code a stack is, and whether it is inside a torch.distributed call.

    The user's frames are those of neither Python, an installed package nor the course
    package itself (its checks and recorder wrap the user's code on the ranks), however the
    course is installed. A stack with no user frame is placed at the course's innermost frame.
    """
    if not frames:
        return None, False
    user = [i for i, f in enumerate(frames) if owner(f[0]) == "user"]
    user = user or [i for i, f in enumerate(frames) if owner(f[0]) == "course"]
    i = user[-1] if user else -1
    inner = [f for f in frames[i + 1 :] if f"{os.sep}torch{os.sep}distributed{os.sep}" in f[0]]
    if not user:  # failed before reaching user code: start-up
        api = next((f[2] for f in inner if f[2] != "wrapper"), None)
        return (f"dist.{api} during start-up" if api else "start-up"), bool(inner)
    filename, lineno, _, line = frames[i]
    api = next((f[2] for f in inner if f[2] != "wrapper"), None)
    # Work.wait() blocks in C++ with no Python frame of its own: go by the source line.
    line = line or source_line(filename, lineno)
    in_dist = bool(inner) or bool(re.search(r"\bwait\(|\bdist\.", line))
    place = f"{display_name(filename)} line {lineno}"
    if owner(filename) == "course" and line:  # no traceback shows the course's code: quote it
        place = f"{place} (`{line.strip()}`)"
    return (f"dist.{api} at {place}" if api else place), in_dist


def format_traceback(frames: list, last_line: str) -> str:
    """A Python-style traceback of the user's own frames: none of the launcher's, the
    course's, torch's or Python's (the last line still says what was raised)."""
    frames = [f for f in frames or [] if owner(f[0]) == "user"]
    lines = ["Traceback (most recent call last):"] if frames else []
    for filename, lineno, name, line in frames:
        lines.append(f'  File "{display_name(filename)}", line {lineno}, in {name}')
        text = line or source_line(filename, lineno)
        if text:
            lines.append(f"    {text.strip()}")
    if last_line:
        lines.append(last_line)
    return "\n".join(lines)


def display_name(filename: str) -> str:
    """A short name for a code file: IPython's "Cell In[3]", else the file's basename."""
    shell = sys.modules.get("IPython") and sys.modules["IPython"].get_ipython()
    label = getattr(getattr(shell, "compile", None), "format_code_name", lambda _: None)(filename)
    if label:
        return " ".join(label)
    return filename if filename.startswith("<") else os.path.basename(filename)


def source_line(filename: str, lineno: int) -> str:
    """A source line from the caller's linecache, where IPython keeps notebook cells.

    Never for confined ranks: a file name they report must not make the caller read a file.
    """
    if confined.current() is not None:
        return ""
    return linecache.getline(filename, lineno).strip()


def owner(filename: str) -> str:
    """Whose code a frame runs: "library" (Python, installed packages, the relay's wire),
    "course" or "user"."""
    if filename.startswith("<frozen"):
        return "library"
    path = os.path.realpath(filename)
    if path == _WIRE:
        return "library"
    if path.startswith(_COURSE_DIR):  # first: the course may be installed among the packages
        return "course"
    return "library" if path.startswith(_LIBRARY_DIRS) else "user"


def _load_error(exc: Exception) -> dict[str, Any]:
    """Describe a return value the caller could not unpickle."""
    text = f"TypeError: the return value cannot be loaded by the caller: {exc}"
    return {"type": "TypeError", "text": text, "frames": []}
