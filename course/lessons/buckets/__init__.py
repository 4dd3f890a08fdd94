"""Gradient buckets and overlap: ``experiment`` measures DDP's buckets and when their
all-reduces start; ``check`` grades a bucketed all-reduce, ``overlap`` an ``OverlappingDDP``.
"""

from course.exports import Exports

EXPORTS = Exports(
    __name__,
    {
        "HIDDEN_CASES": "course.lessons.buckets.check",
        "check_answer": "course.checks.answers",
        "check_bucketed_allreduce": "course.lessons.buckets.check",
        "check_overlapping_ddp": "course.lessons.buckets.overlap",
        "experiment": "course.lessons.buckets.experiment",
        "say_if_unimplemented": "course.checks.teaching",
    },
)
__all__ = [
    "HIDDEN_CASES",
    "check_answer",
    "check_bucketed_allreduce",
    "check_overlapping_ddp",
    "experiment",
    "say_if_unimplemented",
]
__getattr__ = EXPORTS.getattr
__dir__ = EXPORTS.dir()
