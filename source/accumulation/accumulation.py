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
# # Accumulation, sampling and uneven data
#
# Real training loops do more than one forward and backward per step. They accumulate gradients
# over several micro-batches, split a data set across ranks with a `DistributedSampler`, and
# sometimes meet ranks that run out of data before the others. Each of these interacts with
# DDP's all-reduce, and each has a way to go silently wrong or to hang.
#
# In this notebook you will
#
# 1. answer eleven questions, each next to a cell that **measures** it on real gloo ranks
#    (PyTorch's own DDP, `DistributedSampler` and `Join`, on this machine's CPU);
# 2. write `sampler_indices`, the indices `DistributedSampler` gives each rank;
# 3. write `accumulation_step`, one optimizer step from K micro-batches;
# 4. write `train_uneven`, a training loop that survives ranks with different numbers of batches,
#    without `Join`.
#
# A cell that starts with `%%ranks N` runs on N processes, each a real rank, with `rank`,
# `world_size`, `torch` and `dist` ready; `run(fn, N, ...)` does the same for a function. Every
# run has a deadline: a rank that hangs is stopped and reported, never left running.

# %% nbgrader={"grade": false, "grade_id": "setup", "locked": true, "schema_version": 3, "solution": false, "task": false}
# %load_ext course
import contextlib

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DistributedSampler

from course.experiments import accumulation, sampler
from course.checks import (
    check_accumulation_syncs,
    check_accumulation_values,
    check_answer,
    check_sampler_indices,
    check_train_uneven,
)
from course.ranks import RankError, launch, run

# %% [markdown] nbgrader={"grade": false, "grade_id": "accumulation_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Gradient accumulation and `no_sync`
#
# To train with a batch larger than memory allows, a rank runs K micro-batches, lets `.grad`
# add up over K backward passes, and steps the optimizer once. Under DDP a backward normally
# all-reduces the gradients; `ddp.no_sync()` is a context manager that changes what a backward
# inside it does (PyTorch docs, `DistributedDataParallel.no_sync`). A first attempt:
#
# ```python
# for i, (x, y) in enumerate(micro_batches):
#     with ddp.no_sync() if i < K - 1 else contextlib.nullcontext():
#         loss_fn(ddp(x), y).backward()
# optimizer.step()
# ```

# %% [markdown] nbgrader={"grade": false, "grade_id": "accumulation_1_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Question accumulation_1: how often does DDP communicate?
#
# *Difficulty 1/3*
#
# Two ranks accumulate K = 4 micro-batches per optimizer step with the loop above: the first
# 3 backward passes run inside `ddp.no_sync()`, the 4th outside it. The model is small, so DDP
# puts all its gradients in one bucket. How many times does DDP all-reduce that bucket during
# one optimizer step?
#
# * a) 4 times, once per backward: `no_sync` only delays writing into `.grad`.
# * b) 3 times: once for each of the backward passes run inside `no_sync`.
# * c) Once, in the last backward, on the gradients summed over all 4 passes.
# * d) Never: with `no_sync` in the loop, the gradients are not averaged at all.

# %% nbgrader={"grade": false, "grade_id": "accumulation_1_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
answer_accumulation_1 = ""  # your answer: one letter, "a" to "d"
### BEGIN SOLUTION
answer_accumulation_1 = "c"
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "accumulation_1_check", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
check_answer("answer_accumulation_1", answer_accumulation_1, choices="abcd")
### BEGIN HIDDEN TESTS
check_answer(
    "answer_accumulation_1",
    answer_accumulation_1,
    choices="abcd",
    key="c",
    explanation="""
    Inside no_sync() DDP's reducer does not launch its bucket all-reduces: the backward passes
    only add into .grad on each rank. The first backward outside it all-reduces the buckets,
    which by then hold the sum over all 4 micro-batches. The measurement counts the calls with a
    comm hook: with K = 3 and K = 6, one all-reduce per backward without no_sync, and with it
    none until the last backward, which makes one; the accumulated .grad is the same either way
    (all-reducing a sum step by step or once gives the same sum). a) no_sync does skip the
    communication, not only the write. b) It is the backward passes outside no_sync that
    communicate. d) The last backward, outside no_sync, averages everything accumulated so far.
    With K micro-batches no_sync saves K - 1 of every K all-reduces.
    """,
    giveaways=(
        r"none until the last backward",
        r"saves K ?- ?1 of every K",
        r"reducer does not launch",
        r"one all-reduce \(?in the last backward",
    ),
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "accumulation_1_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it.** `course.experiments.accumulation.accumulation_counts` runs the loop on 2 ranks
# with a comm hook that counts DDP's all-reduces (`course.experiments.accumulation.counting_hook`),
# for K = 3 and K = 6 micro-batches, once without and once with `no_sync` on all but the last,
# and compares the accumulated `.grad` of both runs. What would K = 4 give?

# %% nbgrader={"grade": false, "grade_id": "accumulation_1_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
for k in (3, 6):
    grads = {}
    for use_no_sync in (False, True):
        r = run(accumulation.accumulation_counts, 2, use_no_sync, k)[0]
        grads[use_no_sync] = torch.tensor(r["grad"])
        print(f"K = {k}, no_sync on all but the last: {use_no_sync!s:5}  all-reduces per backward "
              f"{r['allreduces_per_backward']}")
    print(f"K = {k}: same .grad with and without no_sync: {torch.allclose(grads[False], grads[True], atol=1e-6)}")

# %% [markdown] nbgrader={"grade": false, "grade_id": "accumulation_2_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Question accumulation_2: the scale of accumulated gradients
#
# *Difficulty 2/3*
#
# The same two ranks accumulate 4 micro-batches with the loop above: `no_sync` on the first 3,
# and `loss_fn(ddp(x), y).backward()` on each micro-batch's **mean** loss (MSE).
# Compared with the gradient of the mean loss over the whole global batch (all 4 micro-batches
# of both ranks), what does `.grad` hold when the optimizer steps?
#
# * a) The same gradient: DDP divides by the number of backward passes it saw.
# * b) 4 times the large-batch gradient: one mean per micro-batch, added up.
# * c) 8 times the large-batch gradient: 4 micro-batches times 2 ranks.
# * d) A quarter of it: only the last micro-batch's gradient is all-reduced.

# %% nbgrader={"grade": false, "grade_id": "accumulation_2_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
answer_accumulation_2 = ""  # your answer: one letter, "a" to "d"
### BEGIN SOLUTION
answer_accumulation_2 = "b"
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "accumulation_2_check", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_answer("answer_accumulation_2", answer_accumulation_2, choices="abcd")
### BEGIN HIDDEN TESTS
check_answer(
    "answer_accumulation_2",
    answer_accumulation_2,
    choices="abcd",
    key="b",
    explanation="""
    .grad adds up the gradients of the 4 backward passes, so it holds the sum of 4 micro-batch
    mean gradients, 4 times their mean. DDP then divides the all-reduced sum by world_size
    only, which turns the sum over ranks into a mean over ranks (so not c: the ranks are
    averaged, only the micro-batches add up); it knows nothing about micro-batches, so not a
    either. The measured ratio of .grad to the large-batch gradient is K for every parameter:
    3.0 with K = 3. Nothing is lost (d): the last all-reduce carries what the no_sync passes
    accumulated. Divide each micro-batch's loss by K (or the learning rate by K) to get the
    large-batch step.
    """,
    giveaways=(
        r"\b4(\.0)? ?(x|times) the large-batch",
        r"ratio of \.grad to the large-batch gradient is",
        r"divide each micro-batch's loss by K",
    ),
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "accumulation_2_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it.** The accumulated `.grad` of the loop above with **K = 3** micro-batches, against
# the mean-loss gradient of the whole global batch (2 ranks x 3 micro-batches x 2 samples)
# computed in one process: their ratio, element by element. What law gives it, and what
# would it be with 4 micro-batches?

# %% nbgrader={"grade": false, "grade_id": "accumulation_2_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
r = run(accumulation.accumulation_counts, 2, True, 3)[0]
got, want = torch.tensor(r["grad"]), torch.tensor(r["large_batch_grad"])
ratio = (got / want)[want.abs() > 1e-3]  # elements of the large-batch gradient that are not ~0
print(f"K = 3: .grad / large-batch gradient over {ratio.numel()} elements: "
      f"min {ratio.min().item():.4f}, median {ratio.median().item():.4f}, max {ratio.max().item():.4f}")

# %% [markdown] nbgrader={"grade": false, "grade_id": "sampler_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## `DistributedSampler`
#
# `DistributedSampler(dataset, num_replicas, rank, shuffle=True, seed=0, drop_last=False)`
# gives each rank its own share of the indices of a data set; a `DataLoader` on each rank
# reads only those. It needs no process group when `num_replicas` and `rank` are given, so the
# measurements below run in this kernel.

# %% [markdown] nbgrader={"grade": false, "grade_id": "accumulation_3_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Question accumulation_3: a data set that does not divide evenly
#
# *Difficulty 2/3*
#
# A data set of 10 samples is split over 4 ranks with
# `DistributedSampler(ds, num_replicas=4, rank=r, shuffle=False)` (and `drop_last=False`, the
# default). What does one epoch give the ranks?
#
# * a) 3, 3, 2 and 2 samples: every sample read exactly once in the epoch.
# * b) 3 samples each: samples 0 and 1 are read twice in the epoch.
# * c) 2 samples each: samples 8 and 9 are left out of the epoch.
# * d) An error: the sampler needs a length that divides by 4.

# %% nbgrader={"grade": false, "grade_id": "accumulation_3_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
answer_accumulation_3 = ""  # your answer: one letter, "a" to "d"
### BEGIN SOLUTION
answer_accumulation_3 = "b"
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "accumulation_3_check", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_answer("answer_accumulation_3", answer_accumulation_3, choices="abcd")
### BEGIN HIDDEN TESTS
check_answer(
    "answer_accumulation_3",
    answer_accumulation_3,
    choices="abcd",
    key="b",
    explanation="""
    DistributedSampler gives every rank the same number of samples, ceil(10 / 4) = 3, so that
    every rank runs the same number of steps (and so of all-reduces): not a, whose uneven
    shares would leave ranks waiting. It pads the index list to 12 by repeating it from the
    start and deals it round robin: rank 0 gets [0, 4, 8], rank 1 [1, 5, 9], rank 2 [2, 6,
    0], rank 3 [3, 7, 1]. Samples 0 and 1 count twice in the epoch's gradient; the measurement
    shows the same padding with 11 samples (sample 0 twice) and 7 over 3 ranks. c) is what
    drop_last=True does: it drops the tail instead, 2 samples each, [0, 4] to [3, 7]. d) No
    length is refused: even 3 samples over 4 ranks works, and rank 3 reads sample 0.
    """,
    giveaways=(
        r"\[2, 6, 0\]",
        r"samples 0 and 1 (are read|count) twice",
        r"pads? the index list to 12",
        r"\b0 and 1 (are )?read twice",
    ),
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "accumulation_3_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it.** The indices `DistributedSampler` gives each rank
# (`course.experiments.sampler.sampler_split`) for 11 samples on 4 ranks, 7 on 3 and 3 on
# 4, with and without `drop_last`, and the picture of the first (an x marks a sample read a
# second time). What rule makes these, and what does it give for 10 samples on 4 ranks?

# %% nbgrader={"grade": false, "grade_id": "accumulation_3_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
for n, ranks in ((11, 4), (7, 3), (3, 4)):
    for drop_last in (False, True):
        print(f"{n} samples, {ranks} ranks, drop_last={drop_last!s:5}: "
              f"{sampler.sampler_split(n, ranks, drop_last=drop_last)}")
sampler.sampler_figure(sampler.sampler_split(11, 4), 11)

# %% [markdown] nbgrader={"grade": false, "grade_id": "accumulation_4_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Question accumulation_4: shuffling without `set_epoch`
#
# *Difficulty 1/3*
#
# A training script builds `DistributedSampler(ds, num_replicas=2, rank=r, shuffle=True)` once
# and loops over 3 epochs, but never calls `sampler.set_epoch(epoch)`. What order does rank 0
# read its samples in?
#
# * a) A new random order every epoch: `shuffle=True` reshuffles every pass.
# * b) One random order, the same in every epoch: its epoch never changes.
# * c) The data set's own order: shuffling only starts with `set_epoch`.
# * d) A new order every epoch, and on rank 1 one that overlaps rank 0's.

# %% nbgrader={"grade": false, "grade_id": "accumulation_4_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
answer_accumulation_4 = ""  # your answer: one letter, "a" to "d"
### BEGIN SOLUTION
answer_accumulation_4 = "b"
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "accumulation_4_check", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
check_answer("answer_accumulation_4", answer_accumulation_4, choices="abcd")
### BEGIN HIDDEN TESTS
check_answer(
    "answer_accumulation_4",
    answer_accumulation_4,
    choices="abcd",
    key="b",
    explanation="""
    The sampler shuffles with a generator seeded with seed + epoch, and the epoch is whatever
    set_epoch last set: 0 if it is never called. Every pass then draws the same permutation
    (not a), a random one, not the data set's order (not c): the measurement finds identical
    orders in every epoch, for 12 samples on 3 ranks as for any size, and different ones once
    set_epoch is called. d) Every rank draws the same permutation and takes its own positions
    of it, which is what keeps the ranks' shares disjoint: the seed must be the same on all
    ranks.
    """,
    giveaways=(
        r"seed ?\+ ?epoch",
        r"same permutation",
        r"identical orders? in every epoch",
    ),
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "accumulation_4_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it.** Rank 0's order in 3 epochs, for 12 samples on 3 ranks, without and with
# `set_epoch` (`course.experiments.sampler.epoch_orders`).

# %% nbgrader={"grade": false, "grade_id": "accumulation_4_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
for set_epoch in (False, True):
    print(f"set_epoch called: {set_epoch!s:5}  rank 0's order per epoch: "
          f"{sampler.epoch_orders(12, 3, 3, set_epoch)}")

# %% [markdown] nbgrader={"grade": false, "grade_id": "uneven_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Uneven data and `Join`
#
# Ranks may hold different numbers of batches (a data set split by hand, a filter applied per
# rank, `drop_last=False` with an iterable data set), so one rank may finish its loop while
# another is still training. PyTorch's answer is the `Join` context manager (PyTorch docs,
# *Distributed training with uneven inputs using the Join context manager*): `with Join([ddp]):`
# around the loop lets a rank that is done *shadow* the collectives of the ranks still
# training. Questions accumulation_5 and 6 measure a loop without and with `Join`; in Exercise
# 3 you build the same agreement yourself, without `Join`.

# %% [markdown] nbgrader={"grade": false, "grade_id": "accumulation_5_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Question accumulation_5: one rank runs out of batches
#
# *Difficulty 2/3*
#
# Two ranks train with DDP in a plain loop (`zero_grad`, forward, `backward`, no `Join`). Rank 0
# has 3 batches, rank 1 has 2. Rank 1, out of batches, returns from its training function; its
# process stays alive, idle. What happens at rank 0's third batch?
#
# * a) Rank 0 steps with its own gradient alone: DDP sees that rank 1 left.
# * b) DDP sees the uneven inputs and raises an error on both ranks at once.
# * c) Rank 0 waits in its third backward's all-reduce until gloo times out.
# * d) Rank 1 replays its last batch, so that rank 0 can finish its third.

# %% nbgrader={"grade": false, "grade_id": "accumulation_5_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
answer_accumulation_5 = ""  # your answer: one letter, "a" to "d"
### BEGIN SOLUTION
answer_accumulation_5 = "c"
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "accumulation_5_check", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_answer("answer_accumulation_5", answer_accumulation_5, choices="abcd")
### BEGIN HIDDEN TESTS
check_answer(
    "answer_accumulation_5",
    answer_accumulation_5,
    choices="abcd",
    key="c",
    explanation="""
    Nothing in DDP counts batches: rank 0's third backward launches the bucket all-reduce and
    waits for a partner that is not coming. Rank 1 has left the loop, so nothing is raised
    anywhere (not b) until gloo's timeout on the wait (here shortened to 5 s; by default the
    process group's timeout is 30 minutes): the measured run, with 4 batches against 2, fails
    on rank 0, gloo giving up after 5 s inside backward(), while rank 1 finished normally. A
    real job would look hung. No rank steps alone (a) and no batch is replayed (d). What the
    short rank does next changes the ending: had its process exited, gloo would have seen the
    connection close and rank 0 would have failed before the timeout; had it called
    dist.barrier(), both ranks would have waited out the timeout. Join, a loop in which the
    ranks agree each step whether anyone still has data (Exercise 3), or equal numbers of
    batches on every rank (DistributedSampler) prevents it.
    """,
    giveaways=(
        r"waits? in its third backward",
        r"until gloo'?s? timeout",
        r"gloo giving up after",
    ),
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "accumulation_5_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it.** The loop of `course.experiments.accumulation.uneven_loop` on 2 ranks with 4
# batches on rank 0 and 2 on rank 1, no `Join`, launched with a 5 s gloo timeout
# (`pg_timeout`) instead of the default 30 minutes. The launcher's report says what each rank
# was doing.

# %% nbgrader={"grade": false, "grade_id": "accumulation_5_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
result = launch(accumulation.uneven_loop, 2, (4, 2), False, timeout=60, pg_timeout=5)
print(f"finished: {result.ok} after {result.elapsed:.1f} s")
print(f"rank 1 returned: {result.results[1]}")
print(RankError(result) if not result.ok else "")

# %% [markdown] nbgrader={"grade": false, "grade_id": "accumulation_6_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Question accumulation_6: what `Join` puts in `.grad`
#
# *Difficulty 3/3*
#
# The same two ranks run the same loop inside `with Join([ddp]):`. Batch i of rank r is one
# sample whose two inputs are both `10 r + i + 1`, and the loss is `sum(w . x)`, so a rank's local
# gradient is its input: in rank 0's third step it is `[3, 3]`. Rank 1 has already run out of
# batches. What does rank 0's `m.weight.grad` hold after that third backward?
#
# * a) `[3.0, 3.0]`: its own local gradient, since no other rank adds to it.
# * b) `[1.5, 1.5]`: its local gradient divided by the world size of 2.
# * c) `[0.0, 0.0]`: the joined rank's zeros replace the gradient.
# * d) `[7.5, 7.5]`: the average of `[3, 3]` and rank 1's last input `[12, 12]`.

# %% nbgrader={"grade": false, "grade_id": "accumulation_6_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
answer_accumulation_6 = ""  # your answer: one letter, "a" to "d"
### BEGIN SOLUTION
answer_accumulation_6 = "b"
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "accumulation_6_check", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
check_answer("answer_accumulation_6", answer_accumulation_6, choices="abcd")
### BEGIN HIDDEN TESTS
check_answer(
    "answer_accumulation_6",
    answer_accumulation_6,
    choices="abcd",
    key="b",
    explanation="""
    A rank that has joined shadows each all-reduce of the others with zeros, and DDP still
    divides the sum by the world size it started with (Join's divide_by_initial_world_size=True
    by default). So rank 0 gets (3 + 0) / 2 = 1.5, as if the missing rank had a zero gradient:
    not its own gradient alone (a), not zeros only (c), and not rank 1's stale input (d). The
    measurement on 3 ranks with 3, 2 and 1 batches shows the law: at step 2 (2 + 12 + 0) / 3,
    at step 3 (3 + 0 + 0) / 3 = 1.0. That keeps the scale of an extra step consistent with the
    others; pass divide_by_initial_world_size=False to divide by the ranks still training.
    When the last rank leaves the Join context, DDP broadcasts its final parameters to the
    joined ranks, so all ranks end with the same weights.
    """,
    giveaways=(
        r"\(3 ?\+ ?0\) ?/ ?2",
        r"shadows? each all-reduce (of the others )?with zeros",
        r"divides? the sum by the world size it started with",
        r"contributes zeros",
        r"divided by the initial world size",
    ),
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "accumulation_6_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it.** `uneven_loop` with `Join` on **3** ranks holding 3, 2 and 1 batches: each rank's
# input and `.grad`, step by step. What law gives `.grad` once some ranks have run out, and what
# does it give on the question's 2 ranks?

# %% nbgrader={"grade": false, "grade_id": "accumulation_6_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
for rank, steps in enumerate(run(accumulation.uneven_loop, 3, (3, 2, 1), True)):
    for i, s in enumerate(steps):
        print(f"rank {rank}, step {i + 1}: local gradient {s['local']}  .grad {[round(g, 4) for g in s['grad']]}")

# %% [markdown] nbgrader={"grade": false, "grade_id": "more_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Unused parameters, mismatched collectives, random numbers, clipping and buffers

# %% [markdown] nbgrader={"grade": false, "grade_id": "accumulation_7_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Question accumulation_7: a parameter the loss does not use
#
# *Difficulty 3/3*
#
# A module has two heads, `self.used` and `self.unused`, and its `forward` uses only the first.
# It is wrapped in `DDP(model)` with the default `find_unused_parameters=False`, and two ranks
# run two training steps (inputs `rank + 1`, loss `sum(w . x)`). What happens?
#
# * a) DDP raises an error in the first backward: a parameter got no gradient.
# * b) Both steps run as usual, and `self.unused` simply keeps its `.grad` at `None`.
# * c) The first step leaves unsynced local gradients in `.grad`; the next raises.
# * d) Both steps work and average `.grad`: DDP finds the unused head itself.

# %% nbgrader={"grade": false, "grade_id": "accumulation_7_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
answer_accumulation_7 = ""  # your answer: one letter, "a" to "d"
### BEGIN SOLUTION
answer_accumulation_7 = "c"
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "accumulation_7_check", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
check_answer("answer_accumulation_7", answer_accumulation_7, choices="abcd")
### BEGIN HIDDEN TESTS
check_answer(
    "answer_accumulation_7",
    answer_accumulation_7,
    choices="abcd",
    key="c",
    explanation="""
    DDP all-reduces a bucket only when every parameter in it has reported a gradient. The unused
    head never does, so its bucket (here the only one) is never reduced: the first backward
    returns normally (not a) and leaves each rank's local gradient in .grad, [1, 1] on rank 0
    and [2, 2] on rank 1, not the average [1.5, 1.5] (not b, and not d: DDP does not look for
    unused parameters unless told to). An optimizer step now would silently drive the
    replicas apart. Only the next forward notices the unfinished reduction and raises
    "Expected to have finished reduction in the prior iteration before starting a new one";
    the measurement shows the same on 3 ranks. With find_unused_parameters=True DDP marks
    unused parameters ready after each forward, and both steps average.
    """,
    giveaways=(
        r"Expected to have finished reduction",
        r"(is )?never reduced",
        r"leaves each rank's local gradient",
    ),
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "accumulation_7_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it.** `course.experiments.accumulation.unused_parameter_steps` on 3 ranks, with and
# without `find_unused_parameters`.

# %% nbgrader={"grade": false, "grade_id": "accumulation_7_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
for find in (False, True):
    print(f"find_unused_parameters={find}")
    for rank, steps in enumerate(run(accumulation.unused_parameter_steps, 3, find)):
        for i, s in enumerate(steps):
            print(f"  rank {rank}, step {i + 1}: {s['error'].split('. ')[0] if 'error' in s else '.grad ' + str(s['grad'])}")

# %% [markdown] nbgrader={"grade": false, "grade_id": "accumulation_8_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Question accumulation_8: collectives called in a different order
#
# *Difficulty 3/3*
#
# After a step, each rank sums two one-element tensors with `dist.all_reduce`: its loss sum
# (rank r holds `1 + r`) and its sample count (rank r holds `100 (r + 1)`). Because of an `if`,
# rank 0 reduces the loss first and then the count, while rank 1 reduces the count first and
# then the loss. What happens on 2 ranks?
#
# * a) Both end with the right sums, loss 3 and count 300: gloo pairs them by name.
# * b) The run hangs: each all-reduce keeps waiting for the call it matches.
# * c) Both ranks raise an error at once: the two collectives do not match.
# * d) No error, no hang: rank 0 ends with a loss sum of 201 and a count of 102.

# %% nbgrader={"grade": false, "grade_id": "accumulation_8_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
answer_accumulation_8 = ""  # your answer: one letter, "a" to "d"
### BEGIN SOLUTION
answer_accumulation_8 = "d"
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "accumulation_8_check", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
check_answer("answer_accumulation_8", answer_accumulation_8, choices="abcd")
### BEGIN HIDDEN TESTS
check_answer(
    "answer_accumulation_8",
    answer_accumulation_8,
    choices="abcd",
    key="d",
    explanation="""
    Collectives are matched by their order on each rank, not by which tensor they carry (not
    a). Rank 0's first all_reduce pairs with rank 1's first, whatever the tensors mean: rank
    0's loss 1 is added to rank 1's count 200, giving 201, and rank 0's count 100 to rank 1's
    loss 2, giving 102. Same shapes, same dtypes, so gloo has nothing to complain about (not
    c) and every call finds a partner (not b): measured with other values (loss 5 + r, count
    1000 (r + 1)), both ranks finish at once with the sums paired by order. Mismatches are
    only caught when something else differs: a different number of elements crashed the
    process (SIGABRT inside gloo), and all_reduce against broadcast hung until the timeout.
    Every rank must issue the same collectives in the same order.
    """,
    giveaways=(
        r"\b201\b",
        r"\b102\b",
        r"matched by (their )?order",
        r"paired by order",
    ),
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "accumulation_8_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it.** `course.experiments.accumulation.swapped_all_reduce` on 2 ranks, with other
# values than the question's (rank r's loss sum `5 + r`, its count `1000 (r + 1)`), then two
# other mismatches for comparison: different sizes, and `all_reduce` against `broadcast` (5 s
# timeout). What would the question's values give?

# %% nbgrader={"grade": false, "grade_id": "accumulation_8_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
result = launch(accumulation.swapped_all_reduce, 2, 5.0, 1000.0, timeout=30, pg_timeout=5)
print(f"swapped_all_reduce: after {result.elapsed:.1f} s")
for rank in range(2):
    r = result.results[rank]
    print(f"  {result.failures[rank]}" if rank in result.failures else
          f"  rank {rank}: loss sum {r['loss_sum']}  count {r['count']}")


def sizes_differ():
    t = torch.ones(3 if dist.get_rank() == 0 else 5)
    dist.all_reduce(t)


def ops_differ():
    t = torch.ones(3)
    dist.all_reduce(t) if dist.get_rank() == 0 else dist.broadcast(t, 0)


for fn in (sizes_differ, ops_differ):
    result = launch(fn, 2, timeout=30, pg_timeout=5)
    print(f"\n{fn.__name__}: after {result.elapsed:.1f} s")
    for rank, failure in sorted(result.failures.items()):
        print(f"  {failure}"[:160])

# %% [markdown] nbgrader={"grade": false, "grade_id": "accumulation_9_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Question accumulation_9: dropout on every rank
#
# *Difficulty 1/3*
#
# Every rank runs `torch.manual_seed(0)` at start-up (so that the models start equal), wraps its
# model in DDP, and then trains a model with dropout, each rank on different data. How do the
# dropout masks of the ranks relate in the first step?
#
# * a) Independent: each process has a random number generator of its own.
# * b) Identical on every rank: the same seed draws the same masks.
# * c) Different: DDP reseeds each rank's generator with its rank number.
# * d) Different: each rank's own data changes what dropout draws.

# %% nbgrader={"grade": false, "grade_id": "accumulation_9_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
answer_accumulation_9 = ""  # your answer: one letter, "a" to "d"
### BEGIN SOLUTION
answer_accumulation_9 = "b"
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "accumulation_9_check", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
check_answer("answer_accumulation_9", answer_accumulation_9, choices="abcd")
### BEGIN HIDDEN TESTS
check_answer(
    "answer_accumulation_9",
    answer_accumulation_9,
    choices="abcd",
    key="b",
    explanation="""
    Each process has its own generator, but the same seed gives the same sequence (so a's
    independence does not follow), and every rank draws the same dropout mask for the same
    layer shape: measured on 3 ranks, after building DDP, the masks are equal element for
    element. DDP does not touch random number generators (not c: it broadcasts parameters and
    buffers, not RNG state), and a mask does not depend on the data it is applied to (not d).
    Because the ranks see different data the training still works, but the ranks drop the
    same units, which correlates them. To get independent masks, seed with seed + rank after
    building the model (DDP's construction already makes the weights equal, question
    ddp_4).
    """,
    giveaways=(
        r"same seed (gives|draws) the same",
        r"equal element for element",
        r"seed ?\+ ?rank",
    ),
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "accumulation_9_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it.** The masks of `nn.functional.dropout(torch.ones(12), 0.5)` on 3 ranks, drawn after
# `torch.manual_seed` and after building a DDP model, seeded alike and with their rank
# (`course.experiments.accumulation.dropout_masks`).

# %% nbgrader={"grade": false, "grade_id": "accumulation_9_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
for per_rank in (False, True):
    masks = run(accumulation.dropout_masks, 3, per_rank)
    seed = "seed = rank" if per_rank else "seed = 0   "
    print(f"{seed}: " + "\n             ".join(f"rank {r} {m}" for r, m in enumerate(masks)))

# %% [markdown] nbgrader={"grade": false, "grade_id": "accumulation_10_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Question accumulation_10: clipping the gradient norm
#
# *Difficulty 2/3*
#
# Two ranks train with DDP and clip gradients with `nn.utils.clip_grad_norm_(model.parameters(),
# max_norm)` right after `backward()`. In a single-process run on all the data, the clip would
# use the norm of the large-batch gradient. What norm does each rank compute?
#
# * a) Its local gradient's norm: ranks clip apart unless the norm is all-reduced.
# * b) The averaged gradient's norm, the same on every rank, with no communication.
# * c) The global norm: `clip_grad_norm_` all-reduces the norm across ranks itself.
# * d) The norm of the sum over ranks, since `.grad` holds the summed gradient.

# %% nbgrader={"grade": false, "grade_id": "accumulation_10_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
answer_accumulation_10 = ""  # your answer: one letter, "a" to "d"
### BEGIN SOLUTION
answer_accumulation_10 = "b"
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "accumulation_10_check", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_answer("answer_accumulation_10", answer_accumulation_10, choices="abcd")
### BEGIN HIDDEN TESTS
check_answer(
    "answer_accumulation_10",
    answer_accumulation_10,
    choices="abcd",
    key="b",
    explanation="""
    After DDP's backward every rank's .grad already holds the averaged gradient, identical on all
    ranks (not the sum, d, nor the local gradient, a), so clip_grad_norm_ computes the same norm
    everywhere without communicating. Measured on 3 ranks: every rank computes the norm of the
    large-batch gradient computed in one process, while the ranks' local gradients have other
    norms; the recorder saw no collective call inside clip_grad_norm_ (not c). So every rank
    scales by the same factor and the replicas stay in step. Under accumulation, clip once
    after the last (synced) backward, not after each no_sync backward, whose .grad is still
    local. The norm does need an all-reduce when each rank holds only a shard of the gradients
    (ZeRO, FSDP), not under DDP.
    """,
    giveaways=(
        r"without communicating",
        r"no collective call inside",
        r"same norm everywhere",
    ),
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "accumulation_10_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it.** `course.experiments.accumulation.clipped_norms` on 3 ranks: the norm `clip_grad_norm_`
# returns, the rank's local gradient norm, the large-batch norm from one process, and the
# collectives recorded during the clip (`course.ring.recorder.Recorder`).

# %% nbgrader={"grade": false, "grade_id": "accumulation_10_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
for r in run(accumulation.clipped_norms, 3):
    print(f"rank {r['rank']}: clip_grad_norm_ saw {r['norm']:.4f}   local gradient norm "
          f"{r['local_norm']:.4f}   large-batch norm {r['large_batch_norm']:.4f}   "
          f"collectives during the clip: {r['collectives']}")

# %% [markdown] nbgrader={"grade": false, "grade_id": "accumulation_11_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Question accumulation_11: batch-norm buffers
#
# *Difficulty 3/3*
#
# A model with one `nn.BatchNorm1d(1)` (momentum 0.1, so after a batch
# `running_mean = 0.9 running_mean + 0.1 batch_mean`, starting at 0) is wrapped in `DDP(model)`
# with the default `broadcast_buffers=True`. Rank 0's batch always has mean 1.5, rank 1's mean
# 11.5. After two training steps rank 0's `running_mean` is 0.285. What is rank 1's?
#
# * a) 0.285: DDP keeps the buffers identical on every rank, like the weights.
# * b) 2.185: its own batches' statistics only, as if it trained alone.
# * c) 1.285: rank 0's mean after step 1, updated with rank 1's own batch.
# * d) 1.235: the average of the two ranks' own running means after step 2.

# %% nbgrader={"grade": false, "grade_id": "accumulation_11_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
answer_accumulation_11 = ""  # your answer: one letter, "a" to "d"
### BEGIN SOLUTION
answer_accumulation_11 = "c"
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "accumulation_11_check", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
check_answer("answer_accumulation_11", answer_accumulation_11, choices="abcd")
### BEGIN HIDDEN TESTS
check_answer(
    "answer_accumulation_11",
    answer_accumulation_11,
    choices="abcd",
    key="c",
    explanation="""
    DDP averages gradients, not buffers. With broadcast_buffers=True it copies rank 0's buffers
    to every rank at the start of each forward, and each rank's BatchNorm then updates its copy
    with its own batch. Step 1: both start from 0, rank 1 ends at 0.1 x 11.5 = 1.15. Step 2: the
    forward first overwrites that with rank 0's 0.15, then 0.9 x 0.15 + 0.1 x 11.5 = 1.285. The
    measurement, with batch means 1.5 and 21.5, gives rank 1 2.15 then 0.9 x 0.15 + 2.15 =
    2.285. So the ranks' buffers differ after every step (not a), and rank 1's history is thrown
    away at each forward; a checkpoint saved from rank 0 holds rank 0's statistics. b) is
    broadcast_buffers=False: each rank keeps its own (2.185). d) Nothing averages buffers.
    Statistics over all ranks need nn.SyncBatchNorm, which runs only on accelerators: on a CPU
    tensor its forward raises "SyncBatchNorm expected input tensor to be on GPU or XPU or
    privateuseone", and DDP refuses to wrap it ("SyncBatchNorm layers only work with GPU
    modules"), so this course cannot measure it.
    """,
    giveaways=(
        r"\b1\.285\b",
        r"copies rank 0's buffers",
        r"overwrites that with rank 0's",
    ),
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "accumulation_11_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it.** `course.experiments.accumulation.batchnorm_buffers` on 2 ranks, with batch means
# 1.5 and **21.5** (not the question's): the running mean after each step, with and without
# `broadcast_buffers`; then `nn.SyncBatchNorm` on this CPU. What law gives rank 1's value?

# %% nbgrader={"grade": false, "grade_id": "accumulation_11_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
for broadcast in (True, False):
    means = run(accumulation.batchnorm_buffers, 2, broadcast, 2, 20.0)
    print(f"broadcast_buffers={broadcast!s:5}  running_mean after steps 1, 2: "
          + "   ".join(f"rank {r} {[round(m, 4) for m in ms]}" for r, ms in enumerate(means)))
print(f"nn.SyncBatchNorm on a CPU rank: {run(accumulation.sync_batchnorm_on_cpu, 2)[0]}")

# %% [markdown] nbgrader={"grade": false, "grade_id": "sampler_exercise_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Exercise 1: the sampler's indices
#
# Write `sampler_indices(dataset_len, num_replicas, rank, shuffle=True, seed=0, epoch=0,
# drop_last=False)`: the list of indices that
# `DistributedSampler(range(dataset_len), num_replicas, rank, shuffle, seed, drop_last)` yields
# after `set_epoch(epoch)`. Do not call `DistributedSampler` (the grader compares with it, and
# refuses it on the grading ranks). What you need:
#
# * how many samples each rank gets, and which: questions accumulation_3's measurement, with and
#   without `drop_last` (mind data sets smaller than the number of ranks);
# * the shuffled order: `torch.randperm(dataset_len, generator=g).tolist()` with
#   `g = torch.Generator()` seeded as `DistributedSampler.__iter__` seeds it (read it:
#   `DistributedSampler.__iter__??`, and question accumulation_4).
#
# It is graded in two parts (in order; shuffled), on cases that include a data set smaller than
# the number of ranks; each failing case says what differed.

# %% nbgrader={"grade": false, "grade_id": "sampler_indices", "locked": false, "schema_version": 3, "solution": true, "task": false}
def sampler_indices(
    dataset_len: int,
    num_replicas: int,
    rank: int,
    shuffle: bool = True,
    seed: int = 0,
    epoch: int = 0,
    drop_last: bool = False,
) -> list[int]:
    """The indices DistributedSampler gives rank ``rank`` of ``num_replicas`` in epoch ``epoch``."""
    ### BEGIN SOLUTION
    if shuffle:
        g = torch.Generator()
        g.manual_seed(seed + epoch)
        indices = torch.randperm(dataset_len, generator=g).tolist()
    else:
        indices = list(range(dataset_len))
    if drop_last and dataset_len % num_replicas:
        per_rank = -(-(dataset_len - num_replicas) // num_replicas)
    else:
        per_rank = -(-dataset_len // num_replicas)
    total = per_rank * num_replicas
    while len(indices) < total:
        indices += indices[: total - len(indices)]
    return indices[:total][rank:total:num_replicas]
    ### END SOLUTION

# %% [markdown] nbgrader={"grade": false, "grade_id": "sampler_try_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### Test as you go
#
# Your indices beside `DistributedSampler`'s for 13 samples on 5 ranks.

# %% nbgrader={"grade": false, "grade_id": "sampler_try", "locked": true, "schema_version": 3, "solution": false, "task": false}
for r in range(5):
    mine = sampler_indices(13, 5, r, shuffle=False)
    theirs = list(DistributedSampler(range(13), 5, r, shuffle=False))
    print(f"rank {r}: yours {mine}  DistributedSampler {theirs}  {'ok' if mine == theirs else 'DIFFERENT'}")

# %% nbgrader={"grade": true, "grade_id": "sampler_indices_in_order", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
# Without shuffling: padding, drop_last, fewer samples than ranks.
print(check_sampler_indices(sampler_indices, "in order"))
### BEGIN HIDDEN TESTS
print(check_sampler_indices(sampler_indices, "in order, hidden"))
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "sampler_indices_shuffled", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
# Shuffled, with seeds and epochs.
print(check_sampler_indices(sampler_indices, "shuffled"))
### BEGIN HIDDEN TESTS
print(check_sampler_indices(sampler_indices, "shuffled, hidden"))
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "accumulation_exercise_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Exercise 2: an accumulation step
#
# Write `accumulation_step(ddp, optimizer, micro_batches)`. `micro_batches` is this rank's list
# of K pairs `(x, y)`; the loss of a micro-batch is `nn.functional.mse_loss(ddp(x), y)`. The
# function must do **one** optimizer step such that:
#
# * the weights move exactly as one SGD step on the mean loss over **all** micro-batches of
#   **all** ranks (question accumulation_2: mind the scale);
# * DDP communicates as little as `no_sync` allows (question accumulation_1), and the function
#   makes no collective calls of its own.
#
# `.grad` is empty when it is called. It is graded on fresh ranks with K = 4, counting DDP's
# all-reduces with a comm hook and recording every collective call (`course.ring.recorder`): one
# part for the values, one for the communication.

# %% nbgrader={"grade": false, "grade_id": "accumulation_step", "locked": false, "schema_version": 3, "solution": true, "task": false}
def accumulation_step(ddp: DDP, optimizer: torch.optim.Optimizer, micro_batches: list) -> None:
    """One optimizer step from K micro-batches: the large-batch step, as little communication as DDP allows."""
    ### BEGIN SOLUTION
    k = len(micro_batches)
    for i, (x, y) in enumerate(micro_batches):
        with ddp.no_sync() if i < k - 1 else contextlib.nullcontext():
            (nn.functional.mse_loss(ddp(x), y) / k).backward()
    optimizer.step()
    optimizer.zero_grad()
    ### END SOLUTION

# %% [markdown] nbgrader={"grade": false, "grade_id": "accumulation_try_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### Test as you go
#
# Your step on 2 ranks, K = 4, with the counting hook: it prints how many all-reduces DDP made,
# how many other collectives ran, and whether the update equals the large-batch step.

# %% nbgrader={"grade": false, "grade_id": "accumulation_try", "locked": true, "schema_version": 3, "solution": false, "task": false}
from course.checks.accumulation import try_accumulation_step

try:
    r = try_accumulation_step(accumulation_step, world_size=2, k=4)
    print(r["problem"] or f"DDP all-reduces: {r['syncs']}, other collectives: "
          f"{len(r['collectives']) - r['syncs']}, update equals the large-batch step: "
          f"{torch.allclose(r['update'], r['large_update'], atol=1e-5)}")
except RankError as err:
    print(err)

# %% nbgrader={"grade": true, "grade_id": "accumulation_step_matches_large_batch", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
# The weights move as one SGD step on the whole global batch.
print(check_accumulation_values(accumulation_step, world_sizes=(2,)))
### BEGIN HIDDEN TESTS
print(check_accumulation_values(accumulation_step, world_sizes=(3,), k=3))
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "accumulation_step_communication", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
# DDP's communication: as little as no_sync allows, and no collective of the step's own.
print(check_accumulation_syncs(accumulation_step, world_sizes=(2,)))
### BEGIN HIDDEN TESTS
print(check_accumulation_syncs(accumulation_step, world_sizes=(3,), k=5))
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "uneven_exercise_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Exercise 3: a loop for uneven data, without `Join`
#
# Write `train_uneven(ddp, optimizer, batches)`, a training loop that finishes when ranks hold
# **different** numbers of batches (question accumulation_5) **without `Join`**: the ranks agree,
# each step, whether anyone still has data.
#
# Each step of the loop:
#
# 1. one small collective: `dist.all_reduce` of a "have I a batch?" flag (1 or 0, as a tensor),
#    so every rank learns how many ranks still have a batch; if none has, every rank stops;
# 2. `zero_grad`, the loss `nn.functional.mse_loss(ddp(x), y)` on this rank's next batch, and
#    `backward()`. A rank that has run out still takes part in the all-reduce of `backward()`:
#    it runs its **last** batch with a loss that contributes nothing to the weights' update;
# 3. `optimizer.step()`, on every rank, also on a rank that has run out.
#
# Every rank has at least one batch. The result must be the weights `Join` gives (what question
# accumulation_6 measured), and the same weights on every rank.
#
# It is graded on fresh ranks with 5 and 3 batches (7, 5 and 3 on 3 ranks) under a 6 s gloo
# timeout: a loop that hangs fails after those 6 s, with what each rank was doing. `Join` is
# refused on the grading ranks: a loop that uses it earns none of this exercise's points.

# %% nbgrader={"grade": false, "grade_id": "train_uneven", "locked": false, "schema_version": 3, "solution": true, "task": false}
def train_uneven(ddp: DDP, optimizer: torch.optim.Optimizer, batches: list) -> None:
    """One SGD step per step of the loop, until no rank has a batch; no Join."""
    ### BEGIN SOLUTION
    step = 0
    while True:
        mine = step < len(batches)  # has this rank a batch this step?
        anyone = torch.tensor(float(mine))
        dist.all_reduce(anyone)  # how many ranks have one
        if anyone.item() == 0:
            return
        x, y = batches[min(step, len(batches) - 1)]  # out of data: the last batch, times 0
        optimizer.zero_grad()
        (nn.functional.mse_loss(ddp(x), y) * float(mine)).backward()
        optimizer.step()
        step += 1
    ### END SOLUTION

# %% [markdown] nbgrader={"grade": false, "grade_id": "uneven_try_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### Test as you go
#
# Your loop on 2 ranks, rank 0 with 3 batches and rank 1 with 2, under a 5 s gloo timeout: it
# should finish, and (once it trains) both ranks should end with the same weights.

# %% nbgrader={"grade": false, "grade_id": "uneven_try", "locked": true, "schema_version": 3, "solution": false, "task": false}
def try_uneven(train):
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    ddp = DDP(model)
    g = torch.Generator().manual_seed(rank)
    batches = [(torch.randn(2, 3, generator=g), torch.randn(2, 1, generator=g)) for _ in range(3 - rank)]
    train(ddp, torch.optim.SGD(ddp.parameters(), lr=0.1), batches)
    return [round(v, 4) for p in model.parameters() for v in p.detach().flatten().tolist()]


from course.checks.teaching import not_implemented

if not_implemented(train_uneven):  # the empty stub takes no step: "equal" would say nothing
    print(f"Note: {not_implemented(train_uneven)}")
else:
    result = launch(try_uneven, 2, train_uneven, timeout=60, pg_timeout=5)
    if result.ok:
        print(f"finished in {result.elapsed:.1f} s; weights per rank: {result.results}; "
              f"equal: {result.results[0] == result.results[1]}")
    else:
        print(RankError(result))

# %% nbgrader={"grade": true, "grade_id": "train_uneven_finishes", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
# Finishes with uneven batches, without Join, with the weights that Join gives.
print(check_train_uneven(train_uneven, world_sizes=(2,)))
### BEGIN HIDDEN TESTS
print(check_train_uneven(train_uneven, world_sizes=(3,)))
### END HIDDEN TESTS
