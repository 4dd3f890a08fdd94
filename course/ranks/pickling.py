"""How a job travels to the ranks: cloudpickle by value, tuned for ranks that imported torch.

Private API, on purpose and in one place. The public ``cloudpickle.dumps`` renames every
code object's file to "<dynamic-code>" (so a rank's traceback could not name the user's
cell) and ships every imported ``torch.*`` submodule a function mentions (sympy and all,
~1.5 s a rank). Overriding that needs ``cloudpickle.cloudpickle._code_reduce`` and
``Pickler._dynamic_function_reduce``: known to work with cloudpickle 3.0 to 3.1, the range
pyproject.toml allows; ``tests/ranks/test_pickling.py`` fails with a clear message outside it.
"""

from __future__ import annotations

import contextlib
import io
import types
from collections import ChainMap
from typing import Any, ClassVar

import cloudpickle

__all__ = ["TESTED_CLOUDPICKLE", "dumps"]

TESTED_CLOUDPICKLE = ("3.0", "3.1")  # major.minor versions whose internals this module uses


def dumps(obj: Any) -> bytes:
    """cloudpickle by value, keeping code filenames so rank tracebacks name the user's file."""
    with io.BytesIO() as buf:
        _Pickler(buf).dump(obj)
        return buf.getvalue()


def _code_reduce(code: types.CodeType) -> tuple:
    """cloudpickle's code reducer, minus its renaming of every file to "<dynamic-code>"."""
    constructor, args = cloudpickle.cloudpickle._code_reduce(code)  # noqa: SLF001 - see the module docstring
    return constructor, tuple(code.co_filename if a == "<dynamic-code>" else a for a in args)


class _Pickler(cloudpickle.Pickler):
    """cloudpickle, tuned for ranks that already imported torch (uses cloudpickle internals)."""

    dispatch_table: ClassVar = ChainMap(
        {types.CodeType: _code_reduce}, cloudpickle.Pickler.dispatch_table
    )

    def _dynamic_function_reduce(self, func: types.FunctionType) -> tuple:
        """Do not make ranks import every torch submodule the caller happened to import.

        cloudpickle sends along any imported submodule whose name matches an attribute
        the function uses: after ``torch.testing.assert_close`` (which imports
        ``torch.distributed.tensor``), any function that says ``dist`` and ``.tensor``
        made every rank import sympy, ~1.5 s each. torch loads what it needs itself.
        """
        reduced = super()._dynamic_function_reduce(func)
        with contextlib.suppress(LookupError, TypeError, AttributeError):
            slots = reduced[2][1]
            modules = slots["_cloudpickle_submodules"]
            slots["_cloudpickle_submodules"] = [
                m for m in modules if not m.__name__.startswith("torch.")
            ]
        return reduced
