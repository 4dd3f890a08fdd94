"""The judge's own caps per submission: its memory and its CPU time, watched from a thread.

    with JudgeLimits() as limits:
        for cell in grade_cells:
            with limits.judging():      # OverLimit is raised in here, past a cap
                judge(cell)

What the ranks send is capped message by message (``course.ranks.messages``), and their
time by each check's deadline, but the judge's own work on what they sent (decoding replies,
reading traces, parsing the notebook) could still grow with what a submission makes it read,
and nbgrader's wall-clock cap would then end the submission as FAILED. A watcher thread looks
at the judge's resident memory and the CPU time this process (not its ranks) has used since
the ``with`` began: both are the judge's own, so a busy machine, which slows the wall clock,
does not bring them nearer. Past a cap it interrupts the main thread with a signal whose
handler raises :class:`OverLimit` (a ``BaseException``, so no ``except Exception`` on the way
swallows it; the launcher's ``finally`` blocks still stop the ranks); the judge fails that
cell with the reason. Once the time is spent, :meth:`JudgeLimits.spent` fails the rest.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from types import FrameType, TracebackType
from typing import Self

import psutil

__all__ = ["MEMORY", "SECONDS", "SECONDS_ENV", "JudgeLimits", "OverLimit"]

SECONDS = 120.0  # the judge's CPU seconds per submission, unless $COURSE_JUDGE_SECONDS says
SECONDS_ENV = "COURSE_JUDGE_SECONDS"
MEMORY = 3 * 2**30  # the judge's resident memory, bytes (torch and nbgrader take ~0.6 GiB)
_POLL = 0.1  # seconds between looks
_SIGNAL = signal.SIGUSR2


class OverLimit(BaseException):
    """The judge went over a cap while judging a cell; the message says which, in words."""


class JudgeLimits:
    """Caps on this process's memory and time for the duration of a ``with`` (module doc)."""

    def __init__(self, seconds: float | None = None, memory: int = MEMORY) -> None:
        self.seconds = float(os.environ.get(SECONDS_ENV, SECONDS)) if seconds is None else seconds
        self.memory = memory
        self._start = 0.0
        self._why: str | None = None
        self._inside = False  # the main thread is judging a cell: OverLimit may be raised
        self._armed = threading.Event()  # set while a cell is being judged
        self._done = threading.Event()
        self._main = threading.main_thread().ident

    def __enter__(self) -> Self:
        self._me = psutil.Process()
        self._start = self._cpu()
        self._previous = signal.signal(_SIGNAL, self._raise)
        self._watcher = threading.Thread(target=self._watch, name="judge-limits", daemon=True)
        self._watcher.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._done.set()
        self._watcher.join()
        signal.signal(_SIGNAL, self._previous)

    def _cpu(self) -> float:
        """CPU seconds this process (the judge, not its ranks) has used."""
        times = self._me.cpu_times()
        return times.user + times.system

    def used(self) -> float:
        """CPU seconds the judge has used since the ``with`` began."""
        return self._cpu() - self._start

    def spent(self) -> str | None:
        """Why nothing more may be judged (the judge's time is used up), or None."""
        if self.used() >= self.seconds:
            return (
                f"the grader had already spent the {self.seconds:g} s of its own time it gives "
                "one submission before this check could run: reading what the checks before "
                "it were sent back took that long"
            )
        return None

    @contextlib.contextmanager
    def judging(self) -> Iterator[None]:
        """Watch the caps while one cell is judged; a cap reached raises OverLimit in here."""
        self._why = None
        self._inside = True
        self._armed.set()
        try:
            yield
        finally:
            self._armed.clear()
            self._inside = False

    def _watch(self) -> None:
        while not self._done.wait(_POLL):
            if not self._armed.is_set():
                continue
            why = None
            if self.used() >= self.seconds:
                why = (
                    f"the grader spent more than the {self.seconds:g} s of its own time it gives "
                    "one submission reading what your code's ranks sent back for this check: "
                    "return only the values the exercise asks for"
                )
            elif self._me.memory_info().rss > self.memory:
                why = (
                    f"what your code's ranks sent back took more than {self.memory / 2**30:g} "
                    "GiB of the grader's memory to read: return only the values the exercise "
                    "asks for"
                )
            if why is not None:
                self._why = why
                self._armed.clear()
                signal.pthread_kill(self._main, _SIGNAL)

    def _raise(self, _signum: int, _frame: FrameType | None) -> None:
        if self._why is not None and self._inside:  # never once the cell is done
            why, self._why = self._why, None
            raise OverLimit(why)
