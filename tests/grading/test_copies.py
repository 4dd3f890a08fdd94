"""Near copies of the course's solutions are flagged; other work, and the stub, are not."""

from __future__ import annotations

import attacks

from course.grading.copies import near_copies, shared_rules


def test_the_solution_with_names_changed_is_flagged() -> None:
    solution = attacks.solution_cell()
    assert near_copies([attacks.near_copy()], [solution]) == ["ring_allreduce"]


def test_other_work_and_the_stub_are_not() -> None:
    solution = attacks.solution_cell()
    stub = 'def ring_allreduce(tensor):\n    """Sum it."""\n    # YOUR CODE HERE\n'
    assert near_copies([attacks.HONEST_RING], [solution]) == []
    assert near_copies([stub], [stub]) == []


HOOK_SOLUTION = '''
def reduce_hook(state, bucket):
    """The exercise's solution."""
    buffer = bucket.buffer().div_(dist.get_world_size())
    work = dist.all_reduce(buffer, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])
'''


def test_a_solution_rule_inside_other_code_is_found() -> None:
    """Is a helper that holds a solution's body, renamed, one line added and its calls chained,
    found inside a module, and a helper that only calls torch's own hook not?"""
    shipped = """
def counting_hook(calls: list, b):
    calls.append(b.index())
    buf = b.buffer().div_(dist.get_world_size())
    return dist.all_reduce(buf, async_op=True).get_future().then(lambda f: f.value()[0])


def delegating_hook(calls: list, b):
    calls.append(b.index())
    return allreduce_hook(None, b)
"""
    found = shared_rules({"helpers.py": shipped}, [HOOK_SOLUTION])
    assert len(found) == 1 and found[0].startswith("helpers.py: counting_hook holds")


def test_short_idioms_are_not_rules() -> None:
    """Are a solution's lines under the rule size (a two-line loop) never taken for a rule?"""
    solution = "def f(xs):\n    for x in xs:\n        x.add_(1)\n"
    assert shared_rules({"m.py": solution}, [solution]) == []
