"""Autograde a whole class: bounded parallelism, a time cap each, resumable, every outcome listed.

nbgrader's SQLite gradebook takes one writer at a time, so each submission is autograded by
its own ``nbgrader autograde`` process in a private scratch course (a copy of the gradebook,
links to ``source/`` and to that one student's submission); finished submissions are merged
into the real gradebook one at a time by this (single) process. Killing a run loses at most
the submissions in flight: ``autograded/.classrun.json`` records each finished one with a
hash of its submitted files, and the next run skips those whose files did not change.

    python -m course.instructor.classrun ring_allreduce --workers 2 --timeout 600
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass
from pathlib import Path

from course.instructor.commands import env

__all__ = ["Outcome", "autograde_class", "main"]

MANIFEST = ".classrun.json"


@dataclass
class Outcome:
    """How one student's submission ended: graded (with its score) or failed (with why)."""

    student: str
    status: str  # "graded", "failed" or "skipped" (graded before, files unchanged)
    score: float = 0.0
    max_score: float = 0.0
    seconds: float = 0.0
    error: str = ""
    digest: str = ""


def submission_digest(folder: Path) -> str:
    """A hash of every file the student submitted (names and contents)."""
    h = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        h.update(str(path.relative_to(folder)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def _autograde_one(
    root: Path, gradebook: Path, assignment: str, student: str, timeout: float
) -> tuple[Path, float]:
    """Autograde one submission in a scratch course; return it (caller removes) and seconds."""
    started = time.monotonic()
    scratch = Path(tempfile.mkdtemp(prefix=f"classrun-{student}-"))
    (scratch / "submitted" / student).mkdir(parents=True)
    os.symlink(
        root / "submitted" / student / assignment, scratch / "submitted" / student / assignment
    )
    os.symlink(root / "source", scratch / "source")
    shutil.copyfile(gradebook, scratch / "gradebook.db")
    cmd = [sys.executable, "-m", "nbgrader", "autograde", assignment, "--student", student]
    cmd += [f"--CourseDirectory.root={scratch}", "--force"]
    cmd += [f"--CourseDirectory.db_url=sqlite:///{scratch / 'gradebook.db'}"]
    with open(scratch / "autograde.log", "w") as log:
        proc = subprocess.Popen(cmd, cwd=root, stdout=log, stderr=subprocess.STDOUT,
                                env=env(), start_new_session=True)  # fmt: skip
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # nbgrader, its kernel and any ranks
            proc.wait()
            raise TimeoutError(
                f"autograde took longer than {timeout:.0f} s and was stopped"
            ) from None
    if code != 0 or not (scratch / "autograded" / student / assignment).is_dir():
        tail = (scratch / "autograde.log").read_text()[-600:]
        shutil.rmtree(scratch, ignore_errors=True)
        raise RuntimeError(f"nbgrader autograde exited with {code}: {tail}")
    return scratch, time.monotonic() - started


def _merge(root: Path, scratch: Path, assignment: str, student: str) -> tuple[float, float]:
    """Copy one submission's autograded files and grades from its scratch course; return score."""
    from nbgrader.api import Gradebook
    from sqlalchemy.exc import SAWarning

    dest = root / "autograded" / student / assignment
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(scratch / "autograded" / student / assignment, dest)
    with (
        warnings.catch_warnings(action="ignore", category=SAWarning),  # nbgrader's own noise
        Gradebook(f"sqlite:///{scratch / 'gradebook.db'}") as src,
        Gradebook(f"sqlite:///{root / 'gradebook.db'}") as gb,
    ):
        theirs = src.find_submission(assignment, student)
        gb.update_or_create_student(student)
        ours = gb.update_or_create_submission(assignment, student, timestamp=theirs.timestamp)
        for nb in theirs.notebooks:
            for grade in nb.grades:
                mine = gb.find_grade(grade.name, nb.name, assignment, student)
                mine.auto_score = grade.auto_score
                mine.needs_manual_grade = grade.needs_manual_grade
            for comment in nb.comments:
                note = gb.find_comment(comment.name, nb.name, assignment, student)
                note.auto_comment = comment.auto_comment
        gb.db.commit()
        return float(ours.score), float(ours.max_score)


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
    retry_failed: bool = False,
    progress: Callable[[str], None] = print,
) -> list[Outcome]:
    """Autograde every submission of ``assignment`` under ``root``; one :class:`Outcome` each."""
    root = Path(root).resolve()
    submitted = root / "submitted"
    everyone = sorted(p.name for p in submitted.iterdir() if (p / assignment).is_dir())
    todo = [s for s in everyone if students is None or s in students]
    manifest = _Manifest(root / "autograded" / MANIFEST, assignment)
    outcomes, queue = _plan(submitted, assignment, todo, manifest.entries, retry_failed)
    progress(f"{assignment}: {len(queue)} to grade, {len(outcomes)} unchanged since last run")
    started = time.monotonic()

    def record(outcome: Outcome) -> None:
        outcomes[outcome.student] = outcome
        manifest.write(outcome)
        n = sum(o.status != "skipped" for o in outcomes.values())
        what = (f"{outcome.score:g}/{outcome.max_score:g}" if outcome.status == "graded"
                else f"FAILED: {outcome.error[:120]}")  # fmt: skip
        progress(f"[{n}/{len(queue)}] {outcome.student}: {what} ({outcome.seconds:.1f} s)")

    snapshot = Path(tempfile.mkdtemp(prefix="classrun-")) / "gradebook.db"
    shutil.copyfile(root / "gradebook.db", snapshot)  # workers copy this, never the live one
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        pending: dict[Future, tuple[str, str]] = {}
        for student, digest in queue:
            fut = pool.submit(_autograde_one, root, snapshot, assignment, student, timeout)
            pending[fut] = (student, digest)
        while pending:
            finished, _ = wait(pending, return_when=FIRST_COMPLETED)
            for fut in finished:
                record(_collect(root, assignment, fut, *pending.pop(fut)))
    shutil.rmtree(snapshot.parent, ignore_errors=True)
    elapsed = time.monotonic() - started
    failed = sorted(s for s, o in outcomes.items() if o.status == "failed")
    progress(f"{assignment}: {len(queue)} graded in {elapsed:.0f} s; failed: {failed or 'none'}")
    return [outcomes[s] for s in todo]


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
    submitted: Path, assignment: str, todo: list[str], done: dict[str, dict], retry_failed: bool
) -> tuple[dict[str, Outcome], list[tuple[str, str]]]:
    """Outcomes kept from earlier runs (unchanged submissions), and the (student, digest) queue."""
    outcomes: dict[str, Outcome] = {}
    queue = []
    for student in todo:
        digest = submission_digest(submitted / student / assignment)
        before = done.get(student)
        keep = before and before["digest"] == digest
        if keep and (before["status"] == "graded" or not retry_failed):
            status = "skipped" if before["status"] == "graded" else before["status"]
            outcomes[student] = Outcome(**{**before, "status": status})
        else:
            queue.append((student, digest))
    return outcomes, queue


def _collect(root: Path, assignment: str, fut: Future, student: str, digest: str) -> Outcome:
    """One finished submission: merged into the gradebook, or failed with its reason."""
    outcome = Outcome(student, "failed", digest=digest)
    try:
        scratch, outcome.seconds = fut.result()
        try:  # merging is serial: only the caller's thread writes the real gradebook
            outcome.score, outcome.max_score = _merge(root, scratch, assignment, student)
            outcome.status = "graded"
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    except Exception as err:  # noqa: BLE001 - any failure is recorded; the run goes on
        outcome.error = f"{type(err).__name__}: {err}"
    return outcome


def main(argv: list[str] | None = None) -> int:
    """``python -m course.instructor.classrun ASSIGNMENT [--workers N] [--timeout S]``."""
    parser = argparse.ArgumentParser(
        prog="python -m course.instructor.classrun", description=__doc__
    )
    parser.add_argument("assignment")
    parser.add_argument("--root", default=".")
    parser.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) // 2))
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per submission")
    parser.add_argument("--retry-failed", action="store_true")
    parser.add_argument("--student", action="append", help="only these students")
    args = parser.parse_args(argv)
    outcomes = autograde_class(
        args.assignment, args.root, students=args.student, workers=args.workers,
        timeout=args.timeout, retry_failed=args.retry_failed,
        progress=lambda line: print(line, flush=True),
    )  # fmt: skip
    return 1 if any(o.status == "failed" for o in outcomes) else 0


if __name__ == "__main__":
    raise SystemExit(main())
