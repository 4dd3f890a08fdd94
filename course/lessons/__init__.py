"""The lessons, one package each, named as its assignment in ``source/`` is.

Each holds its experiments, checks and pictures, and exports what its notebook calls
(``from course.lessons.fsdp import check_fully_shard``), each name imported on first use
(``course.exports``). A lesson depends on the machinery below it (``course.ranks``,
``course.ring``, ``course.checks``, ``course.pictures``), never on another lesson.
"""

__all__ = [
    "accumulation",
    "buckets",
    "ddp_gradients",
    "fault_tolerance",
    "fsdp",
    "ring_allreduce",
    "synchrony",
    "zero",
]
