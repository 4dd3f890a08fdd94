"""The judge's own caps per submission: its memory and its time, watched from a thread.

    with JudgeLimits(seconds=450, memory=3 * 2**30) as limits:
        for cell in grade_cells:
            try:
                judge(cell)
            except OverLimit as over:   # this cell fails with over's reason; the next is judged
                ...

What the ranks send is capped message by message (``course.ranks.messages``), but a verdict
computed from many of them, or from one that is costly to read, could still hold the judge's
memory or time without end, and nbgrader's own cap would then end the submission as FAILED.
A watcher thread checks the judge's resident memory and the clock; past a cap it interrupts
the main thread with a signal whose handler raises :class:`OverLimit` (a ``BaseException``,
so no ``except Exception`` on the way swallows it; the launcher's ``finally`` blocks still
stop the ranks). Once the time is spent, :meth:`JudgeLimits.spent` says so before each cell.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from types import FrameType, TracebackType
from typing import Self

import psutil

__all__ = ["MEMORY", "SECONDS", "SECONDS_ENV", "JudgeLimits", "OverLimit"]

SECONDS = 450.0  # the judge's time per submission, unless $COURSE_JUDGE_SECONDS says
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
        self._deadline = 0.0
        self._why: str | None = None
        self._armed = threading.Event()  # set while a cell is being judged
        self._done = threading.Event()
        self._main = threading.main_thread().ident

    def __enter__(self) -> Self:
        self._deadline = time.monotonic() + self.seconds
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

    def spent(self) -> str | None:
        """Why nothing more may be judged (the time is up), or None."""
        if time.monotonic() >= self._deadline:
            return (
                f"grading this notebook took the {self.seconds:g} s the grader gives one "
                "submission before this check could run: the checks before it took that long "
                "(an endless loop, or code far slower than the exercise needs)"
            )
        return None

    @contextlib.contextmanager
    def judging(self) -> Iterator[None]:
        """Watch the caps while one cell is judged; a cap reached raises OverLimit in here."""
        self._why = None
        self._armed.set()
        try:
            yield
        finally:
            self._armed.clear()

    def _watch(self) -> None:
        me = psutil.Process()
        while not self._done.wait(_POLL):
            if not self._armed.is_set():
                continue
            why = None
            if time.monotonic() >= self._deadline:
                why = (
                    f"this check was still running when grading this notebook had taken the "
                    f"{self.seconds:g} s the grader gives one submission: an endless loop, or "
                    "code far slower than the exercise needs"
                )
            elif me.memory_info().rss > self.memory:
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
        if self._why is not None:
            why, self._why = self._why, None
            raise OverLimit(why)
