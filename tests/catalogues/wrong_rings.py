"""A catalogue of student-style ``ring_allreduce(tensor)`` implementations, wrong and right.

Used by the grader's tests, the widget's tests and the sample submissions. Each function is
written the way a student would write it in a notebook cell (self-contained, plain
``torch.distributed``), and the module travels to the ranks by value, as a notebook cell does.

``WRONG`` maps a name to ``(fn, check, words)``: ``check`` is the narrowest grading check that
must fail ("sums" or "pattern") and ``words`` are what its message must mention.
``CORRECT`` maps a name to a function that every check must pass.
"""

from __future__ import annotations

import os
import sys

import cloudpickle
import torch
import torch.distributed as dist
from torch.distributed import recv, send


def _bounds(numel, n):
    q, extra = divmod(numel, n)
    return [(c * q + min(c, extra), (c + 1) * q + min(c + 1, extra)) for c in range(n)]


def _isend_irecv_ring(tensor, direction=1, bounds=None, buffer_dtype=None, chunk_shift=0):
    """A ring with knobs for the mistakes below; the defaults make it right."""
    n, r = dist.get_world_size(), dist.get_rank()
    flat = tensor.view(-1)
    bounds = bounds or _bounds(flat.numel(), n)
    chunks = [flat[lo:hi] for lo, hi in bounds]
    right, left = (r + direction) % n, (r - direction) % n
    for s in range(2 * (n - 1)):
        if s < n - 1:
            send_c, recv_c = (r - direction * s) % n, (r - direction * (s + 1)) % n
            send_c, recv_c = (send_c + chunk_shift) % n, (recv_c + chunk_shift) % n
        else:
            t = s - (n - 1)
            send_c, recv_c = (r - direction * (t - 1)) % n, (r - direction * t) % n
        out = chunks[send_c].to(buffer_dtype) if buffer_dtype else chunks[send_c]
        buf = torch.empty(chunks[recv_c].numel(), dtype=buffer_dtype or flat.dtype)
        req = dist.isend(out, right)
        dist.irecv(buf, left).wait()
        req.wait()
        if s < n - 1:
            chunks[recv_c] += buf.to(flat.dtype)
        else:
            chunks[recv_c].copy_(buf)


# --- wrong -------------------------------------------------------------------------------


def deadlock(tensor):
    """Every rank receives first, with blocking calls: nobody ever sends."""
    n, r = dist.get_world_size(), dist.get_rank()
    buf = torch.empty_like(tensor)
    recv(buf, (r - 1) % n)
    send(tensor, (r + 1) % n)
    tensor += buf


def off_by_one_chunk(tensor):
    """Reduce-scatter's chunk indices are one off (consistently, so sizes still match): the
    all-gather then sends chunks that are not fully reduced."""
    _isend_irecv_ring(tensor, chunk_shift=1)


def dropped_remainder(tensor):
    """Chunks of numel // N elements: the last numel % N elements are never summed."""
    n = dist.get_world_size()
    q = tensor.numel() // n
    _isend_irecv_ring(tensor, bounds=[(c * q, (c + 1) * q) for c in range(n)])


def averaging(tensor):
    """A right ring, then divided by world_size: that is DDP's average, not all_reduce's sum."""
    _isend_irecv_ring(tensor)
    tensor.copy_(tensor / dist.get_world_size())


def naive_exchange(tensor):
    """Every rank sends its whole tensor to every other rank: right sums, N-1 full copies."""
    n, r = dist.get_world_size(), dist.get_rank()
    mine = tensor.clone()
    bufs = [torch.empty_like(tensor) for _ in range(n)]
    reqs = [dist.isend(mine, p) for p in range(n) if p != r]
    reqs += [dist.irecv(bufs[p], p) for p in range(n) if p != r]
    for req in reqs:
        req.wait()
    for p in range(n):
        if p != r:
            tensor += bufs[p]


def whole_tensor_ring(tensor):
    """The whole tensor forwarded N-1 times round the ring: right sums, N times the bytes."""
    n, r = dist.get_world_size(), dist.get_rank()
    passing = tensor.clone()
    for _ in range(n - 1):
        incoming = torch.empty_like(tensor)
        req = dist.isend(passing, (r + 1) % n)
        dist.irecv(incoming, (r - 1) % n).wait()
        req.wait()
        tensor += incoming
        passing = incoming


def library_collective(tensor):
    """Not a ring at all: the library's own collective."""
    dist.all_reduce(tensor)


def crash_on_one_rank(tensor):
    """Rank 1 raises before sending anything."""
    if dist.get_rank() == 1:
        raise ValueError("rank 1 lost its chunk index")
    _isend_irecv_ring(tensor)


def exits_on_one_rank(tensor):
    """Rank 1 leaves the process with os._exit."""
    if dist.get_rank() == 1:
        os._exit(3)
    _isend_irecv_ring(tensor)


def spins(tensor):
    """Rank 0 never returns: an endless loop outside any dist call."""
    rank = dist.get_rank()
    while rank == 0:
        pass
    _isend_irecv_ring(tensor)


def returns_result(tensor):
    """Sums right, but into a new tensor that it returns: the caller's tensor is unchanged."""
    result = tensor.clone()
    _isend_irecv_ring(result)
    return result


def reduce_scatter_only(tensor):
    """The reduce-scatter and no all-gather: each rank ends with one chunk fully summed."""
    n, r = dist.get_world_size(), dist.get_rank()
    chunks = torch.tensor_split(tensor.view(-1), n)
    for s in range(n - 1):
        send_c, recv_c = (r - s) % n, (r - s - 1) % n
        buf = torch.empty_like(chunks[recv_c])
        req = dist.isend(chunks[send_c], (r + 1) % n)
        dist.recv(buf, (r - 1) % n)
        req.wait()
        chunks[recv_c].add_(buf)


def cell_names(tensor):
    """Uses the %%ranks cell's `rank` and `world_size`, which a function does not see."""
    chunks = torch.tensor_split(tensor.view(-1), world_size)  # noqa: F821 - the mistake itself
    chunks[rank].add_(1)  # noqa: F821 - the mistake itself


def tuple_item_assignment(tensor):
    """Adds a received chunk with `chunks[i] += buf` on tensor_split's tuple: a TypeError."""
    n, r = dist.get_world_size(), dist.get_rank()
    chunks = torch.tensor_split(tensor.view(-1), n)
    buf = torch.empty_like(chunks[(r - 1) % n])
    req = dist.isend(chunks[r], (r + 1) % n)
    dist.recv(buf, (r - 1) % n)
    req.wait()
    chunks[(r - 1) % n] += buf


def torch_chunk(tensor):
    """torch.chunk gives fewer than N chunks when numel is small (e.g. 5 into 4 gives 3)."""
    n, r = dist.get_world_size(), dist.get_rank()
    chunks = list(torch.chunk(tensor.view(-1), n))
    for s in range(2 * (n - 1)):
        t = s - (n - 1)
        send_c = (r - s) % n if t < 0 else (r + 1 - t) % n
        recv_c = (r - s - 1) % n if t < 0 else (r - t) % n
        buf = torch.empty_like(chunks[recv_c])
        req = dist.isend(chunks[send_c], (r + 1) % n)
        dist.irecv(buf, (r - 1) % n).wait()
        req.wait()
        if t < 0:
            chunks[recv_c] += buf
        else:
            chunks[recv_c].copy_(buf)


def float32_buffers(tensor):
    """Chunks travel as float32 whatever the tensor's dtype: float64 sums lose precision."""
    _isend_irecv_ring(tensor, buffer_dtype=torch.float32)


WRONG = {
    "deadlock": (deadlock, "sums", ["deadlock", "recv", "while summing a float32 tensor"]),
    "off_by_one_chunk": (off_by_one_chunk, "sums", ["wrong", "expected"]),
    "dropped_remainder": (dropped_remainder, "sums", ["wrong", "expected"]),
    "averaging": (averaging, "sums", ["average"]),
    "naive_exchange": (naive_exchange, "pattern", ["made 1 send;", "2(N-1) = 2"]),
    "whole_tensor_ring": (whole_tensor_ring, "pattern", ["made 1 send;", "2(N-1) = 2"]),
    "library_collective": (library_collective, "sums", ["dist.all_reduce", "a collective"]),
    "crash_on_one_rank": (crash_on_one_rank, "sums", ["ValueError", "lost its chunk index"]),
    "exits_on_one_rank": (exits_on_one_rank, "sums", ["rank 1", "os._exit"]),
    "spins": (spins, "sums", ["rank 0", "loop"]),
    "returns_result": (returns_result, "sums", ["returned a Tensor", "in place"]),
    "torch_chunk": (torch_chunk, "sums", ["IndexError"]),
    "float32_buffers": (float32_buffers, "sums", ["float64", "expected"]),
    "reduce_scatter_only": (reduce_scatter_only, "sums", ["reduce-scatter without the all-gather"]),
    "cell_names": (cell_names, "sums", ["NameError", "rank = dist.get_rank()"]),
    "tuple_item_assignment": (
        tuple_item_assignment,
        "sums",
        ["does not support item assignment", ".add_(received)"],
    ),
}

# the pattern verdict alone must also catch these (their sums may be right or wrong)
WRONG_PATTERN = ["off_by_one_chunk", "naive_exchange", "whole_tensor_ring", "library_collective"]


# --- correct, in other styles ----------------------------------------------------------


def blocking_by_parity(tensor):
    """Blocking send/recv; even ranks send first, odd ranks receive first, so none deadlock."""
    n, r = dist.get_world_size(), dist.get_rank()
    flat = tensor.view(-1)
    chunks = [flat[lo:hi] for lo, hi in _bounds(flat.numel(), n)]
    for s in range(2 * (n - 1)):
        t = s - (n - 1)
        send_c = (r - s) % n if t < 0 else (r + 1 - t) % n
        recv_c = (r - s - 1) % n if t < 0 else (r - t) % n
        buf = torch.empty_like(chunks[recv_c])
        if r % 2 == 0:
            send(chunks[send_c], (r + 1) % n)
            recv(buf, (r - 1) % n)
        else:
            recv(buf, (r - 1) % n)
            send(chunks[send_c], (r + 1) % n)
        if t < 0:
            chunks[recv_c] += buf
        else:
            chunks[recv_c].copy_(buf)


def batched(tensor):
    """Each step's send and receive as one batch_isend_irecv."""
    n, r = dist.get_world_size(), dist.get_rank()
    flat = tensor.view(-1)
    chunks = [flat[lo:hi] for lo, hi in _bounds(flat.numel(), n)]
    for s in range(2 * (n - 1)):
        t = s - (n - 1)
        send_c = (r - s) % n if t < 0 else (r + 1 - t) % n
        recv_c = (r - s - 1) % n if t < 0 else (r - t) % n
        buf = torch.empty_like(chunks[recv_c])
        ops = [
            dist.P2POp(dist.isend, chunks[send_c], (r + 1) % n),
            dist.P2POp(dist.irecv, buf, (r - 1) % n),
        ]
        for req in dist.batch_isend_irecv(ops):
            req.wait()
        if t < 0:
            chunks[recv_c] += buf
        else:
            chunks[recv_c].copy_(buf)


def reversed_ring(tensor):
    """The same ring, run the other way round: send to rank - 1."""
    _isend_irecv_ring(tensor, direction=-1)


def with_copies(tensor):
    """Works on cloned chunks of a contiguous copy, then writes the result back."""
    n, r = dist.get_world_size(), dist.get_rank()
    work = tensor.reshape(-1).clone()
    chunks = [work[lo:hi].clone() for lo, hi in _bounds(work.numel(), n)]
    for s in range(2 * (n - 1)):
        t = s - (n - 1)
        send_c = (r - s) % n if t < 0 else (r + 1 - t) % n
        recv_c = (r - s - 1) % n if t < 0 else (r - t) % n
        buf = torch.zeros_like(chunks[recv_c])
        req = dist.isend(chunks[send_c].clone(), (r + 1) % n)
        dist.irecv(buf, (r - 1) % n).wait()
        req.wait()
        chunks[recv_c] = chunks[recv_c] + buf if t < 0 else buf.clone()
    tensor.copy_(torch.cat(chunks).view(tensor.shape))


def remainder_last(tensor):
    """Another chunking: equal chunks, the last one takes the remainder."""
    n = dist.get_world_size()
    numel = tensor.numel()
    q = numel // n
    _isend_irecv_ring(
        tensor, bounds=[(c * q, numel if c == n - 1 else (c + 1) * q) for c in range(n)]
    )


CORRECT = {
    "blocking_by_parity": blocking_by_parity,
    "batched": batched,
    "reversed_ring": reversed_ring,
    "with_copies": with_copies,
    "remainder_last": remainder_last,
}

# ranks receive these functions by value, as they would a notebook cell's
cloudpickle.register_pickle_by_value(sys.modules[__name__])
