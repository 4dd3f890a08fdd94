"""ZeRO from the ring's halves: ``halves`` grades the student's reduce-scatter and all-gather,
``check`` their ZeRO optimizer, ``feedback`` an error-feedback fp16 hook; ``experiment``,
``traffic`` and ``compression`` measure, and ``report`` prints and draws it for the notebook.
"""

from course.exports import Exports

EXPORTS = Exports(
    __name__,
    {
        "animate_half": "course.pictures.widgets",
        "check_all_gather": "course.lessons.zero.halves",
        "check_answer": "course.checks.answers",
        "check_error_feedback_hook": "course.lessons.zero.feedback",
        "check_halves_pattern": "course.lessons.zero.halves",
        "check_reduce_scatter": "course.lessons.zero.halves",
        "check_zero_matches_ddp": "course.lessons.zero.check",
        "check_zero_memory": "course.lessons.zero.check",
        "chunk_bounds": "course.ring.schedule",
        "collective_traffic": "course.ring.traffic",
        "half_widget": "course.pictures.widgets",
        "report": "course.lessons.zero.report",
        "say_if_unimplemented": "course.checks.teaching",
    },
)
__all__ = [
    "animate_half",
    "check_all_gather",
    "check_answer",
    "check_error_feedback_hook",
    "check_halves_pattern",
    "check_reduce_scatter",
    "check_zero_matches_ddp",
    "check_zero_memory",
    "chunk_bounds",
    "collective_traffic",
    "half_widget",
    "report",
    "say_if_unimplemented",
]
__getattr__ = EXPORTS.getattr
__dir__ = EXPORTS.dir()
