"""Grades student code cannot forge: an out-of-kernel re-check and an in-kernel tamper check.

nbgrader scores a grade cell by its outputs in the kernel that also ran the student's code,
so code that rewrites later cells (``get_ipython().input_transformers_post``), patches what
checks call, or hides errors can score full marks. Two defences live here:

* :class:`Rejudge`, an nbgrader preprocessor placed after ``Execute``: it re-runs every
  grade cell, with the instructor's source from the gradebook, in a fresh sandboxed Python
  (:mod:`course.instructor.sandbox`) that holds only the student's *definitions*, taken from the
  submitted solution cells' text (top-level statements other than imports, ``def``/``class``
  and literal assignments are not run; names the checks rely on cannot be rebound). A cell
  that fails there gets an error output first, so nbgrader scores it 0. The grade is thus
  the minimum of the kernel's verdict and the re-check's: attacking the kernel gains nothing.
* :func:`check_integrity`, for hidden tests: reports an interpreter altered since the
  course was imported (input transformers, builtins, patched ``course`` or
  ``torch.distributed`` functions, replaced modules, trace hooks).

Register the preprocessor in ``nbgrader_config.py``::

    from course.instructor.integrity import autograde_preprocessors
    c.Autograde.autograde_preprocessors = autograde_preprocessors()
"""

from __future__ import annotations

import ast
import builtins
import json
import os
import secrets
import subprocess
import sys
import sysconfig
import tempfile
import types
from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = [
    "IntegrityError",
    "assert_intact",
    "autograde_preprocessors",
    "check_integrity",
    "definitions_only",
    "judge_cells",
]

JUDGE_CELL_TIMEOUT = 120  # seconds per grade cell in the re-check
JUDGE_STARTUP = 60  # seconds for the re-check's interpreter to start (imports torch)

_REAL_BUILTINS = dict(vars(builtins))
_isinstance, _id, _getattr = builtins.isinstance, builtins.id, builtins.getattr
_HOME = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the course package
_LIBRARY_ROOTS = tuple({sysconfig.get_paths()[k] for k in ("stdlib", "purelib", "platlib")})
_HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: set on classes made in Python, never on built-ins
_WATCHED_SLOTS = ((str, "__eq__"), (str, "__hash__"), (object, "__eq__"), (type, "__call__"))
_REAL_SLOTS = {(t, n): t.__dict__[n] for t, n in _WATCHED_SLOTS}
_DIST_NAMES = ("send", "recv", "isend", "irecv", "batch_isend_irecv", "all_reduce", "barrier")
_DIST_NAMES += ("broadcast", "all_gather", "reduce_scatter", "get_rank", "get_world_size")


class IntegrityError(Exception):
    """The interpreter running the checks was altered by code in the notebook."""


# ---------------------------------------------------------------- in-kernel tamper check


def _shell_state() -> dict[str, tuple[int, ...]]:
    """Identity of the IPython hooks that can rewrite or skip later cells."""
    ipython = sys.modules.get("IPython")
    ip = ipython.get_ipython() if ipython is not None else None
    if ip is None:
        return {}
    lists = ("input_transformers_post", "input_transformers_cleanup", "ast_transformers")
    state = {name: tuple(map(id, getattr(ip, name, ()))) for name in lists}
    state["events"] = tuple(id(cb) for cbs in ip.events.callbacks.values() for cb in cbs)
    state["overrides"] = tuple(sorted(n for n in vars(ip) if n.startswith(("run_", "transform"))))
    return state  # type: ignore[return-value]


_PRISTINE_SHELL = _shell_state()
_PRISTINE_MODULES = {n: m for n, m in sys.modules.items() if n == "course" or n[:7] == "course."}


def _builtins_problems() -> list[str]:
    """Uses only references captured at import: the builtins it checks may be fake."""
    problems = []
    current = vars(builtins)
    for name, real in _REAL_BUILTINS.items():
        if _isinstance(real, type | types.BuiltinFunctionType) and current.get(name) is not real:
            problems.append("builtins." + name + " was replaced")
    for (owner, slot), real in _REAL_SLOTS.items():
        if owner.__dict__.get(slot) is not real:
            problems.append(owner.__name__ + "." + slot + " was replaced")
    return problems


def _fresh_codes(filename: str) -> dict[tuple[str, int], types.CodeType]:
    """Every code object compiled fresh from the file on disk, by (qualname, first line)."""
    codes: dict[tuple[str, int], types.CodeType] = {}
    try:
        top = compile(Path(filename).read_text(), filename, "exec", dont_inherit=True)
    except (OSError, SyntaxError, ValueError):
        return codes
    stack = [top]
    while stack:
        code = stack.pop()
        codes[(code.co_qualname, code.co_firstlineno)] = code
        stack += [c for c in code.co_consts if isinstance(c, types.CodeType)]
    return codes


def _is_original(fn: object, home: str, cache: dict[str, dict]) -> bool:
    """Is ``fn`` a function whose code matches its source file under ``home``?

    Decorated functions are followed through ``__wrapped__``: each layer must be library code
    (under ``home`` or an installed package) matching its file, and the innermost under ``home``.
    """
    if isinstance(fn, types.BuiltinFunctionType):
        return True  # C functions cannot be redefined from Python, only replaced by others
    code = getattr(fn, "__code__", None)
    if not isinstance(fn, types.FunctionType) or code is None:
        return False
    inner = fn.__dict__.get("__wrapped__")
    roots = (home,) if inner is None else (home, *_LIBRARY_ROOTS)
    if not code.co_filename.startswith(roots):
        return False
    fresh = cache.setdefault(code.co_filename, _fresh_codes(code.co_filename))
    twin = fresh.get((code.co_qualname, code.co_firstlineno))
    same = twin is not None and twin.co_code == code.co_code and twin.co_names == code.co_names
    return same and (inner is None or _is_original(inner, home, cache))


def _module_problems() -> list[str]:
    problems: list[str] = []
    cache: dict[str, dict] = {}
    for name, module in _PRISTINE_MODULES.items():
        if sys.modules.get(name) is not module:
            problems.append(f"sys.modules[{name!r}] was replaced")
    home = _HOME
    for name, module in list(sys.modules.items()):
        if not (name == "course" or name.startswith("course.")) or module is None:
            continue
        for attr, value in list(vars(module).items()):
            ours = isinstance(value, types.FunctionType) and value.__module__ == name
            if ours and not _is_original(value, home, cache):
                problems.append(f"{name}.{attr} was patched")
    dist = sys.modules.get("torch.distributed")
    if dist is not None:
        torch_home = str(Path(dist.__file__).parent.parent)
        for attr in _DIST_NAMES:
            value = getattr(dist, attr, None)
            if value is not None and not _is_original(value, torch_home, cache):
                problems.append(f"torch.distributed.{attr} was patched")
    return problems


def check_integrity() -> list[str]:
    """What code in this interpreter altered since ``course`` was imported (empty if nothing)."""
    problems = _builtins_problems()
    if problems:  # the rest of this check relies on builtins: stop at what is certain
        return problems
    problems += _module_problems()
    shell = _shell_state()
    for key, pristine in _PRISTINE_SHELL.items():
        if shell.get(key) != pristine:
            problems.append(f"IPython's {key} changed (code rewrites or skips later cells)")
    if sys.gettrace() is not None or sys.getprofile() is not None:
        problems.append("a trace or profile hook is installed (sys.settrace/setprofile)")
    return problems


def assert_intact() -> None:
    """Raise :class:`IntegrityError` naming what was altered; for hidden tests."""
    problems = check_integrity()
    if problems:
        raise IntegrityError(
            "The notebook changed how Python runs the checks, so this cell is not graded: "
            + "; ".join(problems)
            + ". Remove that code, restart the kernel and run all cells."
        )


# ---------------------------------------------------------------- solution cells: defs only

_UNSAFE = (ast.Call, ast.Lambda, ast.NamedExpr, ast.Await, ast.Yield, ast.YieldFrom)
_UNSAFE += (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


def _safe_expr(node: ast.AST | None) -> bool:
    """Does evaluating ``node`` at definition time run no code of the student's?"""
    return node is None or not any(isinstance(n, _UNSAFE) for n in ast.walk(node))


def _def_time_parts(node: ast.AST) -> Iterable[ast.AST | None]:
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        a = node.args
        yield from [*a.defaults, *a.kw_defaults, node.returns]
        yield from [x.annotation for x in [*a.posonlyargs, *a.args, *a.kwonlyargs]]
        yield from [a.vararg and a.vararg.annotation, a.kwarg and a.kwarg.annotation]
    elif isinstance(node, ast.ClassDef):
        yield from node.bases


def _allowed(node: ast.stmt, in_class: bool = False) -> bool:  # noqa: PLR0911 - a decision table, one return per kind of statement
    """Statements a solution cell may run at top level: definitions and literal values."""
    if isinstance(node, ast.Import | ast.ImportFrom | ast.Pass):
        return not in_class
    if isinstance(node, ast.Expr):
        return isinstance(node.value, ast.Constant)
    if isinstance(node, ast.Assign | ast.AnnAssign):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        try:
            ast.literal_eval(node.value) if node.value is not None else None
        except ValueError:
            return False
        return all(isinstance(t, ast.Name) for t in targets)
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        if node.decorator_list or (isinstance(node, ast.ClassDef) and node.keywords):
            return False
        if not all(_safe_expr(part) for part in _def_time_parts(node)):
            return False
        return not isinstance(node, ast.ClassDef) or all(_allowed(s, True) for s in node.body)
    return False


def _bound_names(node: ast.stmt) -> set[str]:
    if isinstance(node, ast.Import | ast.ImportFrom):
        return {(a.asname or a.name).split(".")[0] for a in node.names}
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return {node.name}
    targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
    return {t.id for t in targets if isinstance(t, ast.Name)}


def definitions_only(
    source: str, reserved: set[str] = frozenset(), same_imports: set[str] = frozenset()
) -> tuple[str, list[str]]:
    """Keep a solution cell's imports, defs and literal assignments; say what was left out.

    ``reserved`` names (builtins, names the instructor's cells use) may not be rebound, so a
    solution cannot redefine ``all`` or ``check_answer`` under the checks; an import that
    repeats one of the instructor's (``same_imports``, as ``ast.dump``) may.
    """
    try:
        tree = ast.parse(source)
    except SyntaxError as err:
        return "", [f"the cell has a syntax error (line {err.lineno}): {err.msg}"]
    kept, dropped = [], []
    for node in tree.body:
        repeat = isinstance(node, ast.Import | ast.ImportFrom) and ast.dump(node) in same_imports
        clash = _bound_names(node) & reserved if _allowed(node) and not repeat else set()
        if _allowed(node) and not clash:
            kept.append(node)
        else:
            why = f"rebinds {', '.join(sorted(clash))}" if clash else "is not a definition"
            dropped.append(f"line {node.lineno} {why}")
    return ast.unparse(ast.Module(body=kept, type_ignores=[])), dropped


def _instructor_names(sources: Iterable[str]) -> tuple[set[str], set[str], set[str]]:
    """Names the instructor's cells read and bind, and their imports (magic lines skipped)."""
    reads, binds, imports = set(), set(), set()
    for source in sources:
        try:
            tree = ast.parse(_strip_magics(source))
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Name):
                (reads if isinstance(node.ctx, ast.Load) else binds).add(node.id)
            elif isinstance(node, ast.Import | ast.ImportFrom):
                imports.add(ast.dump(node))
                binds.update((a.asname or a.name).split(".")[0] for a in node.names)
            elif isinstance(node, ast.FunctionDef | ast.ClassDef | ast.AsyncFunctionDef):
                binds.add(node.name)
    return reads, binds, imports


def _strip_magics(source: str) -> str:
    return "\n".join("" if line.lstrip().startswith("%") else line for line in source.splitlines())


def judge_cells(cells: list[dict]) -> list[dict]:
    """Turn notebook cells into the re-check's program: setup, vetted solutions, grade cells.

    ``cells`` are ``{"kind": "setup"|"solution"|"grade", "grade_id", "source"}`` in notebook
    order; solution sources are reduced with :func:`definitions_only`.
    """
    instructor = [c["source"] for c in cells if c["kind"] != "solution"]
    reads, binds, imports = _instructor_names(instructor)
    expected = reads - binds - set(_REAL_BUILTINS)  # what the checks take from the student
    reserved = (reads | binds | set(_REAL_BUILTINS)) - expected
    out = []
    for cell in cells:
        if cell["kind"] == "solution":
            source, dropped = definitions_only(cell["source"], reserved, imports)
            out.append({**cell, "source": source, "dropped": dropped})
        else:
            out.append(dict(cell))
    return out


# ---------------------------------------------------------------- the re-check process


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
    cmd = [sys.executable, "-m", "course.instructor.integrity", "judge"]
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
        tree = ast.parse(_strip_magics(source))
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
        "usage: python -m course.instructor.integrity judge  (reads a job on stdin)",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
