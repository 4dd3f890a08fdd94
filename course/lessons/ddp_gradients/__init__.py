"""What DDP does to gradients: ``experiment`` measures it on gloo ranks, ``check`` grades the
student's averaging comm hook and loss for uneven batches, ``hooks`` keeps a hook from
crashing DDP.
"""

from course.exports import Exports

EXPORTS = Exports(
    __name__,
    {
        "check_answer": "course.checks.answers",
        "check_reduce_hook": "course.lessons.ddp_gradients.check",
        "check_weighted_loss": "course.lessons.ddp_gradients.check",
        "experiment": "course.lessons.ddp_gradients.experiment",
        "guard_hook": "course.lessons.ddp_gradients.hooks",
        "regression_data": "course.lessons.ddp_gradients.experiment",
        "say_if_unimplemented": "course.checks.teaching",
    },
)
__all__ = [
    "check_answer",
    "check_reduce_hook",
    "check_weighted_loss",
    "experiment",
    "guard_hook",
    "regression_data",
    "say_if_unimplemented",
]
__getattr__ = EXPORTS.getattr
__dir__ = EXPORTS.dir()
