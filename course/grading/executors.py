"""Where a class's submissions are graded: a pool on this machine, or a Dask cluster.

    LocalPool(workers=2)                      # this machine, 2 submissions at a time
    DaskCluster("tcp://10.0.0.5:8786")        # every worker of a running Dask scheduler

Both run :func:`course.grading.scratch.grade_task`, one task per submission, and yield its
plain result as each ends; neither writes anything of the class's. On Dask
(https://distributed.dask.org) a worker that dies mid-task costs a retry on another worker
(the scheduler reschedules what a lost worker held, up to ``distributed.scheduler.allowed-
failures`` times); a task lost for good comes back as a failed result, never a grade.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from typing import Any, Protocol

from course.grading.scratch import grade_task

__all__ = ["DaskCluster", "Executor", "LocalPool", "executor_for"]

CONNECT_TIMEOUT = 30.0  # seconds to reach a Dask scheduler


class Executor(Protocol):
    """Grades tasks somewhere; yields each plain result as it ends, in any order."""

    def run(self, course: dict[str, Any], tasks: list[dict[str, Any]]) -> Iterator[dict]: ...


def _lost(task: dict[str, Any], why: str, started: float) -> dict[str, Any]:
    """The result of a task the executor itself lost: failed, with why (a rerun retries it)."""
    error = f"the grading machine failed, not the submission ({why})"
    return {"student": task["student"], "digest": task["digest"], "status": "failed",
            "error": error, "seconds": time.monotonic() - started}  # fmt: skip


def _same(value: Any) -> Any:
    return value


class LocalPool:
    """Threads of this process, ``workers`` submissions at a time (each leases its own uid)."""

    def __init__(self, workers: int = 2) -> None:
        self.workers = max(1, workers)
        self._slots = threading.Semaphore(self.workers)  # shared by runs at the same time

    def __repr__(self) -> str:
        return f"a local pool of {self.workers}"

    def run(self, course: dict[str, Any], tasks: list[dict[str, Any]]) -> Iterator[dict]:
        started = time.monotonic()
        with ThreadPoolExecutor(max_workers=self.workers) as pool:
            pending = {pool.submit(self._grade, course, t): t for t in tasks}
            while pending:
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for fut in done:
                    task = pending.pop(fut)
                    err = fut.exception()
                    yield _lost(task, repr(err), started) if err else fut.result()

    def _grade(self, course: dict[str, Any], task: dict[str, Any]) -> dict[str, Any]:
        with self._slots:
            return grade_task(course, task)


class DaskCluster:
    """The workers of a running Dask scheduler at ``address`` (``tcp://HOST:8786``)."""

    def __init__(self, address: str) -> None:
        self.address = address

    def __repr__(self) -> str:
        return f"the Dask cluster at {self.address}"

    def run(self, course: dict[str, Any], tasks: list[dict[str, Any]]) -> Iterator[dict]:
        from distributed import Client, as_completed

        started = time.monotonic()
        with Client(self.address, timeout=CONNECT_TIMEOUT, set_as_default=False) as client:
            run_id = uuid.uuid4().hex[:8]
            # A task, not scattered data: a lost worker's copy is recomputed, not lost for good.
            shared = client.submit(_same, course, key=f"course-{course['assignment']}-{run_id}")
            futures = {
                client.submit(
                    grade_task, shared, t, pure=False,
                    key=f"autograde-{course['assignment']}-{t['student']}-{run_id}",
                ): t
                for t in tasks
            }  # fmt: skip
            for fut in as_completed(futures, loop=client.loop):
                task = futures[fut]
                try:
                    yield fut.result()
                except Exception as err:  # noqa: BLE001 - KilledWorker and the like: retried next run
                    yield _lost(task, f"{type(err).__name__} on the Dask cluster: {err}", started)
                finally:
                    fut.release()


def executor_for(scheduler: str | None, workers: int) -> Executor:
    """The executor a command line asks for: ``--scheduler`` given, else the local pool."""
    return DaskCluster(scheduler) if scheduler else LocalPool(workers)
