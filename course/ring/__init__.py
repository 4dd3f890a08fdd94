"""The ring: a pure schedule, trace and cost model first, then the torch side.

``schedule`` (chunk bounds, which chunk a rank sends at each step, a simulator), ``trace`` (one
message format for the checks, the widget and the simulator), ``cost`` (alpha-beta model),
then on real ranks: ``recorder`` (every point-to-point message and collective a rank makes),
``wire`` (what a rank put on its TCP connections, gloo's own collectives included), ``p2p``
(blocking orders) and ``bandwidth``. The course's working ring is the instructor's:
``course.instructor.reference``.
"""
