"""The rank box a submission's checks need, known before any of its code runs.

Which forkserver a submission's checks get (``course.grading.rankbox.RankBox``): with
``torch._dynamo`` only if a grade cell's check may train with DDP, and preloaded with what
every rank would import on its own (the instructor's setup cells, the built-ins the called
checks refuse); all of it read from the gradebook's cells, never the student's. A grading
process can start that box before nbgrader's own start-up (:func:`rank_box_started`), and
the judge takes it over.
"""

from __future__ import annotations

import ast
import importlib
from collections.abc import Iterable
from typing import Any

from course.checks.refusals import Refusal
from course.exports import module_of
from course.grading.student import parse_cell

__all__ = [
    "NO_DDP",
    "POINT_TO_POINT",
    "box_options",
    "rank_imports",
    "trains_ddp",
]


# Checks whose ranks only send, receive or return: their forkserver needs no torch._dynamo.
POINT_TO_POINT = frozenset({
    "check_answer", "check_returns", "check_ring_allreduce", "check_ring_pattern",
    "check_ring_sums", "check_reduce_scatter", "check_all_gather", "check_halves_pattern",
    "check_tree_allreduce", "check_tree_pattern", "check_tree_sums",
})  # fmt: skip
# Checks whose ranks call collectives or wait on stragglers but never train: no torch._dynamo.
NO_DDP = POINT_TO_POINT | {
    "check_hierarchical_allreduce", "check_hierarchical_pattern", "check_hierarchical_sums",
    "check_step_with_backups",
}  # fmt: skip
# The FSDP checks (check_fully_shard, check_fsdp_traffic, check_fsdp_memory,
# check_fsdp_mixed_precision) are not in NO_DDP: their ranks train without DDP, but an
# optimizer's step imports torch._dynamo all the same (measured on torch 2.13).


def _checks_called(sub: Any) -> set[str]:
    """The ``check_*`` names the grade cells (the instructor's, from the gradebook) use."""
    called = set()
    for gid, _cell in sub.grade_cells:
        tree = parse_cell(sub.sources[gid])
        names = ast.walk(tree) if tree is not None else ()
        called |= {n.id for n in names if isinstance(n, ast.Name) and n.id.startswith("check_")}
    return called


def trains_ddp(checks: Iterable[str]) -> bool:
    """Might one of the ``check_*`` named train with DDP (any not known never to: NO_DDP)?
    Its box's forkserver then preloads ``torch._dynamo``."""
    return not set(checks) <= NO_DDP


def rank_imports(sub: Any) -> tuple[str, ...]:
    """What every rank of ``sub`` would import on its own: the modules of the instructor's
    setup cells (for a ``from a import b``, also the module ``b`` lives in: a lesson exports
    each name from its own module, ``course.exports``) and those of the built-ins the called
    checks refuse. Its forkserver imports them once instead (a name that is no module fails
    to import there, harmlessly); nothing here is the student's."""
    modules, checks = [], {}
    for setup in sub.setup:
        tree = parse_cell(setup)
        for node in tree.body if tree is not None else ():
            if isinstance(node, ast.Import):
                modules += [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                modules.append(node.module)
                for alias in node.names:
                    where = _module_of(node.module, alias.name)
                    modules.append(where or f"{node.module}.{alias.name}")
                    checks[alias.asname or alias.name] = where
    for name in sorted(_checks_called(sub)):
        module = _imported(checks.get(name))
        refusals = [r for r in vars(module).values() if isinstance(r, Refusal)] if module else []
        modules += [target.partition(":")[0] for r in refusals for target in r.names]
    return tuple(dict.fromkeys(modules))


def _module_of(package: str, name: str) -> str | None:
    """The module that defines ``package``'s ``name`` (importing ``package`` only, which
    for a lesson is its table of names); None if ``package`` is not the course's."""
    return module_of(_imported(package), name) if package.startswith("course") else None


def _imported(module: str | None) -> Any:
    """The course's ``module``, imported here (in the grader: it is the instructor's code),
    or None if it does not import."""
    try:
        return importlib.import_module(module) if module else None
    except ImportError:
        return None


def box_options(sub: Any) -> dict[str, Any]:
    """How the submission's :class:`RankBox` is made: DDP or not, what it preloads."""
    return {"ddp": trains_ddp(_checks_called(sub)), "preload": rank_imports(sub)}
