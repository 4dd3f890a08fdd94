"""FSDP with mixed precision. Graded: ``check`` (a step against a single process, and its
traffic), ``memory`` (what a rank holds, and the precision policy), with their rank side
(``rank``), the replies' reading (``replies``) and the traffic's rules (``traffic``) on the
check's model (``model``). Measured: ``experiment``, ``precision``, ``timeline``. Drawn:
``schedule`` (one step as data), ``view``, ``layout`` and ``picture`` (the figure),
``widget`` and ``record`` (the student's own step, played).
"""

from course.exports import Exports

EXPORTS = Exports(
    __name__,
    {
        "animate_fully_shard": "course.lessons.fsdp.record",
        "check_answer": "course.checks.answers",
        "check_fsdp_memory": "course.lessons.fsdp.memory",
        "check_fsdp_mixed_precision": "course.lessons.fsdp.memory",
        "check_fsdp_traffic": "course.lessons.fsdp.check",
        "check_fully_shard": "course.lessons.fsdp.check",
        "experiment": "course.lessons.fsdp.experiment",
        "loss_of": "course.lessons.fsdp.model",
        "make_batches": "course.lessons.fsdp.model",
        "picture": "course.lessons.fsdp.picture",
        "precision": "course.lessons.fsdp.precision",
        "say_if_unimplemented": "course.checks.teaching",
        "timeline": "course.lessons.fsdp.timeline",
        "tiny_lm": "course.lessons.fsdp.model",
    },
)
__all__ = [
    "animate_fully_shard",
    "check_answer",
    "check_fsdp_memory",
    "check_fsdp_mixed_precision",
    "check_fsdp_traffic",
    "check_fully_shard",
    "experiment",
    "loss_of",
    "make_batches",
    "picture",
    "precision",
    "say_if_unimplemented",
    "timeline",
    "tiny_lm",
]
__getattr__ = EXPORTS.getattr
__dir__ = EXPORTS.dir()
