"""Imported by the warm grader's forkserver (:mod:`course.grading.warm`): it makes one
feedback page (:func:`course.grading.feedback.warm`), so every ``generate_feedback`` forked
after starts with the feedback template compiled and the regular expressions of its
highlighter and markdown renderer too."""

from __future__ import annotations

from course.grading.feedback import warm

warm()
