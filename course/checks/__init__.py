"""The checks' common core: what every lesson's checks share.

Every check runs the student's code on fresh ranks (``course.ranks``) and computes its
verdict in the caller, from what the ranks send back; none trusts the kernel's state. When
grading, the caller is the judge (``course.grading.judge``), which never runs student code.

``teaching`` turns a failed run of ranks into a message that teaches; ``compare`` holds the
numbers checks compare; ``refusals`` the torch built-ins a rank refuses; ``answers`` grades a
quiz letter; ``calls`` the simplest check; ``allreduce`` (with ``ring_cases`` and
``ring_hints``) grades any all-reduce built from point-to-point calls, the ring, its halves,
the tree and the two-level one alike; ``memory`` reads what a rank holds from the relay. Each
lesson's own checks live in its package (``course.lessons.<lesson>``).
"""

from __future__ import annotations

from course.checks.answers import check_answer
from course.checks.calls import check_returns

__all__ = ["check_answer", "check_returns"]
