"""Synchronous data-parallel training, measured: the package behind the course notebooks.

Load the notebook magic with ``%load_ext course``; then ``%%ranks 4`` runs a cell on four
real ``torch.distributed`` ranks (gloo, CPU).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from IPython.core.interactiveshell import InteractiveShell

__all__ = ["load_ipython_extension"]


def load_ipython_extension(ipython: InteractiveShell) -> None:
    """Register the ``%%ranks`` cell magic (called by ``%load_ext course``), and warm the
    ranks' forkserver whenever a cell runs: it stops by itself once idle for a minute."""
    from course.ranks import warm_up
    from course.ranks.magics import RanksMagics

    ipython.register_magics(RanksMagics)
    ipython.events.register("pre_run_cell", lambda *_info: warm_up())
