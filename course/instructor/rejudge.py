"""The re-check: every grade cell run again, outside the kernel, on the student's definitions.

:class:`Rejudge`, an nbgrader preprocessor placed after ``Execute``, re-runs every grade cell,
with the instructor's source from the gradebook, in a fresh sandboxed Python
(:mod:`course.instructor.sandbox`) that holds only the student's definitions
(:mod:`course.instructor.definitions`). A cell that fails there gets an error output first,
so nbgrader scores it 0: the grade is the minimum of the kernel's verdict and the re-check's.

Register it in ``nbgrader_config.py``::

    from course.instructor.rejudge import autograde_preprocessors
    c.Autograde.autograde_preprocessors = autograde_preprocessors()
"""

from __future__ import annotations

import ast
import json
import os
import secrets
import subprocess
import sys
import tempfile
from typing import Any

from course.instructor.definitions import judge_cells, strip_magics

__all__ = ["autograde_preprocessors", "run_judge"]

JUDGE_CELL_TIMEOUT = 120  # seconds per grade cell in the re-check
JUDGE_STARTUP = 60  # seconds for the re-check's interpreter to start (imports torch)


def _judge_main() -> None:
    """Run a re-check job from stdin (inside the sandbox); print verdicts on a private fd."""
    import ctypes
    import signal

    ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: no /proc/<pid>/fd, no ptrace
    job = json.loads(sys.stdin.read())
    out = os.fdopen(os.dup(1), "w")  # dup'd fds are not inherited by children (PEP 446)
    os.dup2(2, 1)  # everything the cells print goes to stderr
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance(colors="NoColor")

    def timeout(_signum: int, _frame: object) -> None:
        raise TimeoutError(f"the check took longer than {job['cell_timeout']} s")

    signal.signal(signal.SIGALRM, timeout)
    verdicts: dict[str, list] = {}
    earlier = ""  # a setup or solution cell that failed explains the grade cells after it
    for cell in job["cells"]:
        signal.alarm(job["cell_timeout"])
        result = shell.run_cell(cell["source"], store_history=False)
        signal.alarm(0)
        error = result.error_before_exec or result.error_in_exec
        message = f"{type(error).__name__}: {error}"[:2000] if error else ""
        if cell["kind"] == "grade":
            verdicts[cell["grade_id"]] = [error is None, message + earlier if error else ""]
        elif error:
            earlier += f" (before it, cell {cell['grade_id']} failed: {message[:500]})"
    out.write(json.dumps({"nonce": job["nonce"], "verdicts": verdicts}) + "\n")
    out.flush()
    os._exit(0)  # skip interpreter shutdown: nothing of the student's runs after the verdict


def run_judge(
    cells: list[dict], *, sandbox: bool = True, cell_timeout: int = JUDGE_CELL_TIMEOUT
) -> dict[str, tuple[bool, str]]:
    """Re-run the grade cells of :func:`judge_cells` in a fresh (sandboxed) Python."""
    nonce = secrets.token_hex(16)
    job = {"nonce": nonce, "cells": cells, "cell_timeout": cell_timeout}
    cmd = [sys.executable, "-m", "course.instructor.rejudge", "judge"]
    with tempfile.TemporaryDirectory(prefix="course-judge-") as work:
        if sandbox:
            from course.instructor.sandbox import confine, give_to_sandbox

            give_to_sandbox(work)
            cmd = confine(cmd, rw=[work], cwd=work)
        env = {**os.environ, "NBGRADER_EXECUTION": "autograde"}
        deadline = JUDGE_STARTUP + cell_timeout * sum(c["kind"] == "grade" for c in cells)
        proc = subprocess.run(
            cmd, input=json.dumps(job), capture_output=True, text=True, cwd=work,
            timeout=deadline, env=env, check=False,
        )  # fmt: skip
    for line in proc.stdout.splitlines():
        try:
            reply = json.loads(line)
        except ValueError:
            continue
        if isinstance(reply, dict) and reply.get("nonce") == nonce:
            return {k: (bool(v[0]), str(v[1])) for k, v in reply["verdicts"].items()}
    raise RuntimeError(
        f"the re-check gave no verdict (exit {proc.returncode}): {proc.stderr[-800:]}"
    )


# ---------------------------------------------------------------- the nbgrader preprocessor


def _setup_like(source: str) -> bool:
    """A locked cell worth replaying in the re-check: only imports and ``%load_ext``."""
    try:
        tree = ast.parse(strip_magics(source))
    except SyntaxError:
        return False
    magics = [ln for ln in source.splitlines() if ln.lstrip().startswith("%")]
    only_imports = all(isinstance(n, ast.Import | ast.ImportFrom) for n in tree.body)
    return only_imports and all(ln.split()[0] == "%load_ext" for ln in magics)


def _make_rejudge() -> type:  # noqa: C901 - one nbgrader preprocessor class, defined on first use
    """Build :class:`Rejudge` on first use: nbgrader is too heavy to import in every kernel."""
    from nbgrader.preprocessors import NbGraderPreprocessor
    from traitlets import Bool, Integer

    class Rejudge(NbGraderPreprocessor):
        """Score each grade cell at most what a fresh, sandboxed re-run of its check gives."""

        sandbox = Bool(True, help="Confine the re-check (course.instructor.sandbox)").tag(
            config=True
        )
        cell_timeout = Integer(JUDGE_CELL_TIMEOUT, help="Seconds per grade cell").tag(config=True)

        def preprocess(self, nb: Any, resources: dict) -> tuple[Any, dict]:
            from nbgrader.api import Gradebook

            info = resources["nbgrader"]
            with Gradebook(info["db_url"]) as gb:
                record = gb.find_notebook(info["notebook"], info["assignment"])
                sources = {c.name: c.source for c in record.source_cells}
                graded = {c.name for c in record.grade_cells}
                solutions = {c.name for c in record.solution_cells}
            cells, targets = self._job(nb, sources, graded, solutions)
            try:
                verdicts = run_judge(judge_cells(cells), sandbox=self.sandbox,
                                     cell_timeout=self.cell_timeout)  # fmt: skip
            except (RuntimeError, subprocess.TimeoutExpired) as err:
                self.log.error("Re-check failed for %s: %s", info["notebook"], err)  # noqa: TRY400 - the reason is in the message; no traceback in the log
                verdicts = dict.fromkeys(
                    targets, (False, f"the grader could not re-check it: {err}")
                )
            for gid, cell in targets.items():
                ok, message = verdicts.get(gid, (False, "the grader did not reach this cell"))
                if not ok:
                    self.log.warning("Re-check of %s failed: %s", gid, message)
                    cell.outputs.insert(0, _error_output(message))
            return nb, resources

        def _job(self, nb: Any, sources: dict, graded: set, solutions: set) -> tuple[list, dict]:
            cells, targets = [], {}
            for cell in nb.cells:
                gid = cell.metadata.get("nbgrader", {}).get("grade_id")
                if cell.cell_type != "code" or gid is None:
                    continue
                if gid in solutions and gid not in graded:
                    cells.append({"kind": "solution", "grade_id": gid, "source": cell.source})
                elif gid in graded and gid not in solutions:
                    cells.append({"kind": "grade", "grade_id": gid, "source": sources[gid]})
                    targets[gid] = cell
                elif gid in sources and _setup_like(sources[gid]):
                    cells.append({"kind": "setup", "grade_id": gid, "source": sources[gid]})
            return cells, targets

    Rejudge.__module__ = __name__
    return Rejudge


_LAZY: dict[str, type] = {}


def __getattr__(name: str) -> type:
    if name == "Rejudge":
        return _LAZY.setdefault(name, _make_rejudge())
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _error_output(message: str) -> Any:
    from nbformat.v4 import new_output

    text = (
        "The grader re-ran this check in a fresh Python holding only the definitions from "
        f"your solution cells, and it failed there: {message}"
    )
    return new_output("error", ename="RecheckFailed", evalue=text, traceback=[text])


def autograde_preprocessors() -> list[type]:
    """nbgrader 0.9.6's autograde pipeline with :class:`Rejudge` right after ``Execute``."""
    from nbgrader.converters import Autograde
    from nbgrader.preprocessors import Execute

    pipeline = list(Autograde.class_traits()["autograde_preprocessors"].default())
    pipeline.insert(pipeline.index(Execute) + 1, __getattr__("Rejudge"))
    return pipeline


def _main(argv: list[str]) -> int:
    if argv[:1] == ["judge"]:
        _judge_main()
    print(
        "usage: python -m course.instructor.rejudge judge  (reads a job on stdin)",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
