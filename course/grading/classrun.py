"""Autograde a whole class: on a local pool or a Dask cluster, a time cap each, resumable.

Each submitted folder is first inspected without following anything
(:mod:`course.grading.intake`): one holding a symlink, a hard link, a device, a FIFO, or too
much, is rejected with the reason and never reaches nbgrader. Each accepted submission
becomes one task of plain data (its files as read, the assignment's source, the config, a
gradebook without any student's work), graded by a worker of the executor
(:mod:`course.grading.executors`: a pool on this machine by default, or every worker of
a Dask scheduler) in a private scratch course, as a uid leased for it alone
(:mod:`course.grading.scratch`). Each worker sends back plain data, which this (single)
process checks and merges into the real gradebook one at a time: no worker writes it.
Killing a run loses at most the submissions in flight: ``autograded/.classrun.json`` records
each finished one with a hash of its submitted files; the next run skips those graded with
unchanged files and retries the rest.

    python -m course.grading.classrun ring_allreduce --workers 2 --timeout 600
    python -m course.grading.classrun ring_allreduce --scheduler tcp://HOST:8786
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from course.grading.executors import Executor, LocalPool, executor_for
from course.grading.gradebook import open_gradebook
from course.grading.intake import Rejected, inspect, read_inert
from course.grading.results import WRITING, merge
from course.grading.scratch import course_task, trimmed_gradebook
from course.grading.warm import warm_up

__all__ = ["Outcome", "autograde_class", "main", "submission_digest"]

MANIFEST = ".classrun.json"


@dataclass
class Outcome:
    """How one student's submission ended: graded (its score), or why it has no new grade."""

    student: str
    # "graded"; "skipped" (graded before, files unchanged); "failed" (the grading machine
    # failed or the time cap was hit: a rerun retries it); "rejected" (not plain files)
    status: str
    score: float = 0.0
    max_score: float = 0.0
    seconds: float = 0.0
    error: str = ""
    digest: str = ""
    note: str = ""  # graded, but something was left out of autograded/ (not a plain file)
    worker: str = ""  # host:pid of the worker that graded it


def submission_digest(folder: Path) -> str:
    """A hash of every file the student submitted (names and contents), following nothing."""
    return inspect(folder.parent, folder.name)


def _candidates(submitted: Path, assignment: str) -> list[str]:
    """Students with something at submitted/<student>/<assignment> (a symlinked student too)."""
    if not submitted.is_dir():
        return []
    with os.scandir(submitted) as entries:
        return sorted(
            e.name
            for e in entries
            if e.is_symlink()
            or (e.is_dir(follow_symlinks=False) and os.path.lexists(Path(e.path) / assignment))
        )


def _load_manifest(path: Path) -> dict[str, dict]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def autograde_class(
    assignment: str,
    root: str | os.PathLike = ".",
    *,
    students: list[str] | None = None,
    workers: int = 2,
    timeout: float = 600.0,
    progress: Callable[[str], None] = print,
    executor: Executor | None = None,
) -> list[Outcome]:
    """Autograde every submission of ``assignment`` under ``root``; one :class:`Outcome` each.

    ``executor`` grades the tasks (default: a local pool of ``workers``).
    """
    root = Path(root).resolve()
    executor = executor or LocalPool(workers)
    if isinstance(executor, LocalPool):
        warm_up()  # its graders fork from a forkserver of this process: start it now
    todo = [
        s for s in _candidates(root / "submitted", assignment) if students is None or s in students
    ]
    manifest = _Manifest(root / "autograded" / MANIFEST, assignment)
    outcomes, queue = _plan(root / "submitted", assignment, todo, manifest.entries)
    kept = sum(o.status == "skipped" for o in outcomes.values())
    progress(f"{assignment}: {len(queue)} to grade on {executor}, {kept} unchanged since last run")
    report = _Reporter(outcomes, manifest, len(queue), progress, assignment)
    for outcome in outcomes.values():
        if outcome.status != "skipped":
            report.before_run(outcome)
    started = time.monotonic()
    if queue:
        _grade_queue(root, assignment, queue, executor, timeout, report)
    elapsed = time.monotonic() - started
    failed = sorted(s for s, o in outcomes.items() if o.status == "failed")
    rejected = sorted(s for s, o in outcomes.items() if o.status == "rejected")
    progress(
        f"{assignment}: {len(queue)} autograded in {elapsed:.0f} s; "
        f"failed: {failed or 'none'}; rejected: {rejected or 'none'}"
    )
    for student in rejected:
        progress(f"    REJECTED {student}: {outcomes[student].error}")
    return [outcomes[s] for s in todo]


def _grade_queue(
    root: Path,
    assignment: str,
    queue: list[tuple[str, str]],
    executor: Executor,
    timeout: float,
    report: Callable[[Outcome], None],
) -> None:
    """Grade ``queue`` on ``executor``, one task each; merge each result here as it ends."""
    with WRITING:  # never copied while another assignment's result is being merged
        with open_gradebook(root / "gradebook.db"):  # made (or repaired) before it is copied
            pass
        gradebook = trimmed_gradebook(root / "gradebook.db")
    course = course_task(root, assignment, gradebook)
    tasks = []
    for student, digest in queue:
        try:
            files, _ = read_inert(root / "submitted", (student, assignment))
        except Rejected as why:  # it changed since the inspection, into something not plain
            report(Outcome(student, "rejected", error=f"submitted/{student}/{assignment}: {why}"))
            continue
        task = {"student": student, "digest": digest, "submission": files, "timeout": timeout}
        tasks.append(task)
    for result in executor.run(course, tasks):
        report(_collect(root, assignment, result))


@dataclass
class _Reporter:
    """Records each outcome (in the run's results and the manifest) and prints one line."""

    outcomes: dict[str, Outcome]
    manifest: _Manifest
    queued: int
    progress: Callable[[str], None]
    assignment: str = ""
    done: int = 0

    def before_run(self, outcome: Outcome) -> None:
        """An outcome decided by the inspection alone: rejected, or unreadable."""
        self.manifest.write(outcome)
        word = "REJECTED, not graded" if outcome.status == "rejected" else "FAILED"
        self.progress(f"{self.assignment}/{outcome.student}: {word}: {outcome.error}")

    def __call__(self, outcome: Outcome) -> None:
        self.outcomes[outcome.student] = outcome
        self.manifest.write(outcome)
        self.done += 1
        what = {
            "graded": f"{outcome.score:g}/{outcome.max_score:g}",
            "failed": f"FAILED: {outcome.error[:200]}",
            "rejected": f"REJECTED, not graded: {outcome.error}",
        }[outcome.status]
        note = f"; left out of autograded/: {outcome.note}" if outcome.note else ""
        self.progress(
            f"[{self.done}/{self.queued}] {self.assignment}/{outcome.student}: {what} "
            f"({outcome.seconds:.1f} s){note}"
        )


class _Manifest:
    """What was graded, per assignment and student, rewritten atomically after each one."""

    def __init__(self, path: Path, assignment: str) -> None:
        self.path, self.assignment = path, assignment
        path.parent.mkdir(exist_ok=True)
        self.entries: dict[str, dict] = _load_manifest(path).get(assignment, {})

    def write(self, outcome: Outcome) -> None:
        self.entries[outcome.student] = {**asdict(outcome), "status": outcome.status}
        with WRITING:  # one assignment's writer at a time rewrites the whole file
            everything = _load_manifest(self.path)
            everything[self.assignment] = self.entries
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(everything, indent=1, sort_keys=True))
            tmp.replace(self.path)  # atomic: an interrupted run never leaves half a manifest


def _plan(
    submitted: Path, assignment: str, todo: list[str], done: dict[str, dict]
) -> tuple[dict[str, Outcome], list[tuple[str, str]]]:
    """Inspect every submission; keep what was graded with unchanged files; queue the rest.

    Failed submissions are queued again (a machine-side failure may not recur); rejected
    ones, and ones that cannot be read, get their outcome here and never reach nbgrader.
    """
    outcomes: dict[str, Outcome] = {}
    queue = []
    for student in todo:
        try:
            digest = inspect(submitted, student, assignment)
        except Rejected as why:
            where = f"submitted/{student}/{assignment}"
            outcomes[student] = Outcome(student, "rejected", error=f"{where}: {why}")
            continue
        except OSError as err:
            outcomes[student] = Outcome(student, "failed", error=f"could not be read: {err}")
            continue
        before = done.get(student)
        if before and before["digest"] == digest and before["status"] in ("graded", "skipped"):
            outcomes[student] = Outcome(**{**before, "status": "skipped"})
        else:
            queue.append((student, digest))
    return outcomes, queue


def _collect(root: Path, assignment: str, result: dict) -> Outcome:
    """One finished submission: merged into the gradebook, or failed (or rejected) and why."""
    student, digest = result["student"], result["digest"]
    outcome = Outcome(student, "failed", digest=digest, seconds=float(result.get("seconds", 0)))
    outcome.worker = str(result.get("worker", ""))
    if result.get("status") == "rejected":
        outcome.status = "rejected"
        outcome.error = f"submitted/{student}/{assignment}: {result.get('error', '')}"
        return outcome
    if result.get("status") != "graded":
        outcome.error = str(result.get("error", "no result"))
        return outcome
    try:  # merging is serial: only this process writes the gradebook and autograded/
        outcome.score, outcome.max_score, left_out = merge(root, assignment, student, result)
        outcome.status, outcome.note = "graded", "; ".join(left_out)
    except Rejected as why:  # a result file name that could leave its folder
        outcome.error = f"the grading machine sent back an unsafe file ({why})"
    except Exception as err:  # noqa: BLE001 - any failure is recorded; the run goes on
        outcome.error = f"{type(err).__name__}: {err}"
    return outcome


def main(argv: list[str] | None = None) -> int:
    """``python -m course.grading.classrun ASSIGNMENT [--workers N | --scheduler URL]``."""
    parser = argparse.ArgumentParser(prog="python -m course.grading.classrun", description=__doc__)
    parser.add_argument("assignment")
    parser.add_argument("--root", default=".")
    parser.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) // 2))
    parser.add_argument(
        "--scheduler", help="grade on the Dask cluster of this scheduler (tcp://HOST:8786)"
    )
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per submission")
    parser.add_argument(
        "--retry-failed", action="store_true", help="kept for old scripts: every run retries"
    )
    parser.add_argument("--student", action="append", help="only these students")
    args = parser.parse_args(argv)
    outcomes = autograde_class(
        args.assignment, args.root, students=args.student, timeout=args.timeout,
        progress=lambda line: print(line, flush=True),
        executor=executor_for(args.scheduler, args.workers),
    )  # fmt: skip
    return 0 if all(o.status in ("graded", "skipped") for o in outcomes) else 1


if __name__ == "__main__":
    raise SystemExit(main())
