"""Imported by the warm grader's forkserver (:mod:`course.grading.warm`): it makes one
feedback page (:func:`course.grading.feedback.warm`), so every ``generate_feedback`` forked
after starts with the feedback template compiled and the regular expressions of its
highlighter and markdown renderer too. A page that cannot be made here costs only that head
start (each grader compiles its own), never the forkserver: multiprocessing lets a preloaded
module fail only with an ImportError."""

from __future__ import annotations

import contextlib

from course.grading.feedback import warm

with contextlib.suppress(Exception):
    warm()
