"""How long does the course take to autograde a class, against stock nbgrader on the same class?

    .venv/bin/python benchmarks/autograde.py [--students 10] [--assignments ring_allreduce,zero]
                                             [--keep DIR] [--only ours|stock] [--load]

One class (``--students``, each handing in every assignment of ``--assignments``, default all
five) is graded twice, each time in a throwaway course root:

* stock nbgrader: ``nbgrader_config.py`` cut down to the course's course_id, root,
  CourseDirectory.ignore and ClearSolutions.code_stub, with a 120 s cell timeout (no judge:
  the kernel runs every cell), then ``nbgrader autograde <a> --force`` per assignment, one
  after the other, as an instructor would. Timed: the autograde commands.
* ours: the course's own ``nbgrader_config.py``, then
  ``python -m course.instructor.pipeline autograde --root ROOT --jobs 2``: what
  ``make autograde`` runs (the judge, the sandbox, 2 at a time). Timed: that whole command, so
  generate_feedback, export and the grade table are in it (stock does none of them): the
  figure is what ``make autograde`` costs.

Students rotate over the kinds of benchmarks/autograde_class.toml (right, wrong answers,
deadlocking, crashing, hostile). A submission nbgrader fails, or one still running when a
command's cap stops it, counts as failed: a result, not an error of the benchmark.

Measured on 2 cores, `--students 5` (25 submissions, the first five assignments), the machine
otherwise quiet: stock nbgrader 684.5 s (27.4 s a submission: it runs every measuring cell),
ours 102.3 s (4.1 s: the judge runs only the checks, in a warm nbgrader, every assignment at
once, each submission's forkserver started before nbgrader, importing once what its ranks
would each, killed when done), ratio 6.69 (it was 4.28 before the last three, 2.59 before
the warm nbgrader). `--students 4` (32 submissions, all eight assignments): stock 764.2 s,
ours 75.9 s, ratio 10.06 (10.12 a commit earlier; `--only ours`: 67.4 to 75.9 s). On a slower
day it was 90.5 s against 815.4 s (9.01), and ours took 106.5 s (7.77) before
feedback pages were made with their templates compiled once per grader
(course.grading.feedback) and a grader stopped reading every process on the machine for
each rank, and 159.5 s (about 5.2) before each submission's forkserver was forked from a
template that imports torch once per grading process, not started in the sandbox importing
it. About 15 minutes in all with the roots built. Stock
graded the default class (50 submissions, with its deadlocks and a cell that loops for the
whole 120 s cell timeout) in 26 minutes: count about 35 minutes for both sides, most of
`make benchmarks`.

``--load`` grades the class ours twice, quiet and then beside a spinning process on every
core (at the grader's own priority), and prints every grade cell that differs and
``identical grades: yes/no``; measured, `--students 5 --load`: quiet 103.8 s, beside 2 CPU
hogs 152.6 s, 225 grade cells, identical grades: yes.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path

import nbformat
import psutil
from traitlets.config.loader import PyFileConfigLoader

import course
from course.grading.gradebook import env
from course.instructor.commands import gradebook_url, nbgrader
from course.instructor.pipeline import prepare_course
from course.instructor.selfstudy import grade_id
from course.instructor.submissions import Submission, load_specs, submit
from course.instructor.workcopies import COURSE_ORDER

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
CLASS = tomllib.loads((HERE / "autograde_class.toml").read_text())
KINDS = tuple(CLASS)
ASSIGNMENTS = COURSE_ORDER
SIDES = ("stock", "ours")
CAP = 600  # seconds a command may spend per submission before it is stopped
STOCK = ("CourseDirectory.ignore", "ClearSolutions.code_stub")
# Stock nbgrader's 30 s per cell would stop the course's longer measuring cells half way.
STOCK_CELL_TIMEOUT = 120
MARKERS = ("### BEGIN SOLUTION", "### END SOLUTION")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line: class size, assignments, where to keep the roots, which side to run."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--students", type=int, default=10, help="class size (default 10)")
    parser.add_argument("--assignments", default=",".join(ASSIGNMENTS), help="a,b (default all)")
    parser.add_argument("--keep", type=Path, help="keep both course roots (and logs) here")
    parser.add_argument("--only", choices=SIDES, help="run one side only (no ratio)")
    parser.add_argument(
        "--load", action="store_true",
        help="grade the class ours twice, quiet then beside a CPU hog on every core, and "
        "compare every grade cell's score",
    )  # fmt: skip
    args = parser.parse_args(argv)
    args.assignments = [a for a in args.assignments.split(",") if a]
    unknown = sorted(set(args.assignments) - set(ASSIGNMENTS))
    if unknown or not args.assignments:
        parser.error(f"--assignments: {unknown or 'none given'}; choose from {ASSIGNMENTS}")
    if args.students < 1:
        parser.error("--students: at least 1")
    return args


def inject(text: str, fault: str) -> str:
    """``text`` with ``fault`` first in its first function's body (after the docstring)."""
    func = next(n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.FunctionDef))
    first = func.body[0]
    docstring = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
    at = first.end_lineno if docstring and len(func.body) > 1 else first.lineno - 1
    lines = text.split("\n")
    fault_lines = [" " * first.col_offset + x for x in fault.strip("\n").split("\n")]
    return "\n".join(lines[:at] + fault_lines + lines[at:])


def _exercise(assignment: str) -> tuple[str, str]:
    """(grade_id, model solution) of the first exercise calling torch.distributed (or the first)."""
    nb = nbformat.read(REPO / "source" / assignment / f"{assignment}.ipynb", as_version=4)
    cells = [
        (grade_id(c), c.source)
        for c in nb.cells
        if c.metadata.get("nbgrader", {}).get("solution") and not grade_id(c).endswith("_answer")
    ]
    gid, text = next((c for c in cells if "dist." in c[1]), cells[0])
    return gid, "\n".join(x for x in text.split("\n") if x.strip() not in MARKERS)


def _submission(who: str, assignment: str, specs: dict) -> Submission:
    """One kind's submission of one assignment, as benchmarks/autograde_class.toml says."""
    table = {**CLASS[who], **CLASS[who].get(assignment, {})}
    if (table.get("spec"), assignment) in specs:
        return specs[table["spec"], assignment]
    cells = {"*": table.get("cells", "solution")}
    if "fault" in table:
        gid, text = _exercise(assignment)
        cells[gid] = inject(text, table["fault"])
    return Submission("", assignment, {"*": table.get("answers", "key")}, cells)


def kind(student: str) -> str:
    """A student's kind, from the id ``class_submissions`` gives it (``s07_deadlock``)."""
    return student.split("_", 1)[1]


def class_submissions(students: int, assignments: Sequence[str]) -> list[Submission]:
    """Every student's submission of every assignment; student k is of kind KINDS[k % 5]."""
    specs = {(s.student, s.assignment): s for s in load_specs(REPO / "autograde" / "submissions")}
    kinds = [KINDS[k % len(KINDS)] for k in range(students)]
    return [
        replace(
            _submission(who, a, specs), student=f"s{k:02d}_{who}", first_name=who, timestamp=None
        )
        for k, who in enumerate(kinds)
        for a in assignments
    ]


def add_attack(nb: nbformat.NotebookNode, sub: Submission) -> None:
    """Add the attack of the submission's kind, if it has one here, to its quiz answer cells."""
    attack = CLASS[kind(sub.student)].get(sub.assignment, {})
    answers = [c for c in nb.cells if grade_id(c).endswith("_answer")] if "code" in attack else []
    for cell in answers if attack.get("every_answer") else answers[:1]:
        cell.source += "\n" + attack["code"]


def hand_in(root: Path, subs: list[Submission]) -> None:
    """Submit the class into ``root`` (course.instructor.submissions), then add the attacks."""
    for sub, path in zip(subs, submit(root, subs), strict=True):
        nb = nbformat.read(path, as_version=4)
        add_attack(nb, sub)
        nbformat.write(nb, path)


def stock_config(root: Path) -> None:
    """Replace root's nbgrader_config.py by stock nbgrader's, with the course's own values."""
    course = PyFileConfigLoader("nbgrader_config.py", path=str(root)).load_config()
    lines = ["import os", "", "c = get_config()  # noqa: F821 - injected by traitlets"]
    lines += [f"c.CourseDirectory.course_id = {course.CourseDirectory.course_id!r}"]
    lines += ["c.CourseDirectory.root = os.path.dirname(os.path.abspath(__file__))"]
    lines += [f"c.{name} = {course[name.split('.')[0]][name.split('.')[1]]!r}" for name in STOCK]
    lines += [f"c.Execute.timeout = {STOCK_CELL_TIMEOUT}"]
    (root / "nbgrader_config.py").write_text("\n".join(lines) + "\n")


def build(side: str, root: Path, subs: list[Submission]) -> Path:
    """A course root for ``side``: the course, its config (stock or ours), released, submitted."""
    prepare_course(root, REPO / "source")
    if side == "stock":
        stock_config(root)
    for a in sorted({s.assignment for s in subs}, key=ASSIGNMENTS.index):
        nbgrader(root, "generate_assignment", a, "--force")
    hand_in(root, subs)
    return root


def run(cmd: list[str], cwd: Path, log: Path, cap: float) -> tuple[float, int | None]:
    """(seconds, exit code, or None if the cap stopped it) of ``cmd``, logged to ``log``.

    Whatever it started is killed when it ends, kernels too (jupyter setsid()s each apart).
    """
    environ = env()
    with log.open("a") as out:
        started = time.monotonic()
        proc = subprocess.Popen(cmd, cwd=cwd, env=environ, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
        try:
            code = proc.wait(timeout=cap)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            seconds = time.monotonic() - started
            _kill_tree(proc)
    return seconds, code


def _kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL every process below ``proc`` (if it still runs), then its process group."""
    if proc.poll() is None:  # not reaped yet: its pid is still its own
        for p in psutil.Process(proc.pid).children(recursive=True):
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def grade(side: str, root: Path, subs: list[Submission]) -> tuple[float, dict]:
    """Autograde the class on one side: (seconds, {(student, assignment): fraction or None})."""
    log = root / "autograde.log"
    if side == "ours":
        cmd = [sys.executable, "-m", "course.instructor.pipeline", "autograde", "--root", str(root)]
        seconds, code = run([*cmd, "--jobs", "2"], REPO, log, CAP * len(subs) + 600)
        print(f"  ours: {len(subs)} submissions in {seconds:.1f} s ({_ended(code)})", flush=True)
        return seconds, scores(root, subs)
    seconds = 0.0
    for a in sorted({s.assignment for s in subs}, key=ASSIGNMENTS.index):
        students = sum(s.assignment == a for s in subs)
        cmd = [sys.executable, "-m", "nbgrader", "autograde", a, "--force"]
        took, code = run(cmd, root, log, CAP * students)
        seconds += took
        print(f"  stock: {a}, {students} submissions in {took:.1f} s ({_ended(code)})", flush=True)
    return seconds, scores(root, subs)


def _ended(code: int | None) -> str:
    return "stopped at its cap" if code is None else f"exit {code}"


def scores(root: Path, subs: list[Submission]) -> dict[tuple[str, str], float | None]:
    """Each submission's score as a fraction of its points; None if it was not autograded."""
    from nbgrader.api import Gradebook, MissingEntry
    from sqlalchemy.exc import SAWarning

    got: dict[tuple[str, str], float | None] = {}
    with (
        warnings.catch_warnings(action="ignore", category=SAWarning),
        Gradebook(gradebook_url(root)) as gb,
    ):
        for sub in subs:
            a = sub.assignment
            done = (root / "autograded" / sub.student / a / f"{a}.ipynb").is_file()
            try:
                found = gb.find_submission(a, sub.student)
            except MissingEntry:
                found = None
            ok = done and found is not None and found.max_score
            got[sub.student, a] = found.score / found.max_score if ok else None
    return got


def report(results: dict[str, tuple[float, dict]], subs: list[Submission]) -> None:
    """Per side: seconds, seconds per submission, failures; per kind: each side's mean score."""
    n = len(subs)
    print(f"\n{'run':16s} {'total s':>8s} {'s/submission':>13s} {'graded':>7s} {'failed':>7s}")
    for side, (seconds, got) in results.items():
        failed = sum(v is None for v in got.values())
        name = "stock nbgrader" if side == "stock" else "ours"
        print(f"{name:16s} {seconds:8.1f} {seconds / n:13.1f} {n - failed:7d} {failed:7d}")
    print("\nmean score per kind, % of the points (of the graded; failed counted apart)")
    print(f"{'kind':10s} {'n':>3s}" + "".join(f" {s:>7s} {'failed':>6s}" for s in results))
    for who in KINDS:
        mine = [(s.student, s.assignment) for s in subs if kind(s.student) == who]
        if not mine:
            continue
        row = f"{who:10s} {len(mine):3d}"
        for _seconds, got in results.values():
            graded = [got[s] for s in mine if got[s] is not None]
            mean = f"{100 * sum(graded) / len(graded):7.1f}" if graded else f"{'-':>7s}"
            row += f" {mean} {len(mine) - len(graded):6d}"
        print(row)
    if len(results) == len(SIDES):
        ours, stock = results["ours"][0], results["stock"][0]
        print(f"autograde: {n} submissions, ours {ours:.1f} s, stock nbgrader {stock:.1f} s, "
              f"ratio Y/X = {stock / ours:.2f}")  # fmt: skip


def cell_scores(root: Path) -> dict[tuple[str, str, str], float | None]:
    """Every (student, assignment, grade cell) autograded in ``root`` and its score."""
    from nbgrader.api import Gradebook
    from sqlalchemy.exc import SAWarning

    got = {}
    with (
        warnings.catch_warnings(action="ignore", category=SAWarning),
        Gradebook(gradebook_url(root)) as gb,
    ):
        for a in gb.assignments:
            for sub in gb.assignment_submissions(a.name):
                for nb in sub.notebooks:
                    for g in nb.grades:
                        got[sub.student_id, a.name, g.name] = g.score
    return got


@contextlib.contextmanager
def cpu_hog(cores: int) -> Iterator[None]:
    """``cores`` processes that spin at the grader's own priority until the block ends."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(cores)]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


def loaded(work: Path, subs: list[Submission]) -> int:
    """Ours quiet, then ours beside a hog on every core: are all grades the same?"""
    quiet_s, _ = grade("ours", build("ours", work / "quiet", subs), subs)
    quiet = cell_scores(work / "quiet")
    root = build("ours", work / "loaded", subs)
    cores = os.cpu_count() or 2
    with cpu_hog(cores):
        loaded_s, _ = grade("ours", root, subs)
    busy = cell_scores(root)
    differ = sorted(k for k in quiet.keys() | busy.keys() if quiet.get(k) != busy.get(k))
    print(f"\nquiet: {quiet_s:.1f} s; beside {cores} CPU hogs: {loaded_s:.1f} s; "
          f"{len(quiet)} grade cells")  # fmt: skip
    for key in differ:
        print(f"  differs: {'/'.join(key)}: quiet {quiet.get(key)}, loaded {busy.get(key)}")
    print(f"identical grades: {'no' if differ or not quiet else 'yes'}")
    return 1 if differ else 0


def main(argv: Sequence[str] | None = None) -> int:
    """Build the class, grade it on each side in its own throwaway root, print the figures."""
    args = parse_args(argv)
    subs = class_submissions(args.students, args.assignments)
    work = (args.keep or Path(tempfile.mkdtemp(prefix="bench-autograde-"))).resolve()
    print(f"{args.students} students x {len(args.assignments)} assignments = {len(subs)} "
          f"submissions; course roots in {work}", flush=True)  # fmt: skip
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so the finally blocks kill and clean
    if Path(course.__file__).resolve().parents[1] != REPO:  # a venv installed from elsewhere
        print(f"note: the graders import course from {Path(course.__file__).parent}, not {REPO}")
    results = {}
    try:
        if args.load:
            return loaded(work, subs)
        for side in (args.only,) if args.only else SIDES:
            results[side] = grade(side, build(side, work / side, subs), subs)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    report(results, subs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
