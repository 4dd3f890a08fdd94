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

from course.checks import (
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
from course.experiments import latency
from course.pictures import synchrony as pictures

times = latency.pingpong()  # one-way seconds per message size, 2 ranks, the fastest of many
alpha, beta = latency.fit_alpha_beta(list(times), list(times.values()))
print(f"alpha = {alpha * 1e6:.0f} us per message, 1/beta = {1 / beta / 1e9:.2f} GB/s")
pictures.alpha_beta_figure(times, alpha, beta)

# %% [markdown] nbgrader={"grade": false, "grade_id": "synchrony_1_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Question synchrony_1: half the bandwidth
#
# *Difficulty 2/3*
#
# A message of n bytes moves at n / t(n) = n / (alpha + n beta), which climbs towards the peak
# 1/beta as n grows. At what size does a message reach **half** of that peak?
#
# * a) At n = alpha / beta: there the fixed cost and the bytes take equal time.
# * b) At n = 2 alpha / beta: there the bytes take twice the fixed cost's time.
# * c) At about 1 KB: below that size every message costs alpha, whatever it holds.
# * d) At half the largest size measured, where the fitted line turns flat.
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
    Half the peak means n / (alpha + n beta) = 1 / (2 beta), that is alpha + n beta = 2 n beta, so
    n = alpha / beta: the size whose bytes take as long as the fixed cost (n one-half, in the
    parallel-computing literature). b) n = 2 alpha / beta is where the bytes take 2/3 of the
    time: two thirds of the peak. c) a message's share of the peak is n / (n + alpha / beta),
    a half at 1 KB only if alpha / beta were 1 KB, and over loopback TCP it is far larger (the
    cell prints it). d) half of the largest size, far above alpha / beta, comes close to the
    whole peak in the model, not to half of it. What the cell prints are measurements against
    a fit, and both move with the machine and its load: the share at alpha / beta can land away
    from 0.5, and a size can even print above 1, for 1/beta is the fitted line's slope, not a
    ceiling. Below alpha / beta a message is latency-bound, above it bandwidth-bound: gradients
    of megabytes are the second kind, a 256 B control message the first. Real networks have a
    much smaller alpha (a few us on InfiniBand) and a larger 1/beta (tens of GB/s), which puts
    their half-bandwidth size at tens of KB or more.
    """,
    giveaways=(
        r"n\s*1/2",
        r"n one-half",
        r"alpha \+ n beta = 2 n beta",
    ),
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "synchrony_1_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it.** The bandwidth each message size reached in the cell above, as a share of the
# fitted peak 1/beta. Where does it cross one half, and how does that size compare with
# alpha / beta?

# %% nbgrader={"grade": false, "grade_id": "synchrony_1_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
print(f"alpha / beta = {alpha / beta / 1024:.0f} KB")
for size, seconds in times.items():
    print(f"{size / 1024:8.0f} KB  {seconds * 1e6:8.1f} us  {size / seconds * beta:5.2f} of 1/beta")

# %% [markdown] nbgrader={"grade": false, "grade_id": "synchrony_2_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Question synchrony_2: a tiny all-reduce
#
# *Difficulty 3/3*
#
# A ring all-reduce on N ranks is 2(N-1) steps one after another, so the alpha-beta model puts
# a tiny one (256 bytes: the bytes cost nothing) at about 2(N-1) alpha, with alpha the fixed
# cost of one message you fitted above. On 4 gloo ranks on this machine, measured, a 256 B
# `dist.all_reduce` takes:
#
# * a) About 1 alpha: the tensor is so small that one message carries it all.
# * b) About 2 alpha: a tiny all-reduce is done in log2 N exchanges, not a ring.
# * c) About 6 alpha: one message time for each of the 2(N-1) steps of the ring.
# * d) More than 15 alpha: each call costs far more than its messages' alpha.
#
# Set `answer_synchrony_2` to your letter and run the cell below it.

# %% nbgrader={"grade": false, "grade_id": "synchrony_2_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
answer_synchrony_2 = ""  # your answer: one letter, "a" to "d"
### BEGIN SOLUTION
answer_synchrony_2 = "d"
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "synchrony_2_check", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
check_answer("answer_synchrony_2", answer_synchrony_2, choices="abcd")
### BEGIN HIDDEN TESTS
check_answer(
    "answer_synchrony_2",
    answer_synchrony_2,
    choices="abcd",
    key="d",
    explanation="""
    Measured, a 256 B call takes more than 15 alpha on 4 ranks, and more than the model's 2 on 2
    ranks (how many more varies with the machine and its load): the model of messages leaves
    out what a call costs on its own. Every collective call on gloo queues work for gloo's
    threads, sets up its algorithm and its buffers, and where ranks outnumber cores (4 ranks on
    2 cores, say) its steps also wait for each other's turn on the CPU: each call pays a fixed
    cost of many alphas before any byte matters. So c) is the model's answer, and the
    measurement is several times over it; a) and b) are below even the model: one message
    cannot carry a sum over 4 ranks, and the log2 N = 2 exchanges of a tree would be 2 alpha.
    This per-call cost is what DDP's buckets amortize (the buckets assignment), and what makes
    small all-reduces latency-bound even where the network is fast. On GPUs with NCCL the fixed
    cost of a call is a few microseconds to tens of them, and NCCL picks a tree or a
    low-latency protocol for small messages; the lesson carries: measure the cost of a call,
    not of a message.
    """,
    giveaways=(
        r"more than the model's 2",
        r"fixed\s+cost of many alphas",
        r"per-call cost",
    ),
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "synchrony_2_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it**, on 2 ranks, where a ring all-reduce is 2(N-1) = 2 steps: gloo's all-reduce of
# 64 float32 (256 bytes), the fastest of 21 calls, in units of the alpha fitted above. Try
# `world_size=3` and 4 too.

# %% nbgrader={"grade": false, "grade_id": "synchrony_2_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
tiny = latency.allreduce_times([64], repeats=21, world_size=2)[64]
print(f"256 B all-reduce on 2 ranks: {tiny * 1e6:.0f} us = {tiny / alpha:.1f} alpha")

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
# On N = 4 ranks recursive doubling takes log2 4 = 2 steps, each sending the whole tensor of S
# bytes; the ring takes 2(N-1) = 6 steps of S/4. With t = alpha + n beta per message, up to what
# size S does the alpha-beta model say recursive doubling is the faster of the two?
#
# * a) Up to S = alpha / beta, where one message turns bandwidth-bound.
# * b) Up to S = 8 alpha / beta; above it the ring's fewer bytes win.
# * c) Up to S = 2 alpha / beta; the 4 fewer steps save 4 alpha at most.
# * d) At every S: with 2 steps against 6 it is faster whatever S is.
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
    The tree costs 2 (alpha + S beta) = 2 alpha + 2 S beta; the ring 6 (alpha + S beta / 4) = 6 alpha
    + 1.5 S beta. They are equal where 4 alpha = 0.5 S beta, at S = 8 alpha / beta: 1 to 3 MB with
    the alpha and beta fitted here (the crossover figure after exercise 1 marks it). In general
    S* = alpha (2(N-1) - log2 N) / (beta (log2 N - 2(N-1)/N)), 8.8 alpha / beta on 8 ranks.
    Measured with the model tree and ring (both Python point-to-point code) on 4 ranks, the tree
    was 1.9 to 6 times faster over 1 to 64 KB (the median; one small size alone varies, a
    call's fixed cost dominating there) and the ring 1.1 to 2.6 times faster at 16 and 32 MB;
    the crossover fell between 1 and 32 MB, most often at 4 MB, at or above the model's,
    because each of the ring's 6 dependent steps costs more than alpha here (question
    synchrony_2). a) alpha /
    beta is where one message reaches half its bandwidth, not where the two algorithms tie. c)
    saving 4 alpha is right, but the tree also sends 0.5 S more per rank, and the two balance at
    8 alpha / beta, not 2. d) the tree sends 2 S per rank against the ring's 1.5 S, so large
    tensors favour the ring. This is why MPI and NCCL switch algorithms by message size.
    """,
    giveaways=(
        r"8 alpha / beta",
        r"4 alpha = 0\.5 S beta",
        r"S\s*=\s*8\s*alpha",
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

from course.checks.teaching import not_implemented


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
    display(pictures.crossover_figure(by_bytes, alpha, beta, world_size=4))

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
# ## Question synchrony_4: bytes between the nodes
#
# *Difficulty 2/3*
#
# Eight ranks on two nodes: ranks 0 to 3 on one, 4 to 7 on the other. Each rank all-reduces S
# bytes. How many bytes does the **busiest link between the two nodes** carry, in one direction,
# with gloo's flat ring over all 8 ranks, and with the two-level all-reduce (reduce-scatter in
# the node, all-reduce of the shard across, all-gather in the node)?
#
# * a) Flat 1.75 S, on one link; two-level 0.25 S, on each of four links.
# * b) Flat 0.25 S, on each of four links; two-level 1.75 S, on one link.
# * c) 1.75 S either way: the full sum must cross between the nodes once.
# * d) Flat 7 S: each of 4 ranks sends its 1.75 S across; two-level 1 S.
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
    The flat ring is one cycle through all 8 ranks, and only two of its links cross between the
    nodes, one each way (gloo's ring sends its data to rank - 1: rank 4 to rank 3 and rank 0 to
    rank 7); each carries what any ring link carries, 2(N-1)/N S = 1.75 S. Measured with S = 1
    MiB: 1.7526 S on each of those two links (gloo's own bookkeeping adds 0.3%); besides, every
    rank sends 1344 bytes to rank + 1, which crosses only from rank 3 to 4 and from 7 to 0, and
    ranks 1, 2, 5 and 6 send nothing to the other node. The two-level scheme sends between
    nodes only the all-reduce of each shard of S/4, among 2 ranks (one per node): 2(2-1)/2 x
    S/4 = 0.25 S from every rank, on four links at once (measured 0.2505 S). b) swaps the two.
    c) the ring does not send the sum across once: its link between the nodes carries every
    step's chunk, 14 of them. d) counts every rank's traffic as crossing, but 6 of the flat
    ring's 8 links stay inside a node. With links between nodes 10 times slower than inside,
    the busiest link decides: fed with the bytes measured, each phase run alone and the three
    in turn, the flat ring takes 1.75 / (0.1 x 1.5 + 0.25 + 0.1 x 0.75) = 3.7 times as long as
    the two-level scheme (gloo's reduce-scatter sends an all-reduce's 1.5 S, question zero_1,
    its all-gather 0.75 S), and 1.75 / 0.4 = 4.4 times with a ring's reduce-scatter of 0.75 S,
    as NCCL's (4.3 in course.ring.hierarchy's model, which adds 10 us to every step). A real
    cluster's nodes have a network card per accelerator or two, so the four links exist; NCCL
    builds its rings node by node for this reason.
    """,
    giveaways=(
        r"1\.7526",
        r"0\.2505",
        r"only two of its links cross",
    ),
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "synchrony_4_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it**, on 4 ranks seen as 2 nodes of 2 (ranks 0 and 1, ranks 2 and 3): the bytes each
# rank's TCP sockets sent to the other node during gloo's flat all-reduce of 1 MiB
# (`course.ring.wire.WireMeter`, as in the ring assignment), in units of the tensor's size.
# How many links cross, and what does each carry?

# %% nbgrader={"grade": false, "grade_id": "synchrony_4_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
from course.experiments import hierarchy


def flat(tensor):
    dist.all_reduce(tensor)


sent = run(hierarchy.peer_traffic, 4, flat, 2**18)  # 2**18 float32 = 1 MiB on every rank
across = hierarchy.crossing_bytes(sent, ranks_per_node=2)
print("sent to the other node, per rank, in tensors:", [round(b / 2**20, 4) for b in across])

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

# %% nbgrader={"grade": false, "grade_id": "try_hierarchical", "locked": true, "schema_version": 3, "solution": false, "task": false}
# %%ranks 4 --timeout 20
from course.checks.teaching import say_if_unimplemented

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
# ## Question synchrony_5: one slow rank
#
# *Difficulty 1/3*
#
# Four ranks train with DDP. Rank 3's forward and backward take twice as long as the other
# ranks' (a slower chip, say); everything else is the same. What happens to each rank's time
# per step?
#
# * a) Only rank 3's step is slower: the others go on at their own pace.
# * b) Every step takes the ranks' average time: DDP evens the work out.
# * c) DDP drops rank 3's gradient when it is late and steps without it.
# * d) Every rank's step takes as long as rank 3's: the rest wait for it.
#
# Set `answer_synchrony_5` to your letter and run the cell below it.

# %% nbgrader={"grade": false, "grade_id": "synchrony_5_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
answer_synchrony_5 = ""  # your answer: one letter, "a" to "d"
### BEGIN SOLUTION
answer_synchrony_5 = "d"
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "synchrony_5_check", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
check_answer("answer_synchrony_5", answer_synchrony_5, choices="abcd")
### BEGIN HIDDEN TESTS
check_answer(
    "answer_synchrony_5",
    answer_synchrony_5,
    choices="abcd",
    key="d",
    explanation="""
    A synchronous step cannot end before the all-reduce of every rank's gradients, so the fast
    ranks finish their backward, enter the all-reduce and wait there for rank 3. Measured on 4
    ranks with compute emulated by a sleep (so that the 2 shared cores do not blur it): 35 to 44
    ms per step with equal ranks; with rank 3 at twice the compute, every rank's step took 64 to
    70 ms, and the fast ranks spent 32 to 38 ms of it waiting in the all-reduce, rank 3 only 3
    to 8 ms. a) would need the fast ranks to step without rank 3's gradient, which DDP never
    does. b) DDP moves no work between ranks. c) DDP has no deadline of its own: it waits until
    the process group's timeout fails the collective, 30 minutes by default on gloo
    (torch.distributed.default_pg_timeout) and 10 on NCCL. The slowest rank sets the
    pace: one straggler in a thousand ranks slows all thousand, which is what backup workers
    (the next question) and elastic, asynchronous methods try to avoid.
    """,
    giveaways=(
        r"64 to\s+70 ms",
        r"wait there for rank 3",
        r"slowest rank sets the\s+pace",
    ),
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "synchrony_5_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it**, with rank 3 at 1.5 times the others' compute (the question asks about 2): six
# DDP steps on 4 ranks, a small model whose forward sleeps for the compute, so that the 2 shared
# cores do not blur the timing (`course.experiments.stragglers`). The figure is each rank's
# timeline: compute, then waiting in the all-reduce.

# %% nbgrader={"grade": false, "grade_id": "synchrony_5_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
from course.experiments import stragglers

spans = stragglers.straggler_run(4, slow_rank=3, slowdown=1.5)
print("step, ms:      ", [round(t * 1e3) for t in stragglers.step_seconds(spans)])
print("waiting, ms:   ", [round(t * 1e3) for t in stragglers.waiting_seconds(spans)])
pictures.timeline_figure(spans)

# %% [markdown] nbgrader={"grade": false, "grade_id": "synchrony_6_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Question synchrony_6: backup workers
#
# *Difficulty 2/3*
#
# With **backup workers** (Chen et al., 2016) a step on N ranks uses the first N - b gradients to
# arrive and drops the other b. Four ranks, b = 1, and rank 3 computes twice as long as the
# others, as in the last question. What does a step then cost, and what does it average?
#
# * a) The time of the third gradient to arrive; the mean of those 3 gradients.
# * b) Rank 3's time, as before; the mean of the 3 gradients that came first.
# * c) The time of the third gradient to arrive; the mean of 4, rank 3 as zero.
# * d) The time of the first gradient to arrive; the mean of those that are in.
#
# Set `answer_synchrony_6` to your letter and run the cell below it.

# %% nbgrader={"grade": false, "grade_id": "synchrony_6_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
answer_synchrony_6 = ""  # your answer: one letter, "a" to "d"
### BEGIN SOLUTION
answer_synchrony_6 = "a"
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "synchrony_6_check", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_answer("answer_synchrony_6", answer_synchrony_6, choices="abcd")
### BEGIN HIDDEN TESTS
check_answer(
    "answer_synchrony_6",
    answer_synchrony_6,
    choices="abcd",
    key="a",
    explanation="""
    The step waits for N - b = 3 arrivals, so it ends when the third one is in, and it averages
    what it kept: the sum of 3 gradients over 3 (dividing by 4 would shrink the step by a
    quarter, c). From the arrivals measured in the straggler cell (rank 3's gradient ready about
    twice as late as the others'), one backup put the step at the third arrival, 32 to 33 ms
    against the 64 to 70 ms of waiting for all four, and dropped rank 3 at every step; the model
    backup step of exercise 3, run with a straggler half a second late, let every other rank
    finish its step in under a quarter of a second, every rank with the mean of the three. b) is the cost without backups: the point of
    dropping the last gradient is not to wait for it. d) waits for one gradient only, b = 3: the
    batch shrinks to a quarter. The price of backups: each step's batch is (N - b)/N of the full
    one, and the dropped rank's compute is wasted, so b is kept small (Chen et al. used about 5%
    of the workers).
    """,
    giveaways=(
        r"32 to\s+33 ms",
        r"ends when the third one is in",
        r"sum of 3 gradients over 3",
    ),
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "synchrony_6_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it.** When each rank's gradient was ready, step by step, in the run above (ms from
# the step's start). With one backup, which gradient would each step wait for, and with two?

# %% nbgrader={"grade": false, "grade_id": "synchrony_6_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
for step, ready in enumerate(stragglers.arrivals(spans)):
    print(f"step {step}: " + "  ".join(f"rank {r} {t * 1e3:3.0f}" for r, t in enumerate(ready)))

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

# %% nbgrader={"grade": false, "grade_id": "try_backups", "locked": true, "schema_version": 3, "solution": false, "task": false}
# %%ranks 4 --timeout 20
import time

from course.checks.teaching import say_if_unimplemented

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
# With a fixed batch of B samples per rank, N ranks average N B samples' gradients: the
# global batch grows N-fold. One epoch is then N times fewer optimizer steps.

# %% [markdown] nbgrader={"grade": false, "grade_id": "synchrony_7_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Question synchrony_7: more ranks, same learning rate
#
# *Difficulty 2/3*
#
# A job trains for 4 epochs on 1 rank with a batch of 16 and learning rate 0.2. It moves to 4
# ranks, each still taking a batch of 16 (DDP averages their gradients), for the same 4 epochs
# and the same learning rate. Compared with 1 rank, its loss after 4 epochs is:
#
# * a) The same: each sample is seen as often as before; keep the rate.
# * b) Lower: the 4 times larger batch is less noisy; keep the rate.
# * c) Higher: 4 times fewer steps of the same size; scale the rate by 4.
# * d) Diverged: the mean over 4 ranks makes steps 4 times longer; divide it.
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
    The global batch is 4 x 16 = 64, so an epoch is 4 times fewer optimizer steps, and each step,
    an average, is no longer than one rank's: the same distance per step, a quarter of the steps.
    Measured (a 2-layer MLP on fixed synthetic data, final loss after 4 epochs, same learning
    rate): 0.027 on 1 rank, 0.046 on 2, 0.085 on 4, 0.142 on 8. The linear scaling rule (Goyal et
    al., 2017: multiply the learning rate by N) took every N back to 1 rank's loss or below:
    0.027, 0.025, 0.025, 0.016. a) seeing each sample as often is not the same as taking as many
    steps. b) a less noisy gradient helps per step, but does not make up for 4 times fewer
    steps here. d) averaging does not lengthen the step: DDP divides the sum by N. The rule has a
    limit: at 8 ranks from a learning rate of 0.5 (4.0 after scaling) training diverged, and the
    next question looks at warmup.
    """,
    giveaways=(
        r"0\.085 on 4",
        r"a quarter of the steps",
        r"0\.027, 0\.025, 0\.025",
    ),
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "synchrony_7_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it**, on 1 and 2 ranks (the question asks about 4): the same 2-layer MLP, data and
# seed, a batch of 16 per rank, 4 epochs, with the learning rate kept, scaled by N, and scaled
# after a warmup (`course.experiments.batch_size`); the loss over the whole data set before
# training and after each epoch.

# %% nbgrader={"grade": false, "grade_id": "synchrony_7_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
from course.experiments import batch_size

curves = batch_size.sweep(world_sizes=(1, 2))
for (n, rule), losses in curves.items():
    print(f"N = {n}, {rule:15}", "  ".join(f"{x:.3f}" for x in losses))
pictures.loss_curves_figure(curves)

# %% [markdown] nbgrader={"grade": false, "grade_id": "synchrony_8_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Question synchrony_8: warmup
#
# *Difficulty 3/3*
#
# From a learning rate of 0.5 on 1 rank, the linear rule gives 4 ranks a rate of 2.0. Goyal et
# al. (2017) do not start at the scaled rate: they **warm up**, raising it linearly from the
# unscaled rate over the first epochs. On the model and data of the last question (4 ranks,
# 4 epochs, the same seed), what does a one-epoch warmup to 2.0 change?
#
# * a) Nothing: the first epoch's spike comes back once the rate is 2.0.
# * b) It makes it worse: its small early steps leave the spike for later.
# * c) It does not help: the spike comes from the batch, not from the rate.
# * d) It stops the first epoch's spike, and the loss ends near one rank's.
#
# Set `answer_synchrony_8` to your letter and run the cell below it.

# %% nbgrader={"grade": false, "grade_id": "synchrony_8_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
answer_synchrony_8 = ""  # your answer: one letter, "a" to "d"
### BEGIN SOLUTION
answer_synchrony_8 = "d"
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "synchrony_8_check", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
check_answer("answer_synchrony_8", answer_synchrony_8, choices="abcd")
### BEGIN HIDDEN TESTS
check_answer(
    "answer_synchrony_8",
    answer_synchrony_8,
    choices="abcd",
    key="d",
    explanation="""
    Measured, seed 0: at 2.0 from the first step the loss went from 0.834 to 14.5 in the first
    epoch and ended at 0.804, 30 times 1 rank's 0.024; warmed up over the first epoch (16 steps)
    it went 0.834, 0.163, ... and ended at 0.034. At the start the weights are far from any
    minimum and the gradients are large: a step 4 times longer than the one that worked on 1 rank
    overshoots, and from there training may not recover within the epochs it has. Once the loss
    has come down, the scaled rate is safe: a) once the rate reached 2.0 the loss was 0.163 and
    falling, and no spike came, then or later (b); warmup's early steps are as long as 1
    rank's, which worked. c) the same batch of 64 at the warmed-up rate did not spike. Warmup is insurance: with data
    seed 1 the scaled rate did not spike at all and warmup ended a little higher (0.048 against
    0.018), and at 8 ranks (a rate of 4.0) both diverged: the linear rule stops working at some
    batch size, which is why large-batch training adds tricks such as LARS.
    """,
    giveaways=(
        r"14\.5",
        r"0\.834, 0\.163",
        r"Warmup is insurance",
    ),
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "synchrony_8_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it**, without the warmup: 4 ranks at 4 x 0.5 = 2.0 from the first step, against 1
# rank at 0.5. What would a warmup have to change in the first epoch?

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
# *Difficulty 1/3*
#
# Your ring all-reduce of an 800 MB gradient on 8 ranks takes 2.0 s. nccl-tests prints, for
# it, an algorithm bandwidth algbw = 800 MB / 2.0 s = 0.4 GB/s and a **bus bandwidth** busbw.
# What busbw does it print?
#
# * a) 0.7 GB/s: what each rank's link carried, 1.75 x 800 MB, over 2 s.
# * b) 0.4 GB/s: for an all-reduce bus and algorithm bandwidth are the same.
# * c) 3.2 GB/s: the bytes all 8 ranks handed in, 8 x 800 MB, over 2 s.
# * d) 0.8 GB/s: every byte is sent twice, once to sum it, once to share it.
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
    busbw = algbw x 2(N-1)/N for an all-reduce: 0.4 x 14/8 = 0.7 GB/s, the bytes each rank's link
    really carried (1400 MB, question ring_2) over the time. It is the figure to set against a
    link's speed, because it does not fall with N as algbw does for a ring on the same links.
    Measured on this machine for a 4 MB all-reduce, over several runs: algbw on 4 ranks was
    0.26 to 0.56 of its value on 2, busbw 0.38 to 0.84 of it; busbw falls too here, because 4
    ranks share 2 cores, but by less. d) 2 x is the limit of 2(N-1)/N for large N, 1.75 on 8 ranks.
    c) multiplies by the ranks, as if one link carried everyone's data. b) holds on 2 ranks
    only, where 2(N-1)/N = 1. nccl-tests' factor differs by collective: (N-1)/N for all-gather
    and reduce-scatter, 1 for broadcast.
    """,
    giveaways=(
        r"0\.4 x 14/8",
        r"busbw = algbw x 2\(N-1\)/N",
        r"0\.7 GB/s, the bytes",
    ),
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "synchrony_9_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it**, for gloo's all-reduce of 4 MB on 2, 3 and 4 ranks: the time, algbw = S / t and
# busbw as nccl-tests computes it. What is busbw / algbw on each, and what would it be on 8?

# %% nbgrader={"grade": false, "grade_id": "synchrony_9_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
rows = latency.bandwidth_by_world_size(2**20, (2, 3, 4))  # 2**20 float32 = 4 MB
for n, row in rows.items():
    print(f"N = {n}: {row['seconds'] * 1e3:5.1f} ms, algbw {row['algbw'] / 1e9:.2f} GB/s, "
          f"busbw {row['busbw'] / 1e9:.2f} GB/s")

# %% [markdown] nbgrader={"grade": false, "grade_id": "closing", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## What you measured
#
# * **One message**: its fixed cost alpha and its cost per byte beta, fitted from 1 KB to
#   64 MB; and what a tiny all-reduce costs against the model's 2(N-1) alpha.
# * **Your recursive doubling** against a ring, timed from 1 KB to 32 MB, under the model.
# * **Bytes between nodes**: gloo's flat ring, and your two-level all-reduce on subgroups.
# * **A straggler** under DDP, each rank's timeline, and your step that drops it.
# * **The batch**: loss curves on 1 and more ranks with the learning rate kept, scaled, and
#   warmed up; and bus bandwidth against algorithm bandwidth.
#
# How these carry to a real cluster. The bytes (questions synchrony_4 and 9, and the checks'
# patterns) and the training curves (7 and 8) do not depend on the machine. The timings do:
# here every rank is a process on one machine with 2 cores, every link is loopback TCP, and
# ranks take turns on the CPU. On a real network alpha is smaller, the links run in parallel,
# and no rank waits for a core, so the tree's crossover sits nearer the model's, busbw stays
# flatter as N grows, and no rank waits for another's turn on a core. The explanations of
# the questions come with your feedback.
