"""Under grading, whether a step waited for its straggler comes from the relay's record.

In a notebook the check reads the time each rank's step ended from the ranks themselves; a
step that waits for the straggler and stops the ranks' clocks would pass there. Graded, the
relay's own clock on each message decides, and the same step earns nothing.
"""

from __future__ import annotations

import inspect

import pytest
import synchrony_impls
import wrong_backups
from boxes import graded_box

from course.grading import sandbox
from course.grading.student import StudentCode
from course.lessons.synchrony import check_step_with_backups

pytestmark = [
    pytest.mark.ranks,
    pytest.mark.slow,
    pytest.mark.skipif(not sandbox.available(), reason="needs bubblewrap, setpriv and prlimit"),
]

HEADER = "import torch, torch.distributed as dist\n"

# Waits for every gradient, then keeps the ones that came first by its own stopwatch, and
# stops the clock the check's rank code reads, so every step seems to end at time 0.
STOPPED_CLOCK = """
def step_with_backups(grad, backups):
    import time
    stopwatch, time.monotonic = time.perf_counter, lambda: 0.0
    rank, n = dist.get_rank(), dist.get_world_size()
    reply = torch.empty(n + grad.numel(), dtype=torch.float64)
    if rank:
        dist.send(grad, 0)
        dist.recv(reply, 0)
        grad.copy_(reply[n:])
        return [r for r in range(n) if reply[r]]
    grads, took = [grad.clone()], [0.0]
    for r in range(1, n):
        start, incoming = stopwatch(), torch.empty_like(grad)
        dist.recv(incoming, r)
        grads.append(incoming)
        took.append(stopwatch() - start)
    kept = sorted(sorted(range(n), key=took.__getitem__)[: n - backups])
    grad.copy_(torch.stack([grads[k] for k in kept]).mean(0))
    reply = torch.cat([torch.zeros(n, dtype=torch.float64), grad.double()])
    reply[kept] = 1
    for r in range(1, n):
        dist.send(reply, r)
    return kept
"""


def _code(source: str) -> StudentCode:
    return StudentCode((("step_with_backups", HEADER + source),), "step_with_backups")


def _source(module: object, name: str) -> str:
    names = [n for n in ("_STEPS", "_SENDING") if n in vars(module)]
    state = "".join(f"{n} = {[0] if n == '_STEPS' else []}\n" for n in names)
    return state + inspect.getsource(getattr(module, name))


def _as_step(module: object, name: str) -> str:
    """Function ``name`` of ``module``, with its module's state, as a notebook's
    ``step_with_backups``."""
    return _source(module, name).replace(f"def {name}(", "def step_with_backups(")


def test_the_model_step_passes_through_the_relay() -> None:
    with graded_box(check_step_with_backups):
        report = check_step_with_backups(
            _code(_source(synchrony_impls, "step_with_backups")), world_sizes=(3, 4)
        )
    assert "no rank waited for the straggler" in str(report)


def test_waiting_with_the_clocks_stopped_earns_nothing() -> None:
    """Does a step that waits for every gradient, the ranks' clocks stopped and marks of its
    own sent to the relay (to seem to have ended early), pass the notebook's check (the
    attack works there) but fail the graded one, by the relay's clock between the check's
    barriers?"""
    attack = STOPPED_CLOCK.replace(
        "    import time\n",
        "    import time\n    import course.ranks.relay\n\n    course.ranks.relay.mark(1)\n",
    )
    namespace: dict = {}
    exec(HEADER + attack, namespace)  # noqa: S102 - defined here, run on the ranks only
    assert "passed" in str(check_step_with_backups(namespace["step_with_backups"], (3,)))
    with (
        graded_box(check_step_with_backups),
        pytest.raises(AssertionError, match="it waited for the straggler"),
    ):
        check_step_with_backups(_code(attack), world_sizes=(3,))


@pytest.mark.parametrize(
    ("impl", "words"),
    [
        ("waits_for_everyone", "waited for"),
        ("all_reduce_of_everyone", "waited for"),
        ("blocks_on_the_straggler", "waited for the straggler"),
        ("divides_by_everyone", "divided by N, not by the number kept"),
        ("each_keeps_its_own", "the ranks disagree on whom they kept"),
    ],
)
def test_each_misconception_gets_the_notebooks_verdict_graded(impl: str, words: str) -> None:
    """Does each wrong step fail graded as it fails in a notebook (where its straggler sleeps),
    for the same reason, though no rank is told who the straggler is?"""
    with graded_box(check_step_with_backups), pytest.raises(AssertionError, match=words):
        check_step_with_backups(_code(_as_step(wrong_backups, impl)), world_sizes=(3,))


def test_a_reply_in_two_messages_passes_on_both_paths() -> None:
    """Does a right step that replies with the kept flags and the mean as two tagged messages
    pass in a notebook and graded?"""
    impl = synchrony_impls.step_with_backups_in_two_messages
    assert "passed" in str(check_step_with_backups(impl, world_sizes=(4,)))
    with graded_box(check_step_with_backups):
        report = check_step_with_backups(
            _code(_as_step(synchrony_impls, "step_with_backups_in_two_messages")), (4,)
        )
    assert "no rank waited for the straggler" in str(report)


def peeks_at_the_frame() -> str:
    """What a step could learn of the straggler from the check's own frame on the rank."""
    import inspect as look

    frame = look.currentframe()
    while frame is not None and "todo" not in frame.f_locals:
        frame = frame.f_back
    return repr([getattr(c, "straggler", None) for c in frame.f_locals["todo"]]) if frame else ""


def test_no_rank_is_told_who_the_straggler_is() -> None:
    """Graded, do the cases the ranks get name no straggler (the relay makes it)?"""
    source = inspect.getsource(peeks_at_the_frame).replace(
        "def peeks_at_the_frame() -> str:", "def _peek():"
    )
    attack = (
        source
        + "\ndef step_with_backups(grad, backups):\n"
        + "    raise RuntimeError('stragglers ' + _peek())\n"
    )
    with graded_box(check_step_with_backups), pytest.raises(AssertionError) as failed:
        check_step_with_backups(_code(attack), world_sizes=(3,))
    assert "RuntimeError: stragglers [None]" in str(failed.value)
