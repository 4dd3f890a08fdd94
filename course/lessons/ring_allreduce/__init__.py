"""The ring all-reduce: write one from point-to-point calls, and measure what it sends.

``check`` grades the student's ``ring_allreduce`` (its sums, and that it is a ring). The rest
is shared machinery the notebook calls through this package: the ring widget
(``course.pictures.widgets``), the alpha-beta cost (``course.ring.cost``), blocking orders on
real ranks (``course.ring.p2p``), gloo's own ring on the wire (``course.ring.traffic``,
``course.ring.wire``, ``course.ring.bandwidth``).
"""

from course.exports import Exports

EXPORTS = Exports(
    __name__,
    {
        "WireMeter": "course.ring.wire",
        "animate": "course.pictures.widgets",
        "check_answer": "course.checks.answers",
        "check_ring_allreduce": "course.lessons.ring_allreduce.check",
        "check_ring_pattern": "course.lessons.ring_allreduce.check",
        "check_ring_sums": "course.lessons.ring_allreduce.check",
        "collective_traffic": "course.ring.traffic",
        "compare_busbw": "course.ring.bandwidth",
        "cost": "course.ring.cost",
        "p2p": "course.ring.p2p",
        "ring_widget": "course.pictures.widgets",
        "say_if_unimplemented": "course.checks.teaching",
    },
)
__all__ = [
    "WireMeter",
    "animate",
    "check_answer",
    "check_ring_allreduce",
    "check_ring_pattern",
    "check_ring_sums",
    "collective_traffic",
    "compare_busbw",
    "cost",
    "p2p",
    "ring_widget",
    "say_if_unimplemented",
]
__getattr__ = EXPORTS.getattr
__dir__ = EXPORTS.dir()
