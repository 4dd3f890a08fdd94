"""What a run of ranks reports: per-rank failures, the run's result, and the error it raises.

Plain data, no processes and no torch: the launcher fills these in (``course.ranks.report``
decides each failure's kind and which frames are the user's) and every check turns a
:class:`RankError` into its teaching message with ``course.checks.teaching``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from course.ranks.mistakes import hint_for
from course.ranks.wording import count, ranks_text

__all__ = [
    "CAUSES",
    "CELL_NAME",
    "RankError",
    "RankFailure",
    "RanksInterrupted",
    "RunResult",
    "format_report",
]

CELL_NAME = "<cell>"  # the filename of run_source() code in tracebacks
# Kinds that start a failure; the others (blocked, aborted, deadlock, timeout) follow from one.
CAUSES = frozenset({"raised", "exited", "killed", "spin"})
# gloo's words for "my peer went away": a rank that raised this only followed another's failure
PEER_GONE = re.compile(
    r"Connection (closed|reset) by peer|Broken pipe|ECONNRESET|EPIPE", re.IGNORECASE
)


@dataclass(frozen=True)
class RankFailure:
    """What went wrong on one rank: ``kind``, a one-line ``message``, ``where``, ``traceback``.

    Kinds. Causes: ``raised`` (an exception, or a value that cannot be sent back),
    ``exited`` (sys.exit or os._exit), ``killed`` (a signal: segfault, OOM killer),
    ``spin`` (still running outside any dist call at the deadline). Consequences:
    ``blocked`` (waiting in a dist call on a rank that failed), ``aborted`` (stopped
    after another rank failed), ``deadlock`` (every unfinished rank waiting in a dist
    call, no cause), ``timeout`` (did not finish and did not say where it was).
    """

    rank: int
    kind: str
    message: str
    where: str | None = None
    traceback: str = ""
    exitcode: int | None = None

    def __str__(self) -> str:
        return f"rank {self.rank} {self.message}"

    @property
    def is_cause(self) -> bool:
        """Whether this rank failed by itself, not only because a peer it waited on failed."""
        return self.kind in CAUSES and not (
            self.kind == "raised" and PEER_GONE.search(self.message)
        )


@dataclass
class RunResult:
    """Everything a run left behind: per-rank values, output and failures."""

    world_size: int
    results: list[Any]
    stdout: list[str]
    stderr: list[str]
    failures: dict[int, RankFailure] = field(default_factory=dict)
    elapsed: float = 0.0
    relayed: tuple = ()  # backend="relay": every message and collective, as the caller saw it
    stored: dict = field(default_factory=dict)  # backend="relay": its storage's objects, at the end

    @property
    def ok(self) -> bool:
        """Whether every rank returned normally."""
        return not self.failures

    def check(self) -> list[Any]:
        """The per-rank values, or raise :class:`RankError` if any rank failed."""
        if self.failures:
            raise RankError(self)
        return self.results


class RankError(RuntimeError):
    """One or more ranks failed; ``failures`` maps rank -> :class:`RankFailure`."""

    def __init__(self, result: RunResult) -> None:
        self.result = result
        self.failures = result.failures
        super().__init__(format_report(result))

    def __reduce__(self) -> tuple:
        return (RankError, (self.result,))

    def _render_traceback_(self) -> list[str]:
        """Show the ranks' own tracebacks in IPython, not the launcher's frames."""
        return [f"RankError: {self}"]


class RanksInterrupted(KeyboardInterrupt):
    """An interrupt (Ctrl-C, Jupyter's stop button) during a run, after every rank was stopped.

    Still a ``KeyboardInterrupt``, so Jupyter stops a Run All there; IPython shows one line.
    """

    def __init__(self, world_size: int, elapsed: float) -> None:
        self.world_size, self.elapsed = world_size, elapsed
        super().__init__(
            f"interrupted after {elapsed:.1f} s: all {count(world_size, 'rank')} of the run "
            "were stopped, and nothing of it is left running"
        )

    def __reduce__(self) -> tuple:
        return (RanksInterrupted, (self.world_size, self.elapsed))

    def _render_traceback_(self) -> list[str]:
        """The one line IPython prints instead of the launcher's frames."""
        return [f"KeyboardInterrupt: {self}"]


def format_report(result: RunResult) -> str:
    """The RankError message: one line per failed rank, causes first, the hint for a common
    mistake where a cause's error is one, then the causes' own tracebacks."""
    failures = sorted(result.failures.values(), key=lambda f: (not f.is_cause, f.rank))
    lines = [f"{len(failures)} of {count(result.world_size, 'rank')} failed:"]
    lines += [f"  {f}" for f in failures]
    causes = [f for f in failures if f.is_cause]
    lines += sorted({hint_for(f"{f.message}\n{f.traceback}") for f in causes} - {None})
    shown: dict[str, list[int]] = {}
    for f in causes:
        if f.traceback:
            shown.setdefault(f.traceback, []).append(f.rank)
    for text, ranks in shown.items():
        lines += ["", f"{ranks_text(ranks)}:", text]
    return "\n".join(lines)
