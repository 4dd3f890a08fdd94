"""Near copies of the course's solutions are flagged; other work, and the stub, are not."""

from __future__ import annotations

import attacks

from course.grading.copies import near_copies


def test_the_solution_with_names_changed_is_flagged() -> None:
    solution = attacks.solution_cell()
    assert near_copies([attacks.near_copy()], [solution]) == ["ring_allreduce"]


def test_other_work_and_the_stub_are_not() -> None:
    solution = attacks.solution_cell()
    stub = 'def ring_allreduce(tensor):\n    """Sum it."""\n    # YOUR CODE HERE\n'
    assert near_copies([attacks.HONEST_RING], [solution]) == []
    assert near_copies([stub], [stub]) == []
