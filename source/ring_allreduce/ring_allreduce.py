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
# 1. watch the ring at work, chunk by chunk;
# 2. answer two questions about its cost, and **measure** each answer on real
#    `torch.distributed` ranks;
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
from course.ring import cost
from course.ring.recorder import record
from course.ring.trace import bytes_sent, steps
from course.ring.verdict import ring_violations

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
# ## The ring, step by step
#
# Each rank's tensor is cut into N chunks. The widget colours each chunk by how many ranks'
# contributions it already holds.
#
# * **Reduce-scatter**: at each step rank r sends the chunk it has been summing to rank r+1,
#   which adds its own copy and passes it on, until every rank holds *one* chunk that is fully
#   reduced, a different one on each rank.
# * **All-gather**: the fully reduced chunks then travel round the ring, this time copied, not
#   added, until every rank holds all of them.
#
# Press play, or step through; change the world size and watch what stays the same. The
# arrows are the messages of the step the counter names; the grid shows the chunks once they
# have landed.

# %% nbgrader={"grade": false, "grade_id": "watch_ring_widget", "locked": true, "schema_version": 3, "solution": false, "task": false}
widgets.ring_widget(world_size=4, formulas=False)  # the formulas come after the questions

# %% [markdown] nbgrader={"grade": false, "grade_id": "ring_1_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Question ring_1: how many steps?
#
# *Difficulty 1/3*
#
# In ring all-reduce with N ranks, how many communication steps (reduce-scatter plus
# all-gather) does the algorithm run, whatever the size of the tensor? In one step every rank
# sends one message and receives one.
#
# * a) N steps: one per rank, as each rank's chunk goes once round the ring.
# * b) 2(N-1) steps: one pass round the ring to sum the chunks, a second to share the sums.
# * c) log2(N) steps: as in a tree, the number of ranks a partial sum covers doubles each step.
# * d) N-1 steps: each chunk visits the other N-1 ranks once, and then every rank has the sum.
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
    tensor size (the measuring cell counts 2, 4, 6, ... for N = 2, 3, 4, ...). N-1 steps is
    only the reduce-scatter: after it each rank holds one finished chunk, not all N. log2(N)
    steps belongs to tree and recursive-doubling all-reduces, which send the whole tensor at
    every step instead of a 1/N chunk.
    """,
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "ring_1_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it.** The cell below plays the ring's traffic on real ranks, for several world
# sizes: `ring_traffic` sends, step by step, every message a ring all-reduce sends, chunk by
# chunk and of its real size, but adds nothing (the sums are yours to write, below). It
# records every message each rank sends and counts the steps (the most sends any rank made).
# Compare the counts with the options above.

# %% nbgrader={"grade": false, "grade_id": "ring_1_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
from course.ring.traffic import ring_traffic

print(" N | steps measured |  N  | N-1 | 2(N-1) | ceil(log2 N)")
for n in (2, 3, 4, 5, 6, 8):
    trace = record(ring_traffic, n, numel=1000)
    print(f"{n:2} | {steps(trace):14} | {n:3} | {n - 1:3} | {2 * (n - 1):6} | {(n - 1).bit_length():12}")

# %% [markdown] nbgrader={"grade": false, "grade_id": "ring_2_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Question ring_2: how many bytes does each rank send?
#
# *Difficulty 3/3*
#
# You run ring all-reduce to sum gradients across 8 ranks. Each rank's local gradient tensor
# is 800 MB. Roughly how much data does **each** rank send over the network in total during the
# ring all-reduce, ignoring protocol overhead?
#
# * a) 800 MB: each rank passes its tensor once, to its neighbour.
# * b) 5600 MB: each rank sends a full copy to each of the 7 other ranks.
# * c) About 1400 MB: 14 messages of 100 MB each.
# * d) About 700 MB: 7 messages of 100 MB each, one per step of the ring.

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
    (the measuring cell: 14 sends of 1 MB for an 8 MB tensor). Half of it is the
    reduce-scatter, half the all-gather: counting only the reduce-scatter gives 700 MB.
    Sending a full copy to each of 7 peers would be 5600 MB, four times more, and the ring's
    cost per rank barely grows with N: it tends to 2 S, which is why it is called
    bandwidth-optimal.
    """,
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "ring_2_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it.** 800 MB on each of 8 ranks would not fit this machine, so the cell below
# scales the tensor down 100 times, to 8 MB of float32 per rank, plays the ring's traffic on 8
# real ranks, and records what each rank sends. Scale the measured bytes back up by 100 and
# compare them with the options, and with 2(N-1)/N times the size. (Once your ring works,
# put `ring_allreduce` in place of `ring_traffic`: it should send the same bytes.)

# %% nbgrader={"grade": false, "grade_id": "ring_2_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
# %%ranks 8
from course.ring.recorder import Recorder
from course.ring.traffic import ring_traffic

tensor = torch.ones(2_000_000)  # 8 MB of float32 on every rank: 800 MB scaled down 100 times
with Recorder() as recorder:
    ring_traffic(tensor)

sends = [m for m in recorder.messages if m.op == "send"]
megabytes = sum(m.nbytes for m in sends) / 1e6
formula = 2 * (world_size - 1) / world_size * tensor.numel() * tensor.element_size() / 1e6
print(
    f"{len(sends)} sends, {megabytes:.2f} MB sent (x100 = {100 * megabytes:.0f} MB); "
    f"2(N-1)/N x size = {formula:.2f} MB"
)

# %% [markdown] nbgrader={"grade": false, "grade_id": "cost_model", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Why the ring? The alpha-beta cost model
#
# A message of n bytes costs about alpha + n * beta: a fixed latency alpha, plus n over the
# link's bandwidth. The figure compares four ways to all-reduce:
#
# * the **ring** pays alpha 2(N-1) times but sends only 2(N-1)/N times the tensor;
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
# * a) It works: a message that small is buffered, so `send` returns at once and every rank
#   moves on to its `recv`.
# * b) Every rank waits in `dist.send` forever: a gloo send completes only once the peer has
#   posted the matching receive, and every peer is itself sending.
# * c) gloo raises an error at once, because a rank may not send to a peer that is sending.
# * d) It works on 3 ranks, since an odd ring cannot pair up; it would only hang on 2.

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
    small message "eagerly"; gloo does not). If every rank sends first, every rank waits for
    a receive that its neighbour will only post after its own send completes: a cycle of
    waits, a deadlock, on 2 ranks and on 3 alike. The measuring cell shows every rank stuck
    in dist.send until the deadline, and two orders that work: even ranks send first while
    odd ranks receive first, or post the send with dist.isend, receive, then wait for the
    send. Your ring needs one of them at every step.
    """,
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "ring_3_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it.** `course.ring.p2p` holds the three orders as small functions (read them with
# `course.ring.p2p.send_first??`). The cell runs each on 2 and 3 real ranks with a one-element
# tensor and an 8-second deadline, and prints how each rank ended. The hanging runs take
# their full deadline.

# %% nbgrader={"grade": false, "grade_id": "ring_3_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
from course.ring import p2p
from course.ranks import launch

for order in (p2p.send_first, p2p.parity_ordered, p2p.isend_then_recv):
    for n in (2, 3):
        result = launch(order, n, 1, timeout=8)
        ends = [str(result.failures[r]) if r in result.failures else f"rank {r} {result.results[r]}" for r in range(n)]
        print(f"{order.__name__} on {n} ranks, {result.elapsed:.1f} s:\n  " + "\n  ".join(ends))

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
#   the other, 2(N-1) messages per rank, about 2(N-1)/N times the tensor in bytes.
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
# 5. Every rank both sends and receives at each step: if they all call a blocking `send` first
#    they can deadlock. Post the send with `dist.isend`, then `dist.recv`, then wait for the
#    send; or order blocking calls by rank parity.

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
# A real ring: neighbours only, 2(N-1) messages, 2(N-1)/N of the tensor per rank, no collective.
print(check_ring_pattern(ring_allreduce, world_sizes=(3,)))
### BEGIN HIDDEN TESTS
print(check_ring_pattern(ring_allreduce))
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "benchmark_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### How fast is yours?
#
# Bus bandwidth, as nccl-tests reports it: size x 2(N-1)/N / time, the rate at which each
# rank's link moves data. Yours against gloo's own `dist.all_reduce` on the same ranks. On one
# machine gloo's ranks still talk over TCP, through the loopback interface, and the CPU cores
# do the copying and the adding, so expect roughly 0.25 to 1.5 GB/s, not a datacenter's
# tens of GB/s.

# %% nbgrader={"grade": false, "grade_id": "benchmark", "locked": true, "schema_version": 3, "solution": false, "task": false}
from course.ring.bandwidth import compare_busbw

rows = compare_busbw(ring_allreduce, world_size=2, megabytes=(1, 16))

# %% [markdown] nbgrader={"grade": false, "grade_id": "summary", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## What the measurements showed
#
# * **Steps.** The recorded ring took 2, 4, 6, 8, 10 and 14 steps on 2, 3, 4, 5, 6 and 8
#   ranks: two passes of N-1 steps, whatever the tensor size.
# * **Bytes.** Each of 8 ranks sent 14 chunks of 1/8 of the tensor, 1.75 times its size;
#   more ranks would push that towards twice the size, never more.
# * **Blocking order.** With blocking calls and every rank sending first, every rank waited
#   in `dist.send` until the deadline, on 2 ranks and on 3; ordering by rank parity, or
#   `isend` before `recv`, finished at once.
# * **Your ring** has been checked for its sums and for its pattern (neighbours only, 2(N-1)
#   messages, 2(N-1)/N of the tensor), and timed against gloo's own all-reduce.
