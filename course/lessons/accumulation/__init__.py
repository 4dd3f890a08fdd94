"""Accumulation and uneven data: ``experiment`` and ``sampler`` measure ``no_sync``, ``Join``
and ``DistributedSampler`` on gloo ranks; ``indices``, ``check`` and ``uneven`` grade the
student's sampler, accumulation step and loop for uneven data.
"""

from course.exports import Exports

EXPORTS = Exports(
    __name__,
    {
        "check_accumulation_syncs": "course.lessons.accumulation.check",
        "check_accumulation_values": "course.lessons.accumulation.check",
        "check_answer": "course.checks.answers",
        "check_sampler_indices": "course.lessons.accumulation.indices",
        "check_train_uneven": "course.lessons.accumulation.uneven",
        "experiment": "course.lessons.accumulation.experiment",
        "not_implemented": "course.checks.teaching",
        "sampler": "course.lessons.accumulation.sampler",
        "say_if_unimplemented": "course.checks.teaching",
        "try_accumulation_step": "course.lessons.accumulation.check",
    },
)
__all__ = [
    "check_accumulation_syncs",
    "check_accumulation_values",
    "check_answer",
    "check_sampler_indices",
    "check_train_uneven",
    "experiment",
    "not_implemented",
    "sampler",
    "say_if_unimplemented",
    "try_accumulation_step",
]
__getattr__ = EXPORTS.getattr
__dir__ = EXPORTS.dir()
