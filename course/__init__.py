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
    """Register the ``%%ranks`` cell magic (called by ``%load_ext course``)."""
    from course.ranks.magics import RanksMagics

    ipython.register_magics(RanksMagics)
