"""The cost of synchrony: ``latency``, ``links``, ``stragglers`` and ``batch_size`` measure it
on gloo ranks, ``picture`` draws it; ``tree``, ``hierarchy`` and ``backups`` grade the
student's recursive doubling, two-level all-reduce and step with backup workers.
"""

from course.exports import Exports

EXPORTS = Exports(
    __name__,
    {
        "batch_size": "course.lessons.synchrony.batch_size",
        "check_answer": "course.checks.answers",
        "check_hierarchical_allreduce": "course.lessons.synchrony.hierarchy",
        "check_hierarchical_pattern": "course.lessons.synchrony.hierarchy",
        "check_hierarchical_sums": "course.lessons.synchrony.hierarchy",
        "check_step_with_backups": "course.lessons.synchrony.backups",
        "check_tree_allreduce": "course.lessons.synchrony.tree",
        "check_tree_pattern": "course.lessons.synchrony.tree",
        "check_tree_sums": "course.lessons.synchrony.tree",
        "collective_traffic": "course.ring.traffic",
        "latency": "course.lessons.synchrony.latency",
        "links": "course.lessons.synchrony.links",
        "not_implemented": "course.checks.teaching",
        "picture": "course.lessons.synchrony.picture",
        "say_if_unimplemented": "course.checks.teaching",
        "stragglers": "course.lessons.synchrony.stragglers",
    },
)
__all__ = [
    "batch_size",
    "check_answer",
    "check_hierarchical_allreduce",
    "check_hierarchical_pattern",
    "check_hierarchical_sums",
    "check_step_with_backups",
    "check_tree_allreduce",
    "check_tree_pattern",
    "check_tree_sums",
    "collective_traffic",
    "latency",
    "links",
    "not_implemented",
    "picture",
    "say_if_unimplemented",
    "stragglers",
]
__getattr__ = EXPORTS.getattr
__dir__ = EXPORTS.dir()
