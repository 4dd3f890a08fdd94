"""Synchronous data-parallel training, measured: the package behind the course notebooks.

Load the notebook magic with ``%load_ext course``; then ``%%ranks 4`` runs a cell on four
real ``torch.distributed`` ranks (gloo, CPU).
"""

from __future__ import annotations

__all__ = ["load_ipython_extension"]


def load_ipython_extension(ipython) -> None:  # noqa: ANN001 - IPython's own hook signature
    """Register the ``%%ranks`` cell magic (called by ``%load_ext course``)."""
    from course.magics import RanksMagics

    ipython.register_magics(RanksMagics)
