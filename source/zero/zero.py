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

from course.lessons.zero import (
    animate_half,
    check_all_gather,
    check_answer,
    check_error_feedback_hook,
    check_halves_pattern,
    check_reduce_scatter,
    check_zero_matches_ddp,
    check_zero_memory,
    chunk_bounds,
    half_widget,
    report,
)
from course.ranks import run

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
half_widget("reduce-scatter", world_size=4, numel=12, formulas=False, resizable=False)

# %% nbgrader={"grade": false, "grade_id": "watch_all_gather", "locked": true, "schema_version": 3, "solution": false, "task": false}
half_widget("all-gather", world_size=4, numel=12, formulas=False, resizable=False)

# %% [markdown] nbgrader={"grade": false, "grade_id": "zero_1_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Question zero_1: what must a reduce-scatter send?
#
# *Difficulty 2/3*
#
# A reduce-scatter leaves each rank with the sum, over all ranks, of its own shard of a
# tensor, and nothing else. On **8** ranks, each holding a 1 GB gradient, the shards are
# uneven: rank 0's shard is **40%** of the tensor, and the 7 other ranks' shards split the
# rest equally (3/35 each). Whatever the algorithm (without compression), some rank sends
# the most: at best, how much does that rank send, and which rank is it?
#
# * a) 0.60 GB, from rank 0: the rank whose shard is the largest.
# * b) 1.75 GB, from every rank: an all-reduce's, like gloo's own.
# * c) 0.88 GB, from every rank: what each rank of a ring sends.
# * d) 0.91 GB, from each other rank: those with the small shards.

# %% nbgrader={"grade": false, "grade_id": "zero_1_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
answer_zero_1 = ""  # your answer: one letter, "a" to "d"
### BEGIN SOLUTION
answer_zero_1 = "d"
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "zero_1_check", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_answer("answer_zero_1", answer_zero_1, choices="abcd")
### BEGIN HIDDEN TESTS
check_answer(
    "answer_zero_1",
    answer_zero_1,
    choices="abcd",
    key="d",
    explanation="""
    Every rank's tensor holds a part of every rank's shard, and no other rank has that
    part: the sum in shard c needs chunk c of each rank's tensor, and no other shard needs
    it (measured on 8 ranks with these shards: changing chunk c of rank 0's tensor changes
    rank c's shard and no other, for every c; and the same for rank 1's). So every chunk
    of a rank's tensor outside its own shard must leave that rank in some form, added to
    other ranks' parts on the way (as a ring does) or straight to its owner: 1 minus its
    own shard. Rank 0 keeps 40% and must send 0.60 GB, but each of the 7 others keeps only
    3/35 and must send 32/35 of 1 GB, 0.91 GB: the ranks with the smallest shards are the
    busiest. And that much is enough: a ring reduce-scatter cut at those shards, measured,
    sends 0.6 of the tensor from rank 0 and 32/35 from each other rank. a) is rank 0's
    bound, the least busy rank's: the rank with the largest shard has the least to give.
    c) is a ring's 7/8 on even shards, carried over; on these shards no rank sends 7/8.
    b) is what gloo's reduce_scatter_tensor sends (1.75 of the tensor on 8 ranks,
    measured: an all-reduce's bytes), more than it must; NCCL's reduce-scatter is a ring
    half (on GPUs; not measured here).
    """,
    giveaways=(
        r"0\.91 GB",
        r"32/35",
        r"smallest shards are the\s+busiest",
        r"those with the small shards",
    ),
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "zero_1_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it.** gloo's own collectives on 2, 3 and 4 real ranks, on a 4 MiB tensor, each rank's
# bytes read from the kernel's TCP counters (`course.ring.traffic.collective_traffic`:
# nothing in gloo is wrapped), in units of the tensor's size. Then what each shard depends on:
# on 4 ranks, each chunk of rank 0's tensor is changed in turn (nothing else, on no rank), and
# every rank says whether its shard of gloo's `reduce_scatter_tensor` changed.
# `zero_report.report_shards(world_size, numel, reduce_scatter)` also takes your own
# `reduce_scatter` once you have written it (Exercise 1), and
# `course.lessons.zero.traffic.shard_dependence(reduce_scatter, numel, source, bounds)`
# changes the chunks `bounds` gives, for a `reduce_scatter` that cuts the tensor elsewhere.

# %% nbgrader={"grade": false, "grade_id": "zero_1_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
from course.lessons.zero import collective_traffic

numel = 2**20  # 4 MiB of float32
for name in ("reduce_scatter_tensor", "all_reduce"):
    shares = []
    for n in (2, 3, 4):
        shares.append(max(r["sent"] for r in run(collective_traffic, n, name, numel)) / (numel * 4))
    listed = ", ".join(f"{x:.2f}" for x in shares)
    print(f"{name:21} sends {listed} of the tensor on 2, 3, 4 ranks")
report.report_shards(world_size=4)

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

# %% tags=["raises-exception"] nbgrader={"grade": false, "grade_id": "try_halves", "locked": true, "schema_version": 3, "solution": false, "task": false}
# %%ranks 3 --timeout 20
from course.lessons.zero import say_if_unimplemented

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
animate_half(reduce_scatter, "reduce-scatter", world_size=4)

# %% nbgrader={"grade": false, "grade_id": "watch_your_all_gather", "locked": true, "schema_version": 3, "solution": false, "task": false}
animate_half(all_gather, "all-gather", world_size=4)

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
# ## Question zero_2: what does sharding the parameters cost in traffic?
#
# *Difficulty 2/3*
#
# A model of 1 GB (fp32 parameters) trains on **64** ranks with ZeRO-3: besides its shards of
# the gradient and of the optimizer state, each rank keeps only its shard of the parameters,
# and frees a layer's gathered parameters as soon as the layer has used them. Built from
# ring halves like yours, how many bytes does each rank send per training step?
#
# * a) 0.98 GB: only the gathering of the parameters before each forward.
# * b) 2.95 GB: parameters gathered twice, the gradient scattered once.
# * c) 1.97 GB: as much as DDP, the same two halves in another order.
# * d) 3.94 GB: a gather each way plus an all-reduce of the gradient.

# %% nbgrader={"grade": false, "grade_id": "zero_2_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
answer_zero_2 = ""  # your answer: one letter, "a" to "d"
### BEGIN SOLUTION
answer_zero_2 = "b"
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "zero_2_check", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_answer("answer_zero_2", answer_zero_2, choices="abcd")
### BEGIN HIDDEN TESTS
check_answer(
    "answer_zero_2",
    answer_zero_2,
    choices="abcd",
    key="b",
    explanation="""
    Each ring half sends (N-1)/N of the tensor per rank (0.875 of the model on 8 ranks,
    measured with the model solution's halves; your cell measures 2 to 4 ranks), so 63/64
    of 1 GB = 0.98 GB on 64. A ZeRO-3 rank frees each layer's parameters after its
    forward, and backward needs them again (the gradient of a layer's input is computed
    with its weights): it gathers them a second time, then
    reduce-scatters the gradient. Three halves: 3 x 0.98 = 2.95 GB, 1.5 times DDP's 1.97 GB
    (c, which is ZeRO-1/2's traffic: they keep the parameters whole, so they gather once,
    after the update). a) forgets the backward gather and the gradient's reduce-scatter.
    d) prices the reduce-scatter as an all-reduce: that is what torch's fully_shard pays on
    gloo, whose reduce_scatter_tensor sends what its all_reduce sends (its whole step
    measures 3.5 model sizes on 8 ranks, in the same run: 0.875 + 0.875 + 1.75), not a
    ring half.
    Re-gathering is the price of holding 1/N of the parameters between uses: the memory
    saving costs half a DDP step of traffic more.
    """,
    giveaways=(
        r"2\.95 GB",
        r"3 x 0\.98",
        r"gathers? them a second time",
        r"three (ring )?halves",
    ),
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "zero_2_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it**, with your own halves: one training step of a 4-layer model on 2, 3 and 4 real
# ranks, in units of the model's size. DDP's step and torch's `fully_shard` step (ZeRO-3, each
# layer a unit) are measured on the wire; your `reduce_scatter`, your `all_gather` and a
# ZeRO-1/2 step built from them are recorded message by message. `calls=True` also lists the
# collectives `fully_shard` called.

# %% nbgrader={"grade": false, "grade_id": "zero_2_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
report.report_traffic(reduce_scatter, all_gather, world_sizes=(2, 3, 4), calls=False)

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

# %% tags=["raises-exception"] nbgrader={"grade": false, "grade_id": "try_zero", "locked": true, "schema_version": 3, "solution": false, "task": false}
report.report_matches(ZeroOptimizer, world_size=2)

# %% nbgrader={"grade": true, "grade_id": "zero_optimizer_matches_ddp", "locked": true, "points": 5, "schema_version": 3, "solution": false, "task": false}
# Trains like DDP + Adam: 5 steps, world sizes 2 and 3, parameters within 1e-4.
print(check_zero_matches_ddp(ZeroOptimizer, world_sizes=(3,)))
### BEGIN HIDDEN TESTS
print(check_zero_matches_ddp(ZeroOptimizer))
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "zero_optimizer_memory", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
# Holds 1/N: Adam's state and the gradient, measured on 4 ranks after step().
### BEGIN HIDDEN TESTS
print(check_zero_memory(ZeroOptimizer, world_size=4))
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "zero_3_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Question zero_3: memory per rank, with the reduce-scatter inside backward
#
# *Difficulty 2/3*
#
# Your `ZeroOptimizer` reduce-scatters the gradient in `step()`, once backward is over.
# DeepSpeed's ZeRO-2 does it during backward. Take that variant of your optimizer: its
# `__init__` allocates a buffer for this rank's shards of the gradient (1/N of the
# parameters) and registers a hook on every parameter (`p.register_post_accumulate_grad_hook`).
# As soon as backward has accumulated a parameter's gradient, the hook reduce-scatters it
# with your `reduce_scatter`, writes this rank's shard, averaged, into the buffer, and sets
# `p.grad = None`; `step()` updates the shards with Adam and all-gathers each parameter. It
# trains the course's toy model (12 equal bias-free layers, P parameters) in fp32 on **8**
# ranks. Counting parameters, gradients and Adam's state (4, 4 and 8 bytes per parameter
# unsharded), what is the most a rank holds at any moment of the second step's backward, and
# what does it hold after `step()`?
#
# * a) 9.00P at most during backward, then 5.50P after `step()`.
# * b) 5.50P at most during backward, then 5.50P after `step()`.
# * c) 2.33P at most during backward, then 2.00P after `step()`.
# * d) 5.83P at most during backward, then 5.50P after `step()`.

# %% nbgrader={"grade": false, "grade_id": "zero_3_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
answer_zero_3 = ""  # your answer: one letter, "a" to "d"
### BEGIN SOLUTION
answer_zero_3 = "d"
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "zero_3_check", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_answer("answer_zero_3", answer_zero_3, choices="abcd")
### BEGIN HIDDEN TESTS
check_answer(
    "answer_zero_3",
    answer_zero_3,
    choices="abcd",
    key="d",
    explanation="""
    A hook runs as soon as its parameter's gradient has been accumulated, and the
    reduce-scatter needs that gradient whole on every rank: at that moment a rank holds one
    layer's whole gradient, 4P/12 = 0.33P, on top of what it keeps anyway: all the
    parameters (4P: ZeRO-2 keeps them whole, the next forward needs them all), its eighth of
    Adam's state (8P/8 = 1P) and its shards of the gradient (4P/8 = 0.5P), besides the
    ring's scratch of a chunk. That is 5.83P, at every hook, since each frees its layer's
    gradient before backward produces the next; so the 12 layers' whole gradients never
    coexist. After step() the shards stay: 5.5P. a) is what your ZeroOptimizer holds (9P
    before step(), measured): it reduce-scatters only once backward has produced the whole
    gradient, so its peak is ZeRO-1's. b) forgets that a layer's gradient exists whole
    before its reduce-scatter can start. c) shards the parameters too: that is ZeRO-3.
    Measured with the model solution's halves on 8 ranks, counting at every parameter's hook
    during the second backward: 5.83P at most, 5.50P after step(), and 9.00P for your
    optimizer's design; both train to DDP's weights. DeepSpeed copies gradients into
    buckets of a set size (reduce_bucket_size) rather than a layer each: the peak holds a
    bucket instead of a layer.
    """,
    giveaways=(
        r"5\.83 ?P",
        r"one\s+layer's whole gradient",
        r"whole gradients never coexist",
    ),
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "zero_3_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it**, with your `ZeroOptimizer` against DDP + Adam: the bytes of every tensor of
# parameters, gradients and optimizer state each rank holds in the second step, on 4 ranks, in
# units of P, once backward has run (before `step()`) and after `step()`. `when` also takes
# `"during backward"`: the most a rank holds at any moment backward has just accumulated a
# parameter's gradient, counted by a hook that
# `course.lessons.zero.experiment.memory_during_backward(kind, zero_class)` registers on every
# parameter before it builds the optimizer (so it runs before any hook the optimizer adds).

# %% nbgrader={"grade": false, "grade_id": "zero_3_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
report.report_memory(ZeroOptimizer, world_size=4, when=("after backward", "after step"))

# %% [markdown] nbgrader={"grade": false, "grade_id": "zero_3_measure_figure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# The same measurement after `step()`, for world sizes 2 to 4, against DDP and torch's ZeRO-1
# (`ZeroRedundancyOptimizer`), as points on the formulas' lines.

# %% nbgrader={"grade": false, "grade_id": "zero_3_measure_figure", "locked": true, "schema_version": 3, "solution": false, "task": false}
report.memory_figure(ZeroOptimizer, world_sizes=(2, 3, 4))

# %% [markdown] nbgrader={"grade": false, "grade_id": "zero_4_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Question zero_4: the same weights as DDP?
#
# *Difficulty 3/3*
#
# You train the same model from the same weights on the same data for 20 steps, once with DDP
# + Adam and once with your ZeRO-2 optimizer built on your ring halves (it divides the summed
# shard by N, as Exercise 2 asks). How do the final parameters compare, on **2** ranks and on
# **4** ranks?
#
# * a) Bit for bit identical on 2 ranks; bit for bit identical on 4 ranks.
# * b) Apart by rounding on 2 ranks; apart by rounding on 4 ranks.
# * c) Bit for bit identical on 2 ranks; apart by rounding on 4 ranks.
# * d) Apart by rounding on 2 ranks; bit for bit identical on 4 ranks.

# %% nbgrader={"grade": false, "grade_id": "zero_4_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
answer_zero_4 = ""  # your answer: one letter, "a" to "d"
### BEGIN SOLUTION
answer_zero_4 = "c"
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "zero_4_check", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
check_answer("answer_zero_4", answer_zero_4, choices="abcd")
### BEGIN HIDDEN TESTS
check_answer(
    "answer_zero_4",
    answer_zero_4,
    choices="abcd",
    key="c",
    explanation="""
    Adam works element by element, so updating a shard with its shard of the averaged
    gradient is exactly what a full Adam does to those elements: only the averaged
    gradients can differ, and nothing diverges. Float addition is commutative but not
    associative. With 2 ranks each element's sum is one addition, a + b = b + a whichever
    rank makes it, and halving is exact, before the sum (DDP scales each gradient by 1/N,
    question ddp_1) or after it (your optimizer): the parameters come out bit for bit
    identical, measured (so b and d fail). With more ranks the ring adds the contributions
    to each chunk in an order that depends on the chunk, while gloo's all-reduce adds them
    in its own, and another order rounds differently. On 3 ranks the parameters differ by
    about 2e-6 of the largest one against DDP, and still by less than half that against a
    DDP that divides after its sum, as your optimizer does: the order alone. On 4 ranks 1/4
    is exact, so dividing before or after the sum gives exactly the same gap (a few
    millionths against either DDP, measured), but the order stays (so a fails: a power of two makes the division
    exact, not the sums). d) has the two cases the wrong way round. The difference is
    rounding in the last bits, which 20 steps of training grow to a few millionths.
    """,
    giveaways=(
        r"halving is exact",
        r"last bits",
        r"a ?\+ ?b ?= ?b ?\+ ?a",
        r"identical on 2 ranks; apart by rounding on 4",
    ),
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "zero_4_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it**, with your optimizer, on 3 ranks: against DDP + Adam as it is (each gradient
# scaled by 1/N before the sum), and against DDP + Adam with a comm hook that divides after the
# sum, as your optimizer does (`course.lessons.zero.experiment.sum_then_divide`). Give `world_sizes`
# other world sizes to measure them.

# %% nbgrader={"grade": false, "grade_id": "zero_4_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
report.report_equivalence(ZeroOptimizer, world_sizes=(3,))

# %% [markdown] nbgrader={"grade": false, "grade_id": "zero_5_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Question zero_5: PyTorch's own ZeroRedundancyOptimizer
#
# *Difficulty 2/3*
#
# PyTorch ships ZeRO-1 as `torch.distributed.optim.ZeroRedundancyOptimizer`. A model's
# parameters are one embedding matrix of 50M elements and 24 weight matrices of 1M each (74M
# in all). It trains with fp32 Adam (8 bytes of state per parameter) wrapped in
# `ZeroRedundancyOptimizer` on **8** ranks. How much Adam state does the busiest rank hold?
#
# * a) 400 MB: the embedding's state alone, on a rank of its own.
# * b) 424 MB: the embedding and every eighth matrix, dealt out in order.
# * c) 592 MB: all of it, rank 0 updating and broadcasting the rest.
# * d) 74 MB: an eighth of the model's state, cut across the tensors.

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
    ZeroRedundancyOptimizer partitions the parameter list, not the elements (not d): it
    hands out whole parameters, largest first, each to the rank with the fewest elements so
    far, and every rank updates its own (not c). The embedding goes first, to one rank; the
    24 matrices then go to the 7 others, which stay far below 50M, 3 or 4 each. The busiest
    rank holds the embedding's two moments alone: 50M x 8 B = 400 MB (plus a 4-byte step
    counter), 5.4 times the even 74 MB. b) deals the parameters out in order, round robin:
    on parameters of equal size, as in the default measurement, both rules deal them alike
    (sizes tie, and a tie goes to the lowest rank), and only sizes that differ tell them
    apart. Measured at a thousandth of the size on 8 ranks: 400,004 bytes on one rank,
    32,016 or 24,012 on each other. Your ZeroOptimizer shards the flattened parameters by
    element, so its shards differ by at most one element: d) is what it holds. A model of
    many similar layers evens out under whole-parameter partitioning; one large embedding
    does not.
    """,
    giveaways=(
        r"whole parameters",
        r"largest first",
        r"400,?004 bytes",
        r"embedding's state alone, on a rank of its own",
    ),
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "zero_5_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it.** Which parameters' Adam state each rank holds after one step, and its bytes,
# for flat parameters of 10,000 elements each: three of them on 2 ranks, four on 3. Give
# `report_torch_zero` other sizes (a list per world size) to measure other models.

# %% nbgrader={"grade": false, "grade_id": "zero_5_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
report.report_torch_zero([(2, [10_000] * 3), (3, [10_000] * 4)])

# %% [markdown] nbgrader={"grade": false, "grade_id": "zero_6_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Question zero_6: fp16 compression on more ranks
#
# *Difficulty 2/3*
#
# Compression trades the bytes a ring sends for accuracy. DDP's `fp16_compress_hook` sends
# every gradient bucket as float16 (half the bytes) and hands `.grad` back as float32. On
# **8** ranks, every rank's gradient holds the same two elements, x = 2e4 and y = 2e-7, so
# the exact average is 2e4 and 2e-7. What does `.grad` hold after backward with the hook?
#
# * a) x comes back as inf; y comes back as 0.
# * b) x comes back near 2e4; y comes back as 0.
# * c) x comes back near 2e4; y comes back near 2e-7.
# * d) x comes back as inf; y comes back near 2e-7.

# %% nbgrader={"grade": false, "grade_id": "zero_6_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
answer_zero_6 = ""  # your answer: one letter, "a" to "d"
### BEGIN SOLUTION
answer_zero_6 = "b"
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "zero_6_check", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_answer("answer_zero_6", answer_zero_6, choices="abcd")
### BEGIN HIDDEN TESTS
check_answer(
    "answer_zero_6",
    answer_zero_6,
    choices="abcd",
    key="b",
    explanation="""
    The hook casts each rank's bucket to float16, divides it by the world size in float16,
    and only then all-reduces the sum. Dividing first keeps the sum in range: 8 x 2e4 =
    1.6e5 is past float16's largest finite value, 65504, and would be inf (d and a: a sum
    taken before the division), while eight terms of 2e4 / 8 = 2500 add up to 2e4 again
    (19984 measured: float16 rounds the partial sums). The price is at the small end: 2e-7
    casts to 1.79e-7, three steps of float16's smallest subnormal (5.96e-8), and an eighth
    of that is below half a step, so it rounds to 0 on every rank and the sum is 0 (not c).
    On 2 ranks the same y survives, as 2.38e-7: what underflows depends on the world size,
    not only on the value. The default measurement, at ordinary values on 2 ranks, shows
    only the cast's rounding (the hook gives back exactly what the cast holds): halving is
    exact there, so it cannot tell dividing first from summing first. Mixed precision
    training scales the loss for this reason.
    """,
    giveaways=(
        r"x comes back near 2e4; y comes back as 0",
        r"an eighth\s+of that is below",
        r"divides it by the world size in float16",
        r"depends on the world size",
    ),
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "zero_6_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it**: float16's range, and what a cast alone does to each value on one rank. Then
# the gradient of `w . x` is `x`, so feeding values as `x` on every rank makes them the
# gradient, without and with the hook. Change the values and `world_size` (up to 8) to see
# what the hook does elsewhere.

# %% nbgrader={"grade": false, "grade_id": "zero_6_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
report.report_fp16([3.0, 0.1, 1e-3, 1e-5], world_size=2)

# %% [markdown] nbgrader={"grade": false, "grade_id": "exercise_3_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Exercise 3 (optional): error feedback
#
# Plain fp16 compression can lose small gradient elements, and it loses them at every step:
# if the gradients stay that small, the weights never move.
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

# %% tags=["raises-exception"] nbgrader={"grade": false, "grade_id": "try_ef", "locked": true, "schema_version": 3, "solution": false, "task": false}
report.report_ef_training(ef_fp16_hook)

# %% nbgrader={"grade": true, "grade_id": "ef_fp16_hook_trains", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
# Within 5% of fp32 training where plain fp16 compression loses every gradient.
### BEGIN HIDDEN TESTS
print(check_error_feedback_hook(ef_fp16_hook))
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "zero_7_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Question zero_7: PowerSGD's rank
#
# *Difficulty 3/3*
#
# `powerSGD_hook` replaces each gradient matrix by two thin float32 factors of rank r
# (`matrix_approximation_rank`) and all-reduces those instead. Two ranks train one bias-free
# `nn.Linear(128, 512)` (a 512 x 128 weight: 256 KiB of gradient) with DDP and the hook, r = 8,
# `start_powerSGD_iter=2` and error feedback off, on batches of 4 samples per rank, any loss.
# From step 3 on, how many bytes does each rank all-reduce per step, and what is `.grad`?
#
# * a) 20 KiB per step; the compressed gradient equals the exact average.
# * b) 16 KiB per step; the compressed gradient equals the exact average.
# * c) 20 KiB per step; the compressed gradient misses part of the average.
# * d) 16 KiB per step; the compressed gradient misses part of the average.

# %% nbgrader={"grade": false, "grade_id": "zero_7_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
answer_zero_7 = ""  # your answer: one letter, "a" to "d"
### BEGIN SOLUTION
answer_zero_7 = "a"
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "zero_7_check", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
check_answer("answer_zero_7", answer_zero_7, choices="abcd")
### BEGIN HIDDEN TESTS
check_answer(
    "answer_zero_7",
    answer_zero_7,
    choices="abcd",
    key="a",
    explanation="""
    An n x m gradient M is approximated by P Q^T with P of n x r and Q of m x r: the hook
    all-reduces P, then Q, (n + m) x r floats, (512 + 128) x 8 x 4 bytes = 20,480 bytes,
    20 KiB, where the measured 256 x 256 layer sends (256 + 256) x r x 4. The bytes follow
    the matrix's sides, not its size: 16 KiB (b, d) is what a square layer of the same 256
    KiB sends. The error follows the gradient's rank. A linear layer's weight gradient is a
    sum of one outer product per sample (the output's gradient times the input), so a rank's
    gradient on 4 samples has rank at most 4, and the average over 2 ranks at most 8 = r.
    P spans the gradient's columns (P = M Q for a random Q), and P P^T M = M: the
    compressed gradient is the exact average, to rounding (relative error below 1e-5),
    not c. With r = 4, or with batches of 8, the same layer's error is about 0.6 (measured
    0.66 and 0.60): r is then below the gradient's rank. So is every r of the default
    measurement (1, 2 and 4, for a gradient of rank up to 16 on batches of 8 on 2 ranks),
    and all of them miss part of it; the same square layer at r = 16 is exact, measured.
    PowerSGD loses little where gradients are low-rank.
    """,
    giveaways=(
        r"\(512 \+ 128\) x 8 x 4",
        r"20,?480 bytes",
        r"at most 8 = r",
        r"20 KiB per step; the compressed gradient equals",
    ),
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "zero_7_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it**: bytes passed to `dist.all_reduce` per step, and the relative error of `.grad`
# against the exact average, for r = 1, 2 and 4, with `start_powerSGD_iter=3`, error feedback
# off (to see one step's error). Change `shape` (rows, columns), `batch` (samples per rank) or
# `ranks` to measure other layers.

# %% nbgrader={"grade": false, "grade_id": "zero_7_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
report.report_powersgd(ranks=(1, 2, 4), start_iter=3, shape=(256, 256), batch=8)

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

