"""The launcher's two private dependencies: versions it was tested with, and what it relies on.

``course/ranks/pickling.py`` uses cloudpickle's internals and ``course/ranks/forkserver.py``
multiprocessing's; on a version nobody has tried, these fail first and say what to do.
"""

from __future__ import annotations

import sys
import types

import cloudpickle
import pytest

from course.ranks import pickling


def test_cloudpickle_is_a_version_the_launcher_was_tested_with() -> None:
    """Is the installed cloudpickle one whose internals course/ranks/pickling.py knows?"""
    version = ".".join(cloudpickle.__version__.split(".")[:2])
    assert version in pickling.TESTED_CLOUDPICKLE, (
        f"cloudpickle {cloudpickle.__version__} is untested: course/ranks/pickling.py overrides "
        f"its private _code_reduce and _dynamic_function_reduce (tested with "
        f"{', '.join(pickling.TESTED_CLOUDPICKLE)}). Install a tested version, or run the "
        "launcher's tests on this one and add it to TESTED_CLOUDPICKLE and pyproject's bound."
    )


def test_python_is_a_version_the_forkserver_was_tested_with() -> None:
    """Is this Python one whose multiprocessing internals course/ranks/forkserver.py knows?"""
    assert (3, 11) <= sys.version_info[:2] <= (3, 13), (
        f"Python {sys.version.split()[0]} is untested: course/ranks/forkserver.py uses "
        "multiprocessing.forkserver's private attributes (known to work on 3.11 to 3.13)."
    )


def _cell_function(x: int) -> int:
    return x + 1


def test_pickled_code_keeps_its_file_name() -> None:
    """Does a function sent to the ranks keep its file name (so tracebacks name the cell)?"""
    code = compile("def f(x):\n    return x + 1\n", "Cell In[7]", "exec")
    namespace: dict = {}
    exec(code, namespace)  # noqa: S102 - defines a function as a notebook cell does
    loaded = cloudpickle.loads(pickling.dumps(namespace["f"]))
    assert loaded.__code__.co_filename == "Cell In[7]" and loaded(1) == 2


def test_torch_submodules_are_not_shipped_with_a_function() -> None:
    """Does a function that mentions torch leave the ranks to import torch's submodules?"""
    import torch.distributed as dist
    import torch.distributed.tensor  # noqa: F401 - imported, so cloudpickle would ship it

    def uses_dist() -> object:
        return dist.tensor

    def shipped(pickler: cloudpickle.Pickler) -> list[str]:
        reduced = pickler._dynamic_function_reduce(uses_dist)  # noqa: SLF001 - what we override
        return [m.__name__ for m in reduced[2][1]["_cloudpickle_submodules"]]

    sink = types.SimpleNamespace(write=lambda _: None)
    assert "torch.distributed.tensor" in shipped(cloudpickle.Pickler(sink))  # stock: shipped
    assert not [m for m in shipped(pickling._Pickler(sink)) if m.startswith("torch.")]  # noqa: SLF001


@pytest.mark.parametrize("value", [_cell_function, {"a": [1, 2.5]}])
def test_plain_values_round_trip(value: object) -> None:
    """Does the launcher's pickler load back what it dumps?"""
    loaded = cloudpickle.loads(pickling.dumps(value))
    assert loaded == value or loaded(1) == value(1)
