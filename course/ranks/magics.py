"""The ``%%ranks`` cell magic: run a notebook cell on N real torch.distributed ranks.

    %load_ext course

    %%ranks 4 --timeout 20
    t = torch.tensor([float(rank)])
    dist.all_reduce(t)
    print(t.item())

Every rank prints under its own ``[rank r]`` header, in rank order. The work is done
by :mod:`course.ranks`; this module only parses the line, picks the variables to send
and shows the output.
"""

from __future__ import annotations

import ast
import sys
import traceback
import types
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from course.ranks import launcher as ranks
from course.ranks.failures import CELL_NAME

__all__ = ["RanksMagics", "bound_names"]

PROVIDED = {"rank", "world_size", "torch", "dist", "device"}  # defined on every rank already


@magics_class
class RanksMagics(Magics):
    """IPython magics that run cells on torch.distributed ranks."""

    def __init__(self, shell: Any = None) -> None:
        super().__init__(shell)
        ranks.warm_up()  # torch loads in the forkserver while the student reads the next cell

    @magic_arguments()
    @argument("world_size", type=int, help="number of ranks to start (processes)")
    @argument(
        "--timeout",
        type=float,
        default=ranks.DEFAULT_TIMEOUT,
        help="seconds before every rank is stopped and the cell fails (default 60)",
    )
    @argument(
        "--pg-timeout",
        type=float,
        default=None,
        help="seconds a rank waits on a peer before gloo gives up (default min(timeout, 10))",
    )
    @argument(
        "--backend",
        default="gloo",
        choices=("gloo", "nccl"),
        help="gloo: every rank on the CPU (default); nccl: rank r on cuda:r (needs N GPUs)",
    )
    @argument("--out", metavar="NAME", help="store the ranks' last-expression values in NAME")
    @argument(
        "--show",
        metavar="RANKS",
        default="all",
        help='whose output to show: "all" (default) or a comma-separated list like 0,2',
    )
    @argument("-q", "--quiet", action="store_true", help="show no rank output (errors still show)")
    @cell_magic
    def ranks(self, line: str, cell: str) -> None:
        """Run the cell on N gloo ranks: ``%%ranks N [--timeout S] [--out NAME] [--show 0,1] [-q]``.

        Each rank runs the cell body as plain Python (no % magics) with ``rank``,
        ``world_size``, ``torch``, ``dist`` and ``device`` (``cpu``, or ``cuda:rank`` with
        ``--backend nccl``) defined and the default process group initialised. Variables and
        functions from earlier cells that the cell uses (and does not define itself) are
        copied to every rank. Output comes back grouped by
        rank, then each rank's last expression value. A failure on any rank fails the
        cell with that rank's traceback and what the other ranks were doing.
        """
        args = parse_argstring(self.ranks, line)
        show = _shown_ranks(args.show, args.world_size, args.quiet)
        cell = "\n" + cell  # the %%ranks line is line 1: tracebacks then name the lines you see
        try:
            code = compile(cell, CELL_NAME, "exec")
        except SyntaxError as exc:
            text = "".join(traceback.format_exception_only(exc)).rstrip()
            raise UsageError(f"%%ranks: the cell is not valid Python:\n{text}") from None
        variables = self._variables(cell, code)
        try:
            result = ranks.launch(
                cell,
                args.world_size,
                timeout=args.timeout,
                pg_timeout=args.pg_timeout,
                backend=args.backend,
                variables=variables,
            )
        except (TypeError, ValueError) as exc:
            raise UsageError(f"%%ranks: {exc}") from None
        display_output(result, show)
        if not result.ok:
            raise ranks.RankError(result)
        if args.out:
            self.shell.user_ns[args.out] = result.results

    def _variables(self, cell: str, code: types.CodeType) -> dict[str, Any]:
        """The notebook variables the cell uses but does not define, to copy to every rank."""
        user_ns = self.shell.user_ns
        hidden = set(getattr(self.shell, "user_ns_hidden", {}))
        names = (_names(code) - bound_names(ast.parse(cell)) - PROVIDED - hidden) & set(user_ns)
        return {n: user_ns[n] for n in sorted(names) if not n.startswith("_")}


def _names(code: types.CodeType) -> set[str]:
    """Every global or attribute name a code object (and the code inside it) uses."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names(const)
    return names


def bound_names(tree: ast.AST, *, deep: bool = True) -> set[str]:
    """Names a cell binds itself (``deep``: anywhere in it) or one statement binds (not deep):
    assignment targets, ``def`` and ``class`` names, imports."""
    if deep:
        nodes: list[ast.AST] = list(ast.walk(tree))
    else:
        targets = tree.targets if isinstance(tree, ast.Assign) else [getattr(tree, "target", None)]
        nodes = [tree, *getattr(tree, "names", [])]
        nodes += [n for t in targets if isinstance(t, ast.AST) for n in ast.walk(t)]
    bound = set()
    for node in nodes:
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            bound.add(node.id)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            bound.add(node.name)
        elif isinstance(node, ast.alias):
            bound.add((node.asname or node.name).split(".")[0])
    return bound


def _shown_ranks(spec: str, world_size: int, quiet: bool) -> list[int]:
    """Parse --show: "all" or a comma-separated list of ranks below world_size."""
    if quiet:
        return []
    if spec.strip() == "all":
        return list(range(world_size))
    try:
        chosen = sorted({int(part) for part in spec.split(",") if part.strip()})
    except ValueError:
        raise UsageError(f'--show takes "all" or ranks like 0,2; got {spec!r}') from None
    if any(not 0 <= r < world_size for r in chosen):
        raise UsageError(f"--show {spec}: ranks go from 0 to {world_size - 1}")
    return chosen


def display_output(result: ranks.RunResult, show: list[int]) -> None:
    """Print each shown rank's stdout, stderr and value under a ``[rank r]`` header."""
    blocks = {r: _block(result, r) for r in show}
    blocks = {r: b for r, b in blocks.items() if b[0] or b[1]}
    one_line = all(len(out) <= 1 and not err for out, err in blocks.values())
    for r, (out, err) in blocks.items():
        if one_line:
            print(f"[rank {r}] {out[0]}")
            continue
        print(f"[rank {r}]")
        for text in out:
            print(text)
        if err:
            sys.stdout.flush()
            print("\n".join(err), file=sys.stderr)
            sys.stderr.flush()


def _block(result: ranks.RunResult, r: int) -> tuple[list[str], list[str]]:
    """One rank's output lines and error lines, with its last expression value if any."""
    out = result.stdout[r].splitlines()
    if result.results[r] is not None:
        out += repr(result.results[r]).splitlines()
    return out, result.stderr[r].splitlines()
