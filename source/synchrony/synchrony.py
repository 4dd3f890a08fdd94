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
# # The cost of synchrony
#
# Synchronous data parallelism has one rule: no rank takes its optimizer step until every
# rank's gradient is in the sum. The ring made that sum cheap in **bytes**. This notebook
# measures what else a synchronous step pays for, the costs a job meets the first time it
# runs on more than one machine:
#
# 1. **latency**: what one message costs on this machine, split into a fixed part and a part
#    per byte, and what that says about small all-reduces;
# 2. **trees**: an all-reduce in fewer, bigger steps, and where it beats the ring; you write
#    one, `tree_allreduce`, and find the crossover yourself;
# 3. **hierarchy**: ranks on several machines, where the links between machines are slower
#    than those inside one; you write `hierarchical_allreduce` on process subgroups;
# 4. **stragglers**: one slow rank, and what every other rank does while it catches up;
# 5. **the batch size**: what N ranks do to the batch, and to the learning rate it needs.
#
# As before, `%%ranks N` runs a cell on N gloo ranks, and `course.ranks.run(fn, N, ...)` runs a
# function on N ranks and returns each rank's value in rank order. Every rank here is a
# process on this one machine, talking to the others over loopback TCP: the figures are this
# machine's, and the notebook says at each step how they carry to a real network.

# %% nbgrader={"grade": false, "grade_id": "setup", "locked": true, "schema_version": 3, "solution": false, "task": false}
# %load_ext course
import torch
import torch.distributed as dist

from course.checks import (
    check_answer,
    check_hierarchical_pattern,
    check_hierarchical_sums,
    check_tree_pattern,
    check_tree_sums,
)
from course.ranks import run

# %% [markdown] nbgrader={"grade": false, "grade_id": "part_1_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 1. What one message costs
#
# The alpha-beta model prices a message of n bytes at t(n) = alpha + n beta: **alpha** is
# what any message pays (the system calls, the network stack, the handshake of a send with
# its receive), **beta** the time per byte, one over the link's bandwidth. The cell times one
# `dist.send` / `dist.recv` between two ranks at sizes from 1 KB to 64 MB (each the median of
# several round trips, halved), fits the model by least squares, and draws both.

# %% nbgrader={"grade": false, "grade_id": "alpha_beta_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
from course.experiments import latency
from course.pictures import synchrony as pictures

sizes, times = latency.pingpong_on_ranks()
alpha, beta = latency.fit_alpha_beta(sizes, times)
print(f"alpha = {alpha * 1e6:.0f} us per message, 1/beta = {1 / beta / 1e9:.2f} GB/s")
pictures.alpha_beta_figure(sizes, times, alpha, beta)

# %% [markdown] nbgrader={"grade": false, "grade_id": "synchrony_1_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Question synchrony_1: half the bandwidth
#
# *Difficulty 2/3*
#
# A message of n bytes reaches the bandwidth n / t(n) = n / (alpha + n beta), which climbs
# towards the peak 1/beta as n grows. At what message size does a message reach **half** of
# the peak?
#
# * a) n = alpha / beta: the fixed cost and the bytes take equal time there.
# * b) n = 2 alpha / beta: the bytes must take twice the fixed cost's time.
# * c) About 1 KB: below it every message costs alpha, whatever it holds.
# * d) Half the largest size measured, where the fitted line flattens out.
#
# Set `answer_synchrony_1` to your letter and run the cell below it.

# %% nbgrader={"grade": false, "grade_id": "synchrony_1_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
answer_synchrony_1 = ""  # your answer: one letter, "a" to "d"
### BEGIN SOLUTION
answer_synchrony_1 = "a"
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "synchrony_1_check", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_answer("answer_synchrony_1", answer_synchrony_1, choices="abcd")
### BEGIN HIDDEN TESTS
check_answer(
    "answer_synchrony_1",
    answer_synchrony_1,
    choices="abcd",
    key="a",
    explanation="""
    EXPLAIN_1
    """,
    giveaways=(r"n_?1/2", r"alpha\s*/\s*beta.{0,40}half", r"half.{0,40}alpha\s*/\s*beta"),
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "synchrony_2_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# QUESTION_2

# %% [markdown] nbgrader={"grade": false, "grade_id": "part_2_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 2. Fewer, bigger steps: recursive doubling
#
# The ring pays alpha 2(N-1) times. **Recursive doubling** (Thakur, Rabenseifner & Gropp,
# 2005, the small-message all-reduce of MPICH) pays it log2 N times: at step k every rank
# swaps its **whole** tensor with the rank whose number differs from its own in bit k, and
# adds. After step 0, ranks 0 and 1 both hold 0 + 1, ranks 2 and 3 hold 2 + 3; after step 1,
# rank 0 swaps with rank 2 and every rank holds all four. Each step sends the whole tensor,
# not a 1/N chunk: fewer messages, more bytes.
#
# On 8 ranks:
#
# | step | rank 0 swaps with | rank 5 swaps with | each rank then holds the sum of |
# | --- | --- | --- | --- |
# | 0 | 1 | 4 | 2 ranks |
# | 1 | 2 | 7 | 4 ranks |
# | 2 | 4 | 1 | 8 ranks |
#
# When N is not a power of two, let p be the largest power of two below it: ranks p .. N-1
# first hand their tensor to rank - p (which adds it), the p ranks run the steps, and the
# folded ranks get the result back at the end: two more steps.

# %% [markdown] nbgrader={"grade": false, "grade_id": "synchrony_3_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# QUESTION_3

# %% [markdown] nbgrader={"grade": false, "grade_id": "exercise_1_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Exercise 1: your own recursive doubling
#
# Write `tree_allreduce(tensor)`. Like your ring, it sums `tensor` **in place** across all
# ranks of the default process group and returns nothing, for any shape, float and integer
# dtypes and any number of ranks, with **point-to-point calls only** (`dist.send`,
# `dist.recv`, `dist.isend`, `dist.irecv`, `dist.batch_isend_irecv`; no collective).
#
# 1. p = the largest power of two not above N (`1 << (N.bit_length() - 1)`).
# 2. Fold: a rank q >= p sends its tensor to q - p and later receives the result from it;
#    a rank q < N - p first receives q + p's tensor and adds it.
# 3. For distance = 1, 2, 4, ... below p: swap the **whole** tensor with `rank ^ distance`
#    and add what came in. Both ranks of a pair send and receive at once, so post the send
#    with `dist.isend` before the receive (question ring_3 of the ring assignment).
# 4. Unfold: a rank q < N - p sends the result to q + p.
#
# Receive into a buffer of the tensor's own shape and dtype, never into the tensor you are
# still sending. Graded in two parts: right sums (4 points) on world sizes 2 to 6, and a real
# recursive doubling (4 points): at every step the right partner, the whole tensor, and a
# partial sum that holds exactly the ranks it should, read from a recorded run.

# %% nbgrader={"grade": false, "grade_id": "tree_allreduce", "locked": false, "schema_version": 3, "solution": true, "task": false}
def tree_allreduce(tensor: torch.Tensor) -> None:
    """Sum ``tensor`` in place across all ranks by recursive doubling, point-to-point only."""
    ### BEGIN SOLUTION
    rank, n = dist.get_rank(), dist.get_world_size()
    p = 1 << (n.bit_length() - 1)
    incoming = torch.empty_like(tensor)
    if rank >= p:
        dist.send(tensor, rank - p)
        dist.recv(tensor, rank - p)
        return
    if rank + p < n:
        dist.recv(incoming, rank + p)
        tensor.add_(incoming)
    distance = 1
    while distance < p:
        request = dist.isend(tensor, rank ^ distance)
        dist.recv(incoming, rank ^ distance)
        request.wait()
        tensor.add_(incoming)
        distance *= 2
    if rank + p < n:
        dist.send(tensor, rank + p)
    ### END SOLUTION


# %% [markdown] nbgrader={"grade": false, "grade_id": "try_tree_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### Test as you go
#
# On 3 ranks (not a power of two: rank 2 folds into rank 0), every rank starts with
# `rank + 1` in each of 5 elements: every element should end as 1 + 2 + 3 = 6 on every rank.

# %% nbgrader={"grade": false, "grade_id": "try_tree", "locked": true, "schema_version": 3, "solution": false, "task": false}
# %%ranks 3 --timeout 20
from course.checks.teaching import say_if_unimplemented

say_if_unimplemented(tree_allreduce)  # a note if the cell above is still the empty stub
t = torch.full((5,), rank + 1.0)
tree_allreduce(t)
print(t.tolist())

# %% [markdown] nbgrader={"grade": false, "grade_id": "visible_tree_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# The grader's checks, on fewer cases. Each stops within its deadline and says which world
# size, tensor, step and rank went wrong.

# %% nbgrader={"grade": false, "grade_id": "visible_tree", "locked": true, "schema_version": 3, "solution": false, "task": false}
print(check_tree_sums(tree_allreduce, world_sizes=(3,)))
print(check_tree_pattern(tree_allreduce, world_sizes=(3,)))

# %% nbgrader={"grade": true, "grade_id": "tree_allreduce_sums", "locked": true, "points": 4, "schema_version": 3, "solution": false, "task": false}
# Right sums: world sizes 2 to 6, powers of two and not, many sizes, shapes and dtypes.
print(check_tree_sums(tree_allreduce, world_sizes=(2,)))
### BEGIN HIDDEN TESTS
print(check_tree_sums(tree_allreduce))
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "tree_allreduce_pattern", "locked": true, "points": 4, "schema_version": 3, "solution": false, "task": false}
# Recursive doubling: the partner of each step, the whole tensor, the ranks each sum holds.
print(check_tree_pattern(tree_allreduce, world_sizes=(3,)))
### BEGIN HIDDEN TESTS
print(check_tree_pattern(tree_allreduce))
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "crossover_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### Where does yours cross the ring?
#
# CROSSOVER_INTRO

# %% [markdown] nbgrader={"grade": false, "grade_id": "part_3_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 3. Ranks on several machines
#
# A real job runs on several machines ("nodes"), each with several accelerators. Inside a
# node they talk over fast links (NVLink moves hundreds of GB/s); between nodes over the
# network, often ten times slower per accelerator. A flat ring over all N ranks does not know
# that: every one of its 2(N-1) steps waits for its slowest link, and some link of the ring
# always crosses between nodes.
#
# A **hierarchical** (two-level) all-reduce uses each link for what it is good at. With N
# ranks on M nodes of N/M ranks each:
#
# 1. inside every node, a **reduce-scatter**: local rank j ends up with the node's sum of
#    shard j, 1/(N/M) of the tensor;
# 2. across nodes, an **all-reduce of that shard** among the M ranks with the same local
#    rank, one per node: the only traffic between nodes, on N/M links at once;
# 3. inside every node, an **all-gather** of the shards.
#
# NCCL does this on its own (its rings and trees are built node by node); here you build it
# from torch's collectives on **process subgroups** (`dist.new_group`).

# %% [markdown] nbgrader={"grade": false, "grade_id": "synchrony_4_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# QUESTION_4

# %% [markdown] nbgrader={"grade": false, "grade_id": "exercise_2_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Exercise 2: a two-level all-reduce on subgroups
#
# Write `hierarchical_allreduce(tensor, ranks_per_node)`. Ranks 0 .. ranks_per_node - 1 are
# node 0, the next ranks_per_node ranks node 1, and so on (the world size is a multiple of
# ranks_per_node). It sums `tensor` in place across all ranks and returns nothing. Here you
# may use torch's collectives: the exercise is the hierarchy.
#
# * **Groups.** `dist.new_group(ranks)` makes a subgroup; **every rank must call it for every
#   group, in the same order**, even for groups it is not in. Make each node's group (its
#   ranks) and each cross-node group (the ranks with the same local rank, one per node) once,
#   and keep them (say in a dict keyed by world size and ranks_per_node): making a group is
#   itself a collective.
# * **Step 1.** Flatten the tensor and pad it with zeros to a multiple of ranks_per_node;
#   `dist.reduce_scatter_tensor(shard, padded, group=node_group)`.
# * **Step 2.** `dist.all_reduce(shard, group=cross_group)`.
# * **Step 3.** `dist.all_gather_into_tensor(padded, shard, group=node_group)`; copy the first
#   `tensor.numel()` elements back into `tensor`.
#
# Graded in two parts: right sums (3 points) on 4 to 8 ranks, nodes of 2 to 4, sizes that
# ranks_per_node does not divide, float and integer dtypes; and a real hierarchy (3 points),
# read from a recorded run: the only collectives between nodes are all-reduces of one shard
# among one rank per node, and the bytes that cross between nodes are what the two-level
# scheme sends.

# %% nbgrader={"grade": false, "grade_id": "hierarchical_allreduce", "locked": false, "schema_version": 3, "solution": true, "task": false}
def hierarchical_allreduce(tensor: torch.Tensor, ranks_per_node: int) -> None:
    """Sum ``tensor`` in place: reduce-scatter in the node, all-reduce across, all-gather in."""
    ### BEGIN SOLUTION
    node_group, cross_group = _node_groups(dist.get_world_size(), ranks_per_node)
    flat = tensor.reshape(-1)
    shard_numel = -(-flat.numel() // ranks_per_node)
    padded = torch.zeros(shard_numel * ranks_per_node, dtype=tensor.dtype)
    padded[: flat.numel()] = flat
    shard = torch.empty(shard_numel, dtype=tensor.dtype)
    dist.reduce_scatter_tensor(shard, padded, group=node_group)
    dist.all_reduce(shard, group=cross_group)
    dist.all_gather_into_tensor(padded, shard, group=node_group)
    tensor.copy_(padded[: flat.numel()].view(tensor.shape))


_GROUPS = {}


def _node_groups(world_size, ranks_per_node):
    """This rank's (node group, cross-node group), made once; every rank makes every group."""
    if (world_size, ranks_per_node) not in _GROUPS:
        rank, nodes, mine = dist.get_rank(), world_size // ranks_per_node, {}
        for node in range(nodes):
            ranks = [node * ranks_per_node + j for j in range(ranks_per_node)]
            group = dist.new_group(ranks)
            if rank in ranks:
                mine["node"] = group
        for j in range(ranks_per_node):
            ranks = [node * ranks_per_node + j for node in range(nodes)]
            group = dist.new_group(ranks)
            if rank in ranks:
                mine["cross"] = group
        _GROUPS[world_size, ranks_per_node] = mine["node"], mine["cross"]
    return _GROUPS[world_size, ranks_per_node]
    ### END SOLUTION


# %% [markdown] nbgrader={"grade": false, "grade_id": "try_hierarchical_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### Test as you go
#
# Four ranks as two nodes of two; every rank holds `rank + 1` in each of 5 elements (5 is odd,
# so the tensor needs padding): every element should end as 1 + 2 + 3 + 4 = 10.

# %% nbgrader={"grade": false, "grade_id": "try_hierarchical", "locked": true, "schema_version": 3, "solution": false, "task": false}
# %%ranks 4 --timeout 20
say_if_unimplemented(hierarchical_allreduce)
t = torch.full((5,), rank + 1.0)
hierarchical_allreduce(t, ranks_per_node=2)
print(t.tolist())

# %% nbgrader={"grade": false, "grade_id": "visible_hierarchical", "locked": true, "schema_version": 3, "solution": false, "task": false}
print(check_hierarchical_sums(hierarchical_allreduce, cases=((4, 2),)))
print(check_hierarchical_pattern(hierarchical_allreduce, cases=((4, 2),)))

# %% nbgrader={"grade": true, "grade_id": "hierarchical_allreduce_sums", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
# Right sums: 4 to 8 ranks, nodes of 2 to 4, sizes the node does not divide, several dtypes.
print(check_hierarchical_sums(hierarchical_allreduce, cases=((4, 2),)))
### BEGIN HIDDEN TESTS
print(check_hierarchical_sums(hierarchical_allreduce))
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "hierarchical_allreduce_pattern", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
# A real hierarchy: between nodes, only an all-reduce of one shard among one rank per node.
print(check_hierarchical_pattern(hierarchical_allreduce, cases=((4, 2),)))
### BEGIN HIDDEN TESTS
print(check_hierarchical_pattern(hierarchical_allreduce))
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "part_4_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 4. Stragglers
#
# A synchronous step is as fast as its slowest rank. On a real cluster a rank falls behind
# for reasons of its own: a slower or hotter chip, a noisy neighbour on a shared host, a
# garbage-collection pause, a bad link, a longer sequence in its batch.

# %% [markdown] nbgrader={"grade": false, "grade_id": "synchrony_5_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# QUESTION_5

# %% [markdown] nbgrader={"grade": false, "grade_id": "synchrony_6_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# QUESTION_6

# %% [markdown] nbgrader={"grade": false, "grade_id": "exercise_3_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Exercise 3: a step with backup workers
#
# Write `step_with_backups(grad, backups)`, called on every rank with its own gradient (a
# 1-D tensor). Rank 0 coordinates, as a parameter server would (in the checks it is never
# the straggler). The step must:
#
# * keep rank 0's gradient and the first N - 1 - backups others **to arrive**, and drop the
#   rest without waiting for them;
# * leave in `grad`, on **every** rank (the dropped ones too), the mean of the kept
#   gradients;
# * return the sorted list of the kept ranks, **the same on every rank**.
#
# What you need:
#
# * `src = dist.recv(buffer, tag=t)` with no `src` receives from **any** rank, whichever
#   message comes first, and returns who sent it.
# * Give each step's messages a tag of their own (a step counter kept between calls): the
#   gradient a straggler sends late must not be taken for one of the next step's.
# * Send with `dist.isend` and **keep the request** (in a list at module level): on gloo a
#   send whose request is dropped is cancelled before it is delivered, and a blocking
#   `dist.send` to the straggler waits for it.
# * Rank 0 can send every other rank one tensor: the kept ranks as 0/1 flags, then the mean.
#
# Graded (4 points) on 3 and 4 ranks with 0, 1 and 2 backups, a straggler drawn at random
# that starts its step a second late: the ranks agree on whom they kept, the straggler is
# not among them, every rank ends with the right mean, and no rank's step went on after the
# straggler woke.

# %% nbgrader={"grade": false, "grade_id": "step_with_backups", "locked": false, "schema_version": 3, "solution": true, "task": false}
def step_with_backups(grad: torch.Tensor, backups: int) -> list[int]:
    """Average ``grad`` over rank 0 and the first N - 1 - backups others to arrive."""
    ### BEGIN SOLUTION
    rank, n = dist.get_rank(), dist.get_world_size()
    _STEPS[0] += 1
    tag = _STEPS[0]
    if rank:
        _SENDING.append(dist.isend(grad, 0, tag=tag))
        reply = torch.empty(n + grad.numel(), dtype=torch.float64)
        dist.recv(reply, 0, tag=tag)
        grad.copy_(reply[n:])
        return [r for r in range(n) if reply[r]]
    total, kept = grad.to(torch.float64), [0]
    incoming = torch.empty_like(grad)
    while len(kept) < n - backups:
        kept.append(dist.recv(incoming, tag=tag))  # from any rank: the first to arrive
        total += incoming
    kept.sort()
    grad.copy_(total / len(kept))
    reply = torch.cat([torch.zeros(n, dtype=torch.float64), grad.to(torch.float64)])
    reply[kept] = 1
    _SENDING.extend(dist.isend(reply, r, tag=tag) for r in range(1, n))
    return kept


_STEPS = [0]  # this rank's steps so far: each step's messages carry its number as their tag
_SENDING = []  # every send's request, kept until the run ends
    ### END SOLUTION


# %% [markdown] nbgrader={"grade": false, "grade_id": "try_backups_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### Test as you go
#
# Four ranks, one backup; rank 3 starts half a second late. Rank r's gradient is r in every
# element, so the kept ranks 0, 1 and 2 should give every rank the mean 1.0, rank 3 too, and
# ranks 0 to 2 should finish long before rank 3 starts.

# %% nbgrader={"grade": false, "grade_id": "try_backups", "locked": true, "schema_version": 3, "solution": false, "task": false}
# %%ranks 4 --timeout 20
import time

say_if_unimplemented(step_with_backups)
start = time.monotonic()
if rank == 3:
    time.sleep(0.5)
grad = torch.full((4,), float(rank))
kept = step_with_backups(grad, backups=1)
print(f"kept {kept}, mean {grad.tolist()}, step ended at +{time.monotonic() - start:.2f} s")

# %% nbgrader={"grade": true, "grade_id": "step_with_backups_check", "locked": true, "points": 4, "schema_version": 3, "solution": false, "task": false}
# Kept ranks agreed, the straggler dropped, the right mean everywhere, nobody waited for it.
print(check_step_with_backups(step_with_backups, world_sizes=(3,)))
### BEGIN HIDDEN TESTS
print(check_step_with_backups(step_with_backups))
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "part_5_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 5. What N ranks do to the batch
#
# With a fixed batch of B samples per rank, N ranks average N B samples' gradients: the
# global batch grows N-fold. One epoch is then N times fewer optimizer steps.

# %% [markdown] nbgrader={"grade": false, "grade_id": "synchrony_7_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# QUESTION_7

# %% [markdown] nbgrader={"grade": false, "grade_id": "synchrony_8_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# QUESTION_8

# %% [markdown] nbgrader={"grade": false, "grade_id": "closing", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## What you measured
#
# CLOSING
