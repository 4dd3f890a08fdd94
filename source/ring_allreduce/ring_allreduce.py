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
#    to send and receive), and **measure** what each one is about on real `torch.distributed`
#    ranks;
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

from course.lessons.ring_allreduce import (
    animate,
    check_answer,
    check_ring_pattern,
    check_ring_sums,
    cost,
    ring_widget,
)
from course.ranks import run

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
# A tensor of a few kilobytes (a layer's biases) is summed by ring all-reduce on 64 ranks.
# Every message pays a fixed latency of 20 us before its first byte, and a few kilobytes
# take far less than that to send, so the ring's time is its number of steps times 20 us.
# About how long does the all-reduce take?
#
# * a) 0.24 ms: 12 steps.
# * b) 40.3 ms: 2016 steps.
# * c) 1.26 ms: 63 steps.
# * d) 2.52 ms: 126 steps.
#
# Set `answer_ring_1` to your letter and run the cell below it.

# %% nbgrader={"grade": false, "grade_id": "ring_1_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
answer_ring_1 = ""  # your answer: one letter, "a" to "d"
### BEGIN SOLUTION
answer_ring_1 = "d"
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "ring_1_check", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
check_answer("answer_ring_1", answer_ring_1, choices="abcd")
### BEGIN HIDDEN TESTS
check_answer(
    "answer_ring_1",
    answer_ring_1,
    choices="abcd",
    key="d",
    explanation="""
    Ring all-reduce is two phases of N-1 steps each. Reduce-scatter: at every step each rank
    passes one partial chunk to its neighbour, which adds its own copy; a chunk needs N-1
    hops to collect all N contributions, so after N-1 steps each rank owns one fully reduced
    chunk. All-gather: N-1 more hops carry each finished chunk to every other rank: two
    steps for each rank other than your own. On 64 ranks that is 2 x 63 = 126 steps,
    each paying the 20 us latency: 2.52 ms, whatever the tensor's size. On 4 ranks the
    animation's 3 + 3 steps and the 6 chunks of 1/4 that gloo's all-reduce sent to one
    neighbour fit this law, and they fit b) too: one step per pair, N(N-1)/2, is also 6 on 4
    ranks. On 8 ranks they differ: gloo's all-reduce sends 14 chunks of 1/8 per rank, where
    one step per pair would take 28. The ring never pairs ranks up: every step moves a chunk
    from each rank to its neighbour at once. c) 63 steps is the reduce-scatter alone: after
    it each rank holds one finished chunk, not all N. a) 2 log2 N steps belongs to recursive
    halving and doubling (Rabenseifner's all-reduce), not to the ring: it gives 4 steps on 4
    ranks, where the animation counts 6. The animation names no phase: that a chunk is
    complete after N-1 steps, and spread after N-1 more, is for its grid to show.
    """,
    giveaways=(
        r"2\.52 ms",
        r"\b126 steps",
        r"2\s*\(\s*N\s*-\s*1\s*\)",
        r"2 x 63",
        r"two steps for each rank other than",
    ),
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "ring_1_measure_watch_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Watch it.** The ring's schedule on 4 ranks, simulated: press play, or step through. The
# arrows are the messages of the step the counter names; the grid colours each chunk by how
# many ranks' contributions it holds, once it has landed. Follow one chunk: where does it
# start, which ranks add to it, and where is it when it holds all four contributions?

# %% nbgrader={"grade": false, "grade_id": "ring_1_measure_widget", "locked": true, "schema_version": 3, "solution": false, "task": false}
ring_widget(world_size=4, formulas=False, resizable=False)  # 4 ranks, no formulas

# %% [markdown] nbgrader={"grade": false, "grade_id": "ring_1_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it on real ranks.** gloo's own `dist.all_reduce` is a ring too (its ring runs the
# other way round: each rank sends to rank - 1). The cell runs it on the widget's 4 ranks with
# a 1 MiB tensor and reads, from the kernel's own TCP counters, how many bytes each rank put
# on the wire to each peer (`course.ring.traffic.collective_traffic(name, numel)`, run
# on n ranks by `run(collective_traffic, n, "all_reduce", numel)`; nothing in gloo is
# wrapped), counted in chunks of a quarter of the tensor. gloo's headers add a few hundred
# bytes per message.

# %% nbgrader={"grade": false, "grade_id": "ring_1_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
from course.lessons.ring_allreduce import collective_traffic

numel = 2**18  # 1 MiB of float32 on every rank
chunk = numel * 4 / 4  # bytes in a quarter of the tensor: 256 KiB
for sent in run(collective_traffic, 4, "all_reduce", numel):
    me = sent["rank"]
    to = [f"{sent['to'].get(p, 0) / chunk:.2f} to rank {p}" for p in range(4) if p != me]
    print(f"rank {me} sent, in chunks of 256 KiB: " + ", ".join(to))

# %% [markdown] nbgrader={"grade": false, "grade_id": "ring_2_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Question ring_2: how long on the wire?
#
# *Difficulty 3/3*
#
# 64 ranks sum a 1 GB gradient with one ring all-reduce. Every rank's network link carries
# 10 GB/s each way, sending and receiving at once; ignore latency and the time to add. About
# how long does the all-reduce take?
#
# * a) 150 ms: each rank sends 1.5 times the tensor, all of it to one neighbour.
# * b) 197 ms: each rank sends 1.97 times the tensor, all of it to one neighbour.
# * c) 2.4 ms: each rank sends 1.5 times the tensor, spread over its 63 peers.
# * d) 3150 ms: each rank sends 31.5 times the tensor, all of it to one neighbour.

# %% nbgrader={"grade": false, "grade_id": "ring_2_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
answer_ring_2 = ""  # your answer: one letter, "a" to "d"
### BEGIN SOLUTION
answer_ring_2 = "b"
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "ring_2_check", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
check_answer("answer_ring_2", answer_ring_2, choices="abcd")
### BEGIN HIDDEN TESTS
check_answer(
    "answer_ring_2",
    answer_ring_2,
    choices="abcd",
    key="b",
    explanation="""
    Each rank sends one chunk of S/N per step, for 2(N-1) steps: 2(N-1)/N of the tensor in
    all, every byte of it to the one neighbour. The chunks' number grows with N about as
    fast as their size shrinks, so the share creeps up towards 2 and never reaches it. On 4
    ranks that is 1.5 times the tensor: the cell measured 6.00 MB of a 4 MB tensor to
    rank - 1 and 0.00 MB to the others, and 6.00 MB in from rank + 1. On 2, 3, 5 and 8 ranks
    gloo's all-reduce sends 1, 4/3, 8/5 and 7/4 of the tensor, still to one neighbour. On 64
    ranks it is 126 chunks of 1/64 GB, 126/64 = 1.97 GB through one link at 10 GB/s, while
    as much comes in from the other neighbour at the same time: 197 ms. a) 1.5 is the share
    on 4 ranks only: on 8 ranks it is already 1.75. c) Nothing is spread: a ring rank sends
    to its neighbour only (the cell shows 0.00 MB to the two other ranks), and 1.5 is again
    the share of 4 ranks. d) 31.5 tensors would be one chunk of S/N for each pair of ranks,
    N(N-1)/2 of them, which is also 1.5 tensors on 4 ranks; on 8 ranks it would be 3.5,
    where the wire shows 1.75. The ring's bandwidth time barely grows with N, which is why
    it is called bandwidth-optimal; its latency term, 2(N-1) steps, does grow.
    """,
    giveaways=(
        r"197 ms",
        r"1\.97 GB",
        r"1\.97 times",
        r"2\s*\(\s*N\s*-\s*1\s*\)\s*/\s*N",
        r"126\s*/\s*64",
    ),
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "ring_2_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it.** gloo's own all-reduce on 4 real ranks, each with 4 MB of float32: the bytes
# each rank sent to each of its peers, and those it received from each, in the same call,
# read from the kernel's TCP counters. (Once your ring works, put `ring_allreduce(tensor)` in
# place of `dist.all_reduce(tensor)` and compare; `%%ranks` takes another number of ranks.)

# %% nbgrader={"grade": false, "grade_id": "ring_2_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
# %%ranks 4
from course.lessons.ring_allreduce import WireMeter

tensor = torch.ones(1_000_000)  # 4 MB of float32 on every rank
dist.all_reduce(tensor)  # once first: gloo sets itself up on the first call
with WireMeter() as wire:
    dist.all_reduce(tensor)
peers = [p for p in range(world_size) if p != rank]
sent = [f"{wire.sent.get(p, 0) / 1e6:.2f} MB to rank {p}" for p in peers]
got = [f"{wire.received.get(p, 0) / 1e6:.2f} MB from rank {p}" for p in peers]
print("sent " + ", ".join(sent) + "\ngot  " + ", ".join(got))

# %% [markdown] nbgrader={"grade": false, "grade_id": "cost_model", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Why the ring? The alpha-beta cost model
#
# A message of n bytes costs about alpha + n * beta: a fixed latency alpha, plus n over the
# link's bandwidth. The figure compares four ways to all-reduce:
#
# * the **ring** pays alpha once per step (question ring_1) and sends each rank's bytes to one
#   neighbour only, as question ring_2's cell measured;
# * **recursive doubling** (a tree) pays alpha only log2 N times but sends the *whole* tensor
#   at every step;
# * the **naive** exchange sends the whole tensor to every peer;
# * a **parameter server** is one extra machine: every rank pushes its whole tensor to it and
#   pulls the sum back, so the server's one link carries N tensors each way (Li et al., 2014,
#   the design of early large-scale training before all-reduce took over).
#
# The figure is drawn for the 4 ranks you measured, against the tensor's size: for small
# messages latency wins, for gradients (megabytes) bandwidth does.

# %% nbgrader={"grade": false, "grade_id": "cost_model_figure", "locked": true, "schema_version": 3, "solution": false, "task": false}
cost.cost_figure(world_size=4, by_world_size=False)

# %% [markdown] nbgrader={"grade": false, "grade_id": "ring_3_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Question ring_3: who waits for whom?
#
# *Difficulty 2/3*
#
# At every ring step each rank sends to its right-hand neighbour and receives from its
# left-hand one, with blocking calls, and each rank chooses which of the two it calls first:
#
# ```python
# dist.send(out, (rank + 1) % world_size)  # or the recv first, then the send
# dist.recv(into, (rank - 1) % world_size)
# ```
#
# On 8 gloo ranks, with a tensor of a single element, how many ranks **at the fewest** must
# call `recv` first (the others calling `send` first) for the step to finish at all, on every
# rank, however long it takes?
#
# * a) None: so small a message is buffered, and every `send` returns at once.
# * b) 4: every rank that sends first needs a neighbour that receives first.
# * c) One: a single rank that receives first is enough for all to finish.
# * d) All 8: then no rank's send has to wait for a receive to be posted.

# %% nbgrader={"grade": false, "grade_id": "ring_3_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
answer_ring_3 = ""  # your answer: one letter, "a" to "d"
### BEGIN SOLUTION
answer_ring_3 = "c"
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "ring_3_check", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_answer("answer_ring_3", answer_ring_3, choices="abcd")
### BEGIN HIDDEN TESTS
check_answer(
    "answer_ring_3",
    answer_ring_3,
    choices="abcd",
    key="c",
    explanation="""
    gloo's send is a rendezvous: it completes when the neighbour's matching receive has been
    posted and the data has moved, even for one element (many MPI libraries would buffer a
    small message "eagerly": a) is true of them, not of gloo; the cell shows every rank stuck
    in dist.send on 3 ranks with one element). If every rank sends first, each waits for its
    right-hand neighbour, which waits for its own right-hand neighbour, all the way round: a
    cycle of waits, a deadlock. d) If every rank receives first, the same cycle runs the
    other way: each recv waits for a send that its neighbour only makes after its own recv.
    One rank that receives first breaks the cycle: its left-hand neighbour's send completes,
    that rank then receives, so the send of the rank before it completes, and so on round
    the ring, one rank after the other. It finishes on 3, 5 and 8 ranks with rank 0 alone
    receiving first, and on any N, but its sends complete one after another (N waits in a
    row), which is why a real ring alternates (half the ranks receiving first, what b)
    mistakes for a minimum) or posts the send with dist.isend. Nothing in gloo breaks a
    cycle for you: a blocked send waits until the process group's timeout (30 minutes by
    default).
    """,
    giveaways=(
        r"\bone rank that receives first\b",
        r"breaks the cycle",
        r"rank 0 alone",
        r"\bsingle rank that receives first",
    ),
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "ring_3_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it.** `course.ring.p2p` holds orders for one ring step as small functions:
# `blocking_step(numel, receivers)` has the ranks in `receivers` call `recv` first and every
# other rank `send` first (`send_first` and `parity_ordered` are two choices of it), and
# `isend_then_recv` posts its send without waiting; read them with
# `course.ring.p2p.blocking_step??`. The cell runs a few of them with one element and with a
# million, under a 4-second deadline, and prints how each rank ended (a run that hangs
# takes its whole deadline).

# %% nbgrader={"grade": false, "grade_id": "ring_3_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
from course.lessons.ring_allreduce import p2p
from course.ranks import launch

for order, n, numel in (
    (p2p.send_first, 3, 1),
    (p2p.send_first, 4, 1_000_000),
    (p2p.parity_ordered, 4, 1),
    (p2p.isend_then_recv, 3, 1),
    (p2p.isend_then_recv, 4, 1_000_000),
):
    result = launch(order, n, numel, timeout=4)
    ends = [
        str(result.failures[r]) if r in result.failures else f"rank {r} {result.results[r]}"
        for r in range(n)
    ]
    print(
        f"{order.__name__}, {n} ranks, {numel} element(s), {result.elapsed:.1f} s:\n  "
        + "\n  ".join(ends)
    )

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
#   the other, one chunk per step, in as many steps and bytes as a ring takes (what questions
#   ring_1 and ring_2 ask about).
#
# A plan, one step at a time:
#
# 1. Work on `flat = tensor.view(-1)` (a view, so writing into it writes into `tensor`).
# 2. Cut it into N chunks with `torch.tensor_split(flat, world_size)`: always N chunks, the
#    first ones one element longer when N does not divide the size. (`torch.chunk` can return
#    *fewer* than N chunks.)
# 3. Reduce-scatter: at step s = 0, 1, 2, ..., send chunk (rank - s) mod N to rank + 1 and
#    receive chunk (rank - s - 1) mod N from rank - 1 into a buffer **of the tensor's dtype**,
#    then add it into that chunk. Stop once every rank holds one chunk with all N ranks'
#    contributions: the widget above shows when that is on 4 ranks; work out when for any N.
# 4. All-gather: at step s = 0, 1, 2, ..., send chunk (rank + 1 - s) mod N and receive chunk
#    (rank - s) mod N, copying it in, until every rank holds every chunk.
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

# %% tags=["raises-exception"] nbgrader={"grade": false, "grade_id": "try_it", "locked": true, "schema_version": 3, "solution": false, "task": false}
# %%ranks 3 --timeout 20
from course.lessons.ring_allreduce import say_if_unimplemented

say_if_unimplemented(ring_allreduce)  # a note if the cell above is still the empty stub
t = torch.full((7,), rank + 1.0)
ring_allreduce(t)
print(t.tolist())

# %% [markdown] nbgrader={"grade": false, "grade_id": "watch_yours_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# Now watch **your** run: the cell records your `ring_allreduce` on 4 real ranks and animates
# what each rank really sent. Where your run departs from a ring (a wrong peer, a wrong chunk,
# extra messages, a rank that never finishes) the widget shows where and says why.

# %% nbgrader={"grade": false, "grade_id": "watch_yours", "locked": true, "schema_version": 3, "solution": false, "task": false}
animate(ring_allreduce, world_size=4, numel=10)

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
# all-reduce over the time it took. Yours against gloo's own `dist.all_reduce` on the same
# ranks. On one machine gloo's ranks still talk over TCP, through the loopback interface, and
# the CPU cores do the copying and the adding, so expect roughly 0.25 to 1.5 GB/s, not a
# datacenter's tens of GB/s.

# %% nbgrader={"grade": false, "grade_id": "benchmark", "locked": true, "schema_version": 3, "solution": false, "task": false}
from course.lessons.ring_allreduce import compare_busbw

rows = compare_busbw(ring_allreduce, world_size=2, megabytes=(1, 16))

# %% [markdown] nbgrader={"grade": false, "grade_id": "summary", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## What you measured
#
# * **Steps and bytes**: the ring's schedule on 4 ranks, and gloo's own all-reduce on 4 ranks,
#   read from the kernel's TCP counters; look at how many chunks each rank sends, to whom,
#   and what it receives meanwhile. `collective_traffic` and `%%ranks` run the same
#   measurement on other world sizes.
# * **Blocking order**: ways to do one ring step, on 3 and 4 ranks; look at which ones
#   finished and where the others were stuck.
# * **Your ring**: its sums, its pattern (neighbours, steps, bytes), your run animated, and its
#   bus bandwidth against gloo's all-reduce. The explanations of the questions come with your
#   feedback.
