"""The mark of a test that runs student code confined, as grading does."""

from __future__ import annotations

import os

import pytest

from course.grading import sandbox

__all__ = ["CONFINED"]

CONFINED = pytest.mark.skipif(
    not sandbox.available() or os.geteuid() != 0,
    reason="graded ranks run confined with bubblewrap as another uid: needs bwrap and root",
)
