"""The instructor's pipeline: release, run, sample submissions, autograde, feedback, grades.

    python -m course.instructor.pipeline demo       # the whole course end to end, in build/demo/
    python -m course.instructor.pipeline release    # generate_assignment: source/ -> release/
    python -m course.instructor.pipeline autograde  # submitted/: grade, feedback, export, table
    python -m course.instructor.pipeline selfstudy  # selfstudy/<a>/<a>.ipynb (see selfstudy.py)

Every grading step is the real nbgrader command line (``nbgrader generate_assignment``,
``autograde``, ``generate_feedback``, ``export``) run in a course root holding
``nbgrader_config.py``; the steps are plain functions of that root so a test can run them in
a temporary copy. Sample submissions are TOML specs in ``autograde/submissions/`` (format in
autograde/README.md), assembled onto the committed release notebooks so they never go stale.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nbformat

from course.grading.classrun import Outcome, autograde_class
from course.grading.executors import Executor, executor_for
from course.grading.gradebook import open_gradebook
from course.instructor.bank import giveaway_leaks, items_of
from course.instructor.commands import (
    assignments,
    execute,
    export,
    feedback,
    release,
    say,
)
from course.instructor.grades import (
    check_expectations,
    format_grades,
    grade_rows,
    near_copies,
)
from course.instructor.selfstudy import write_selfstudy
from course.instructor.submissions import SPECS, load_specs, submit

__all__ = ["autograde", "demo", "main", "prepare_course"]

REPO = Path(__file__).resolve().parents[2]


def autograde(
    root: Path, assignment: str, workers: int = 2, executor: Executor | None = None
) -> list[Outcome]:
    """Grade every submission of ``assignment`` in submitted/: the course's one grading path.

    ``course.grading.classrun`` (each submission inspected, sent as plain data to a worker
    that grades it with its own ``nbgrader autograde`` and the judge, as a uid leased for
    it), on ``executor`` (default: ``workers`` at a time on this machine); one outcome per
    student, each listed as it ends.
    """

    def progress(line: str) -> None:
        say("    " + line)

    return autograde_class(assignment, root, workers=workers, progress=progress, executor=executor)


def prepare_course(dest: Path, source: Path = REPO / "source") -> Path:
    """A fresh course root at ``dest``: a copy of ``source`` and the repo's nbgrader_config.py."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    ignore = shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__")
    shutil.copytree(source, dest / "source", ignore=ignore)
    shutil.copy2(REPO / "nbgrader_config.py", dest / "nbgrader_config.py")
    return dest


def _release_drift(root: Path, repo: Path) -> list[str]:
    """Release files that differ between a regenerated root/release and the repo's release/."""
    made = {p.relative_to(root / "release") for p in (root / "release").rglob("*") if p.is_file()}
    kept = {p.relative_to(repo / "release") for p in (repo / "release").rglob("*") if p.is_file()}
    differ = [
        p
        for p in made & kept
        if (root / "release" / p).read_bytes() != (repo / "release" / p).read_bytes()
    ]
    return sorted(str(p) for p in (made ^ kept) | set(differ))


def _report_run(path: Path, out: Path, source: Path) -> None:
    """Run a release notebook as a student who answered nothing; say what a student would not
    expect: an error that is not a check's, or an output that gives a quiz item away."""
    start = time.monotonic()
    errors = execute(path, out=out)
    took = f"{time.monotonic() - start:.1f} s"
    # Unanswered items and stubs say so and let Run All go on: as released, no cell raises.
    say(f"    {path.name} ran top to bottom in {took}: {len(errors) or 'no'} cells raised")
    for e in errors:
        kind = "a check failed" if e.expected else "UNEXPECTED"
        say(f"    {kind}: {e.ename} in cell {e.grade_id}: {e.message}")
    executed = nbformat.read(out, as_version=4)
    for leak in giveaway_leaks(executed, items_of(source), outputs=True):
        say(f"    UNEXPECTED give-away in an output: {leak}")


def demo(
    dest: Path = REPO / "build" / "demo",
    source: Path = REPO / "source",
    specs: Path = SPECS,
    jobs: int = 2,
) -> int:
    """The whole course end to end in a throwaway root; 0 when every grade is as expected.

    Grades each assignment's samples as `make autograde` does (``jobs`` submissions at a
    time), then runs the release notebooks ``jobs`` at a time, as a student who has not
    answered anything would.
    """
    t0 = time.monotonic()
    step = _stepper(t0)
    root = prepare_course(dest, source)
    subs = load_specs(specs)
    step(f"course copied to {root}; {len(subs)} sample submissions in {specs}")

    made = release(root)
    drift = _release_drift(root, source.parent) if source == REPO / "source" else []
    step(f"generate_assignment: {', '.join(str(p.relative_to(root)) for p in made)}")
    if drift:
        stale = ", ".join(drift)
        say(f"    WARNING: release/ is not what source/ generates ({stale}): run make release")

    submit(root, subs)
    step(f"submitted/: {len(subs)} notebooks assembled from the specs onto release/")
    for assignment in sorted({s.assignment for s in subs}):
        outcomes = autograde(root, assignment, workers=jobs)
        failed = [f"{assignment}/{o.student}: {o.status} {o.error}" for o in outcomes if o.error]
        for line in failed:
            say(f"    NOT GRADED: {line}")
    step(f"autograded every sample, {jobs} at a time")
    out = root / "build" / "executed"
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        runs = [
            pool.submit(
                _report_run, path, out / path.name, root / "source" / path.parent.name / path.name
            )
            for path in made
        ]
        for task in runs:
            task.result()
    step("release notebooks run top to bottom (build/executed/)")
    pages = feedback(root)
    csv = export(root)
    step(f"generate_feedback: {len(pages)} HTML pages; export: {csv.relative_to(root)}")

    rows = grade_rows(root)
    _say_grades(rows, near_copies(root))
    problems = check_expectations(rows, subs)
    for p in problems:
        say(f"    NOT AS EXPECTED: {p}")
    say(f"Feedback HTML: {root / 'feedback'}/<student>/<assignment>/<assignment>.html")
    say(f"Grades CSV:    {csv}")
    verdict = "every grade as its spec expects" if not problems else f"{len(problems)} surprises"
    say(f"demo finished in {time.monotonic() - t0:.0f} s: {verdict}")
    return 1 if problems or drift else 0


def _say_grades(rows: list, copies: dict) -> None:
    """The grade table, and why the samples are flagged as near copies (they are)."""
    say("\n" + format_grades(rows, copies) + "\n")
    if copies:  # the samples are the course's solutions with a mistake each
        say(
            "    The samples are built from the course's own solutions, so most are flagged as "
            "near copies of them;\n    in a real class the flag marks a submission to look at "
            "(it changes no grade)."
        )


def _stepper(t0: float) -> Callable[[str], None]:
    def step(text: str) -> None:
        say(f"[{time.monotonic() - t0:6.1f} s] {text}")

    return step


def _ensure_released(root: Path, todo: list[str]) -> None:
    """Generate the release if the gradebook (made here on a fresh clone) lacks an assignment.

    The gradebook learns an assignment's grade cells from ``generate_assignment``.
    """
    from nbgrader.api import MissingEntry

    with open_gradebook(root / "gradebook.db") as gb:
        missing = []
        for assignment in todo:
            try:
                gb.find_assignment(assignment)
            except MissingEntry:
                missing.append(assignment)
    if missing:
        say(f"{', '.join(missing)} not in the gradebook yet: generating the release first")
        release(root, missing[0] if len(missing) == 1 else "*")  # one nbgrader for several


def _autograde_course(root: Path, workers: int = 2, scheduler: str | None = None) -> int:
    """Autograde every submitted assignment of the real course, then feedback and export.

    Exits 1 while any submission has no grade: FAILED ones (the grading machine's fault or
    the time cap; the next run retries them) and REJECTED ones (not plain files: the
    submission itself must change), each listed with its reason.
    """
    known = set(assignments(root))
    todo = sorted({p.name for p in (root / "submitted").glob("*/*") if p.name in known})
    if not todo:
        say(f"nothing in {root / 'submitted'} to grade: try `make demo` for a dry run")
        return 1
    _ensure_released(root, todo)
    failed, rejected = [], []
    executor = executor_for(scheduler, workers)
    # Every assignment at once on the one executor (its workers bound the parallelism): no
    # worker idles while an assignment's last submission finishes.
    with ThreadPoolExecutor(max_workers=len(todo)) as pool:
        runs = {a: pool.submit(autograde_class, a, root, progress=say, executor=executor)
                for a in todo}  # fmt: skip
        for assignment, run in runs.items():
            for o in run.result():
                if o.status == "failed":
                    failed.append(f"{assignment}/{o.student}: {o.error}")
                elif o.status == "rejected":
                    rejected.append(f"{assignment}/{o.student}: {o.error}")
    if _feedback_missing(root):  # workers make each page; nbgrader makes any they could not
        feedback(root)
    csv = export(root)
    say(format_grades(grade_rows(root), near_copies(root)))
    say(f"Feedback HTML: {root / 'feedback'}/<student>/<assignment>/<assignment>.html")
    say(f"Grades CSV:    {csv}")
    for line in failed:
        say(f"    FAILED (no grade; `make autograde` again retries it): {line}")
    for line in rejected:
        say(f"    REJECTED (no grade; only plain files are graded): {line}")
    _give_back(root)
    return 1 if failed or rejected else 0


def _feedback_missing(root: Path) -> bool:
    """Is there an autograded notebook without its feedback page?"""
    graded = (root / "autograded").glob("*/*/*.ipynb")
    return any(
        not (
            root / "feedback" / nb.parent.parent.name / nb.parent.name / f"{nb.stem}.html"
        ).exists()
        for nb in graded
    )


def _give_back(root: Path) -> None:
    """Run as root in a course root someone else owns (a hub's): hand them what was written."""
    owner = root.stat()
    if os.geteuid() != 0 or owner.st_uid == 0:
        return
    made = [root / "gradebook.db", root / "autograded", root / "feedback", root / "build"]
    for top in (p for p in made if p.exists()):
        for path in [top, *top.rglob("*")] if top.is_dir() else [top]:
            os.lchown(path, owner.st_uid, owner.st_gid)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m course.instructor.pipeline {demo,release,autograde,grades,selfstudy}``."""
    parser = argparse.ArgumentParser(
        prog="python -m course.instructor.pipeline", description=__doc__.split("\n")[0]
    )
    parser.add_argument("command", choices=["demo", "release", "autograde", "grades", "selfstudy"])
    parser.add_argument("--root", type=Path, default=REPO, help="course root (default: the repo)")
    parser.add_argument("--jobs", type=int, default=2, help="notebooks graded at a time")
    parser.add_argument(
        "--scheduler", help="autograde on the Dask cluster of this scheduler (tcp://HOST:8786)"
    )
    args = parser.parse_args(argv)
    root = args.root.resolve()
    if args.command == "demo":
        return demo(jobs=args.jobs)
    if args.command == "release":
        for path in release(root):
            say(f"released {path.relative_to(root)}")
        return 0
    if args.command == "autograde":
        return _autograde_course(root, workers=args.jobs, scheduler=args.scheduler)
    if args.command == "grades":
        say(format_grades(grade_rows(root), near_copies(root)))
        return 0
    for path in write_selfstudy(root / "source", root / "selfstudy"):
        say(f"self-study notebook: {path.relative_to(root)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
