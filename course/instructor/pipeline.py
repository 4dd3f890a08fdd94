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
import fnmatch
import os
import shutil
import subprocess
import sys
import time
import tomllib
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import nbformat
from nbformat import NotebookNode

from course.instructor.classrun import autograde_class
from course.instructor.selfstudy import grade_id, quiz_items, write_selfstudy

__all__ = [
    "CellError",
    "GradeRow",
    "Submission",
    "assemble",
    "autograde",
    "check_expectations",
    "demo",
    "execute",
    "export",
    "feedback",
    "format_grades",
    "grade_rows",
    "load_specs",
    "main",
    "nbgrader",
    "prepare_course",
    "release",
    "submit",
]

REPO = Path(__file__).resolve().parents[2]
SPECS = REPO / "autograde" / "submissions"
_MARKERS = ("BEGIN SOLUTION", "END SOLUTION")


def _say(text: str) -> None:
    print(text, flush=True)


def assignments(root: Path) -> list[str]:
    """Assignment ids of a course: folders ``source/<a>/`` holding ``<a>.ipynb``."""
    return sorted(
        p.parent.name for p in (root / "source").glob("*/*.ipynb") if p.stem == p.parent.name
    )


# --- nbgrader --------------------------------------------------------------------------------


def _env() -> dict[str, str]:
    env = dict(os.environ)
    # nbgrader runs `alembic` for the gradebook: the venv's bin must be on PATH.
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def _noteworthy(line: str) -> bool:
    # nbgrader warns about the checksum of every cell with hidden tests (it stores the
    # checksum before clearing them): expected, so not shown.
    noise = ("Attribute 'checksum'", "Removing existing assignment")
    return ("| WARNING]" in line or "| ERROR]" in line) and not any(n in line for n in noise)


def nbgrader(root: Path, *args: str, on_line=None, check: bool = True) -> str:
    """Run ``nbgrader <args>`` in course ``root`` (its nbgrader_config.py); return its log.

    Streams the log line by line to ``on_line`` (default: print warnings and errors) and,
    with ``check``, raises RuntimeError with the log's tail if nbgrader fails.
    """
    cmd = [sys.executable, "-m", "nbgrader", *args]
    on_line = on_line or (lambda line: _noteworthy(line) and _say("    " + line))
    log = []
    with subprocess.Popen(
        cmd, cwd=root, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    ) as proc:
        for line in proc.stdout:
            log.append(line.rstrip("\n"))
            on_line(log[-1])
    if check and proc.returncode != 0:
        raise RuntimeError(
            f"`nbgrader {' '.join(args)}` failed in {root} (exit {proc.returncode}):\n"
            + "\n".join(log[-40:])
        )
    return "\n".join(log)


def release(root: Path) -> list[Path]:
    """``nbgrader generate_assignment '*' --force``: every source assignment into release/."""
    nbgrader(root, "generate_assignment", "*", "--force")
    return sorted((root / "release").glob("*/*.ipynb"))


def autograde(root: Path, assignment: str) -> dict[str, float]:
    """``nbgrader autograde <assignment> --force`` over submitted/; seconds per student.

    A submission nbgrader cannot process (say, a corrupt notebook) is reported by name and
    left out; the others are graded all the same.
    """
    seconds: dict[str, float] = {}
    current = {"student": None, "since": time.monotonic()}

    def progress(line: str) -> None:
        if "] Autograding " in line:
            current["student"] = Path(line.split("] Autograding ", 1)[1]).parent.parent.name
        elif "Setting destination file permissions" in line and current["student"]:
            student, now = current["student"], time.monotonic()
            seconds[student] = now - current["since"]
            current.update(student=None, since=now)
            got, top = _totals(root, assignment, student)
            _say(f"    {assignment}/{student}: {got:g}/{top:g} points in {seconds[student]:.1f} s")
        elif _noteworthy(line):
            _say("    " + line)

    nbgrader(root, "autograde", assignment, "--force", on_line=progress, check=False)
    submitted = {p.parent.name for p in (root / "submitted").glob(f"*/{assignment}")}
    for student in sorted(submitted - set(seconds)):
        _say(f"    {assignment}/{student}: FAILED, nbgrader could not grade it (see its log above)")
    return seconds


def feedback(root: Path) -> list[Path]:
    """``nbgrader generate_feedback '*' --force``: one HTML page per graded notebook."""
    nbgrader(root, "generate_feedback", "*", "--force")
    return sorted((root / "feedback").glob("*/*/*.html"))


def export(root: Path) -> Path:
    """``nbgrader export``: the gradebook as CSV in build/grades.csv."""
    dest = root / "build" / "grades.csv"
    dest.parent.mkdir(parents=True, exist_ok=True)
    nbgrader(root, "export", "--to", str(dest))
    return dest


# --- running notebooks -----------------------------------------------------------------------


@dataclass(frozen=True)
class CellError:
    """An error a notebook cell raised while running top to bottom."""

    notebook: str
    grade_id: str | None
    ename: str
    message: str

    @property
    def expected(self) -> bool:
        """Checks of unanswered items fail with CheckFailed (an AssertionError); else a bug."""
        return self.ename in ("AssertionError", "CheckFailed")


def execute(path: Path, out: Path | None = None, timeout: int = 120) -> list[CellError]:
    """Run a notebook top to bottom (errors allowed, per-cell timeout) and list its errors."""
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb,
        timeout=timeout,
        kernel_name="python3",
        allow_errors=True,
        resources={"metadata": {"path": str(path.parent)}},
    )
    client.execute()
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, out)
    errors = []
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                lines = (output.get("evalue") or "").strip().splitlines()[:2]
                message = " / ".join(x.strip() for x in lines)
                errors.append(CellError(path.stem, grade_id(cell), output["ename"], message))
    return errors


# --- sample submissions ----------------------------------------------------------------------


@dataclass(frozen=True)
class Submission:
    """One student's submission of one assignment, as a spec in autograde/submissions/."""

    student: str
    assignment: str
    answers: dict[str, str] = field(default_factory=dict)
    cells: dict[str, str] = field(default_factory=dict)
    expect: dict[str, str | float] = field(default_factory=dict)
    first_name: str = ""
    last_name: str = ""
    timestamp: str | None = None


def load_specs(folder: Path = SPECS) -> list[Submission]:
    """Every submission of every ``<student>.toml`` spec in ``folder``."""
    subs = []
    for path in sorted(Path(folder).glob("*.toml")):
        spec = tomllib.loads(path.read_text())
        who = spec.pop("student", {})
        for assignment, part in spec.items():
            subs.append(
                Submission(
                    student=path.stem,
                    assignment=assignment,
                    answers=_as_table(part.get("answers", "key")),
                    cells=_as_table(part.get("cells", "solution")),
                    expect=dict(part.get("expect", {})),
                    first_name=who.get("first_name", ""),
                    last_name=who.get("last_name", ""),
                    timestamp=part.get("timestamp"),
                )
            )
    return subs


def _as_table(value: str | dict[str, str]) -> dict[str, str]:
    return {"*": value} if isinstance(value, str) else dict(value)


def _pick(table: dict[str, str], name: str, default: str) -> str:
    return table.get(name, table.get("*", default))


def _letter(choice: str, key: str, choices: str) -> str:
    """A spec's answer: a letter, "key" (the right one), "wrong" (another one) or ""."""
    if choice == "key":
        return key
    if choice == "wrong":
        return next(c for c in choices if c != key)
    return choice


def _without_markers(source: str) -> str:
    return "\n".join(x for x in source.split("\n") if not any(m in x for m in _MARKERS))


def assemble(sub: Submission, release_nb: NotebookNode, source_nb: NotebookNode) -> NotebookNode:
    """The student's notebook: the release with the spec's answers and cells filled in."""
    nb = nbformat.from_dict(release_nb)
    items = {q.item_id: q for q in quiz_items(source_nb)}
    solutions = {grade_id(c): c.source for c in source_nb.cells if grade_id(c)}
    known = {"*"}
    for cell in nb.cells:
        gid = grade_id(cell)
        if not cell.metadata.get("nbgrader", {}).get("solution"):
            continue
        item = items.get(gid.removesuffix("_answer")) if gid.endswith("_answer") else None
        if item is not None:
            known.add(item.item_id)
            letter = _letter(_pick(sub.answers, item.item_id, "key"), item.key, item.choices)
            if letter:
                cell.source = _answer_source(cell.source, item.name, letter)
            continue
        known.add(gid)
        text = _pick(sub.cells, gid, "solution")
        if text == "solution":
            cell.source = _without_markers(solutions[gid])
        elif text != "stub":
            cell.source = text.strip("\n")
    unknown = (set(sub.answers) | set(sub.cells)) - known
    if unknown:
        raise ValueError(
            f"{sub.student}.toml, [{sub.assignment}]: no answer or solution cell "
            f"{sorted(unknown)} in the release notebook; fix the spec's names"
        )
    return nb


def _answer_source(stub: str, name: str, letter: str) -> str:
    line = f'{name} = "{letter}"'
    lines = stub.split("\n")
    if "# YOUR CODE HERE" in lines:
        return "\n".join(line if x == "# YOUR CODE HERE" else x for x in lines)
    return stub + "\n" + line


def submit(root: Path, subs: Sequence[Submission]) -> list[Path]:
    """Write each submission to submitted/<student>/<a>/<a>.ipynb with its timestamp.txt."""
    written = []
    for sub in subs:
        a = sub.assignment
        release_nb = nbformat.read(root / "release" / a / f"{a}.ipynb", as_version=4)
        source_nb = nbformat.read(root / "source" / a / f"{a}.ipynb", as_version=4)
        dest = root / "submitted" / sub.student / a
        dest.mkdir(parents=True, exist_ok=True)
        nbformat.write(assemble(sub, release_nb, source_nb), dest / f"{a}.ipynb")
        stamp = sub.timestamp or datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S.%f %Z")
        (dest / "timestamp.txt").write_text(stamp + "\n")
        written.append(dest / f"{a}.ipynb")
    _declare_students(root, subs)
    return written


def _declare_students(root: Path, subs: Sequence[Submission]) -> None:
    from nbgrader.api import Gradebook

    with Gradebook(_db_url(root)) as gb:
        for sub in subs:
            gb.update_or_create_student(
                sub.student, first_name=sub.first_name, last_name=sub.last_name
            )


# --- grades ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class GradeRow:
    """One grade cell of one student's submission, as the gradebook holds it."""

    student: str
    assignment: str
    grade_id: str
    score: float
    max_score: float


def _db_url(root: Path) -> str:
    return f"sqlite:///{Path(root).resolve() / 'gradebook.db'}"


def grade_rows(root: Path) -> list[GradeRow]:
    """Every grade of every submission in the course's gradebook."""
    from nbgrader.api import Gradebook

    rows = []
    with Gradebook(_db_url(root)) as gb:
        for assignment in gb.assignments:
            for sub in assignment.submissions:
                for nb in sub.notebooks:
                    for g in nb.grades:
                        score = g.score if g.score is not None else float("nan")
                        rows.append(
                            GradeRow(sub.student.id, assignment.name, g.name, score, g.max_score)
                        )
    return sorted(rows, key=lambda r: (r.assignment, r.student))


def _totals(root: Path, assignment: str, student: str) -> tuple[float, float]:
    mine = [r for r in grade_rows(root) if (r.assignment, r.student) == (assignment, student)]
    return sum(r.score for r in mine), sum(r.max_score for r in mine)


def format_grades(rows: Sequence[GradeRow]) -> str:
    """A table per assignment: one line per grade cell, one column per student, totals."""
    out = []
    for assignment in sorted({r.assignment for r in rows}):
        mine = [r for r in rows if r.assignment == assignment]
        students = sorted({r.student for r in mine})
        cells = list(dict.fromkeys(r.grade_id for r in mine))
        score = {(r.grade_id, r.student): r.score for r in mine}
        top = {r.grade_id: r.max_score for r in mine}
        width = max(len(c) for c in [*cells, "total"]) + 8
        out.append(f"{assignment:<{width}}" + "".join(f"{s:>9}" for s in students))
        for c in cells:
            label = f"  {c} ({top[c]:g})"
            out.append(
                f"{label:<{width}}" + "".join(f"{score.get((c, s), 0):>9g}" for s in students)
            )
        label = f"  total ({sum(top.values()):g})"
        totals = [sum(score.get((c, s), 0) for c in cells) for s in students]
        out.append(f"{label:<{width}}" + "".join(f"{t:>9g}" for t in totals))
    return "\n".join(out)


def check_expectations(rows: Sequence[GradeRow], subs: Sequence[Submission]) -> list[str]:
    """Where a grade differs from its spec's ``expect`` table (first matching pattern wins)."""
    problems = []
    graded = {(r.student, r.assignment) for r in rows}
    for sub in subs:
        if (sub.student, sub.assignment) not in graded:
            problems.append(f"{sub.student}/{sub.assignment}: no grades in the gradebook")
    for r in rows:
        sub = next(
            (s for s in subs if (s.student, s.assignment) == (r.student, r.assignment)), None
        )
        if sub is None or not sub.expect:
            continue
        pattern = next((p for p in sub.expect if fnmatch.fnmatchcase(r.grade_id, p)), None)
        if pattern is None:
            problems.append(f"{r.student}/{r.assignment}/{r.grade_id}: no expectation matches it")
            continue
        want = sub.expect[pattern]
        want = r.max_score if want == "full" else float(want)
        if r.score != want:
            problems.append(
                f"{r.student}/{r.assignment}/{r.grade_id}: {r.score:g} points, expected {want:g}"
            )
    return problems


# --- the whole course ------------------------------------------------------------------------


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


def _report_run(path: Path, out: Path) -> None:
    start = time.monotonic()
    errors = execute(path, out=out)
    odd = [e for e in errors if not e.expected]
    _say(
        f"    {path.name} ran top to bottom in {time.monotonic() - start:.1f} s: "
        f"{len(errors) - len(odd)} checks fail fast, as they should before any answer"
    )
    for e in odd:  # not a check's AssertionError: is it something a student can act on?
        _say(f"    UNEXPECTED {e.ename} in cell {e.grade_id}: {e.message}")


def demo(
    dest: Path = REPO / "build" / "demo",
    source: Path = REPO / "source",
    specs: Path = SPECS,
    jobs: int = 2,
) -> int:
    """The whole course end to end in a throwaway root; 0 when every grade is as expected.

    Runs the release notebooks and each assignment's autograde ``jobs`` at a time (separate
    processes; the gradebook's writes are short, so SQLite's locking serialises them).
    """
    t0 = time.monotonic()
    step = _stepper(t0)
    # The re-check of every grade cell (integrity.py) costs 20-80 s a notebook: the dry
    # run skips it unless asked (COURSE_RECHECK=1 make demo); `make autograde` always runs it.
    os.environ.setdefault("COURSE_RECHECK", "0")
    root = prepare_course(dest, source)
    subs = load_specs(specs)
    step(f"course copied to {root}; {len(subs)} sample submissions in {specs}")

    made = release(root)
    drift = _release_drift(root, source.parent) if source == REPO / "source" else []
    step(f"generate_assignment: {', '.join(str(p.relative_to(root)) for p in made)}")
    if drift:
        stale = ", ".join(drift)
        _say(f"    WARNING: release/ is not what source/ generates ({stale}): run make release")

    submit(root, subs)
    step(f"submitted/: {len(subs)} notebooks assembled from the specs onto release/")
    step(f"autograding and running the release notebooks, {jobs} at a time")
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        by_size = Counter(s.assignment for s in subs).most_common()
        tasks = [pool.submit(autograde, root, a) for a, _ in by_size]
        out = root / "build" / "executed"
        tasks += [pool.submit(_report_run, path, out / path.name) for path in made]
        for task in tasks:
            task.result()
    step("nbgrader autograde done; release notebooks executed (build/executed/)")
    pages = feedback(root)
    csv = export(root)
    step(f"generate_feedback: {len(pages)} HTML pages; export: {csv.relative_to(root)}")

    rows = grade_rows(root)
    _say("\n" + format_grades(rows) + "\n")
    problems = check_expectations(rows, subs)
    for p in problems:
        _say(f"    NOT AS EXPECTED: {p}")
    _say(f"Feedback HTML: {root / 'feedback'}/<student>/<assignment>/<assignment>.html")
    _say(f"Grades CSV:    {csv}")
    verdict = "every grade as its spec expects" if not problems else f"{len(problems)} surprises"
    _say(f"demo finished in {time.monotonic() - t0:.0f} s: {verdict}")
    return 1 if problems or drift else 0


def _stepper(t0: float):
    def step(text: str) -> None:
        _say(f"[{time.monotonic() - t0:6.1f} s] {text}")

    return step


def _autograde_course(root: Path, workers: int = 2) -> int:
    """Autograde every submitted assignment of the real course, then feedback and export."""
    from nbgrader.api import Gradebook, MissingEntry

    known = set(assignments(root))
    todo = sorted({p.name for p in (root / "submitted").glob("*/*") if p.name in known})
    if not todo:
        _say(f"nothing in {root / 'submitted'} to grade: try `make demo` for a dry run")
        return 1
    with Gradebook(_db_url(root)) as gb:
        missing = []
        for assignment in todo:
            try:
                gb.find_assignment(assignment)
            except MissingEntry:
                missing.append(assignment)
    if missing:  # the gradebook learns an assignment's grade cells from generate_assignment
        _say(f"{', '.join(missing)} not in the gradebook yet: generating the release first")
        release(root)
    failed = []
    for (
        assignment
    ) in todo:  # bounded parallelism, a time cap each, resumable (course.instructor.classrun)
        outcomes = autograde_class(assignment, root, workers=workers, progress=_say)
        failed += [f"{assignment}/{o.student}: {o.error}" for o in outcomes if o.status == "failed"]
    feedback(root)
    csv = export(root)
    _say(format_grades(grade_rows(root)))
    _say(f"Feedback HTML: {root / 'feedback'}/<student>/<assignment>/<assignment>.html")
    _say(f"Grades CSV:    {csv}")
    for line in failed:
        _say(f"    FAILED (no grade; fix and rerun `make autograde`): {line}")
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m course.instructor.pipeline {demo,release,autograde,grades,selfstudy}``."""
    parser = argparse.ArgumentParser(
        prog="python -m course.instructor.pipeline", description=__doc__.split("\n")[0]
    )
    parser.add_argument("command", choices=["demo", "release", "autograde", "grades", "selfstudy"])
    parser.add_argument("--root", type=Path, default=REPO, help="course root (default: the repo)")
    parser.add_argument("--jobs", type=int, default=2, help="notebooks graded at a time")
    args = parser.parse_args(argv)
    root = args.root.resolve()
    if args.command == "demo":
        return demo(jobs=args.jobs)
    if args.command == "release":
        for path in release(root):
            _say(f"released {path.relative_to(root)}")
        return 0
    if args.command == "autograde":
        return _autograde_course(root, workers=args.jobs)
    if args.command == "grades":
        _say(format_grades(grade_rows(root)))
        return 0
    for path in write_selfstudy(root / "source", root / "selfstudy"):
        _say(f"self-study notebook: {path.relative_to(root)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
