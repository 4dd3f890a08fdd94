"""The grader: nbgrader's autograde with no kernel; every grade cell judged from plain data.

:class:`Judge` takes the place of nbgrader's ``Execute`` preprocessor, so the ``nbgrader
autograde`` process never runs a line of the submission. It writes each grade cell's output
itself, and nbgrader scores those outputs as usual (an error output: no points):

* a quiz item is read from the notebook's text (:mod:`course.grading.quiz`);
* a code check is the grade cell's own source (the instructor's, from the gradebook, hidden
  tests included) run here, with each name the check takes from the student bound to a
  :class:`~course.grading.student.StudentCode`: the check's ranks define it from the
  submitted cells and run it, confined (:class:`~course.grading.rankbox.RankBox`), and
  send back plain data, from which the check computes its verdict here.

Cells that grade nothing (measurements, widgets, benchmarks, the student's tries) are not
run. Which cells are grade cells, and their points, the gradebook says
(:mod:`course.grading.cells`, first in the sanitizing pipeline). ``nbgrader_config.py``
registers both by name (:mod:`course.grading.pipelines`).
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import io
from pathlib import Path
from typing import Any

from course.checks.teaching import CheckFailed
from course.grading.copies import course_solutions, near_copies
from course.grading.limits import JudgeLimits, OverLimit
from course.grading.preload import box_options
from course.grading.quiz import quiz_call, quiz_verdict
from course.grading.rankbox import RankBox
from course.grading.student import StudentCode, cell_source, parse_cell
from course.ranks.magics import bound_names

__all__ = [
    "GraderError",
    "Submission",
    "judge_cell",
]


class GraderError(RuntimeError):
    """The grader itself failed (not the student's work): the submission is not graded."""


class Submission:
    """A submitted notebook as the grader reads it: the instructor's cells and the student's.

    ``setup`` is the instructor's import cells from the gradebook (a student who deletes one
    deletes nothing the grader runs); the student's cells are every cell they could edit.
    """

    def __init__(self, nb: Any, record: Any) -> None:
        sources = {c.name: c.source for c in record.source_cells}
        graded = {c.name for c in record.grade_cells}
        solutions = {c.name for c in record.solution_cells}
        self.setup = [
            c.source
            for c in record.source_cells
            if c.cell_type == "code" and c.locked and c.name not in graded | solutions
            and _only_imports(c.source)
        ]  # fmt: skip
        self.sources = sources
        self.student: list[tuple[str, str]] = []  # (label, source) of every cell they edit
        self.quiz_cells: set[str] = set()  # answer cells: never run anywhere
        self.grade_cells: list[tuple[str, Any]] = []
        for i, cell in enumerate(nb.cells):
            if cell.cell_type != "code":
                continue
            meta = cell.metadata.get("nbgrader", {})
            gid, locked = meta.get("grade_id"), meta.get("locked", False)
            if gid in graded and gid not in solutions:
                self.grade_cells.append((gid, cell))
            elif gid in solutions or not (gid in sources or locked):
                self.student.append((gid or f"added cell {i + 1}", str(cell.source)))
                if gid in sources and _only_answers(sources[gid]):
                    self.quiz_cells.add(gid)

    def code(self, name: str) -> StudentCode:
        """The student's ``name``: defined on a rank by the setup and the student's cells."""
        cells = [("setup", s) for s in self.setup]
        cells += [(label, s) for label, s in self.student if label not in self.quiz_cells]
        return StudentCode(tuple(cells), name)


def _only_answers(source: str) -> bool:
    """An answer cell, as released: it binds ``answer_*`` names only."""
    tree = parse_cell(source)
    if tree is None:
        return False
    targets = [t for n in tree.body if isinstance(n, ast.Assign) for t in n.targets]
    names = [getattr(t, "id", "") for t in targets]
    return bool(names) and all(n.startswith("answer_") for n in names)


def _only_imports(source: str) -> bool:
    """A setup cell: imports (and magics) only."""
    tree = parse_cell(source)
    return tree is not None and all(isinstance(n, ast.Import | ast.ImportFrom) for n in tree.body)


# Where code runs that only the machine can make fail (starting ranks, confining them): an
# error raised there is the grader's; an error anywhere else while a verdict is computed (the
# check's own arithmetic on what the ranks sent, torch's, the parser's) is the reply's doing.
COURSE = Path(__file__).resolve().parents[1]
MACHINE = tuple(
    str(COURSE / part)
    for part in ("ranks/launcher.py", "ranks/forkserver.py", "ranks/supervisor.py",
                 "ranks/confined.py", "ranks/worker.py", "grading/rankbox.py",
                 "grading/sandbox.py", "grading/slots.py")
)  # fmt: skip


def machine_side(err: BaseException) -> bool:
    """Was ``err`` raised in the machinery that runs ranks, not in computing a verdict?"""
    tb = err.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename.startswith(MACHINE):
            return True
        tb = tb.tb_next
    return False


def bad_reply(err: BaseException) -> str:
    """What a student reads when the check could not compute with what their ranks sent."""
    if isinstance(err, RecursionError):
        what = "it is nested too deeply to read"
    elif isinstance(err, MemoryError):
        what = "it is too large to read"
    else:
        what = f"{type(err).__name__}: {str(err)[:300]}"
    return (
        "What your code's ranks sent back is not what this check reads, so it earns no points "
        f"({what}). Return the values the exercise asks for: the same dtypes, shapes and "
        "sizes as its inputs, with nothing of your own added."
    )


def judge_cell(sub: Submission, source: str) -> tuple[bool, str]:
    """(passed, what the student reads) for one grade cell's (instructor's) source.

    Any error while the verdict is computed fails this cell with its reason; only the
    machine's own failures (:func:`machine_side`) propagate, to fail the submission."""
    call = quiz_call(source)
    try:
        if call is not None:
            return True, quiz_verdict(sub.student, call)
        return True, _run_check(sub, source)
    except AssertionError as err:  # CheckFailed included: the verdict on the student's work
        return False, str(err)
    except Exception as err:
        if machine_side(err):
            raise
        return False, bad_reply(err)


def _run_check(sub: Submission, source: str) -> str:
    """Run a grade cell's check here, the student's names bound to their StudentCode."""
    namespace: dict[str, Any] = {"__name__": "__grader__"}
    for setup in sub.setup:
        exec(compile(cell_source(setup) or "", "<setup>", "exec", dont_inherit=True), namespace)  # noqa: S102 - the instructor's import cell
    code = cell_source(source) or ""
    tree = ast.parse(code)
    wanted = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and _loads(n)}
    for name in wanted - bound_names(tree) - set(namespace) - set(vars(builtins)):
        namespace[name] = sub.code(name)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(tree, "<grade cell>", "exec", dont_inherit=True), namespace)  # noqa: S102 - the instructor's grade cell, from the gradebook
    return out.getvalue()


def _loads(node: ast.Name) -> bool:
    return isinstance(node.ctx, ast.Load)


def _outputs(passed: bool, text: str) -> list[Any]:
    """The cell's outputs: what passed prints, or the error a failed check shows in a notebook
    (its teaching line first, as ``CheckFailed`` renders in JupyterLab)."""
    from nbformat.v4 import new_output

    if passed:
        return [new_output("stream", name="stdout", text=text)] if text else []
    shown = CheckFailed(text)._render_traceback_()
    return [new_output("error", ename="CheckFailed", evalue=text, traceback=shown)]


def _make_judge() -> type:
    """Build :class:`Judge` on first use: nbgrader is too heavy to import in every kernel."""
    from nbgrader.api import Gradebook
    from nbgrader.preprocessors import NbGraderPreprocessor

    class Judge(NbGraderPreprocessor):
        """Write every grade cell's output from the grader's own verdict (module docstring)."""

        def preprocess(self, nb: Any, resources: dict) -> tuple[Any, dict]:
            info = resources["nbgrader"]
            with Gradebook(info["db_url"]) as gb:
                record = gb.find_notebook(info["notebook"], info["assignment"])
                sub = Submission(nb, record)
            root = Path(info["db_url"].removeprefix("sqlite:///")).parent  # the course's
            source = root / "source" / info["assignment"] / f"{info['notebook']}.ipynb"
            copies = near_copies([text for _, text in sub.student], course_solutions(source))
            nb.metadata["course"] = {"near_copies": copies}  # for the grade table
            with RankBox(**box_options(sub)), JudgeLimits() as limits:
                for gid, cell in sub.grade_cells:
                    passed, text = self._judge(sub, gid, limits)
                    cell.outputs = _outputs(passed, text)
                    self.log.info("%s: %s", gid, "passed" if passed else "failed")
                self.log.info("the judge's own CPU time: %.1f s", limits.used())
            return nb, resources

        def _judge(self, sub: Submission, gid: str, limits: JudgeLimits) -> tuple[bool, str]:
            """One grade cell's verdict within the judge's caps; the grader's own failure
            (and only that) raises GraderError."""
            spent = limits.spent()
            if spent:
                return False, spent
            try:
                with limits.judging():
                    return judge_cell(sub, sub.sources[gid])
            except OverLimit as over:
                return False, str(over)
            except Exception as err:
                raise GraderError(
                    f"grading cell {gid} failed: {type(err).__name__}: {err}"
                ) from err

    Judge.__module__ = __name__
    return Judge


_LAZY: dict[str, type] = {}


def __getattr__(name: str) -> type:
    if name == "Judge":
        return _LAZY.setdefault(name, _make_judge())
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
