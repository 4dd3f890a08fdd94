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
# # Ring all-reduce, measured
#
# In synchronous data-parallel training every rank computes gradients on its own slice of the
# batch, and before the optimizer step all ranks must hold the same **sum** (or average) of
# those gradients. That operation is an **all-reduce**, and the algorithm behind it in gloo,
# NCCL and Horovod for large tensors is the **ring**: the tensor is cut into N chunks, and at
# every step each rank sends one chunk to its right-hand neighbour while it receives one from
# its left-hand neighbour.
#
# In this notebook you will
#
# 1. answer three questions about the ring (how many steps, how many bytes, in what order
#    to send and receive), and **measure** each answer on real `torch.distributed` ranks;
# 2. watch the ring at work, chunk by chunk;
# 3. write your own `ring_allreduce(tensor)` with point-to-point calls only, test it as you go,
#    watch *your* run animated, and time it against `dist.all_reduce`.
#
# **How the ranks run.** A cell that starts with `%%ranks N` runs on N separate processes,
# each a real gloo rank on this machine's CPU. In such a cell `rank`, `world_size`, `torch` and
# `dist` are ready and the default process group is initialised; each rank's output comes back
# under its own `[rank r]` header. A run that hangs is stopped at its deadline and tells you
# where each rank was blocked, so nothing you write here can freeze the notebook.

# %% nbgrader={"grade": false, "grade_id": "setup", "locked": true, "schema_version": 3, "solution": false, "task": false}
# %load_ext course
import torch
import torch.distributed as dist

from course.checks import check_answer, check_ring_pattern, check_ring_sums
from course.pictures import widgets
from course.ranks import run
from course.ring import cost

# %% [markdown] nbgrader={"grade": false, "grade_id": "meet_ranks", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Meet your ranks
#
# Four ranks each hold the number `rank + 1`; one `dist.all_reduce` later they all hold the sum,
# 1 + 2 + 3 + 4 = 10. This is the result your own ring must reproduce, with `send` and `recv`
# only.

# %% nbgrader={"grade": false, "grade_id": "meet_ranks_run", "locked": true, "schema_version": 3, "solution": false, "task": false}
# %%ranks 4
t = torch.tensor([rank + 1.0])
dist.all_reduce(t)
print(f"rank {rank} of {world_size} holds {t.item()}")

# %% [markdown] nbgrader={"grade": false, "grade_id": "watch_ring", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## The ring, in two phases
#
# Each rank's tensor is cut into N chunks, and the ranks stand in a ring: each one sends only to
# its right-hand neighbour and receives only from its left-hand one, one chunk at a time.
#
# * **Reduce-scatter**: at each step rank r sends the chunk it has been summing to rank r+1,
#   which adds its own copy and passes it on, until every rank holds *one* chunk that is fully
#   reduced, a different one on each rank.
# * **All-gather**: the fully reduced chunks then travel round the ring, this time copied, not
#   added, until every rank holds all of them.

# %% [markdown] nbgrader={"grade": false, "grade_id": "ring_1_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Question ring_1: how many steps?
#
# *Difficulty 1/3*
#
# In ring all-reduce with N ranks, how many communication steps (reduce-scatter plus
# all-gather) does the algorithm run, whatever the size of the tensor? In one step every rank
# sends one chunk (1/N of the tensor) to its neighbour and receives one.
#
# * a) N steps: one per rank, each rank's own chunk going once round the ring.
# * b) 2(N-1) steps: N-1 steps to sum the chunks, N-1 more to share the sums.
# * c) log2(N) steps: the ranks that a partial sum covers double at every step.
# * d) N-1 steps: each chunk visits the other N-1 ranks once, and then it is done.
#
# Set `answer_ring_1` to your letter and run the cell below it.

# %% nbgrader={"grade": false, "grade_id": "ring_1_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
answer_ring_1 = ""  # your answer: one letter, "a" to "d"
### BEGIN SOLUTION
answer_ring_1 = "b"
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "ring_1_check", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
check_answer("answer_ring_1", answer_ring_1, choices="abcd")
### BEGIN HIDDEN TESTS
check_answer(
    "answer_ring_1",
    answer_ring_1,
    choices="abcd",
    key="b",
    explanation="""
    Ring all-reduce is two phases of N-1 point-to-point steps each. Reduce-scatter: at every
    step each rank passes one partial chunk to its neighbour, which adds its own copy; after
    N-1 steps each rank owns one fully reduced chunk. All-gather: N-1 more steps pass those
    finished chunks round until every rank has all N. That is 2(N-1) steps, whatever the
    tensor size: gloo's own all-reduce sent 2.0, 4.0, 6.0, 8.0, 10.0 and 14.0 chunks per
    rank on 2, 3, 4, 5, 6 and 8 ranks, one chunk per step, 2(N-1) in all. d) N-1 steps is
    only the reduce-scatter: after it each rank holds one finished chunk, not all N. a) N
    steps would move each chunk once round the whole ring, one step more than summing it
    needs and N-2 fewer than sharing the sums too. c) log2(N) steps belongs to tree and
    recursive-doubling all-reduces, which send the whole tensor at every step instead of a
    1/N chunk.
    """,
    giveaways=(r"2\s*\(\s*N\s*-\s*1\s*\)", r"\b2(\.0)?, 4(\.0)?, 6\b", r"N\s*-\s*1 more steps"),
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "ring_1_measure_watch_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Watch it.** The ring's schedule, simulated: press play, or step through. The arrows are
# the messages of the step the counter names; the grid colours each chunk by how many ranks'
# contributions it holds, once it has landed. Change the world size and count the steps.

# %% nbgrader={"grade": false, "grade_id": "ring_1_measure_widget", "locked": true, "schema_version": 3, "solution": false, "task": false}
widgets.ring_widget(world_size=4, formulas=False)  # the closed forms are left out

# %% [markdown] nbgrader={"grade": false, "grade_id": "ring_1_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it on real ranks.** gloo's own `dist.all_reduce` is a ring too (its ring runs the
# other way round: each rank sends to rank - 1). The cell runs it for several world sizes on
# a 1 MiB tensor and reads, from the kernel's own TCP counters, how many bytes each rank put
# on the wire (`course.ring.wire.WireMeter`: nothing in gloo is wrapped). It prints them in
# units of one chunk, 1/N of the tensor; gloo's headers add a few hundred bytes per message.
# Since every step sends one chunk, what do the figures count, and which law fits them all?

# %% nbgrader={"grade": false, "grade_id": "ring_1_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
from course.experiments.ring import allreduce_traffic

numel = 2**18  # 1 MiB of float32 on every rank
print(" N | one chunk | sent by each rank, in chunks")
for n in (2, 3, 4, 5, 6, 8):
    chunk = numel * 4 / n
    sent = run(allreduce_traffic, n, numel)
    print(f"{n:2} | {chunk / 1024:5.0f} KiB | " + "  ".join(f"{b / chunk:.2f}" for b in sent))

# %% [markdown] nbgrader={"grade": false, "grade_id": "ring_2_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Question ring_2: how many bytes does each rank send?
#
# *Difficulty 3/3*
#
# You run ring all-reduce to sum gradients across 8 ranks. Each rank's local gradient tensor
# is 800 MB. Roughly how much data does **each** rank send over the network in total during the
# ring all-reduce, ignoring protocol overhead?
#
# * a) 800 MB: its tensor once, passed on to its one neighbour.
# * b) 5600 MB: a full copy of its tensor to each of the 7 others.
# * c) 1400 MB: 14 chunks of 100 MB, two passes round the ring.
# * d) 700 MB: 7 chunks of 100 MB, a single pass round the ring.

# %% nbgrader={"grade": false, "grade_id": "ring_2_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
answer_ring_2 = ""  # your answer: one letter, "a" to "d"
### BEGIN SOLUTION
answer_ring_2 = "c"
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "ring_2_check", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
check_answer("answer_ring_2", answer_ring_2, choices="abcd")
### BEGIN HIDDEN TESTS
check_answer(
    "answer_ring_2",
    answer_ring_2,
    choices="abcd",
    key="c",
    explanation="""
    Each rank sends one chunk of size S/N per step, for 2(N-1) steps: 2(N-1)/N times S in
    all. With N = 8 that is 14/8 = 1.75 times the tensor, 1.75 x 800 MB = 1400 MB per rank
    (the measuring cell: 14.0 MB of an 8 MB tensor, all of it to one neighbour, times 100).
    d) 700 MB is half of it, the reduce-scatter alone: the all-gather sends as much again.
    b) Sending a full copy to each of 7 peers would be 5600 MB, four times more, and a) 800
    MB would need each rank's single message to carry every other rank's data too. The
    ring's cost per rank barely grows with N: it tends to 2 S, which is why it is called
    bandwidth-optimal.
    """,
    giveaways=(r"1,?400\s*MB", r"1\.75", r"\b14 (chunks|messages|sends)", r"2\s*\(\s*N\s*-\s*1\s*\)\s*/\s*N"),
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "ring_2_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it.** 800 MB on each of 8 ranks would not fit this machine, so the cell below
# scales the tensor down 100 times, to 8 MB of float32 per rank, runs gloo's own all-reduce on
# 8 real ranks, and reads from the kernel's TCP counters what each rank sent, and to whom.
# Scale it back up to the question's tensor. (Once your ring works, put
# `ring_allreduce(tensor)` in place of `dist.all_reduce(tensor)`: it should send the same.)

# %% nbgrader={"grade": false, "grade_id": "ring_2_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
# %%ranks 8
from course.ring.wire import WireMeter

tensor = torch.ones(2_000_000)  # 8 MB of float32 on every rank: 800 MB scaled down 100 times
dist.all_reduce(tensor)  # once first: gloo sets itself up on the first call
with WireMeter() as wire:
    dist.all_reduce(tensor)
peers = ", ".join(f"{n / 1e6:.2f} MB to rank {p}" for p, n in wire.sent.items() if n > tensor.nbytes / 100)
print(f"sent {wire.total_sent / 1e6:.2f} MB of an {tensor.numel() * 4 / 1e6:.0f} MB tensor: {peers}")

# %% [markdown] nbgrader={"grade": false, "grade_id": "cost_model", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Why the ring? The alpha-beta cost model
#
# A message of n bytes costs about alpha + n * beta: a fixed latency alpha, plus n over the
# link's bandwidth. The figure compares four ways to all-reduce:
#
# * the **ring** pays alpha once per step (question ring_1) and sends only the bytes you
#   measured in question ring_2;
# * **recursive doubling** (a tree) pays alpha only log2 N times but sends the *whole* tensor
#   at every step;
# * the **naive** exchange sends the whole tensor to every peer;
# * a **parameter server** is one extra machine: every rank pushes its whole tensor to it and
#   pulls the sum back, so the server's one link carries N tensors each way (Li et al., 2014,
#   the design of early large-scale training before all-reduce took over).
#
# For small messages latency wins, for gradients (megabytes) bandwidth does.

# %% nbgrader={"grade": false, "grade_id": "cost_model_figure", "locked": true, "schema_version": 3, "solution": false, "task": false}
cost.cost_figure(world_size=8)

# %% [markdown] nbgrader={"grade": false, "grade_id": "ring_3_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Question ring_3: who waits for whom?
#
# *Difficulty 2/3*
#
# At every ring step each rank sends to its right-hand neighbour and receives from its
# left-hand one. Suppose every rank does it in the most obvious order, with blocking calls:
#
# ```python
# dist.send(out, (rank + 1) % world_size)
# dist.recv(into, (rank - 1) % world_size)
# ```
#
# On 3 gloo ranks, with a tensor of a **single element**, what happens?
#
# * a) It runs: so small a message is buffered, so every `send` returns at once.
# * b) Every rank blocks in `send`: each waits for a receive no peer has posted.
# * c) gloo raises at once: a rank may not send to a peer that is itself sending.
# * d) It runs on 3 ranks: an odd ring cannot pair up, and only 2 ranks would hang.

# %% nbgrader={"grade": false, "grade_id": "ring_3_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
answer_ring_3 = ""  # your answer: one letter, "a" to "d"
### BEGIN SOLUTION
answer_ring_3 = "b"
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "ring_3_check", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_answer("answer_ring_3", answer_ring_3, choices="abcd")
### BEGIN HIDDEN TESTS
check_answer(
    "answer_ring_3",
    answer_ring_3,
    choices="abcd",
    key="b",
    explanation="""
    gloo's send is a rendezvous: it completes when the neighbour's matching receive has been
    posted and the data has moved, even for one element (many MPI libraries would buffer a
    small message "eagerly": a) is true of them, not of gloo). If every rank sends first,
    every rank waits for a receive that its neighbour will only post after its own send
    completes: a cycle of waits, a deadlock, whatever the number of ranks (d: parity does not
    break the cycle, since every rank sends first) and whatever the size. Nothing in gloo
    looks for it (c): the send simply waits, until the process group's timeout (30 minutes
    by default) ends it with an error; the measuring cell's 8-second deadline stops it
    first. The cell shows every rank stuck in dist.send on 2 ranks with one element and on 4
    ranks with a million, and two orders that work: even ranks send first while odd ranks
    receive first, or post the send with dist.isend, receive, then wait for the send. Your
    ring needs one of them at every step.
    """,
    giveaways=(
        r"(blocks|waits|stuck) in (dist\.)?send",
        r"(every|each) rank (calls a blocking )?send(s)? first",
        r"send is a rendezvous",
        r"\beager",
        r"completes (only )?(once|when) the (peer|neighbour)'s matching receive",
    ),
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "ring_3_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it.** `course.ring.p2p` holds three orders for one ring step as small functions
# (read them with `course.ring.p2p.send_first??`). The cell runs each on 2 ranks with a
# one-element tensor and on 4 ranks with a million elements, under an 8-second deadline, and
# prints how each rank ended (a run that hangs takes its whole deadline). What do the
# results say about 3 ranks and one element?

# %% nbgrader={"grade": false, "grade_id": "ring_3_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
from course.ring import p2p
from course.ranks import launch

for order in (p2p.send_first, p2p.parity_ordered, p2p.isend_then_recv):
    for n, numel in ((2, 1), (4, 1_000_000)):
        result = launch(order, n, numel, timeout=8)
        ends = [str(result.failures[r]) if r in result.failures else f"rank {r} {result.results[r]}" for r in range(n)]
        print(f"{order.__name__}, {n} ranks, {numel} element(s), {result.elapsed:.1f} s:\n  " + "\n  ".join(ends))

# %% [markdown] nbgrader={"grade": false, "grade_id": "exercise_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Exercise: your own ring all-reduce
#
# Write `ring_allreduce(tensor)`. It must behave like `dist.all_reduce(tensor)`: sum `tensor`
# **in place** across all ranks of the default process group and return nothing, for any
# shape, for float and integer dtypes, and for any number of elements, including sizes that N
# does not divide and tensors with fewer elements than ranks. It may use **point-to-point calls
# only**: `dist.send`, `dist.recv`, `dist.isend`, `dist.irecv`, `dist.batch_isend_irecv`. No
# collective (`all_reduce`, `all_gather`, `reduce_scatter`, `broadcast`, ...).
#
# It is graded in two parts:
#
# * **right sums** (6 points): the result equals `dist.all_reduce` on world sizes 2 to 6, odd
#   ones included, many sizes, shapes and dtypes;
# * **a real ring** (4 points): each rank sends only to one neighbour and receives only from
#   the other, one chunk per step, in as many steps and bytes as questions ring_1 and ring_2
#   measured.
#
# A plan, one step at a time:
#
# 1. Work on `flat = tensor.view(-1)` (a view, so writing into it writes into `tensor`).
# 2. Cut it into N chunks with `torch.tensor_split(flat, world_size)`: always N chunks, the
#    first ones one element longer when N does not divide the size. (`torch.chunk` can return
#    *fewer* than N chunks.)
# 3. Reduce-scatter: for step s = 0 .. N-2, send chunk (rank - s) mod N to rank + 1 and
#    receive chunk (rank - s - 1) mod N from rank - 1 into a buffer **of the tensor's dtype**,
#    then add it into that chunk.
# 4. All-gather: for s = 0 .. N-2, send chunk (rank + 1 - s) mod N and receive chunk
#    (rank - s) mod N, copying it in.
# 5. Every rank both sends and receives at each step, so the order of the two calls matters:
#    use one of the orders that finished in question ring_3's measurement.

# %% nbgrader={"grade": false, "grade_id": "ring_allreduce", "locked": false, "schema_version": 3, "solution": true, "task": false}
def ring_allreduce(tensor: torch.Tensor) -> None:
    """Sum ``tensor`` in place across all ranks, with point-to-point calls only."""
    ### BEGIN SOLUTION
    rank, world_size = dist.get_rank(), dist.get_world_size()
    chunks = torch.tensor_split(tensor.view(-1), world_size)
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    buffer = torch.empty_like(chunks[0])
    for step in range(2 * (world_size - 1)):
        if step < world_size - 1:  # reduce-scatter: pass partial sums, add
            send_c, recv_c = (rank - step) % world_size, (rank - step - 1) % world_size
        else:  # all-gather: pass finished chunks, copy
            t = step - (world_size - 1)
            send_c, recv_c = (rank + 1 - t) % world_size, (rank - t) % world_size
        incoming = buffer[: chunks[recv_c].numel()]
        request = dist.isend(chunks[send_c], right)
        dist.recv(incoming, left)
        request.wait()
        if step < world_size - 1:
            chunks[recv_c].add_(incoming)
        else:
            chunks[recv_c].copy_(incoming)
    ### END SOLUTION


# %% [markdown] nbgrader={"grade": false, "grade_id": "try_it_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### Test as you go
#
# First by hand, on 3 ranks: every rank starts with `rank + 1` in each of 7 elements, so every
# element should end up as 1 + 2 + 3 = 6 on every rank.

# %% nbgrader={"grade": false, "grade_id": "try_it", "locked": true, "schema_version": 3, "solution": false, "task": false}
# %%ranks 3 --timeout 20
from course.checks.teaching import say_if_unimplemented

say_if_unimplemented(ring_allreduce)  # a note if the cell above is still the empty stub
t = torch.full((7,), rank + 1.0)
ring_allreduce(t)
print(t.tolist())

# %% [markdown] nbgrader={"grade": false, "grade_id": "watch_yours_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# Now watch **your** run: the cell records your `ring_allreduce` on 4 real ranks and animates
# what each rank really sent. Where your run departs from a ring (a wrong peer, a wrong chunk,
# extra messages, a rank that never finishes) the widget shows where and says why.

# %% nbgrader={"grade": false, "grade_id": "watch_yours", "locked": true, "schema_version": 3, "solution": false, "task": false}
widgets.animate(ring_allreduce, world_size=4, numel=10)

# %% [markdown] nbgrader={"grade": false, "grade_id": "visible_tests_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# The same checks the grader runs, on a smaller set of cases. Each stops within its deadline
# and says which world size, size, dtype and rank went wrong.

# %% nbgrader={"grade": false, "grade_id": "visible_tests", "locked": true, "schema_version": 3, "solution": false, "task": false}
print(check_ring_sums(ring_allreduce, world_sizes=(2, 3)))
print(check_ring_pattern(ring_allreduce, world_sizes=(3,)))

# %% nbgrader={"grade": true, "grade_id": "ring_allreduce_sums", "locked": true, "points": 6, "schema_version": 3, "solution": false, "task": false}
# Right sums: world sizes 2 to 6, sizes divisible by N and not, smaller than N, several dtypes.
print(check_ring_sums(ring_allreduce, world_sizes=(2, 3)))
### BEGIN HIDDEN TESTS
print(check_ring_sums(ring_allreduce))
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "ring_allreduce_pattern", "locked": true, "points": 4, "schema_version": 3, "solution": false, "task": false}
# A real ring: neighbours only, one chunk per step, the ring's steps and bytes, no collective.
print(check_ring_pattern(ring_allreduce, world_sizes=(3,)))
### BEGIN HIDDEN TESTS
print(check_ring_pattern(ring_allreduce))
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "benchmark_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### How fast is yours?
#
# Bus bandwidth, as nccl-tests reports it: the bytes each rank's link carries in one
# all-reduce (the ring's factor from question ring_2 times the size) over the time it took. Yours against gloo's own `dist.all_reduce` on the same ranks. On one
# machine gloo's ranks still talk over TCP, through the loopback interface, and the CPU cores
# do the copying and the adding, so expect roughly 0.25 to 1.5 GB/s, not a datacenter's
# tens of GB/s.

# %% nbgrader={"grade": false, "grade_id": "benchmark", "locked": true, "schema_version": 3, "solution": false, "task": false}
from course.ring.bandwidth import compare_busbw

rows = compare_busbw(ring_allreduce, world_size=2, megabytes=(1, 16))

# %% [markdown] nbgrader={"grade": false, "grade_id": "summary", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## What you measured
#
# * **Steps and bytes**: gloo's own all-reduce on 2 to 8 ranks, read from the kernel's TCP
#   counters; look at how the chunks each rank sends grow with N, and at who receives them.
# * **Blocking order**: three ways to do one ring step, on 2 and 4 ranks; look at which ones
#   finished and where the others were stuck.
# * **Your ring**: its sums, its pattern (neighbours, steps, bytes), your run animated, and its
#   bus bandwidth against gloo's all-reduce. The explanations of the questions come with your
#   feedback.
