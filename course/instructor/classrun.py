"""Autograde a whole class: bounded parallelism, a time cap each, resumable, every outcome listed.

Each submitted folder is first inspected without following anything
(:mod:`course.instructor.intake`): one holding a symlink, a hard link, a device, a FIFO, or too
much, is rejected with the reason and never reaches nbgrader. nbgrader's SQLite gradebook takes
one writer at a time, so each accepted submission is autograded by its own ``nbgrader
autograde`` process in a private scratch course (:mod:`course.instructor.scratch`), as the uid
of its worker slot (:mod:`course.instructor.slots`); finished submissions are merged into the
real gradebook one at a time by this (single) process. Killing a run loses at most the
submissions in flight: ``autograded/.classrun.json`` records each finished one with a hash of
its submitted files; the next run skips those graded with unchanged files and retries the rest.

    python -m course.instructor.classrun ring_allreduce --workers 2 --timeout 600
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass
from pathlib import Path

from course.instructor.commands import open_gradebook
from course.instructor.intake import Rejected, inspect
from course.instructor.scratch import autograde_one, merge
from course.instructor.slots import Slots

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
) -> list[Outcome]:
    """Autograde every submission of ``assignment`` under ``root``; one :class:`Outcome` each."""
    root = Path(root).resolve()
    todo = [
        s for s in _candidates(root / "submitted", assignment) if students is None or s in students
    ]
    manifest = _Manifest(root / "autograded" / MANIFEST, assignment)
    outcomes, queue = _plan(root / "submitted", assignment, todo, manifest.entries)
    kept = sum(o.status == "skipped" for o in outcomes.values())
    progress(f"{assignment}: {len(queue)} to grade, {kept} unchanged since last run")
    report = _Reporter(outcomes, manifest, len(queue), progress)
    for outcome in outcomes.values():
        if outcome.status != "skipped":
            report.before_run(outcome)
    started = time.monotonic()
    if queue:
        _grade_queue(root, assignment, queue, workers, timeout, report)
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
    workers: int,
    timeout: float,
    report: Callable[[Outcome], None],
) -> None:
    """Grade ``queue`` ``workers`` at a time, each as its slot's uid; merge each as it ends."""
    slots = Slots(max(1, workers))

    def grade(student: str) -> tuple[Path | BaseException, float]:
        """The scratch course graded (or why not), and the seconds it took either way."""
        started = time.monotonic()
        try:
            with slots.lend() as lease:  # every process of it is killed when it is given back
                graded: Path | BaseException = autograde_one(
                    root, snapshot, assignment, student, timeout, lease.uid
                )
        except Exception as err:  # noqa: BLE001 - recorded by _collect, with its time
            graded = err
        return graded, time.monotonic() - started

    with open_gradebook(root / "gradebook.db"):  # made (or repaired) before it is copied
        pass
    snapshot = Path(tempfile.mkdtemp(prefix="classrun-")) / "gradebook.db"
    shutil.copyfile(root / "gradebook.db", snapshot)  # workers copy this, never the live one
    try:
        with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
            pending = {pool.submit(grade, student): (student, digest) for student, digest in queue}
            while pending:
                finished, _ = wait(pending, return_when=FIRST_COMPLETED)
                for fut in finished:
                    report(_collect(root, assignment, fut, *pending.pop(fut)))
    finally:
        shutil.rmtree(snapshot.parent, ignore_errors=True)


@dataclass
class _Reporter:
    """Records each outcome (in the run's results and the manifest) and prints one line."""

    outcomes: dict[str, Outcome]
    manifest: _Manifest
    queued: int
    progress: Callable[[str], None]
    done: int = 0

    def before_run(self, outcome: Outcome) -> None:
        """An outcome decided by the inspection alone: rejected, or unreadable."""
        self.manifest.write(outcome)
        word = "REJECTED, not graded" if outcome.status == "rejected" else "FAILED"
        self.progress(f"{outcome.student}: {word}: {outcome.error}")

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
            f"[{self.done}/{self.queued}] {outcome.student}: {what} ({outcome.seconds:.1f} s){note}"
        )


class _Manifest:
    """What was graded, per assignment and student, rewritten atomically after each one."""

    def __init__(self, path: Path, assignment: str) -> None:
        self.path, self.assignment = path, assignment
        path.parent.mkdir(exist_ok=True)
        self.entries: dict[str, dict] = _load_manifest(path).get(assignment, {})

    def write(self, outcome: Outcome) -> None:
        self.entries[outcome.student] = {**asdict(outcome), "status": outcome.status}
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


def _collect(root: Path, assignment: str, fut: Future, student: str, digest: str) -> Outcome:
    """One finished submission: merged into the gradebook, or failed (or rejected) and why."""
    outcome = Outcome(student, "failed", digest=digest)
    graded, outcome.seconds = fut.result()
    try:
        scratch = _result(graded)
        try:  # merging is serial: only the caller's thread writes the real gradebook
            outcome.score, outcome.max_score, left_out = merge(root, scratch, assignment, student)
            outcome.status, outcome.note = "graded", "; ".join(left_out)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    except Rejected as why:  # it changed after the inspection, into something not plain
        where = f"submitted/{student}/{assignment}"
        outcome.status, outcome.error = "rejected", f"{where}: {why}"
    except Exception as err:  # noqa: BLE001 - any failure is recorded; the run goes on
        outcome.error = f"{type(err).__name__}: {err}"
    return outcome


def _result(graded: Path | BaseException) -> Path:
    """The scratch course, or the grading's own exception raised again."""
    if isinstance(graded, BaseException):
        raise graded
    return graded


def main(argv: list[str] | None = None) -> int:
    """``python -m course.instructor.classrun ASSIGNMENT [--workers N] [--timeout S]``."""
    parser = argparse.ArgumentParser(
        prog="python -m course.instructor.classrun", description=__doc__
    )
    parser.add_argument("assignment")
    parser.add_argument("--root", default=".")
    parser.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) // 2))
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per submission")
    parser.add_argument(
        "--retry-failed", action="store_true", help="kept for old scripts: every run retries"
    )
    parser.add_argument("--student", action="append", help="only these students")
    args = parser.parse_args(argv)
    outcomes = autograde_class(
        args.assignment, args.root, students=args.student, workers=args.workers,
        timeout=args.timeout, progress=lambda line: print(line, flush=True),
    )  # fmt: skip
    return 0 if all(o.status in ("graded", "skipped") for o in outcomes) else 1


if __name__ == "__main__":
    raise SystemExit(main())
