# ---
# jupyter:
#   jupytext:
#     cell_metadata_filter: nbgrader,-all
#     notebook_metadata_filter: kernelspec
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown] nbgrader={"grade": false, "grade_id": "intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# # Sharded data parallelism (ZeRO), from the two halves of your ring
#
# Plain data parallelism keeps a full replica of everything on every rank: the parameters,
# the gradients, and the optimizer's state (for Adam, two more numbers per parameter). Once a
# model's optimizer state no longer fits one device, that replication is the first thing to
# go. **ZeRO** (Rajbhandari et al. 2020) shards it: with N ranks, each rank keeps the
# optimizer state (stage 1), and the gradients too (stage 2), for **1/N of the parameters
# only**; stage 3, which PyTorch calls FSDP, shards the parameters as well.
#
# Sharding runs on the two halves of the ring you built in the ring assignment:
#
# * **reduce-scatter**, the ring's first N-1 steps: every rank ends up holding the *sum* of one
#   chunk of the gradient, its shard, and nothing else;
# * **all-gather**, the ring's last N-1 steps: every rank's shard travels round the ring until
#   every rank has all of them.
#
# In this notebook you will
#
# 1. watch each half on its own, and measure what it sends;
# 2. write `reduce_scatter` and `all_gather` with point-to-point calls only: **start from your
#    own `ring_allreduce`**, which already contains both;
# 3. build a ZeRO-2 optimizer from them, and measure the memory it saves and the bytes it sends
#    against DDP, and whether it trains to the same weights;
# 4. measure what PyTorch's compression comm hooks (fp16, PowerSGD) and its own
#    `ZeroRedundancyOptimizer` really do.
#
# As before, `%%ranks N` runs a cell on N gloo ranks, and `course.ranks.run(fn, N, ...)` runs a
# function on N ranks and returns each rank's value in rank order.

# %% nbgrader={"grade": false, "grade_id": "setup", "locked": true, "schema_version": 3, "solution": false, "task": false}
# %load_ext course
import torch
import torch.distributed as dist

from course.pictures import widgets

from course.experiments import zero_report
from course.checks import (
    check_all_gather,
    check_answer,
    check_error_feedback_hook,
    check_halves_pattern,
    check_reduce_scatter,
    check_zero_matches_ddp,
    check_zero_memory,
)
from course.ranks import run
from course.ring.schedule import chunk_bounds

# %% [markdown] nbgrader={"grade": false, "grade_id": "shard_contract", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## The shard contract
#
# Everything below uses the ring's own chunks: flatten the tensor, and cut it with
# `course.ring.schedule.chunk_bounds(numel, world_size)` (what `torch.tensor_split` does: the
# first `numel % N` chunks are one element longer). **Rank r's shard is chunk r.** When the
# tensor has fewer elements than ranks, the last shards are empty.

# %% nbgrader={"grade": false, "grade_id": "shard_contract_run", "locked": true, "schema_version": 3, "solution": false, "task": false}
for numel, n in ((12, 4), (10, 4), (3, 4)):
    print(f"{numel} elements on {n} ranks: shards {chunk_bounds(numel, n)}")

# %% [markdown] nbgrader={"grade": false, "grade_id": "watch_halves", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## The two halves, step by step
#
# The ring widget again, for each half on its own. Each rank's row shows its N chunks,
# coloured by how many ranks' contributions they hold (orange: all of them).
#
# * **Reduce-scatter**: every rank starts with its own contribution in every chunk; at each of
#   the N-1 steps it passes a partial sum to its right-hand neighbour, which adds its own. At
#   the end rank r holds chunk r fully reduced: its shard.
# * **All-gather**: every rank starts with its own shard only (grey: not here yet); the
#   shards travel round the ring, copied, until every rank holds all of them.

# %% nbgrader={"grade": false, "grade_id": "watch_reduce_scatter", "locked": true, "schema_version": 3, "solution": false, "task": false}
widgets.half_widget("reduce-scatter", world_size=4)

# %% nbgrader={"grade": false, "grade_id": "watch_all_gather", "locked": true, "schema_version": 3, "solution": false, "task": false}
widgets.half_widget("all-gather", world_size=4)

# %% [markdown] nbgrader={"grade": false, "grade_id": "zero_1_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Question zero_1: what does a reduce-scatter send?
#
# *Difficulty 1/3*
#
# Four ranks each hold a 400 MB gradient. A ring **reduce-scatter** leaves each rank with the
# sum of its own 100 MB shard, and nothing else. How much does each rank send?
#
# * a) 100 MB: one shard.
# * b) 300 MB: (N-1)/N of the tensor, half of what a ring all-reduce sends.
# * c) 400 MB: the whole tensor, once.
# * d) 1200 MB: its whole tensor to each of the 3 other ranks.
#
# Set `answer_zero_1` to your letter and run the cell below it.

# %% nbgrader={"grade": false, "grade_id": "zero_1_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
answer_zero_1 = ""  # your answer: one letter, "a" to "d"
### BEGIN SOLUTION
answer_zero_1 = "b"
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "zero_1_check", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
check_answer("answer_zero_1", answer_zero_1, choices="abcd")
### BEGIN HIDDEN TESTS
check_answer(
    "answer_zero_1",
    answer_zero_1,
    choices="abcd",
    key="b",
    explanation="""
    A reduce-scatter is the ring's first N-1 steps: at each one every rank passes one chunk of
    S/N to its neighbour, so each rank sends (N-1)/N of S, 3/4 of 400 MB = 300 MB. The
    measurement counts exactly that on 4 real ranks: the first 3 of the ring's 6 sends carry
    0.75 of the tensor. The all-gather sends the other (N-1)/N, which is why a ring all-reduce
    costs 2(N-1)/N: ZeRO pays the same two halves, only at different moments of the step.
    """,
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "zero_1_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it.** A ring all-reduce's traffic (`ring_traffic`, the messages of the ring you
# wrote in the first assignment), recorded on 4 real ranks: its first N-1 steps are a
# reduce-scatter, its last N-1 an all-gather. The cell counts the bytes each rank sends in
# each half, in units of the tensor's size.

# %% nbgrader={"grade": false, "grade_id": "zero_1_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
from course.ring.recorder import record
from course.ring.trace import bytes_sent
from course.ring.traffic import ring_traffic

trace = record(ring_traffic, 4, numel=4000)
first_half = bytes_sent(trace, upto_step=3)
whole = bytes_sent(trace)
for r in range(4):
    rs, ag = first_half[r] / trace.nbytes, (whole[r] - first_half[r]) / trace.nbytes
    print(f"rank {r}: reduce-scatter sent {rs:.2f} of the tensor, all-gather {ag:.2f}")

# %% [markdown] nbgrader={"grade": false, "grade_id": "exercise_1_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Exercise 1: the two halves, as functions
#
# Write two functions with **point-to-point calls only** (`dist.send`, `dist.recv`,
# `dist.isend`, `dist.irecv`, `dist.batch_isend_irecv`; no collective under any name):
#
# * `reduce_scatter(tensor) -> shard`: returns a **new 1-D tensor** holding, on rank r, the sum
#   over all ranks of chunk r of `tensor.view(-1)` (same dtype; empty if chunk r is).
#   `tensor` is **scratch**: your function may overwrite it (summing in place is the ring's way),
#   and the caller must not use it afterwards.
# * `all_gather(shard, out) -> None`: `shard` is rank r's chunk r; fill `out` (any shape, the
#   full tensor) so that on every rank chunk c of `out.view(-1)` holds rank c's shard.
#
# Both must be half a ring: N-1 steps, at each one send one chunk to `rank + 1` and receive one
# from `rank - 1`, so that each rank sends (N-1)/N of the tensor. Start from your
# `ring_allreduce`: its first loop is a reduce-scatter, its second an all-gather. One change:
# in the ring, rank r ends the reduce-scatter holding chunk r + 1; here it must hold chunk r,
# so shift the chunk indices by one (at step s send chunk (r - s - 1) % N, receive and add chunk
# (r - s - 2) % N). In the all-gather, rank r starts with chunk r: at step s send chunk
# (r - s) % N and receive chunk (r - s - 1) % N.
#
# Graded in three parts: right shards (3 points), right gathers (3 points), and each really
# half a ring (4 points), on world sizes 2 to 4 with many sizes and dtypes.

# %% nbgrader={"grade": false, "grade_id": "reduce_scatter", "locked": false, "schema_version": 3, "solution": true, "task": false}
def reduce_scatter(tensor: torch.Tensor) -> torch.Tensor:
    """Return the sum over ranks of chunk ``rank`` of ``tensor`` (scratch), p2p only."""
    ### BEGIN SOLUTION
    rank, n = dist.get_rank(), dist.get_world_size()
    flat = tensor.reshape(-1)
    chunks = [flat[lo:hi] for lo, hi in chunk_bounds(flat.numel(), n)]
    buffer = torch.empty_like(chunks[0])
    for s in range(n - 1):
        out, into = chunks[(rank - s - 1) % n], chunks[(rank - s - 2) % n]
        incoming = buffer[: into.numel()]
        request = dist.isend(out, (rank + 1) % n)
        dist.recv(incoming, (rank - 1) % n)
        request.wait()
        into.add_(incoming)
    return chunks[rank].clone()
    ### END SOLUTION


# %% nbgrader={"grade": false, "grade_id": "all_gather", "locked": false, "schema_version": 3, "solution": true, "task": false}
def all_gather(shard: torch.Tensor, out: torch.Tensor) -> None:
    """Fill ``out`` so that chunk c of ``out.view(-1)`` is rank c's shard, p2p only."""
    ### BEGIN SOLUTION
    rank, n = dist.get_rank(), dist.get_world_size()
    flat = out.view(-1)
    chunks = [flat[lo:hi] for lo, hi in chunk_bounds(flat.numel(), n)]
    chunks[rank].copy_(shard.reshape(-1))
    for s in range(n - 1):
        request = dist.isend(chunks[(rank - s) % n], (rank + 1) % n)
        dist.recv(chunks[(rank - s - 1) % n], (rank - 1) % n)
        request.wait()
    ### END SOLUTION


# %% [markdown] nbgrader={"grade": false, "grade_id": "try_halves_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### Test as you go
#
# On 3 ranks, every rank holds `rank + 1` in each of 7 elements: each shard should hold
# 1 + 2 + 3 = 6 (chunks of 3, 2 and 2 elements), and gathering the shards back gives seven 6s.

# %% nbgrader={"grade": false, "grade_id": "try_halves", "locked": true, "schema_version": 3, "solution": false, "task": false}
# %%ranks 3 --timeout 20
from course.checks.teaching import say_if_unimplemented

say_if_unimplemented(reduce_scatter)  # a note if a cell above is still the empty stub
say_if_unimplemented(all_gather)
t = torch.full((7,), rank + 1.0)
shard = reduce_scatter(t)
out = torch.zeros(7)
all_gather(shard, out)
print(f"shard {shard}   gathered {out.tolist()}")

# %% [markdown] nbgrader={"grade": false, "grade_id": "watch_yours_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# Now watch **your** two functions, recorded on 4 real ranks. Where a run departs from half a
# ring (a wrong neighbour, extra messages, a rank that never finishes) the widget says where.

# %% nbgrader={"grade": false, "grade_id": "watch_your_reduce_scatter", "locked": true, "schema_version": 3, "solution": false, "task": false}
widgets.animate_half(reduce_scatter, "reduce-scatter", world_size=4)

# %% nbgrader={"grade": false, "grade_id": "watch_your_all_gather", "locked": true, "schema_version": 3, "solution": false, "task": false}
widgets.animate_half(all_gather, "all-gather", world_size=4)

# %% [markdown] nbgrader={"grade": false, "grade_id": "visible_halves_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# The grader's checks, on fewer cases. Each stops within its deadline and says which world
# size, tensor and rank went wrong.

# %% nbgrader={"grade": false, "grade_id": "visible_halves", "locked": true, "schema_version": 3, "solution": false, "task": false}
print(check_reduce_scatter(reduce_scatter, world_sizes=(3,)))
print(check_all_gather(all_gather, world_sizes=(3,)))
print(check_halves_pattern(reduce_scatter, all_gather, world_sizes=(3,)))

# %% nbgrader={"grade": true, "grade_id": "reduce_scatter_sums", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
# Right shards: world sizes 2 to 4, sizes divisible by N and not, smaller than N, four dtypes.
print(check_reduce_scatter(reduce_scatter, world_sizes=(2,)))
### BEGIN HIDDEN TESTS
print(check_reduce_scatter(reduce_scatter))
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "all_gather_sums", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
# Right gathers: every chunk of out holds its rank's shard, on every rank.
print(check_all_gather(all_gather, world_sizes=(2,)))
### BEGIN HIDDEN TESTS
print(check_all_gather(all_gather))
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "halves_pattern", "locked": true, "points": 4, "schema_version": 3, "solution": false, "task": false}
# Each half a ring: neighbours only, N-1 messages, (N-1)/N of the tensor per rank, no collective.
print(check_halves_pattern(reduce_scatter, all_gather, world_sizes=(3,)))
### BEGIN HIDDEN TESTS
print(check_halves_pattern(reduce_scatter, all_gather))
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "zero_2_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Question zero_2: what does sharding cost in traffic?
#
# *Difficulty 2/3*
#
# A model of size S (in bytes) trains on 4 ranks. Per step, DDP all-reduces the gradient.
# ZeRO-1 and ZeRO-2 reduce-scatter the gradient, update each rank's shard, and all-gather the
# updated parameters. ZeRO-3 (FSDP) keeps only a shard of the parameters too: it all-gathers
# them before forward, again before backward, and reduce-scatters the gradient. How much does
# each rank send per step?
#
# * a) DDP 1.5 S; ZeRO-1/2 0.75 S (they send only shards); ZeRO-3 0.75 S.
# * b) DDP 1.5 S; ZeRO-1/2 3 S (two collectives instead of one); ZeRO-3 4.5 S.
# * c) DDP 1.5 S; ZeRO-1/2 1.5 S, the same; ZeRO-3 2.25 S, half as much again.
# * d) DDP 3 S; ZeRO-1/2 1.5 S; ZeRO-3 1.5 S.

# %% nbgrader={"grade": false, "grade_id": "zero_2_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
answer_zero_2 = ""  # your answer: one letter, "a" to "d"
### BEGIN SOLUTION
answer_zero_2 = "c"
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "zero_2_check", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_answer("answer_zero_2", answer_zero_2, choices="abcd")
### BEGIN HIDDEN TESTS
check_answer(
    "answer_zero_2",
    answer_zero_2,
    choices="abcd",
    key="c",
    explanation="""
    A ring all-reduce is a reduce-scatter followed by an all-gather, each sending (N-1)/N of
    the tensor: 2(N-1)/N = 1.5 S on 4 ranks. ZeRO-1/2 run the same two halves, with the
    optimizer step in between (the all-gather carries updated parameters instead of summed
    gradients): 1.5 S again, the memory saving costs no extra traffic. ZeRO-3 gathers the
    parameters twice (forward, then backward, because it frees them in between) plus one
    reduce-scatter: 3(N-1)/N = 2.25 S, 1.5 times DDP. The recorder counts 1.50, 1.50 and
    2.25 model sizes on 4 real ranks.
    """,
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "zero_2_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it**, with your own halves: one step's communication of each scheme on 4 real
# ranks, recorded message by message (DDP's all-reduce is a ring all-reduce's traffic,
# `ring_traffic`), in units of the model's size.

# %% nbgrader={"grade": false, "grade_id": "zero_2_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
zero_report.report_traffic(reduce_scatter, all_gather, world_size=4)

# %% [markdown] nbgrader={"grade": false, "grade_id": "exercise_2_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Exercise 2: a ZeRO-2 optimizer
#
# Write `ZeroOptimizer(params, optimizer_class, **defaults)`, the signature of PyTorch's
# `ZeroRedundancyOptimizer`. Every rank holds a full replica of a plain model (no DDP), runs
# forward and backward on its own batch, then calls `step()`, which must:
#
# 1. flatten the gradients of all parameters into one tensor and `reduce_scatter` it, then
#    divide by the world size: this rank's shard of the **averaged** gradient;
# 2. drop the full gradients (`p.grad = None`): from here on this rank keeps only its shard
#    of the gradient (that is ZeRO-2; ZeRO-1 would keep them);
# 3. update **only this rank's shard** of the parameters with `optimizer_class`, so that Adam's
#    state exists for the shard alone;
# 4. `all_gather` the updated shards back into every rank's parameters.
#
# Also give it `zero_grad()`. A way that copies nothing: in `__init__`, copy every parameter
# into one flat buffer and make each parameter a view of it (`p.data = flat[a:b].view_as(p)`);
# then this rank's shard `flat[lo:hi]` is a tensor `optimizer_class([shard], **defaults)` can
# update in place once you set `shard.grad`, and `all_gather(shard, flat)` refreshes every
# parameter at once. `chunk_bounds(flat.numel(), world_size)[rank]` gives `lo, hi`.
#
# Graded in two parts: training matches DDP + Adam to 1e-4 of the largest parameter over 5
# steps on 2 and 3 ranks (5 points); and on 4 ranks each rank holds 1/4 of Adam's state and
# 1/4 of the gradient after `step()`, measured as the bytes of the tensors it keeps (3 points).

# %% nbgrader={"grade": false, "grade_id": "zero_optimizer", "locked": false, "schema_version": 3, "solution": true, "task": false}
class ZeroOptimizer:
    """ZeRO-2: each rank keeps optimizer state and gradients for its own shard only."""

    def __init__(self, params, optimizer_class=torch.optim.Adam, **defaults) -> None:
        """Flatten the parameters, find this rank's shard, give optimizer_class the shard only."""
        ### BEGIN SOLUTION
        self.params = list(params)
        rank, n = dist.get_rank(), dist.get_world_size()
        self.flat = torch.cat([p.detach().reshape(-1) for p in self.params])
        offset = 0
        for p in self.params:
            p.data = self.flat[offset : offset + p.numel()].view_as(p)
            offset += p.numel()
        lo, hi = chunk_bounds(self.flat.numel(), n)[rank]
        self.shard = self.flat[lo:hi]
        self.optimizer = optimizer_class([self.shard], **defaults)
        ### END SOLUTION

    def step(self) -> None:
        """Reduce-scatter the gradients, update this rank's shard, all-gather the parameters."""
        ### BEGIN SOLUTION
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        flat_grad = torch.cat([g.reshape(-1) for g in grads])
        self.shard.grad = reduce_scatter(flat_grad).div_(dist.get_world_size())
        for p in self.params:
            p.grad = None
        self.optimizer.step()
        all_gather(self.shard, self.flat)
        ### END SOLUTION

    def zero_grad(self) -> None:
        """Forget the gradients: the model's and the shard's."""
        ### BEGIN SOLUTION
        for p in self.params:
            p.grad = None
        self.shard.grad = None
        ### END SOLUTION


# %% [markdown] nbgrader={"grade": false, "grade_id": "try_zero_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### Test as you go
#
# Two ranks train the course's toy model (12 square layers, 49,152 parameters) for 20 steps,
# once with DDP + Adam and once with your optimizer, from the same weights on the same data.

# %% nbgrader={"grade": false, "grade_id": "try_zero", "locked": true, "schema_version": 3, "solution": false, "task": false}
zero_report.report_equivalence(ZeroOptimizer, world_sizes=(2,))

# %% nbgrader={"grade": true, "grade_id": "zero_optimizer_matches_ddp", "locked": true, "points": 5, "schema_version": 3, "solution": false, "task": false}
# Trains like DDP + Adam: 5 steps, world sizes 2 and 3, parameters within 1e-4.
print(check_zero_matches_ddp(ZeroOptimizer, world_sizes=(2,)))
### BEGIN HIDDEN TESTS
print(check_zero_matches_ddp(ZeroOptimizer))
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "zero_optimizer_memory", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
# Holds 1/N: Adam's state and the gradient, measured on 4 ranks after step().
### BEGIN HIDDEN TESTS
print(check_zero_memory(ZeroOptimizer, world_size=4))
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "zero_3_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Question zero_3: memory per rank
#
# *Difficulty 2/3*
#
# A model of P parameters trains in fp32 with Adam (4 bytes per parameter, 4 per gradient, 8
# for Adam's two moments) on 4 ranks. Counting only parameters, gradients and optimizer
# state, how many bytes does each rank hold under ZeRO-2?
#
# * a) 7P: full parameters (4P), a quarter of the gradients (1P) and of Adam's state (2P).
# * b) 4P: everything is sharded, 16P / 4.
# * c) 10P: full parameters and gradients (8P), a quarter of Adam's state (2P).
# * d) 16P: sharding saves communication, not memory.

# %% nbgrader={"grade": false, "grade_id": "zero_3_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
answer_zero_3 = ""  # your answer: one letter, "a" to "d"
### BEGIN SOLUTION
answer_zero_3 = "a"
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "zero_3_check", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_answer("answer_zero_3", answer_zero_3, choices="abcd")
### BEGIN HIDDEN TESTS
check_answer(
    "answer_zero_3",
    answer_zero_3,
    choices="abcd",
    key="a",
    explanation="""
    ZeRO-2 shards the optimizer state and the gradients but keeps a full replica of the
    parameters, since forward and backward need them all: 4P + (4P + 8P)/4 = 7P per rank,
    against DDP's 16P. The measurement counts the bytes of the tensors each rank really
    holds after a step of the toy model (P = 49,152): 196,608 bytes of parameters, 49,152
    of gradient shard and 98,304 of Adam's moments (plus a 4-byte step counter). 10P is ZeRO-1
    (full gradients), 4P is ZeRO-3, which shards the parameters too.
    """,
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "zero_3_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it**, with your `ZeroOptimizer` against DDP + Adam: the bytes of every tensor of
# parameters, gradients and optimizer state each rank holds after two steps, on 4 ranks, in
# units of P; and the formulas.

# %% nbgrader={"grade": false, "grade_id": "zero_3_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
zero_report.report_memory(ZeroOptimizer, world_size=4)

# %% [markdown] nbgrader={"grade": false, "grade_id": "memory_figure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# The same measurement for world sizes 2 to 4, as points on the formulas' lines: ZeRO's saving
# grows with N, but never below the replicated parameters (4P) for stages 1 and 2.

# %% nbgrader={"grade": false, "grade_id": "memory_figure", "locked": true, "schema_version": 3, "solution": false, "task": false}
zero_report.memory_figure(ZeroOptimizer, world_sizes=(2, 3, 4))

# %% [markdown] nbgrader={"grade": false, "grade_id": "zero_4_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Question zero_4: the same weights as DDP?
#
# *Difficulty 3/3*
#
# You train the same model from the same weights on the same data for 20 steps, once with DDP
# + Adam and once with your ZeRO-2 optimizer built on your ring halves. How do the final
# parameters compare?
#
# * a) Bit for bit identical on any number of ranks: the same arithmetic, only sharded.
# * b) They differ by about 1e-2 on any number of ranks, because each rank's Adam sees only a
#   shard of the gradient.
# * c) They diverge: Adam's moments must see the whole gradient.
# * d) Bit for bit identical on 2 ranks; on 3 or more they differ in the last bits (about 1e-6
#   of the largest parameter), because the ring adds the ranks' gradients in another order than
#   gloo's all-reduce.

# %% nbgrader={"grade": false, "grade_id": "zero_4_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
answer_zero_4 = ""  # your answer: one letter, "a" to "d"
### BEGIN SOLUTION
answer_zero_4 = "d"
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "zero_4_check", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
check_answer("answer_zero_4", answer_zero_4, choices="abcd")
### BEGIN HIDDEN TESTS
check_answer(
    "answer_zero_4",
    answer_zero_4,
    choices="abcd",
    key="d",
    explanation="""
    Adam works element by element, so updating a shard with its shard of the averaged
    gradient is exactly what a full Adam does to those elements. What differs is the sum: float
    addition is not associative, and the ring adds the ranks' contributions to each chunk in
    an order that depends on the chunk, while gloo sums in its own order. With 2 ranks there
    is one addition, a + b = b + a, and the measurement finds the parameters bit for bit
    identical; on 3 and 4 ranks they differ by a few 1e-6 of the largest parameter: rounding
    in the last bits, which 20 steps of training grow only a little.
    """,
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "zero_4_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it**, with your optimizer, on 2, 3 and 4 ranks.

# %% nbgrader={"grade": false, "grade_id": "zero_4_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
zero_report.report_equivalence(ZeroOptimizer, world_sizes=(2, 3, 4))

# %% [markdown] nbgrader={"grade": false, "grade_id": "zero_5_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Question zero_5: PyTorch's own ZeroRedundancyOptimizer
#
# *Difficulty 2/3*
#
# PyTorch ships ZeRO-1 as `torch.distributed.optim.ZeroRedundancyOptimizer`. You wrap one
# `nn.Linear(1000, 10)` (a weight of 10,000 elements and a bias of 10) with Adam on 2 ranks.
# How is Adam's state split between the ranks?
#
# * a) Very unevenly: it assigns whole parameters to ranks, so one rank holds the weight's
#   state and the other only the bias's.
# * b) Evenly, 5,005 elements' worth each, like your shards.
# * c) Not at all: every rank holds all of it until the first checkpoint.
# * d) Rank 0 holds all of it and sends updates to the others.

# %% nbgrader={"grade": false, "grade_id": "zero_5_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
answer_zero_5 = ""  # your answer: one letter, "a" to "d"
### BEGIN SOLUTION
answer_zero_5 = "a"
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "zero_5_check", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_answer("answer_zero_5", answer_zero_5, choices="abcd")
### BEGIN HIDDEN TESTS
check_answer(
    "answer_zero_5",
    answer_zero_5,
    choices="abcd",
    key="a",
    explanation="""
    ZeroRedundancyOptimizer partitions the parameter list, not the elements: it hands whole
    parameters to ranks, largest first, each to the rank with the least so far. Here rank 0
    gets the weight and holds 80,004 bytes of Adam state (two moments of 10,000 floats and a
    step counter), rank 1 gets the bias and holds 84. A model of many similar layers evens
    out; one large embedding does not. Your ZeroOptimizer shards the flattened parameters by
    element, so its shards differ by at most one element.
    """,
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "zero_5_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it.** The bytes of Adam state each rank holds after one step.

# %% nbgrader={"grade": false, "grade_id": "zero_5_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
zero_report.report_torch_zero()

# %% [markdown] nbgrader={"grade": false, "grade_id": "zero_6_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Question zero_6: fp16 compression
#
# *Difficulty 2/3*
#
# Compression trades the bytes a ring sends for accuracy. DDP's `fp16_compress_hook` casts
# every gradient bucket to float16 before the all-reduce (half the bytes) and back afterwards.
# On 2 ranks, every rank's gradient holds the elements 70000, 1e-8, 1e-6 and 1.0. What does
# `.grad` hold after backward with the hook?
#
# * a) 70000, 1e-8, 1e-6, 1.0: float16 only loses digits far after the decimal point.
# * b) 65504, 6e-8, 1e-6, 1.0: float16 saturates at its largest and smallest values.
# * c) inf, 0, about 9.5e-7, 1.0: 70000 overflows float16, 1e-8 underflows to 0 and 1e-6
#   keeps only a few bits.
# * d) nan in every element, since one element overflowed.

# %% nbgrader={"grade": false, "grade_id": "zero_6_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
answer_zero_6 = ""  # your answer: one letter, "a" to "d"
### BEGIN SOLUTION
answer_zero_6 = "c"
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "zero_6_check", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_answer("answer_zero_6", answer_zero_6, choices="abcd")
### BEGIN HIDDEN TESTS
check_answer(
    "answer_zero_6",
    answer_zero_6,
    choices="abcd",
    key="c",
    explanation="""
    float16's largest finite value is 65504, and a cast rounds anything larger to inf, it
    does not saturate; inf survives the division by world_size and the sum, so .grad holds
    inf and the next optimizer step poisons the weights. Its smallest subnormal is about
    6e-8: 1e-8 rounds to 0, and 1e-6 is a subnormal with few bits left (9.54e-7). The hook
    does not touch other elements of the bucket: 1.0 comes back exact. This is why mixed
    precision training scales the loss, and why the hook suits gradients of moderate range.
    """,
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "zero_6_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it**: the gradient of `w . x` is `x`, so feeding these values as `x` on both ranks
# makes them the gradient, without and with the hook.

# %% nbgrader={"grade": false, "grade_id": "zero_6_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
zero_report.report_fp16([7e4, 1e-8, 1e-6, 1.0])

# %% [markdown] nbgrader={"grade": false, "grade_id": "exercise_3_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Exercise 3 (optional): error feedback
#
# Plain fp16 compression loses every gradient element below float16's smallest subnormal,
# about 6e-8, at every step: if the gradients stay that small, the weights never move.
# **Error feedback** (Seide et al. 2014; Karimireddy et al. 2019) keeps what compression
# dropped and adds it to the next step's gradient before compressing: small gradients
# accumulate until they are large enough to send.
#
# Write `ef_fp16_hook(state, bucket)`, a DDP comm hook: `state` is a dict (empty at first) where
# you keep each bucket's residual under `bucket.index()`. Add the residual to
# `bucket.buffer()`, cast to float16, keep the new residual (the corrected gradient minus the
# float16 value cast back), all-reduce the float16 tensor with `async_op=True`, and return a
# future whose value is the **average** over ranks, as float32 (write it into the buffer and
# return the buffer). Graded (3 points) on 2 ranks: 200 SGD steps with gradients of about
# 1e-8 must end within 5% of fp32 training, where `fp16_compress_hook` does not move at all.

# %% nbgrader={"grade": false, "grade_id": "ef_fp16_hook", "locked": false, "schema_version": 3, "solution": true, "task": false}
def ef_fp16_hook(state: dict, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """fp16 compression with error feedback: the residual joins the next step's gradient."""
    ### BEGIN SOLUTION
    buffer = bucket.buffer()
    corrected = buffer + state.get(bucket.index(), 0)
    compressed = corrected.to(torch.float16)
    state[bucket.index()] = corrected - compressed.to(buffer.dtype)
    future = dist.all_reduce(compressed, async_op=True).get_future()

    def average(fut: torch.futures.Future) -> torch.Tensor:
        buffer.copy_(fut.value()[0].to(buffer.dtype).div_(dist.get_world_size()))
        return buffer

    return future.then(average)
    ### END SOLUTION


# %% [markdown] nbgrader={"grade": false, "grade_id": "try_ef_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Try it**: the first weights after 200 steps, without compression, with plain fp16 and with
# your hook.

# %% nbgrader={"grade": false, "grade_id": "try_ef", "locked": true, "schema_version": 3, "solution": false, "task": false}
zero_report.report_ef_training(ef_fp16_hook)

# %% nbgrader={"grade": true, "grade_id": "ef_fp16_hook_trains", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
# Within 5% of fp32 training where plain fp16 compression loses every gradient.
### BEGIN HIDDEN TESTS
print(check_error_feedback_hook(ef_fp16_hook))
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "zero_7_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Question zero_7: PowerSGD's rank, and its first steps
#
# *Difficulty 3/3*
#
# `powerSGD_hook` replaces each n x m gradient matrix by two thin factors, P (n x r) and
# Q (m x r), where r is `matrix_approximation_rank`, and all-reduces those. You register it
# with r = 4 and `start_powerSGD_iter=2` on a model with one 256 x 256 layer (a 256 KiB
# gradient). How many bytes does each rank all-reduce in steps 1, 2 and 3?
#
# * a) 8 KiB in every step, from the first.
# * b) 128 KiB in every step: PowerSGD is half precision.
# * c) 64 KiB in every step: rank 4 keeps a quarter of the gradient.
# * d) 256 KiB in steps 1 and 2 (a plain all-reduce), then 8 KiB.

# %% nbgrader={"grade": false, "grade_id": "zero_7_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
answer_zero_7 = ""  # your answer: one letter, "a" to "d"
### BEGIN SOLUTION
answer_zero_7 = "d"
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "zero_7_check", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
check_answer("answer_zero_7", answer_zero_7, choices="abcd")
### BEGIN HIDDEN TESTS
check_answer(
    "answer_zero_7",
    answer_zero_7,
    choices="abcd",
    key="d",
    explanation="""
    For its first start_powerSGD_iter steps the hook runs a plain all-reduce of the whole
    gradient (262,144 bytes here), so that training gets through its noisy start
    uncompressed. From then on it sends P and Q: (256 + 256) x 4 floats x 4 bytes = 8,192
    bytes, 32 times less. The bytes grow linearly with r, and the error of the compressed
    gradient falls with it: the measurement shows a large error at r = 1 and 4 for a gradient
    of rank 16 (batches of 8 on 2 ranks), and none at r = 16. Error feedback, on by default,
    carries what compression dropped into the next step.
    """,
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "zero_7_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it**: bytes passed to `dist.all_reduce` per step, and the relative error of the
# gradient against the exact average, for r = 1, 4 and 16 (batches of 8 on 2 ranks, so the
# averaged gradient has rank at most 16; error feedback off, to see one step's error).

# %% nbgrader={"grade": false, "grade_id": "zero_7_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
zero_report.report_powersgd(ranks=(1, 4, 16), start_iter=2)

# %% [markdown] nbgrader={"grade": false, "grade_id": "closing", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Where this goes
#
# You have built ZeRO-2 from the two halves of your ring, and measured the trade: the same
# traffic as DDP for a fraction of the memory, ZeRO-3 saving the parameters too for half as
# much traffic again, and the ranks' sums rounding differently. PyTorch's FSDP
# (`torch.distributed.fsdp.fully_shard`) is ZeRO-3 with the gathers overlapped with compute,
# bucket by bucket, the way the buckets assignment overlapped all-reduces with backward.
