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
# ## Question zero_1: what does gloo's reduce-scatter send?
#
# *Difficulty 2/3*
#
# Eight gloo ranks (PyTorch 2.13, CPU) each hold an 800 MB gradient and call
# `dist.reduce_scatter_tensor(shard, gradient)`, which leaves each rank with the sum of its own
# 100 MB shard, and nothing else. How much does each rank send?
#
# * a) 1/8 of the tensor: its own shard's worth, sent once to the shard's owner.
# * b) 7/8 of the tensor: one pass round a ring, half of what an all-reduce sends.
# * c) 7/4 of the tensor: as much as gloo's all-reduce of the same tensor sends.
# * d) 7 times the tensor: all of it, once to each of the 7 other ranks.

# %% nbgrader={"grade": false, "grade_id": "zero_1_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
answer_zero_1 = ""  # your answer: one letter, "a" to "d"
### BEGIN SOLUTION
answer_zero_1 = "c"
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "zero_1_check", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_answer("answer_zero_1", answer_zero_1, choices="abcd")
### BEGIN HIDDEN TESTS
check_answer(
    "answer_zero_1",
    answer_zero_1,
    choices="abcd",
    key="c",
    explanation="""
    A ring reduce-scatter, like the one you write below, is the ring's first N-1 steps: (N-1)/N
    of the tensor, 7/8 on 8 ranks (b). But gloo has no reduce-scatter algorithm of its own in
    PyTorch 2.13: its reduce_scatter_tensor sends exactly what its all-reduce sends, 2(N-1)/N
    of the tensor, 7/4 here (1400 MB of the 800 MB). The measurement reads it from the kernel's TCP
    counters: 1.00, 1.33 and 1.50 of the tensor on 2, 3 and 4 ranks, the all-reduce's own
    figures, while gloo's all-gather sends (N-1)/N as a ring half should. a) A shard's worth
    would need a rank to reduce its shard from nothing but its own data; d) the naive
    exchange is not what gloo does either. So sharding built on gloo's own reduce-scatter pays
    for a whole all-reduce where a ring half would do; NCCL's reduce-scatter is a ring half
    (on GPUs; not measured here).
    """,
    giveaways=(
        r"as much as (gloo's |its |a whole |an )?all-reduce",
        r"no reduce-scatter algorithm",
    ),
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "zero_1_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it.** gloo's own collectives on 2, 3 and 4 real ranks, on a 4 MiB tensor, each rank's
# bytes read from the kernel's TCP counters (`course.experiments.ring.collective_traffic`:
# nothing in gloo is wrapped), in units of the tensor's size. What law does the reduce-scatter
# follow, and what does it give on 8 ranks?

# %% nbgrader={"grade": false, "grade_id": "zero_1_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
from course.experiments.ring import collective_traffic

numel = 2**20  # 4 MiB of float32
for name in ("reduce_scatter_tensor", "all_gather_into_tensor", "all_reduce"):
    shares = []
    for n in (2, 3, 4):
        shares.append(max(r["sent"] for r in run(collective_traffic, n, name, numel)) / (numel * 4))
    print(f"{name:23} sends " + ", ".join(f"{x:.2f}" for x in shares) + " of the tensor on 2, 3, 4 ranks")

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
# A model of size S (in bytes) trains on **8** ranks. Per step, DDP all-reduces the gradient.
# ZeRO-1 and ZeRO-2 reduce-scatter the gradient, update each rank's shard, and all-gather the
# updated parameters. ZeRO-3 (FSDP) keeps only a shard of the parameters too: it all-gathers
# them before forward, again before backward, and reduce-scatters the gradient. Built from ring
# halves like yours, how much does each rank send per step?
#
# * a) DDP 1.75 S; ZeRO-1/2 0.875 S, only shards; ZeRO-3 0.875 S.
# * b) DDP 1.75 S; ZeRO-1/2 3.5 S, two collectives; ZeRO-3 5.25 S.
# * c) DDP 1.75 S; ZeRO-1/2 1.75 S, the same; ZeRO-3 2.625 S.
# * d) DDP 3.5 S, to send and to receive; ZeRO-1/2 1.75 S; ZeRO-3 1.75 S.

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
    the tensor: 2(N-1)/N = 1.75 S on 8 ranks. ZeRO-1/2 run the same two halves, with the
    optimizer step in between (the all-gather carries updated parameters instead of summed
    gradients): 1.75 S again, so the memory saving costs no extra traffic (a counts one half
    only, b doubles it). ZeRO-3 gathers the parameters twice (forward, then backward, because
    it frees them in between) plus one reduce-scatter: 3(N-1)/N = 2.625 S, 1.5 times DDP. The
    measurement finds each of your halves at (N-1)/N, a ZeRO-1/2 step at DDP's 2(N-1)/N, and
    torch's fully_shard calling two all-gathers and one reduce-scatter per layer, 0.75 S in
    forward and 2.26 S in backward on 4 ranks: one gather pass each way, plus gloo's
    reduce-scatter at an all-reduce's price (question zero_1). With ring halves ZeRO-3 is 2.25
    S on 4 ranks; on gloo it is 3.0 S. d) counts a rank's receives as sends. torch's
    ZeroRedundancyOptimizer is not ZeRO as published either: it keeps DDP's all-reduce and
    then broadcasts each rank's updated parameters, 2.25 S per step on 4 ranks, measured on
    the wire, against DDP's 1.5 S.
    """,
    giveaways=(
        r"2\.625",
        r"3 ?\(N ?- ?1\) ?/ ?N",
        r"costs no extra traffic",
        r"1\.5 times DDP",
    ),
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "zero_2_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it**, with your own halves: one training step of a 4-layer model on 2, 3 and 4 real
# ranks, in units of the model's size. DDP's step and torch's `fully_shard` step (ZeRO-3, each
# layer a unit) are measured on the wire; your `reduce_scatter`, your `all_gather` and a
# ZeRO-1/2 step built from them are recorded message by message. What would a ZeRO-3 step
# built from your halves send, and how does each scheme grow with N?

# %% nbgrader={"grade": false, "grade_id": "zero_2_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
zero_report.report_traffic(reduce_scatter, all_gather, world_sizes=(2, 3, 4))

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
zero_report.report_matches(ZeroOptimizer, world_size=2)

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
# for Adam's two moments) on **8** ranks. Counting only parameters, gradients and optimizer
# state, how many bytes does each rank hold under ZeRO-2?
#
# * a) 5.5P: all the parameters, an eighth of the gradients and of Adam's state.
# * b) 2P: everything is sharded, the 16P of DDP divided by the 8 ranks.
# * c) 9P: all the parameters and gradients, an eighth of Adam's state.
# * d) 16P, as DDP: sharding saves communication, never memory.

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
    parameters, since forward and backward need them all: 4P + (4P + 8P)/8 = 5.5P per rank,
    against DDP's 16P. The measurement counts the bytes of the tensors each rank really holds
    after a step of the toy model on 4 ranks (P = 49,152): 4P of parameters, 1P of gradient
    shard and 2P of Adam's moments (plus a 4-byte step counter), 7P = 4P + 12P/4; the figure
    shows the same law on 2 and 3 ranks. c) 9P is ZeRO-1 (full gradients), b) 2P is ZeRO-3,
    which shards the parameters too, and d) the measurement finds DDP at 16P and ZeRO-2 well
    below.
    """,
    giveaways=(
        r"5\.5 ?P",
        r"4 ?P ?\+ ?\(?4 ?P ?\+ ?8 ?P\)? ?/ ?8",
        r"4 ?P ?\+ ?12 ?P ?/ ?[N4]",
        r"4 ?Psi ?\+ ?12 ?Psi",
    ),
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "zero_3_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it**, with your `ZeroOptimizer` against DDP + Adam: the bytes of every tensor of
# parameters, gradients and optimizer state each rank holds after two steps, on 4 ranks, in
# units of P.

# %% nbgrader={"grade": false, "grade_id": "zero_3_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
zero_report.report_memory(ZeroOptimizer, world_size=4)

# %% [markdown] nbgrader={"grade": false, "grade_id": "zero_3_measure_figure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# The same measurement for world sizes 2 to 4, against DDP and torch's ZeRO-1
# (`ZeroRedundancyOptimizer`), as points on the formulas' lines. What would 8 ranks give?

# %% nbgrader={"grade": false, "grade_id": "zero_3_measure_figure", "locked": true, "schema_version": 3, "solution": false, "task": false}
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
# * a) Bit for bit identical on any number of ranks: the same sums, only sharded.
# * b) 1e-2 apart on any number of ranks: each rank's Adam sees only its shard.
# * c) Far apart: Adam's moments need the whole gradient, so training diverges.
# * d) Identical on 2 ranks; from 3 ranks on, apart in the last bits of each sum.

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
    gradient is exactly what a full Adam does to those elements (not b or c). What differs is
    the sum. Float addition is not associative: the ring adds the ranks' contributions to each
    chunk in an order that depends on the chunk, while gloo sums in its own order (its ring
    runs the other way round). And DDP scales each gradient by 1/N before its sum (question
    ddp_1) where your optimizer divides after it. With 2 ranks there is one addition, a + b =
    b + a, and halving is exact: the measurement finds the parameters bit for bit identical
    (so a holds there only). On 3 ranks they differ by about 2.3e-6 of the largest parameter;
    scaling by 1/3 before the reduce-scatter, as DDP does, cuts that to 6.6e-7, the rest
    being the order of the sums; on 4 ranks, where 1/4 is exact, both give 2.5e-6. Rounding
    in the last bits, which 20 steps of training grow only a little.
    """,
    giveaways=(
        r"halving is exact",
        r"last bits",
        r"a ?\+ ?b ?= ?b ?\+ ?a",
        r"power of two both are exact",
    ),
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
# * a) Unevenly: it gives out whole parameters, so one rank holds the weight's state.
# * b) Evenly: 5,005 elements' worth on each rank, like your optimizer's flat shards.
# * c) Evenly, tensor by tensor: each rank holds half of the weight's and the bias's.
# * d) On rank 0 only: it updates everything there and broadcasts the result to rank 1.

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
    ZeroRedundancyOptimizer partitions the parameter list, not the elements (not b or c): it
    hands whole parameters to ranks, largest first, each to the rank with the least so far,
    and every rank updates its own (not d). The measurement shows the rule on other models:
    two layers of 10,000 + 10 and 10,000 + 1,000 elements on 2 ranks split 11,000 against
    10,010, four layers of 100 x 100 on 3 ranks put two weights on one rank. For one
    nn.Linear(1000, 10), rank 0 gets the weight and holds 80,004 bytes of Adam state (two
    moments of 10,000 floats and a step counter), rank 1 gets the bias and holds 84. A model
    of many similar layers evens out; one large embedding does not. Your ZeroOptimizer shards
    the flattened parameters by element, so its shards differ by at most one element.
    """,
    giveaways=(
        r"whole parameters",
        r"largest first",
        r"80,?004 bytes",
    ),
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "zero_5_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it.** Which parameters' Adam state each rank holds after one step, for two other
# models: `Linear(1000, 10)` then `Linear(10, 1000)` on 2 ranks, and four `Linear(100, 100)` on 3.
# What rule assigns them, and what does it do with the question's single layer?

# %% nbgrader={"grade": false, "grade_id": "zero_5_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
zero_report.report_torch_zero([(2, [(1000, 10), (10, 1000)]), (3, [(100, 100)] * 4)])

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
# * a) 70000, 1e-8, 1e-6, 1.0: float16 only loses digits far after the point.
# * b) 65504, 6e-8, 1e-6, 1.0: float16 clamps to its largest and smallest values.
# * c) inf, 0, 9.5e-7, 1.0: 70000 overflows, 1e-8 underflows, 1e-6 loses bits.
# * d) nan in every element: one element's overflow spoils the whole bucket.

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
    float16's largest finite value is 65504, and a cast rounds to the nearest float16, it
    does not clamp (not b): the measurement finds 65519 rounded to 65504, and 65520, 70000 or
    100000 to inf. inf survives the division by world_size and the sum, so .grad holds inf and
    the next optimizer step poisons the weights. Its smallest subnormal is about 6e-8: 1e-8
    (like the measured 2e-8) rounds to 0, and 1e-6 is a subnormal with few bits left
    (9.54e-7; the measured 2e-6 came back as 2.03e-6), so a) is wrong at both ends. The hook
    does not touch other elements of the bucket: 1.0 comes back exact, not nan (d). This is
    why mixed precision training scales the loss, and why the hook suits gradients of
    moderate range.
    """,
    giveaways=(
        r"inf, 0",
        r"9\.5\d*e-0?7",
        r"65520[^.]{0,30}inf",
        r"rounds? to (the )?nearest",
        r"below float16's smallest subnormal",
    ),
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "zero_6_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it**: the gradient of `w . x` is `x`, so feeding values as `x` on both ranks makes
# them the gradient, without and with the hook. Other values than the question's: large ones
# near float16's largest, and small ones. What would the question's four become?

# %% nbgrader={"grade": false, "grade_id": "zero_6_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
zero_report.report_fp16([1e5, 2e-8, 2e-6, 3.0, 65504.0, 65519.0, 65520.0])

# %% [markdown] nbgrader={"grade": false, "grade_id": "exercise_3_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Exercise 3 (optional): error feedback
#
# Plain fp16 compression loses the gradient elements too small for float16 (question zero_6
# measured which), at every step: if the gradients stay that small, the weights never move.
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
# * a) 8 KiB in every step, from the very first one on.
# * b) 128 KiB in every step: PowerSGD sends half precision.
# * c) 64 KiB in every step: rank 4 keeps a quarter of it.
# * d) 256 KiB in steps 1 and 2, then 8 KiB from step 3.

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
    uncompressed (not a). From then on it sends P and Q: (256 + 256) x 4 floats x 4 bytes =
    8,192 bytes, 32 times less, in float32 (not b), and r is the rank of the factors, not a
    fraction kept (not c). The measurement, with start_powerSGD_iter=3, shows three plain
    steps, then 2,048, 4,096 and 32,768 bytes for r = 1, 2 and 16: linear in r. The error of
    the compressed gradient falls with r: large at r = 1 and 2 for a gradient of rank 16
    (batches of 8 on 2 ranks), none at r = 16. Error feedback, on by default, carries what
    compression dropped into the next step.
    """,
    giveaways=(
        r"8,?192 bytes",
        r"\b8 KiB",
        r"\(256 ?\+ ?256\) ?x ?4",
        r"steps of plain all-reduce",
    ),
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "zero_7_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it**: bytes passed to `dist.all_reduce` per step, and the relative error of the
# gradient against the exact average, for r = 1, 2 and 16 with `start_powerSGD_iter=3`
# (batches of 8 on 2 ranks, so the averaged gradient has rank at most 16; error feedback off,
# to see one step's error). What would r = 4 with `start_powerSGD_iter=2` send?

# %% nbgrader={"grade": false, "grade_id": "zero_7_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
zero_report.report_powersgd(ranks=(1, 2, 16), start_iter=3)

# %% [markdown] nbgrader={"grade": false, "grade_id": "closing", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## What you measured
#
# * **gloo's own collectives** on the wire, and **your halves**, recorded: what each sends.
# * **One training step** of DDP, of ZeRO-1/2 built from your halves, and of torch's
#   `fully_shard` (ZeRO-3), on 2 to 4 ranks.
# * **Memory per rank** with your optimizer, DDP + Adam and torch's ZeRO-1, and whether your
#   optimizer trains to DDP's weights.
# * **torch's `ZeroRedundancyOptimizer`**, `fp16_compress_hook` and `powerSGD_hook`, each on
#   other settings than the questions'.
#
# The explanations of the questions come with your feedback. PyTorch's FSDP
# (`torch.distributed.fsdp.fully_shard`, measured above) is ZeRO-3 with the gathers of one
# layer overlapped with the compute of another, the way the buckets assignment overlapped
# all-reduces with backward.

