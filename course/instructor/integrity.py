"""An in-kernel tamper check: has this interpreter been altered since the course loaded?

:func:`check_integrity` reports input transformers, patched builtins and slots, patched
``course`` or ``torch.distributed`` functions, replaced modules and trace hooks. It runs in
the kernel, so it is a tripwire, not a defence: the re-check (``rejudge.py``) is.
"""

from __future__ import annotations

import builtins
import os
import sys
import sysconfig
import types
from pathlib import Path

__all__ = ["IntegrityError", "assert_intact", "check_integrity"]

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
