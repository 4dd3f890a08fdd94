"""Under grading, verdicts on communication come from the relay's record, not the ranks'.

The ring's and its halves' patterns (on inputs no rank can forge) and the accumulation
step's count of collectives: each attack below gained points when the verdict read what the
ranks recorded or counted themselves; graded through the relay (every confined launch),
each earns nothing, and honest code still passes.
"""

from __future__ import annotations

import pytest
from boxes import graded_box

from course.grading import sandbox
from course.grading.student import StudentCode
from course.lessons.accumulation import check_accumulation_syncs
from course.lessons.ring_allreduce import check_ring_pattern, check_ring_sums
from course.lessons.zero import check_error_feedback_hook, check_halves_pattern

pytestmark = [
    pytest.mark.ranks,
    pytest.mark.slow,
    pytest.mark.skipif(not sandbox.available(), reason="needs bubblewrap, setpriv and prlimit"),
]

HONEST = """
import torch, torch.distributed as dist

def ring_allreduce(tensor):
    n, r = dist.get_world_size(), dist.get_rank()
    flat = tensor.view(-1) if tensor.is_contiguous() else tensor.contiguous().view(-1)
    chunks = list(flat.tensor_split(n))
    right, left = (r + 1) % n, (r - 1) % n
    for phase in (0, 1):
        for s in range(n - 1):
            out, into = chunks[(r - s + phase) % n], chunks[(r - s - 1 + phase) % n]
            buf = torch.empty_like(into)
            sent = dist.isend(out.clone(), right)
            dist.irecv(buf, left).wait()
            sent.wait()
            into.add_(buf) if phase == 0 else into.copy_(buf)
    if flat.data_ptr() != tensor.data_ptr():
        tensor.copy_(flat.view(tensor.shape))
"""

# gloo's own all-reduce, reached through the default group's backend object.
GLOO_OBJECT = """
import torch, torch.distributed as dist

def ring_allreduce(tensor):
    dist.group.WORLD._get_backend(torch.device("cpu")).allreduce([tensor]).wait()
"""

# The dispatcher's all-reduce, which no Python wrapper on the rank sees.
DISPATCHER = """
import torch, torch.distributed as dist

def ring_allreduce(tensor):
    op = torch.ops._c10d_functional
    tensor.copy_(op.wait_tensor(op.all_reduce(tensor, "sum", dist.group.WORLD.group_name)))
"""

# No ring: the sum from a collective, then the messages a ring would send, made up from the
# public encoding (rank q's input is 2**q * (1 + i * 2**N)) and sent round the ring.
FORGED_RING = """
import torch, torch.distributed as dist

def ring_allreduce(tensor):
    n, r = dist.get_world_size(), dist.get_rank()
    scale = torch.arange(tensor.numel(), dtype=torch.float64) * float(1 << n)
    inputs = [(1 + scale) * float(1 << q) for q in range(n)]
    chunks = [list(x.tensor_split(n)) for x in inputs]
    for s in range(2 * (n - 1)):
        if s < n - 1:  # reduce-scatter: chunk r - s, holding ranks r - s .. r
            k, into, held = (r - s) % n, (r - s - 1) % n, [(r - j) % n for j in range(s + 1)]
        else:  # all-gather: whole chunks
            t = s - (n - 1)
            k, into, held = (r - t + 1) % n, (r - t) % n, range(n)
        sent = dist.isend(sum(chunks[q][k] for q in held).clone(), (r + 1) % n)
        dist.irecv(torch.empty_like(chunks[0][into]), (r - 1) % n).wait()
        sent.wait()
    tensor.copy_(sum(inputs).view(tensor.shape).to(tensor.dtype))
"""


def _code(source: str) -> StudentCode:
    return StudentCode((("ring_allreduce", source),), "ring_allreduce")


def test_an_honest_ring_passes_through_the_relay() -> None:
    with graded_box(check_ring_sums, check_ring_pattern):
        assert "correct in-place sums" in str(check_ring_sums(_code(HONEST), world_sizes=(2, 3)))
        assert "a ring pattern" in str(check_ring_pattern(_code(HONEST), world_sizes=(3, 4)))


@pytest.mark.parametrize(
    ("attack", "told"),
    [
        (GLOO_OBJECT, "No backend type associated with device type cpu"),
        (DISPATCHER, "called dist.all_reduce, a collective"),
    ],
)
def test_no_route_to_a_collective_earns_the_sums(attack: str, told: str) -> None:
    """Do gloo's backend object and the dispatcher's op, which the ranks' own recorder did not
    see, fail the sums (there is no gloo; the relay records the all-reduce)?"""
    with graded_box(check_ring_sums), pytest.raises(AssertionError, match=told):
        check_ring_sums(_code(attack), world_sizes=(2,))


def test_forged_ring_messages_earn_no_pattern() -> None:
    """Do the messages a ring would send, computed from the public encoding instead of
    received, fail the pattern under grading (its inputs' bits are secret), where they pass
    on the notebook's path?"""
    forged = StudentCode((("ring_allreduce", FORGED_RING),), "ring_allreduce")
    namespace: dict = {}
    exec(FORGED_RING, namespace)  # noqa: S102 - the attack, run where it still works
    assert "a ring pattern" in str(check_ring_pattern(namespace["ring_allreduce"], (3,)))
    with (
        graded_box(check_ring_pattern),
        pytest.raises(AssertionError, match="not a sum of whole ranks' inputs"),
    ):
        check_ring_pattern(forged, world_sizes=(3,))


HONEST_STEP = """
import contextlib, torch
from torch import nn

def accumulation_step(ddp, optimizer, micro_batches):
    k = len(micro_batches)
    for i, (x, y) in enumerate(micro_batches):
        with ddp.no_sync() if i < k - 1 else contextlib.nullcontext():
            (nn.functional.mse_loss(ddp(x), y) / k).backward()
    optimizer.step()
    optimizer.zero_grad()
"""

# All-reduces after every micro-batch through the dispatcher's op, which neither the rank's
# recorder nor DDP's comm hook sees: K times the communication, counted as DDP's one sync.
HIDDEN_SYNCS = """
import contextlib, torch, torch.distributed as dist
from torch import nn

def accumulation_step(ddp, optimizer, micro_batches):
    k, op = len(micro_batches), torch.ops._c10d_functional
    for i, (x, y) in enumerate(micro_batches):
        with ddp.no_sync() if i < k - 1 else contextlib.nullcontext():
            (nn.functional.mse_loss(ddp(x), y) / k).backward()
        if i < k - 1:  # talks after every micro-batch (the result is not even used)
            for p in ddp.parameters():
                op.wait_tensor(op.all_reduce(p.grad.clone(), "sum", dist.group.WORLD.group_name))
    optimizer.step()
    optimizer.zero_grad()
"""


def _step(source: str) -> StudentCode:
    return StudentCode((("accumulation_step", source),), "accumulation_step")


def test_communication_hidden_from_the_ranks_count_fails_the_syncs() -> None:
    """Do all-reduces the rank's own count does not see (the dispatcher's) fail the syncs
    check under grading, where they pass it on the notebook's path; does an honest step pass?"""
    namespace: dict = {}
    exec(HIDDEN_SYNCS, namespace)  # noqa: S102 - the attack, run where it still works
    assert "once per step" in check_accumulation_syncs(namespace["accumulation_step"])
    with graded_box(check_accumulation_syncs):
        assert "once per step" in check_accumulation_syncs(_step(HONEST_STEP))
        with pytest.raises(AssertionError, match="collective call\\(s\\) of its own"):
            check_accumulation_syncs(_step(HIDDEN_SYNCS))


HALVES = """
import torch, torch.distributed as dist

def reduce_scatter(tensor):
    n, r = dist.get_world_size(), dist.get_rank()
    chunks = list(tensor.view(-1).tensor_split(n))
    for s in range(n - 1):
        out, into = chunks[(r - s - 1) % n], chunks[(r - s - 2) % n]
        buf = torch.empty_like(into)
        sent = dist.isend(out.clone(), (r + 1) % n)
        dist.irecv(buf, (r - 1) % n).wait()
        sent.wait()
        into.add_(buf)
    return chunks[r]

def all_gather(shard, out):
    n, r = dist.get_world_size(), dist.get_rank()
    chunks = list(out.view(-1).tensor_split(n))
    chunks[r].copy_(shard)
    for s in range(n - 1):
        sent = dist.isend(chunks[(r - s) % n].clone(), (r + 1) % n)
        dist.irecv(chunks[(r - s - 1) % n], (r - 1) % n).wait()
        sent.wait()
"""

# A reduce-scatter that receives nothing it uses: each step's chunk made up from the public
# encoding (rank q's input is 2**q * (1 + i * 2**N)), the shard computed the same way.
FORGED_REDUCE_SCATTER = (
    HALVES.replace("def reduce_scatter(tensor):", "def _honest(tensor):")
    + """

def reduce_scatter(tensor):
    n, r = dist.get_world_size(), dist.get_rank()
    scale = torch.arange(tensor.numel(), dtype=torch.float64) * float(1 << n)
    inputs = [list(((1 + scale) * float(1 << q)).tensor_split(n)) for q in range(n)]
    for s in range(n - 1):
        k, into = (r - s - 1) % n, (r - s - 2) % n
        sent = dist.isend(sum(inputs[(r - j) % n][k] for j in range(s + 1)), (r + 1) % n)
        dist.irecv(torch.empty_like(inputs[0][into]), (r - 1) % n).wait()
        sent.wait()
    return sum(inputs[q][r] for q in range(n))
"""
)


def _halves(source: str) -> tuple[StudentCode, StudentCode]:
    cells = (("halves", source),)
    return StudentCode(cells, "reduce_scatter"), StudentCode(cells, "all_gather")


def test_a_forged_reduce_scatter_earns_no_pattern() -> None:
    """Does a reduce-scatter whose messages are made up from the public encoding pass the
    halves' pattern on the notebook's path but fail it under grading; do honest halves pass?"""
    namespace: dict = {}
    exec(FORGED_REDUCE_SCATTER, namespace)  # noqa: S102 - the attack, run where it still works
    passed = check_halves_pattern(namespace["reduce_scatter"], namespace["all_gather"], (3,))
    assert "each half a ring" in passed
    with graded_box(check_halves_pattern):
        assert "each half a ring" in check_halves_pattern(*_halves(HALVES), world_sizes=(3, 4))
        with pytest.raises(AssertionError, match="not a sum of inputs"):
            check_halves_pattern(*_halves(FORGED_REDUCE_SCATTER), world_sizes=(3,))


# Error feedback without compression: the float32 gradient all-reduced, the rank's own
# record of it rewritten to float16's bytes (half its elements).
UNCOMPRESSED = """
import dataclasses
import torch, torch.distributed as dist
import course.ring.recorder as _recorder

def ef_fp16_hook(state, bucket):
    averaged = bucket.buffer().div_(dist.get_world_size())
    work = dist.all_reduce(averaged, async_op=True)
    for seen in _recorder._active:
        last = seen.collectives[-1]
        seen.collectives[-1] = dataclasses.replace(last, nbytes=last.nbytes // 2)
    return work.get_future().then(lambda f: f.value()[0])
"""


def test_an_uncompressed_hook_earns_nothing_graded() -> None:
    """Does a float32 all-reduce whose record on the rank says float16's bytes pass the error
    feedback check in a notebook and fail graded, on the bytes the relay carried?"""
    namespace: dict = {}
    exec(UNCOMPRESSED, namespace)  # noqa: S102 - the attack, run where it still works
    assert "within 5%" in check_error_feedback_hook(namespace["ef_fp16_hook"])
    with (
        graded_box(check_error_feedback_hook),
        pytest.raises(AssertionError, match="bytes a gradient element a step"),
    ):
        check_error_feedback_hook(StudentCode((("ef", UNCOMPRESSED),), "ef_fp16_hook"))


# Every micro-batch synced, the check's marks held back and its step's part started by the
# student's own mark just before the last backward: counted from that mark, one sync.
SYNCS_BEFORE_ITS_MARK = """
import torch
import course.ranks.relay as _relay

_mark, _relay.mark = _relay.mark, lambda tag: None

def accumulation_step(ddp, optimizer, micro_batches):
    k = len(micro_batches)
    for x, y in micro_batches[:-1]:
        (torch.nn.functional.mse_loss(ddp(x), y) / k).backward()
    _mark(0)
    x, y = micro_batches[-1]
    (torch.nn.functional.mse_loss(ddp(x), y) / k).backward()
    optimizer.step()
    optimizer.zero_grad()
"""

# The float32 hook, its counting started by its own mark at the last step.
UNCOMPRESSED_LATE_MARK = """
import torch, torch.distributed as dist
import course.ranks.relay as _relay

_mark, _relay.mark = _relay.mark, lambda tag: None
CALLS = []

def ef_fp16_hook(state, bucket):
    CALLS.append(1)
    if len(CALLS) == 200:
        _mark(0)
    averaged = bucket.buffer().div_(dist.get_world_size())
    return dist.all_reduce(averaged, async_op=True).get_future().then(lambda f: f.value()[0])
"""


def test_marks_of_the_students_own_hide_no_traffic() -> None:
    """Do syncs made before a mark the step sent itself, and a float32 hook counted from its
    own mark, still fail graded (counts over the whole run)?"""
    with graded_box(check_accumulation_syncs):
        with pytest.raises(AssertionError, match="all-reduced the gradients 4 times"):
            check_accumulation_syncs(
                StudentCode((("acc", SYNCS_BEFORE_ITS_MARK),), "accumulation_step")
            )
        with pytest.raises(AssertionError, match="bytes a gradient element a step"):
            check_error_feedback_hook(
                StudentCode((("ef", UNCOMPRESSED_LATE_MARK),), "ef_fp16_hook")
            )
