"""The ring: a pure schedule, trace and cost model first, then the torch side.

``schedule`` (chunk bounds, which chunk a rank sends at each step, a simulator), ``trace`` (one
message format for the checks, the widget and the simulator), ``verdict`` (where a trace
departs from a ring), ``halves``, ``tree`` and ``hierarchy`` (the same for the ring's halves,
recursive doubling and the two-level all-reduce), ``cost`` (alpha-beta model), then on real
ranks: ``recorder`` (every point-to-point message and collective a rank makes), ``relayed``
(the same, read from the grading relay's record), ``wire`` and ``traffic`` (what a rank put on
its TCP connections, gloo's own collectives included), ``p2p`` (blocking orders) and
``bandwidth``. The course's working ring is the instructor's: ``course.instructor.reference``.
"""

__all__ = [
    "bandwidth",
    "collectives",
    "cost",
    "encoding",
    "halves",
    "halves_record",
    "hierarchy",
    "logs",
    "p2p",
    "recorder",
    "relayed",
    "schedule",
    "trace",
    "traffic",
    "tree",
    "verdict",
    "wire",
]
