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
# 4. **stragglers**: one slow rank, and what it does to the others' steps;
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

from course.lessons.synchrony import (
    check_answer,
    check_hierarchical_pattern,
    check_hierarchical_sums,
    check_step_with_backups,
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
# `dist.send` / `dist.recv` between two ranks at sizes from 1 KB to 64 MB (each the fastest of
# many round trips, halved), fits the model to those times, and draws both.

# %% nbgrader={"grade": false, "grade_id": "alpha_beta_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
from course.lessons.synchrony import latency, picture

times = latency.pingpong()  # one-way seconds per message size, 2 ranks, the fastest of many
alpha, beta = latency.fit_alpha_beta(list(times), list(times.values()))
print(f"alpha = {alpha * 1e6:.0f} us per message, 1/beta = {1 / beta / 1e9:.2f} GB/s")
picture.alpha_beta_figure(times, alpha, beta)

# %% [markdown] nbgrader={"grade": false, "grade_id": "synchrony_1_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Question synchrony_1: half the bandwidth, in a ring
#
# *Difficulty 2/3*
#
# On an InfiniBand network with alpha = 2 us and 1/beta = 25 GB/s, one message moves at half
# of the peak 1/beta when it holds 50 KB: there its bytes take as long as alpha. Now 8 ranks,
# each with its own link, all-reduce a tensor of S bytes with a ring. At what size S does the
# model say the all-reduce's **bus bandwidth** (the bytes each rank's link carries in it, over
# its time) reaches half of 1/beta?
#
# * a) About 50 KB: as for one message, its bytes then take as long as alpha.
# * b) About 700 KB: its bytes then take as long as the alphas of its 14 steps.
# * c) About 6 KB: the 8 links share the bytes, so each needs 8 times less.
# * d) About 400 KB: each step's message then holds 50 KB, one eighth of it.
#
# Set `answer_synchrony_1` to your letter and run the cell below it.

# %% nbgrader={"grade": false, "grade_id": "synchrony_1_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
answer_synchrony_1 = ""  # your answer: one letter, "a" to "d"
### BEGIN SOLUTION
answer_synchrony_1 = "d"
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "synchrony_1_check", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_answer("answer_synchrony_1", answer_synchrony_1, choices="abcd")
### BEGIN HIDDEN TESTS
check_answer(
    "answer_synchrony_1",
    answer_synchrony_1,
    choices="abcd",
    key="d",
    explanation="""
    A ring all-reduce on N ranks is 2(N-1) messages in turn, each of S/N bytes: recorded on
    real ranks, 2, 6 and 14 sends per rank on 2, 4 and 8 ranks, each of them one N-th of the
    tensor. Each rank's link carries 2(N-1)/N S in 2(N-1)(alpha + S/N beta), a rate of
    (S/N) / (alpha + S/N beta): one message's law, for a message of S/N bytes. It is half of
    1/beta where S/N = alpha/beta, so at S = N alpha / beta = 8 x 50 KB = 400 KB: each link
    then carries 700 KB in 14 x 2 us + 28 us = 56 us, 12.5 GB/s. a) 50 KB is where one message
    of the whole tensor reaches half; the ring sends it as 14 messages of 6.25 KB, and its
    links reach 11% of the peak. b) sets the tensor's S beta against the 14 alphas, but each
    rank's link carries 1.75 S: at 700 KB the links reach 64%. c) the links do share the bytes,
    but every message pays its alpha whole: smaller messages sit further from the peak, 1.5%
    at 6 KB. The cell measures one message on this machine (its alpha and beta move with the
    machine's load). A bucket that is large for one message can be small for a ring on many
    ranks: every rank sends it in N pieces.
    """,
    giveaways=(
        r"S = N alpha\s*/\s*beta",
        r"8 x 50 KB = 400 KB",
        r"message then holds 50 KB",
    ),
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "synchrony_1_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it.** One message on this machine: the one-way time and the bandwidth (size over
# time) of each message size in the cell above, beside the fitted alpha and 1/beta.

# %% nbgrader={"grade": false, "grade_id": "synchrony_1_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
print(f"alpha = {alpha * 1e6:.0f} us, 1/beta = {1 / beta / 1e9:.2f} GB/s")
for size, seconds in times.items():
    print(f"{size / 1024:8.0f} KB  {seconds * 1e6:9.1f} us  {size / seconds / 1e9:6.3f} GB/s")

# %% [markdown] nbgrader={"grade": false, "grade_id": "synchrony_2_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Question synchrony_2: from 8 ranks to 64
#
# *Difficulty 3/3*
#
# A job all-reduces a 1 MB gradient bucket with a ring, on the network of question
# synchrony_1 (alpha = 2 us, 1/beta = 25 GB/s), every rank with its own link and its own
# cores. It grows from 8 ranks to 64. By how much does the alpha-beta model say the time of
# that all-reduce grows?
#
# * a) About 9 times: each rank makes 9 times as many sends, each paying alpha.
# * b) About 1.1 times: a 1 MB bucket is bandwidth-bound, and its bytes barely grow.
# * c) About 3.4 times: on 64 ranks its alphas come to cost more than its bytes.
# * d) About 8 times: the ring waits on 8 times as many ranks at every step.
#
# Set `answer_synchrony_2` to your letter and run the cell below it.

# %% nbgrader={"grade": false, "grade_id": "synchrony_2_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
answer_synchrony_2 = ""  # your answer: one letter, "a" to "d"
### BEGIN SOLUTION
answer_synchrony_2 = "c"
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "synchrony_2_check", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
check_answer("answer_synchrony_2", answer_synchrony_2, choices="abcd")
### BEGIN HIDDEN TESTS
check_answer(
    "answer_synchrony_2",
    answer_synchrony_2,
    choices="abcd",
    key="c",
    explanation="""
    A ring all-reduce on N ranks is 2(N-1) sends one after another, each of S/N bytes, so
    t = 2(N-1) alpha + 2(N-1)/N S beta. Recorded on real ranks (a ring of point-to-point calls):
    2, 6 and 14 sends per rank on 2, 4 and 8 ranks, and 1, 1.5 and 1.75 S sent per rank; the
    cell's gloo ring put 1, 1.33 and 1.5 times the tensor on each rank's wire on 2, 3 and 4
    ranks, and for a 256 B tensor mostly headers, a fixed size per step. With
    S beta = 1 MB / 25 GB/s = 40 us: on 8 ranks 14 x 2 us + 1.75 x 40 us = 28 + 70 = 98 us, on
    64 ranks 126 x 2 us + 1.97 x 40 us = 252 + 79 = 331 us, 3.4 times as long. The alpha term
    grows 9-fold and goes from under a third of the time to three quarters of it; the bytes
    grow 1.125-fold. a) counts the alphas only: right for a tensor of a few hundred bytes.
    b) counts the bytes only: right for a gigabyte, but 1 MB is 20 alpha / beta, and on 64
    ranks each message holds 16 KB, a third of alpha / beta. d) the time follows the steps,
    2(N-1), and the bytes, 2(N-1)/N S, not N itself. This is why large jobs bucket small
    gradients and why NCCL switches to trees on many ranks: the latency term of a ring grows
    with N, its bandwidth term does not. (On this machine the ranks also share two cores, so
    its timings grow faster still; the model is the cluster's.)
    """,
    giveaways=(
        r"252 \+ 79 = 331",
        r"3\.4 times as long",
        r"alphas come to cost more than",
    ),
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "synchrony_2_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it**, on 2, 3 and 4 ranks: the bytes each rank puts on the wire (the kernel's TCP
# counters, `course.ring.wire.WireMeter`, as in the ring assignment) in gloo's all-reduce of
# a 1 MiB tensor, in units of the tensor, and of a 256 B tensor, in bytes.

# %% nbgrader={"grade": false, "grade_id": "synchrony_2_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
from course.lessons.synchrony import collective_traffic

for n in (2, 3, 4):
    big, small = (
        max(r["sent"] for r in run(collective_traffic, n, "all_reduce", numel))
        for numel in (2**18, 64)  # float32: 1 MiB and 256 B
    )
    print(f"N = {n}: 1 MiB tensor, {big / 2**20:.3f} x 1 MiB sent per rank; "
          f"256 B tensor, {small} B sent per rank")

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
# ## Question synchrony_3: where the tree stops winning
#
# *Difficulty 3/3*
#
# On N ranks recursive doubling takes log2 N steps, each sending the whole tensor of S bytes;
# the ring takes 2(N-1) steps of S/N. With t = alpha + n beta per message, up to what size S
# does the alpha-beta model say recursive doubling is the faster of the two on **64** ranks?
#
# * a) About 8 alpha / beta, as on 4 ranks: both costs grow alike with N.
# * b) About 30 alpha / beta: 120 fewer alphas against about 4 S beta more.
# * c) About 20 alpha / beta: 120 fewer alphas against the tree's 6 S beta.
# * d) At every size: 6 steps against 126 win, whatever the bytes are.
#
# Set `answer_synchrony_3` to your letter and run the cell below it.

# %% nbgrader={"grade": false, "grade_id": "synchrony_3_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
answer_synchrony_3 = ""  # your answer: one letter, "a" to "d"
### BEGIN SOLUTION
answer_synchrony_3 = "b"
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "synchrony_3_check", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
check_answer("answer_synchrony_3", answer_synchrony_3, choices="abcd")
### BEGIN HIDDEN TESTS
check_answer(
    "answer_synchrony_3",
    answer_synchrony_3,
    choices="abcd",
    key="b",
    explanation="""
    Recorded on real ranks, recursive doubling made 1, 2 and 3 sends of the whole tensor per rank
    on 2, 4 and 8 ranks (log2 N), the ring 2, 6 and 14 sends of S/N, 2(N-1)/N S in all. On 64
    ranks the tree costs 6 alpha + 6 S beta and the ring 126 alpha + 1.97 S beta. They are equal
    where 120 alpha = 4.03 S beta, at S = 29.8 alpha / beta: below it the 120 alphas the tree
    saves outweigh the 4 S it sends on top. a) 8 alpha / beta is the tie on 4 ranks (8.8 on 8);
    it does not stay put, because the ring's steps grow with N while the tree's bytes grow only
    with log2 N. c) sets the saving against all of the tree's 6 S and forgets that the ring
    sends its 1.97 S too. d) leaves out the bytes: at 1 GB the tree's 6 S take about 3 times the
    ring's 1.97 S. The crossover figure after exercise 1 draws the model at 4 ranks; MPI and
    NCCL switch algorithms by message size and by the number of ranks for this reason.
    """,
    giveaways=(
        r"29\.8 alpha",
        r"120 alpha = 4\.03 S beta",
        r"About 30 alpha",
    ),
)
### END HIDDEN TESTS

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
# recursive doubling (4 points) on 2 to 8: at every step the right partner, the whole tensor,
# and a partial sum that holds exactly the ranks it should, read from a recorded run.

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

# %% tags=["raises-exception"] nbgrader={"grade": false, "grade_id": "try_tree", "locked": true, "schema_version": 3, "solution": false, "task": false}
# %%ranks 3 --timeout 20
from course.lessons.synchrony import say_if_unimplemented

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
# The cell times your `tree_allreduce` against a ring on 4 ranks, from 1 KB to 32 MB, and
# draws both under the alpha-beta model's lines, with the alpha and beta fitted in part 1
# and the model's crossover marked. For a fair race, paste your `ring_allreduce` from the
# ring assignment into the first cell below (Python against Python): left as it is, the
# ring is gloo's own `dist.all_reduce`, a ring in C++. Where does the measured crossover fall against
# the model's?

# %% nbgrader={"grade": false, "grade_id": "your_ring", "locked": false, "schema_version": 3, "solution": true, "task": false}
def ring_allreduce(tensor: torch.Tensor) -> None:
    """Your ring_allreduce from the ring assignment, pasted here (not graded)."""
    ### BEGIN SOLUTION
    dist.all_reduce(tensor)  # gloo's own ring stands in for a pasted one
    ### END SOLUTION


# %% nbgrader={"grade": false, "grade_id": "crossover", "locked": true, "schema_version": 3, "solution": false, "task": false}
from IPython.display import display

from course.lessons.synchrony import not_implemented


def gloo_ring(tensor):
    dist.all_reduce(tensor)


numels = [2**e for e in range(8, 24, 3)]  # 1 KB to 32 MB of float32
if not_implemented(tree_allreduce):
    print(f"Note: {not_implemented(tree_allreduce)}")
else:
    ring = gloo_ring if not_implemented(ring_allreduce) else ring_allreduce
    contenders = {"tree": tree_allreduce, "ring": ring}
    seconds = {k: latency.time_allreduce(fn, numels, world_size=4) for k, fn in contenders.items()}
    by_bytes = {k: {4 * n: t for n, t in v.items()} for k, v in seconds.items()}
    display(picture.crossover_figure(by_bytes, alpha, beta, world_size=4))

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
#    rank, one per node: the only traffic between nodes, on N/M links at once (each rank
#    has its own link to the network, as on clusters that give every accelerator its own
#    network card);
# 3. inside every node, an **all-gather** of the shards.
#
# NCCL does this on its own (its rings and trees are built node by node); here you build it
# from torch's collectives on **process subgroups** (`dist.new_group`).

# %% [markdown] nbgrader={"grade": false, "grade_id": "synchrony_4_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Question synchrony_4: two layouts of 64 ranks
#
# *Difficulty 3/3*
#
# 64 ranks all-reduce S bytes with the two-level all-reduce (a reduce-scatter inside each
# node, a ring all-reduce of the shard across the nodes, an all-gather inside each node); every
# rank has its own link to the network. The cluster can hold them as 4 nodes of 16 ranks or
# as 16 nodes of 4. How do the bytes that the busiest rank sends to ranks on other nodes, one
# way, compare between the two layouts?
#
# * a) About 5 times fewer on 4 nodes of 16: a smaller shard, a shorter ring.
# * b) About 4 times fewer on 4 nodes of 16: a shard of S/16, not one of S/4.
# * c) The same on both: each rank sends 1.97 S, as in a flat ring of 64.
# * d) About 1.2 times fewer on 4 nodes of 16: each node's whole sum crosses.
#
# Set `answer_synchrony_4` to your letter and run the cell below it.

# %% nbgrader={"grade": false, "grade_id": "synchrony_4_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
answer_synchrony_4 = ""  # your answer: one letter, "a" to "d"
### BEGIN SOLUTION
answer_synchrony_4 = "a"
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "synchrony_4_check", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_answer("answer_synchrony_4", answer_synchrony_4, choices="abcd")
### BEGIN HIDDEN TESTS
check_answer(
    "answer_synchrony_4",
    answer_synchrony_4,
    choices="abcd",
    key="a",
    explanation="""
    After the reduce-scatter inside a node of R ranks each rank holds one shard, S/R, summed
    over its node. Only the all-reduce of that shard crosses between nodes, among the M ranks
    with the same local rank, one per node, and a ring over M members sends 2(M-1)/M of what
    it reduces: every rank sends 2(M-1)/M x S/R to other nodes, on its own link, all at once.
    Measured on the kernel's TCP counters with the model two-level all-reduce: 0.5 S from every
    rank on 2 nodes of 2, 0.25 S on 2 nodes of 4 and 0.75 S on 4 nodes of 2, where gloo's flat
    ring sent 1.5 S, 1.75 S and 1.75 S over each link between two nodes. On 4 nodes of 16 that
    is 2 x 3/4 x S/16 = 0.094 S, on 16 nodes of 4 it is 2 x 15/16 x S/4 = 0.47 S: 5 times
    fewer with the bigger nodes, a shard 4 times smaller in a ring that sends 1.5 times it
    instead of 1.875 times. b) counts the shard and forgets that the ring's share, 2(M-1)/M,
    grows with the number of nodes. c) is the flat ring; the two-level scheme sends far less
    across in both layouts. d) skips the reduce-scatter: an all-reduce of each node's whole
    sum across the nodes would send 1.5 S against 1.875 S. Bigger nodes keep more of the
    traffic on the fast links inside them, which is why NCCL builds its rings node by node.
    """,
    giveaways=(
        r"2 x 3/4 x S/16",
        r"2 x 15/16 x S/4",
        r"5 times\s+fewer with the bigger nodes",
    ),
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "synchrony_4_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it**, on 4 ranks seen as 2 nodes of 2 (ranks 0 and 1, ranks 2 and 3): the bytes each
# rank's TCP sockets sent to the other node (`course.ring.wire.WireMeter`, as in the ring
# assignment), in units of the tensor's size, for gloo's flat all-reduce of 1 MiB, and for an
# all-reduce of the tensor's first half alone among ranks 0 and 2, and among 1 and 3.
# `hierarchy.peer_traffic(fn, numel)` measures any all-reduce `fn(tensor)` on any layout:
# your `hierarchical_allreduce` of exercise 2 too, once it works.

# %% nbgrader={"grade": false, "grade_id": "synchrony_4_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
from course.lessons.synchrony import links


def flat(tensor):
    dist.all_reduce(tensor)


def half_across(numel):
    pairs = [dist.new_group([0, 2]), dist.new_group([1, 3])]  # every rank makes both groups
    pair = pairs[dist.get_rank() % 2]
    return links.peer_traffic(lambda t: dist.all_reduce(t[: numel // 2], group=pair), numel)


measured = {
    "flat ring": run(links.peer_traffic, 4, flat, 2**18),  # 2**18 float32 = 1 MiB
    "half, across": run(half_across, 4, 2**18),
}
for name, sent in measured.items():
    across = links.crossing_bytes(sent, ranks_per_node=2)
    print(f"{name:13} sent to the other node, per rank:", [round(b / 2**20, 4) for b in across])

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
#   `dist.reduce_scatter_single(shard, padded, group=node_group)`.
# * **Step 2.** `dist.all_reduce(shard, group=cross_group)`.
# * **Step 3.** `dist.all_gather_single(padded, shard, group=node_group)`; copy the first
#   `tensor.numel()` elements back into `tensor`.
#
# (`reduce_scatter_single` and `all_gather_single` are torch 2.13's names; the older
# `reduce_scatter_tensor` and `all_gather_into_tensor` still work, with a deprecation warning.)
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
    dist.reduce_scatter_single(shard, padded, group=node_group)
    dist.all_reduce(shard, group=cross_group)
    dist.all_gather_single(padded, shard, group=node_group)
    tensor.copy_(padded[: flat.numel()].view(tensor.shape))


_GROUPS = {}


def _node_groups(world_size, ranks_per_node):
    """This rank's (node group, cross-node group), made once; every rank makes every group."""
    key = (world_size, ranks_per_node)
    if key not in _GROUPS:
        step = ranks_per_node
        nodes = [list(range(first, first + step)) for first in range(0, world_size, step)]
        across = [list(range(local, world_size, step)) for local in range(step)]
        made = [(ranks, dist.new_group(ranks)) for ranks in nodes + across]
        mine = [group for ranks, group in made if dist.get_rank() in ranks]
        _GROUPS[key] = (mine[0], mine[1])
    return _GROUPS[key]
    ### END SOLUTION


# %% [markdown] nbgrader={"grade": false, "grade_id": "try_hierarchical_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### Test as you go
#
# Four ranks as two nodes of two; every rank holds `rank + 1` in each of 5 elements (5 is odd,
# so the tensor needs padding): every element should end as 1 + 2 + 3 + 4 = 10.

# %% tags=["raises-exception"] nbgrader={"grade": false, "grade_id": "try_hierarchical", "locked": true, "schema_version": 3, "solution": false, "task": false}
# %%ranks 4 --timeout 20
from course.lessons.synchrony import say_if_unimplemented

say_if_unimplemented(hierarchical_allreduce)
t = torch.full((5,), rank + 1.0)
hierarchical_allreduce(t, ranks_per_node=2)
print(t.tolist())

# %% nbgrader={"grade": false, "grade_id": "visible_hierarchical", "locked": true, "schema_version": 3, "solution": false, "task": false}
print(check_hierarchical_sums(hierarchical_allreduce, layouts=((4, 2),)))
print(check_hierarchical_pattern(hierarchical_allreduce, layouts=((4, 2),)))

# %% nbgrader={"grade": true, "grade_id": "hierarchical_allreduce_sums", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
# Right sums: 4 to 8 ranks, nodes of 2 to 4, sizes the node does not divide, several dtypes.
print(check_hierarchical_sums(hierarchical_allreduce, layouts=((4, 2),)))
### BEGIN HIDDEN TESTS
print(check_hierarchical_sums(hierarchical_allreduce))
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "hierarchical_allreduce_pattern", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
# A real hierarchy: between nodes, only an all-reduce of one shard among one rank per node.
print(check_hierarchical_pattern(hierarchical_allreduce, layouts=((4, 2),)))
### BEGIN HIDDEN TESTS
print(check_hierarchical_pattern(hierarchical_allreduce))
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "part_4_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 4. Stragglers
#
# On a real cluster one rank can fall behind the others for reasons of its own: a slower or hotter chip, a noisy neighbour on a shared host, a
# garbage-collection pause, a bad link, a longer sequence in its batch.

# %% [markdown] nbgrader={"grade": false, "grade_id": "synchrony_5_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Question synchrony_5: rare pauses on many ranks
#
# *Difficulty 1/3*
#
# 64 ranks train with DDP, each step taking the same compute on every rank, except that at
# every step each rank, independently, has a 1-in-64 chance of a pause that makes its
# forward and backward twice as long (a garbage collection, say). On average, how long does
# a step take, against a step in which no rank pauses?
#
# * a) About 1.02 times: one rank in 64 pauses, and the others do not.
# * b) About 1.6 times: most steps have some rank that pauses.
# * c) About 2 times: with 64 ranks, every step has a pause.
# * d) About 1.5 times: half the steps pause, half run clean.
#
# Set `answer_synchrony_5` to your letter and run the cell below it.

# %% nbgrader={"grade": false, "grade_id": "synchrony_5_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
answer_synchrony_5 = ""  # your answer: one letter, "a" to "d"
### BEGIN SOLUTION
answer_synchrony_5 = "b"
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "synchrony_5_check", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
check_answer("answer_synchrony_5", answer_synchrony_5, choices="abcd")
### BEGIN HIDDEN TESTS
check_answer(
    "answer_synchrony_5",
    answer_synchrony_5,
    choices="abcd",
    key="b",
    explanation="""
    A synchronous step ends for everyone when its slowest rank's gradient is in the all-reduce,
    so a step is twice as long as soon as any one rank pauses. Measured on 4 ranks with rank 3
    at twice the compute (the cell's 1.5 times shows the same; a sleep stands for the
    compute): in every step no rank's backward, which ends
    with DDP's all-reduce, ended before rank 3's gradient was ready; the fast ranks waited in
    the all-reduce for the difference. No rank pauses in a step
    with probability (63/64)^64 = 0.365, about 1/e, so the mean step is 0.365 x 1 + 0.635 x 2
    = 1.635 times a clean one. a) is the mean over the ranks, which would hold if each rank went at
    its own pace. c) a chance of 1 in 64 on each of 64 ranks leaves 36.5% of the steps without a
    pause. d) guesses the share of paused steps instead of computing it. Rare slowdowns become
    common ones at scale: the more ranks, the more steps wait for someone, which is what backup
    workers (the next question) and asynchronous methods try to avoid.
    """,
    giveaways=(
        r"\(63/64\)\^64",
        r"1\.635 times",
        r"most steps have some rank",
    ),
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "synchrony_5_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it**, with rank 3 at 1.5 times the others' compute: six DDP steps on 4 ranks, a small
# model whose forward sleeps for the compute, so that the shared cores do not blur the timing
# (`course.lessons.synchrony.stragglers`). The figure is each rank's timeline.

# %% nbgrader={"grade": false, "grade_id": "synchrony_5_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
from course.lessons.synchrony import stragglers

spans = stragglers.straggler_run(4, slow_rank=3, slowdown=1.5)
print("step, ms:      ", [round(t * 1e3) for t in stragglers.step_seconds(spans)])
print("waiting, ms:   ", [round(t * 1e3) for t in stragglers.waiting_seconds(spans)])
picture.timeline_figure(spans)

# %% [markdown] nbgrader={"grade": false, "grade_id": "synchrony_6_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Question synchrony_6: one backup worker for 64 ranks
#
# *Difficulty 3/3*
#
# With **backup workers** (Chen et al., 2016) a step on N ranks uses the first N - b gradients to
# arrive and drops the other b. The 64 ranks of question synchrony_5 (at every step each rank,
# independently, has a 1-in-64 chance of a pause that makes its forward and backward twice as
# long) add one backup worker: b = 1, and a rank whose gradient is dropped abandons it and
# starts the next step with the others. On average, how long does a step take now, against a
# step in which no rank pauses?
#
# * a) About 1.0 times: the one backup drops whichever rank pauses.
# * b) About 1.63 times: the step waits for 63 ranks now, not 64.
# * c) About 1.37 times: each pause after the first adds a delay of its own.
# * d) About 1.26 times: a step waits only when two ranks or more pause.
#
# Set `answer_synchrony_6` to your letter and run the cell below it.

# %% nbgrader={"grade": false, "grade_id": "synchrony_6_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
answer_synchrony_6 = ""  # your answer: one letter, "a" to "d"
### BEGIN SOLUTION
answer_synchrony_6 = "d"
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "synchrony_6_check", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_answer("answer_synchrony_6", answer_synchrony_6, choices="abcd")
### BEGIN HIDDEN TESTS
check_answer(
    "answer_synchrony_6",
    answer_synchrony_6,
    choices="abcd",
    key="d",
    explanation="""
    With b = 1 a step goes on at the 63rd gradient to arrive. If one rank pauses, its gradient
    is the one dropped and the step runs clean; if two or more pause, the 63rd gradient is a
    paused rank's and the step takes twice as long, as it would without the backup. Measured
    with the model backup step of exercise 3 on 4 ranks, the late ranks starting half a second
    late: with one late rank, one backup kept ranks 0, 1 and 2 and never took its gradient;
    with two late, one backup had to keep one of them (rank 0 needs two gradients besides its
    own, and only rank 1's came early), and two backups kept 0 and 1 alone. Over 64 ranks no
    rank pauses with probability (63/64)^64 = 0.365, exactly one with 64 x 1/64 x (63/64)^63 =
    0.371, so a step is slow with probability 0.264 and lasts 1.264 times a clean one on
    average, against 1.635 without the backup. a) one backup absorbs one pause, and 26% of
    the steps have more. b) is 63 ranks without a backup, slow whenever any of them pauses;
    with the backup the 64th rank is there to be dropped. c) ranks that pause in the same step
    pause at the same time: the step waits for the slowest kept rank, it does not add up the
    delays (which would give 1 + 0.365). Chen et al. keep b at about 5% of the workers: enough
    for the few stragglers of a typical step, a small share of each batch lost.
    """,
    giveaways=(
        r"1\.264 times",
        r"slow with probability 0\.264",
        r"waits only when two ranks or more pause",
    ),
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "synchrony_6_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it.** When each rank's gradient was ready, step by step, in the run above (rank 3
# at 1.5 times the others' compute; ms from the step's start), and when the step could go on
# with no backup and with one: `stragglers.backup_step(ready, b)` plays a step with b backups
# on those times, and `straggler_run` takes a list of slow ranks too (`slow_rank=[2, 3]`).

# %% nbgrader={"grade": false, "grade_id": "synchrony_6_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
for step, ready in enumerate(stragglers.arrivals(spans)):
    goes_on = [stragglers.backup_step(ready, b)["seconds"] * 1e3 for b in (0, 1)]
    print(f"step {step}: " + "  ".join(f"rank {r} {t * 1e3:3.0f}" for r, t in enumerate(ready)),
          f"| goes on at {goes_on[0]:3.0f} with b = 0, {goes_on[1]:3.0f} with b = 1")

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
# ranks 0 to 2 should finish long before rank 3 starts. The barrier at the end keeps every
# rank alive until the straggler has its result (the checks do the same after each step).

# %% tags=["raises-exception"] nbgrader={"grade": false, "grade_id": "try_backups", "locked": true, "schema_version": 3, "solution": false, "task": false}
# %%ranks 4 --timeout 20
import time

from course.lessons.synchrony import say_if_unimplemented

say_if_unimplemented(step_with_backups)
start = time.monotonic()
if rank == 3:
    time.sleep(0.5)
grad = torch.full((4,), float(rank))
kept = step_with_backups(grad, backups=1)
print(f"kept {kept}, mean {grad.tolist()}, step ended at +{time.monotonic() - start:.2f} s")
dist.barrier()  # before the cell ends: gloo drops the sends still in flight when a rank exits

# %% nbgrader={"grade": true, "grade_id": "step_with_backups_check", "locked": true, "points": 4, "schema_version": 3, "solution": false, "task": false}
# Kept ranks agreed, the straggler dropped, the right mean everywhere, nobody waited for it.
print(check_step_with_backups(step_with_backups, world_sizes=(3,)))
### BEGIN HIDDEN TESTS
print(check_step_with_backups(step_with_backups))
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "part_5_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 5. What N ranks do to the batch
#
# Under DDP each rank takes its own batch from its own shard of the data, and the ranks
# average their gradients before every optimizer step: N ranks with B samples each take a
# step on N B samples. A job that moves to more ranks chooses what to keep, the batch per
# rank or the batch of the step, and with it the learning rate.

# %% [markdown] nbgrader={"grade": false, "grade_id": "synchrony_7_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Question synchrony_7: the same global batch on more ranks
#
# *Difficulty 2/3*
#
# A job trains for 4 epochs on 1 rank with a batch of 16 and learning rate 0.2 (the model,
# data and seed of `course.lessons.synchrony.batch_size`). It moves to 4 ranks and keeps the batch
# of each step at 16: a batch of 4 on every rank, rank r taking samples r, r + 4, r + 8, ...
# (DDP averages their gradients), the same 4 epochs, the same learning rate. Compared with 1
# rank, its loss after 4 epochs is:
#
# * a) Higher: each step averages 4 small batches, a noisier gradient.
# * b) Lower: the 4 ranks take 4 times as many steps in the 4 epochs.
# * c) The same, to rounding: each step is 1 rank's step on 16 samples.
# * d) Higher: DDP's mean over 4 ranks makes every step 4 times shorter.
#
# Set `answer_synchrony_7` to your letter and run the cell below it.

# %% nbgrader={"grade": false, "grade_id": "synchrony_7_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
answer_synchrony_7 = ""  # your answer: one letter, "a" to "d"
### BEGIN SOLUTION
answer_synchrony_7 = "c"
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "synchrony_7_check", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_answer("answer_synchrony_7", answer_synchrony_7, choices="abcd")
### BEGIN HIDDEN TESTS
check_answer(
    "answer_synchrony_7",
    answer_synchrony_7,
    choices="abcd",
    key="c",
    explanation="""
    At step k rank r takes samples 16k + r, 16k + r + 4, 16k + r + 8 and 16k + r + 12, so the 4
    ranks together take samples 16k to 16k + 15: the very batch 1 rank takes at step k. Each rank's loss is the
    mean over its 4 samples and DDP averages the 4 ranks' gradients, so the step's gradient is
    the mean over the 16 samples, the gradient 1 rank computes, and the step count is the same
    (256 samples per rank in batches of 4: 64 steps, as 1024 in batches of 16). Measured: the
    two loss curves agree to 5 decimals, 0.83371, 0.0985, 0.06031, 0.0376, 0.02663; only the
    order of the additions differs. a) the average of 4 means of 4 is the mean of 16, no
    noisier. b) each rank has a quarter of the data, so the steps per epoch stay 64. d) DDP
    divides the sum of 4 gradients by 4: the mean, not a shorter step. What changes with N is
    what one rank computes per step, not the training: data parallelism with the global batch
    kept is the same SGD, done faster. Keeping the batch per rank instead grows the global
    batch N-fold, with N times fewer steps per epoch, and that is where the learning rate
    must change.
    """,
    giveaways=(
        r"agree to 5 decimals",
        r"0\.83371, 0\.0985",
        r"the very batch 1 rank takes",
    ),
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "synchrony_7_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it**, on 1 and 2 ranks: the same 2-layer MLP, data and seed, a batch of 16 per
# rank, 4 epochs, with the learning rate kept, scaled by N, and scaled after a warmup
# (`course.lessons.synchrony.batch_size`; `sweep` takes `batch_per_rank=` and `lr=` too); the loss
# over the whole data set before training and after each epoch.

# %% nbgrader={"grade": false, "grade_id": "synchrony_7_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
from course.lessons.synchrony import batch_size

curves = batch_size.sweep(world_sizes=(1, 2))
for (n, rule), losses in curves.items():
    print(f"N = {n}, {rule:15}", "  ".join(f"{x:.3f}" for x in losses))
picture.loss_curves_figure(curves)

# %% [markdown] nbgrader={"grade": false, "grade_id": "synchrony_8_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Question synchrony_8: why warmup works
#
# *Difficulty 3/3*
#
# From a learning rate of 0.5 on 1 rank with a batch of 16, the linear scaling rule (Goyal et
# al., 2017) gives 4 ranks of 16 each a rate of 2.0, and at 2.0 from the first step the loss
# climbs far above its start in the first epoch (the cell below). Goyal et al. **warm up**:
# the rate rises linearly from 0.5 to 2.0 over the first epoch (16 steps) and stays there.
# On this model and data that removes the climb, and the loss ends near 1 rank's. Which
# explains why?
#
# * a) The batch of 64 is noisy at first, and small steps average the noise out.
# * b) DDP's first steps average the ranks' gradients badly; warmup waits it out.
# * c) 2.0 overshoots from the random start; once the loss is down, it is safe.
# * d) Warmup lowers the mean rate to about 1.8, and 1.8 from the start would do too.
#
# Set `answer_synchrony_8` to your letter and run the cell below it.

# %% nbgrader={"grade": false, "grade_id": "synchrony_8_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
answer_synchrony_8 = ""  # your answer: one letter, "a" to "d"
### BEGIN SOLUTION
answer_synchrony_8 = "c"
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "synchrony_8_check", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
check_answer("answer_synchrony_8", answer_synchrony_8, choices="abcd")
### BEGIN HIDDEN TESTS
check_answer(
    "answer_synchrony_8",
    answer_synchrony_8,
    choices="abcd",
    key="c",
    explanation="""
    Measured, seed 0: at 2.0 from the first step the loss went from 0.834 to 14.5 in the first
    epoch (where it ended after that depends on the last bits of the CPU's sums: a run
    thrown that far is chaotic); warmed up, it was 0.163 after the first epoch and then fell at
    2.0 for three epochs, to 0.034. The same rate that blew up from the random start was safe
    once the weights were past it: far from any minimum the gradients are large and the
    curvature unknown, and a step 4 times the one that worked on 1 rank overshoots. a) noise is
    not it: with the whole data set as one batch (no noise at all) a step of 2.0 took the loss
    from 0.834 to 7.42. b) DDP is not it: 1 rank with a batch of 64 at 2.0, no averaging at all,
    rose as high, to 14.5 after the first epoch. d) a constant 1.82, the warmup's mean
    rate over the 4 epochs, still climbed above the start (0.97 after the first epoch) and
    ended above warmup's 0.034. Warmup is insurance, not a cure: at 8 ranks (a rate
    of 4.0) the warmed-up run diverged too, which is why large-batch training adds tricks
    such as LARS.
    """,
    giveaways=(
        r"14\.5 in the first",
        r"from 0\.834 to 7\.42",
        r"safe\s+once the weights were past it",
    ),
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "synchrony_8_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it**, without the warmup: 4 ranks at 4 x 0.5 = 2.0 from the first step, against 1
# rank at 0.5. `sweep` takes the rule `"lr x N, warmup"`, `batch_per_rank=`, `epochs=` and
# `lr=`: each of the four explanations above can be put to a run of its own.

# %% nbgrader={"grade": false, "grade_id": "synchrony_8_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
cold = batch_size.sweep(world_sizes=(1, 4), rules=("lr x N",), lr=0.5)
for (n, rule), losses in cold.items():
    print(f"N = {n}, lr {0.5 * n:g}:", "  ".join(f"{x:.3f}" for x in losses))

# %% [markdown] nbgrader={"grade": false, "grade_id": "part_6_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 6. Reading a bandwidth figure
#
# Benchmarks of collectives (nccl-tests, and the ring assignment's own) print two bandwidths
# for one run: the algorithm bandwidth, the tensor's size over the time, and the bus
# bandwidth. The last question is about the second.

# %% [markdown] nbgrader={"grade": false, "grade_id": "synchrony_9_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Question synchrony_9: bus bandwidth
#
# *Difficulty 2/3*
#
# Your ring all-reduce of an 800 MB gradient on 8 ranks takes 2.0 s, and nccl-tests prints for
# it an algorithm bandwidth algbw = 800 MB / 2.0 s = 0.4 GB/s, and a bus bandwidth busbw. The
# job moves to 64 ranks on links of the same kind, one per rank, and the bytes still rule the
# time. What does nccl-tests print for the same 800 MB there?
#
# * a) algbw 0.36 GB/s, busbw 0.7 GB/s: each link moves 1.97 S, at its rate.
# * b) algbw 0.4 GB/s, busbw 0.79 GB/s: the ring takes 2.0 s on any N.
# * c) algbw 0.05 GB/s, busbw 0.1 GB/s: 8 times the ranks, 8 times the time.
# * d) algbw 0.4 GB/s, busbw 0.7 GB/s: the links fix both figures.
#
# Set `answer_synchrony_9` to your letter and run the cell below it.

# %% nbgrader={"grade": false, "grade_id": "synchrony_9_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
answer_synchrony_9 = ""  # your answer: one letter, "a" to "d"
### BEGIN SOLUTION
answer_synchrony_9 = "a"
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "synchrony_9_check", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
check_answer("answer_synchrony_9", answer_synchrony_9, choices="abcd")
### BEGIN HIDDEN TESTS
check_answer(
    "answer_synchrony_9",
    answer_synchrony_9,
    choices="abcd",
    key="a",
    explanation="""
    busbw = algbw x 2(N-1)/N is what each rank's link carried over the time: on 8 ranks 1.75 x
    800 MB in 2.0 s, 0.7 GB/s (measured: gloo's all-reduce on 8 ranks put 1.75 times the tensor
    on each rank's link, the kernel's TCP counters say). On 64 ranks each link carries
    2 x 63/64 = 1.97 times 800 MB, 1575 MB; at the same 0.7 GB/s that takes 2.25 s, so algbw is
    800 MB / 2.25 s = 0.36 GB/s and busbw again 0.7 GB/s. That is why benchmarks print busbw:
    it stays with the links as N grows, where algbw falls towards half of it. b) a ring's time
    does grow with N, a little: its bytes per rank go from 1.75 S to 1.97 S. c) the ranks share
    the work, each on its own link: the bytes per link do not grow with N. d) busbw / algbw is
    2(N-1)/N, 1.97 on 64 ranks, so the two cannot both stay. (The cell's busbw does not stay
    put as N grows, because its ranks share this machine's two cores and its loopback, so the
    time moves with N for reasons of its own; a cluster's ranks have links and cores of their
    own.)
    """,
    giveaways=(
        r"that takes 2\.25 s",
        r"1575 MB",
        r"busbw again 0\.7",
    ),
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "synchrony_9_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it**, for gloo's all-reduce of 4 MB on 2, 3 and 4 ranks: the time, algbw = S / t and
# busbw as nccl-tests computes it. The ranks here share this machine's cores.

# %% nbgrader={"grade": false, "grade_id": "synchrony_9_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
rows = latency.bandwidth_by_world_size(2**20, (2, 3, 4))  # 2**20 float32 = 4 MB
for n, row in rows.items():
    print(f"N = {n}: {row['seconds'] * 1e3:5.1f} ms, algbw {row['algbw'] / 1e9:.2f} GB/s, "
          f"busbw {row['busbw'] / 1e9:.2f} GB/s")

# %% [markdown] nbgrader={"grade": false, "grade_id": "closing", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## What you measured
#
# * **One message**: its fixed cost alpha and its cost per byte beta, fitted from 1 KB to
#   64 MB; and the bytes a ring all-reduce puts on each rank's wire on 2 to 4 ranks.
# * **Your recursive doubling** against a ring, timed from 1 KB to 32 MB, under the model.
# * **Bytes between nodes**: gloo's flat ring, and your two-level all-reduce on subgroups.
# * **A straggler** under DDP, each rank's timeline, and your step that drops it.
# * **The batch**: loss curves on 1 and more ranks with the learning rate kept, scaled, and
#   warmed up; and bus bandwidth against algorithm bandwidth.
#
# How these carry to a real cluster. The bytes (the hierarchy's and the ring's, and the
# checks' patterns) and the training curves do not depend on the machine. The timings do:
# here every rank is a process on one machine whose cores the ranks share, every link is
# loopback TCP, and ranks take turns on the CPU. On a real network alpha is smaller, the
# links run in parallel, and no rank waits for a core. The explanations of the questions
# come with your feedback.
