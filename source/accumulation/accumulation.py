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

from course.lessons.accumulation import (
    check_accumulation_syncs,
    check_accumulation_values,
    check_answer,
    check_sampler_indices,
    check_train_uneven,
    experiment,
    sampler,
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
# ## Question accumulation_1: a synced backward in the wrong place
#
# *Difficulty 1/3*
#
# Two ranks accumulate K = 4 micro-batches with the loop above, but its condition is inverted:
# the **first** backward runs outside `ddp.no_sync()` and the other 3 inside it
# (`with ddp.no_sync() if i > 0 else contextlib.nullcontext():`). The model is small, so DDP
# puts all its gradients in one bucket. What does `.grad` hold when the optimizer steps?
#
# * a) The same as the right loop's: one all-reduce per step, only earlier.
# * b) The average over ranks of micro-batch 1, the others' gradients dropped.
# * c) On each rank, micro-batch 1 averaged plus its own last 3: ranks differ.
# * d) Nothing usable: DDP raises when no_sync follows a synced backward.

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
    DDP all-reduces in a synced backward what .grad holds at that moment: here the first
    backward's bucket carries micro-batch 1's gradients, averaged over the ranks. The 3
    no_sync backwards after it only add each rank's own gradients into .grad, and no later
    backward communicates (measured: all-reduces per backward [1, 0, 0, 0]). So .grad is the
    average of micro-batch 1 plus the rank's own micro-batches 2 to 4, different on each rank
    (measured element for element), and the optimizer step silently drives the replicas apart.
    a) The place matters: the right loop all-reduces in the last backward, when .grad holds
    all 4 micro-batches, as the cell's runs show. b) Nothing is dropped: .grad keeps adding.
    d) DDP checks nothing of the sort: the run finishes.
    """,
    giveaways=(
        r"\[1, 0, 0, 0\]",
        r"micro-batch 1 averaged plus",
        r"only add each rank's own gradients",
    ),
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "accumulation_1_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it.** `course.lessons.accumulation.experiment.accumulation_counts` runs the loop on 2 ranks
# with a comm hook that counts DDP's all-reduces (`course.lessons.accumulation.experiment.counting_hook`),
# for K = 3 and K = 6 micro-batches, once without and once with `no_sync` on all but the last,
# and compares the accumulated `.grad` of both runs. Its `sync_first` puts the one synced
# backward first; it also returns each micro-batch's local gradient (`local_grads`).

# %% nbgrader={"grade": false, "grade_id": "accumulation_1_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
for k in (3, 6):
    grads = {}
    for use_no_sync in (False, True):
        r = run(experiment.accumulation_counts, 2, use_no_sync, k)[0]
        grads[use_no_sync] = torch.tensor(r["grad"])
        print(f"K = {k}, no_sync on all but the last: {use_no_sync!s:5}  all-reduces per backward "
              f"{r['allreduces_per_backward']}")
    print(f"K = {k}: same .grad with and without no_sync: {torch.allclose(grads[False], grads[True], atol=1e-6)}")

# %% [markdown] nbgrader={"grade": false, "grade_id": "accumulation_2_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Question accumulation_2: the scale of accumulated gradients
#
# *Difficulty 2/3*
#
# The same two ranks accumulate K = 4 micro-batches of 2 samples each with the loop above
# (`no_sync` on the first 3), but each micro-batch's loss is **summed** over its samples,
# `mse_loss(ddp(x), y, reduction="sum")` (the model has one output), and backpropagated as it
# is. Compared with the
# gradient of the mean loss over the whole global batch (all 16 samples of both ranks), what
# does `.grad` hold when the optimizer steps?
#
# * a) 8 times the large-batch gradient
# * b) 4 times the large-batch gradient
# * c) The large-batch gradient itself
# * d) 16 times the large-batch gradient

# %% nbgrader={"grade": false, "grade_id": "accumulation_2_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
answer_accumulation_2 = ""  # your answer: one letter, "a" to "d"
### BEGIN SOLUTION
answer_accumulation_2 = "a"
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "accumulation_2_check", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_answer("answer_accumulation_2", answer_accumulation_2, choices="abcd")
### BEGIN HIDDEN TESTS
check_answer(
    "answer_accumulation_2",
    answer_accumulation_2,
    choices="abcd",
    key="a",
    explanation="""
    Two factors combine. .grad adds up the gradients of the 4 backward passes, and a loss summed
    over a micro-batch's 2 samples has twice the gradient of their mean: each rank's .grad
    holds the sum of its 8 per-sample gradients. DDP divides the all-reduced sum by world_size
    only, which averages over the 2 ranks: .grad is the sum of all 16 per-sample gradients over
    2, that is 8 times their mean, the large-batch gradient (measured: 8.0 for every element).
    The cell's mean-loss run shows the micro-batch factor alone: K (3.0 with K = 3). b) 4 is
    that factor without the sum over samples. d) 16 would need DDP to sum over ranks instead of
    averaging. c) Nothing divides by the micro-batches or the samples: DDP knows neither. For
    the large-batch step, divide each summed loss by the samples per rank (K x 2 = 8).
    """,
    giveaways=(
        r"\b8(\.0)? ?(x|times) (the )?large-batch",
        r"sum of its 8 per-sample gradients",
        r"8 times their mean",
    ),
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "accumulation_2_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it.** The accumulated `.grad` of the loop above with **K = 3** micro-batches and the
# mean loss, against the mean-loss gradient of the whole global batch (2 ranks x 3
# micro-batches x 2 samples) computed in one process: their ratio, element by element.
# `accumulation_counts` also takes `k` and the loss's `reduction`.

# %% nbgrader={"grade": false, "grade_id": "accumulation_2_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
r = run(experiment.accumulation_counts, 2, True, 3)[0]
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
# A data set of 1000 samples is split over 64 ranks with
# `DistributedSampler(ds, num_replicas=64, rank=r, shuffle=True)` (and `drop_last=False`, the
# default), and `sampler.set_epoch(epoch)` is called every epoch. Which samples does one epoch
# read twice?
#
# * a) Samples 0 to 23 in every epoch: the padding repeats the data set's start.
# * b) None: each rank reads 15 or 16 samples, and every sample is read once.
# * c) 24 samples that change with the epoch: the start of its shuffled order.
# * d) Samples 960 to 999 in every epoch: the last, incomplete round of ranks.

# %% nbgrader={"grade": false, "grade_id": "accumulation_3_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
answer_accumulation_3 = ""  # your answer: one letter, "a" to "d"
### BEGIN SOLUTION
answer_accumulation_3 = "c"
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "accumulation_3_check", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_answer("answer_accumulation_3", answer_accumulation_3, choices="abcd")
### BEGIN HIDDEN TESTS
check_answer(
    "answer_accumulation_3",
    answer_accumulation_3,
    choices="abcd",
    key="c",
    explanation="""
    DistributedSampler gives every rank the same number of samples, ceil(1000 / 64) = 16, so
    that every rank runs the same number of steps (and so of all-reduces): not b, whose uneven
    shares would leave ranks waiting. It shuffles first (a permutation seeded with seed +
    epoch), then pads the permuted list to 16 x 64 = 1024 by repeating its start, and deals it
    round robin. So the 24 samples read twice are the first 24 of the epoch's permutation, a
    new set each epoch: measured, the repeated samples are the first 24 of the order rebuilt
    from the ranks' shares, in epochs 0 and 1, and the two sets differ. a) holds only without
    shuffling, the cell's case, where the order is the data set's own. d) takes the last,
    incomplete round for the padding: positions 960 to 999 of the order are read once each, by
    ranks 0 to 39, and only with drop_last=True do they change, dropped (the last 40 of the
    permutation; 15 samples per rank, measured).
    """,
    giveaways=(
        r"first 24 of the epoch'?s? permutation",
        r"pads the permuted list",
        r"start of its shuffled order",
    ),
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "accumulation_3_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it.** The indices `DistributedSampler` gives each rank without shuffling
# (`course.lessons.accumulation.sampler.sampler_split`) for 11 samples on 4 ranks, 7 on 3 and 3 on 4,
# with and without `drop_last`, and the picture of the first (an x marks a sample read a
# second time). `sampler_split` takes `shuffle` too, and `sampler.seeded_split` sets each
# rank's seed and the epoch.

# %% nbgrader={"grade": false, "grade_id": "accumulation_3_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
for n, ranks in ((11, 4), (7, 3), (3, 4)):
    for drop_last in (False, True):
        print(f"{n} samples, {ranks} ranks, drop_last={drop_last!s:5}: "
              f"{sampler.sampler_split(n, ranks, drop_last=drop_last)}")
sampler.sampler_figure(sampler.sampler_split(11, 4), 11)

# %% [markdown] nbgrader={"grade": false, "grade_id": "accumulation_4_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Question accumulation_4: a seed per rank
#
# *Difficulty 1/3*
#
# So that "every rank shuffles differently", a script builds
# `DistributedSampler(ds, num_replicas=3, rank=r, shuffle=True, seed=r)` on each rank r, for a
# data set of 12 samples, and calls `sampler.set_epoch(epoch)` every epoch. What do the three
# ranks read in one epoch?
#
# * a) Disjoint shares of 4, each shuffled by its own seed: all 12 read once.
# * b) Overlapping shares of 4: some samples twice or more, some left out.
# * c) Identical shares of 4 on every rank, each in a different order.
# * d) An error: the sampler checks that all ranks pass the same seed.

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
    DistributedSampler never communicates: each rank draws a permutation of all 12 indices from
    a generator seeded with seed + epoch and keeps positions rank, rank + 3, ... of it. The
    shares are disjoint only because every rank draws the same permutation. With seed = r the
    ranks draw different permutations and each keeps its positions of its own: measured with
    seeds 0, 1 and 2 in epoch 0, the shares are [8, 9, 2, 1], [4, 11, 3, 10] and [3, 5, 8, 11],
    samples 3, 8 and 11 read twice and 0, 6 and 7 never. a) would need the sampler to split
    first and shuffle within a share. c) The shares come from different permutations, so they
    differ. d) It checks nothing, and needs no process group to compare seeds with. Pass the
    same seed on every rank, and set_epoch for a new order each epoch.
    """,
    giveaways=(
        r"every rank draws the same permutation",
        r"\[8, 9, 2, 1\]",
        r"keeps positions rank",
    ),
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "accumulation_4_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it.** Rank 0's order in 3 epochs, for 12 samples on 3 ranks, without and with
# `set_epoch` (`course.lessons.accumulation.sampler.epoch_orders`); then the three ranks' shares in one
# epoch, every rank with the default seed 0 (`sampler.seeded_split`, which takes a seed per
# rank).

# %% nbgrader={"grade": false, "grade_id": "accumulation_4_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
for set_epoch in (False, True):
    print(f"set_epoch called: {set_epoch!s:5}  rank 0's order per epoch: "
          f"{sampler.epoch_orders(12, 3, 3, set_epoch)}")
print(f"seed 0 on every rank, epoch 0: shares {sampler.seeded_split(12, [0, 0, 0])}")

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
# Two ranks train `nn.Linear(2, 1, bias=False)` with DDP in a plain loop (`zero_grad`,
# forward, `backward`, no `Join`). Rank 0 has 3 batches, rank 1 has 2; the model's gradient is
# one bucket of 2 floats, and rank 0's local gradient in its third batch is `[3, 3]`. Rank 1,
# out of batches, calls `dist.all_reduce(torch.zeros(2))` once and then returns. What happens
# at rank 0's third batch?
#
# * a) Rank 0 waits in its third backward until gloo's timeout, as without the call.
# * b) Both ranks raise an error: DDP's all-reduce meets a call that is not DDP's.
# * c) Rank 0 steps on its own gradient alone, `[3.0, 3.0]` in `.grad`.
# * d) Rank 0's backward completes, and its `.grad` then holds `[1.5, 1.5]`.

# %% nbgrader={"grade": false, "grade_id": "accumulation_5_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
answer_accumulation_5 = ""  # your answer: one letter, "a" to "d"
### BEGIN SOLUTION
answer_accumulation_5 = "d"
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "accumulation_5_check", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_answer("answer_accumulation_5", answer_accumulation_5, choices="abcd")
### BEGIN HIDDEN TESTS
check_answer(
    "answer_accumulation_5",
    answer_accumulation_5,
    choices="abcd",
    key="d",
    explanation="""
    Nothing in DDP counts batches or checks whom it reduces with: rank 0's third backward
    launches its bucket's all-reduce, and gloo pairs it with the next all-reduce rank 1 makes,
    of the same size and dtype, whatever it means. So it completes: DDP divided rank 0's
    gradient by the world size 2, and rank 1 brought zeros: 3 / 2 + 0 = 1.5 in each element,
    measured, and both ranks finish. That is how Join keeps the ranks going: a rank that has
    joined shadows the others' all-reduces. a) is the plain loop of the cell, where rank 1
    made no call: rank 0 waited in backward() until gloo gave up (5 s here; the process
    group's default timeout is 30 minutes), while rank 1 had finished normally. b) DDP's
    all-reduce is an ordinary collective on the process group; nothing marks it as DDP's.
    c) DDP always divides by the world size it was built with, before the sum.
    """,
    giveaways=(
        r"rank 1 brought zeros",
        r"checks whom it reduces with",
        r"pairs it with the next all-reduce",
    ),
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "accumulation_5_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it.** The loop of `course.lessons.accumulation.experiment.uneven_loop` on 2 ranks with 4
# batches on rank 0 and 2 on rank 1, no `Join`, launched with a 5 s gloo timeout
# (`pg_timeout`) instead of the default 30 minutes. The launcher's report says what each rank
# was doing. `uneven_loop`'s `then` sets what a rank does once its batches are done.

# %% nbgrader={"grade": false, "grade_id": "accumulation_5_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
result = launch(experiment.uneven_loop, 2, (4, 2), False, timeout=60, pg_timeout=5)
print(f"finished: {result.ok} after {result.elapsed:.1f} s")
print(f"rank 1 returned: {result.results[1]}")
print(RankError(result) if not result.ok else "")

# %% [markdown] nbgrader={"grade": false, "grade_id": "accumulation_6_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Question accumulation_6: the weights after `Join`
#
# *Difficulty 3/3*
#
# Two ranks train `nn.Linear(2, 1, bias=False)`, its weights starting at `[0, 0]`, in the plain
# loop inside `with Join([ddp]):`, with an SGD step (lr **0.2**) after each backward. Batch i
# of rank r is one sample whose two inputs are both `10 r + i + 1`, and the loss is
# `sum(w . x)`, so a rank's local gradient is its input. Rank 0 has **1** batch, rank 1 has
# **3**. What weights does rank 0 hold once both ranks have left the `with` block?
#
# * a) `[-2.45, -2.45]`
# * b) `[-1.20, -1.20]`
# * c) `[-6.20, -6.20]`
# * d) `[-3.70, -3.70]`

# %% nbgrader={"grade": false, "grade_id": "accumulation_6_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
answer_accumulation_6 = ""  # your answer: one letter, "a" to "d"
### BEGIN SOLUTION
answer_accumulation_6 = "d"
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "accumulation_6_check", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
check_answer("answer_accumulation_6", answer_accumulation_6, choices="abcd")
### BEGIN HIDDEN TESTS
check_answer(
    "answer_accumulation_6",
    answer_accumulation_6,
    choices="abcd",
    key="d",
    explanation="""
    Two mechanisms of Join. A rank that has joined shadows each all-reduce of the others with
    zeros, and DDP still divides the sum by the world size it started with (Join's
    divide_by_initial_world_size=True by default): the cell's 3 ranks show both, rank 0's
    .grad at step 3 being (3 + 0 + 0) / 3 = 1.0. Here rank 1's steps are (1 + 11) / 2 = 6,
    then (0 + 12) / 2 = 6 and (0 + 13) / 2 = 6.5 with rank 0 joined: at lr 0.2 its weights go
    -1.2, -2.4, -3.7, while rank 0, done after one step, stays at -1.2 inside the block. When
    the last rank leaves the Join context, DDP's join hook agrees on a last joiner (the highest
    rank among those that joined last) and broadcasts that rank's parameters to every rank, so
    rank 0 ends with rank 1's [-3.70, -3.70], measured. In the cell the last joiner is rank 0,
    so there "from rank 0" and "from the last joiner" look alike; with rank 0 short of data
    they part. b) -1.2 is rank 0's own step, kept: what no final sync, or a sync from rank 0
    (as at DDP's construction), would leave. a) -2.45 averages the two replicas: the final sync
    copies, it does not average. c) -6.2 divides each sum by the ranks still training,
    Join's divide_by_initial_world_size=False (measured: rank 1's steps 6, 12 and 13).
    """,
    giveaways=(
        r"\[-3\.70?, -3\.70?\]",
        r"last joiner",
        r"broadcasts that rank's parameters",
        r"rank 0 ends with rank 1's",
    ),
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "accumulation_6_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it.** `course.lessons.accumulation.experiment.uneven_loop` with `Join` and the SGD step
# (`lr` 0.1, weights from 0), on **3** ranks holding 3, 2 and 1 batches: each rank's input,
# `.grad` and weights step by step inside the `with` block. Its last entry holds the weights
# after the block; it takes the batches per rank, the `lr` and Join's
# `divide_by_initial_world_size`.

# %% nbgrader={"grade": false, "grade_id": "accumulation_6_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
for rank, steps in enumerate(run(experiment.uneven_loop, 3, (3, 2, 1), True, "return", 0.1)):
    for i, s in enumerate(steps[:-1]):  # the last entry, after the with block, is not printed
        print(f"rank {rank}, step {i + 1}: input {s['local']}  .grad {[round(g, 4) for g in s['grad']]}"
              f"  weights {[round(w, 4) for w in s['weight']]}")

# %% [markdown] nbgrader={"grade": false, "grade_id": "more_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Unused parameters, mismatched collectives, random numbers, clipping and buffers

# %% [markdown] nbgrader={"grade": false, "grade_id": "accumulation_7_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Question accumulation_7: a head that only one rank uses
#
# *Difficulty 3/3*
#
# A module has two heads, `self.a` and `self.b` (each `nn.Linear(2, 1, bias=False)`), and its
# `forward(x, head)` runs only the head it is given. It is wrapped in
# `DDP(model, find_unused_parameters=True)`. In the first step rank 0 runs head `a` on input
# `[1, 1]` and rank 1 runs head `b` on input `[3, 3]`, with the loss `sum(w . x)`, so each
# rank's local gradient is its input. After that backward, what do rank 0's
# `a.weight.grad` and `b.weight.grad` hold?
#
# * a) `[1.0, 1.0]` and `None`
# * b) `[1.0, 1.0]` and `[3.0, 3.0]`
# * c) `[0.5, 0.5]` and `None`
# * d) `[0.5, 0.5]` and `[1.5, 1.5]`

# %% nbgrader={"grade": false, "grade_id": "accumulation_7_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
answer_accumulation_7 = ""  # your answer: one letter, "a" to "d"
### BEGIN SOLUTION
answer_accumulation_7 = "d"
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "accumulation_7_check", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
check_answer("answer_accumulation_7", answer_accumulation_7, choices="abcd")
### BEGIN HIDDEN TESTS
check_answer(
    "answer_accumulation_7",
    answer_accumulation_7,
    choices="abcd",
    key="d",
    explanation="""
    DDP all-reduces every bucket on every rank in every synced backward: the collectives must
    match. With find_unused_parameters=True it walks the autograd graph after each forward and
    marks the parameters this rank did not use as ready, so their slots in the bucket carry
    zeros from this rank; the sum is divided by the world size as always. It also all-reduces
    a map of which parameters any rank used: a parameter that no rank used keeps .grad None
    (the measured unused head), but one that some rank used gets the averaged gradient on
    every rank. So rank 0 holds a = (1 + 0) / 2 = 0.5 and b = (0 + 3) / 2 = 1.5 in each
    element, and rank 1 the same, measured. a) would be no reduction at all. b) would divide
    by the ranks that used the head. c) treats a head unused here as unused everywhere. With
    the default find_unused_parameters=False the bucket never completes: the first backward
    leaves local gradients and the next forward raises, as the measurement shows.
    """,
    giveaways=(
        r"\(0 ?\+ ?3\) ?/ ?2",
        r"carry zeros from this rank",
        r"one that some rank used gets the averaged",
    ),
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "accumulation_7_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it.** `course.lessons.accumulation.experiment.unused_parameter_steps`: a module whose
# `forward` never uses its second head, on 3 ranks (rank r's input `r + 1`), two steps with and
# without `find_unused_parameters`: the used head's `.grad` (or the error) and the unused
# head's `.grad`.

# %% nbgrader={"grade": false, "grade_id": "accumulation_7_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
for find in (False, True):
    print(f"find_unused_parameters={find}")
    for rank, steps in enumerate(run(experiment.unused_parameter_steps, 3, find)):
        for i, s in enumerate(steps):
            got = s["error"].split(". ")[0] if "error" in s else (
                f"used .grad {s['grad']}  unused .grad {s['unused_grad']}")
            print(f"  rank {rank}, step {i + 1}: {got}")

# %% [markdown] nbgrader={"grade": false, "grade_id": "accumulation_8_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Question accumulation_8: collectives called in a different order
#
# *Difficulty 3/3*
#
# After a step, each of 3 ranks sums two one-element tensors with `dist.all_reduce`: its loss
# sum (rank r holds `1 + r`) and its sample count (64 on every rank); then it prints its mean
# loss, loss sum / count. Because of an `if`, ranks 0 and 1 reduce the loss first and then the
# count, while rank 2 reduces the count first and then the loss. What does rank 0 print?
#
# * a) 0.031 (6 / 192)
# * b) 1.870 (129 / 69)
# * c) 0.511 (67 / 131)
# * d) 1.955 (131 / 67)

# %% nbgrader={"grade": false, "grade_id": "accumulation_8_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
answer_accumulation_8 = ""  # your answer: one letter, "a" to "d"
### BEGIN SOLUTION
answer_accumulation_8 = "c"
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "accumulation_8_check", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
check_answer("answer_accumulation_8", answer_accumulation_8, choices="abcd")
### BEGIN HIDDEN TESTS
check_answer(
    "answer_accumulation_8",
    answer_accumulation_8,
    choices="abcd",
    key="c",
    explanation="""
    Collectives are matched by their order on each rank, not by which tensor they carry. The
    first all_reduce of every rank is one collective: ranks 0 and 1 bring their losses 1 and 2,
    rank 2 its count 64, so 67 lands in the loss sums of ranks 0 and 1 and in rank 2's count.
    The second brings 64 + 64 + 3 = 131, into the counts of ranks 0 and 1 and rank 2's loss
    sum. Rank 0 prints 67 / 131 = 0.511, as rank 1 does; d) 131 / 67 = 1.955 is what rank 2
    prints. a) 6 / 192 = 0.031 would need the calls paired by the tensor they carry: nothing
    in an all_reduce call names it. b) 129 / 69 = 1.870 pairs each rank's loss with the other
    ranks' counts, as if the swap crossed every pair of ranks: on 2 ranks that rule and the
    order give the same values (measured: rank 0's loss sum 5 + 2000 in the cell's run), on 3
    they part: what pairs is the k-th call of every rank, whichever rank made it. Same shapes,
    same dtypes, so gloo has nothing to complain about and every call finds a partner: the
    cell's run finishes without an error, and the 3-rank run with these values, silently
    wrong. Mismatches are only caught when something else differs: a different number of
    elements crashed the process (SIGABRT inside gloo), and all_reduce against broadcast hung
    until the timeout. Every rank must issue the same collectives in the same order.
    """,
    giveaways=(
        r"\b67 ?/ ?131\b",
        r"matched by (their )?order",
        r"k-th call of every rank",
        r"\b0\.511\b",
    ),
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "accumulation_8_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it.** `course.lessons.accumulation.experiment.swapped_all_reduce` on 2 ranks: rank r's loss
# sum is `5 + r` and its count `1000 (r + 1)`, and rank 1 reduces them in the opposite order to
# rank 0. The cell prints whether every rank returned, and any error; then two other mismatches
# for comparison: different sizes, and `all_reduce` against `broadcast` (5 s timeout).
# `swapped_all_reduce` returns each rank's loss sum and count after the two calls, and takes
# which ranks swap and whether the counts differ per rank.

# %% nbgrader={"grade": false, "grade_id": "accumulation_8_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
result = launch(experiment.swapped_all_reduce, 2, 5.0, 1000.0, timeout=30, pg_timeout=5)
print(f"swapped_all_reduce: after {result.elapsed:.1f} s, every rank returned: {result.ok}")
for rank, failure in sorted(result.failures.items()):
    print(f"  {failure}"[:160])


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
# Every rank runs `torch.manual_seed(rank)` at start-up, builds its model (which has dropout),
# wraps it in `DDP(model)`, and then trains, each rank on different data. In the first step,
# how do the ranks' weights and their dropout masks compare?
#
# * a) Weights different on each rank; dropout masks different too.
# * b) Weights equal on every rank; dropout masks equal too.
# * c) Weights equal on every rank; dropout masks different.
# * d) Weights different on each rank; dropout masks equal.

# %% nbgrader={"grade": false, "grade_id": "accumulation_9_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
answer_accumulation_9 = ""  # your answer: one letter, "a" to "d"
### BEGIN SOLUTION
answer_accumulation_9 = "c"
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "accumulation_9_check", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
check_answer("answer_accumulation_9", answer_accumulation_9, choices="abcd")
### BEGIN HIDDEN TESTS
check_answer(
    "answer_accumulation_9",
    answer_accumulation_9,
    choices="abcd",
    key="c",
    explanation="""
    Two mechanisms. DDP's constructor broadcasts rank 0's parameters and buffers to every rank,
    so the replicas start equal whatever each rank's seed (measured on 3 ranks seeded with
    their rank: equal weights after wrapping). It leaves random number generators alone: each
    process keeps its own, and seeded with their rank the ranks draw different masks
    (measured); seeded alike, as in the cell, they draw equal ones. Different masks are what
    you want: the ranks drop different units, as one process would across a larger batch.
    b) DDP syncs no generator state. a) and d) forget the broadcast at construction (question
    ddp_4). To give every rank equal weights and its own masks without relying on it, seed
    alike, build the model, then seed with seed + rank.
    """,
    giveaways=(
        r"broadcasts rank 0's parameters and buffers to every rank",
        r"seeded with their rank the ranks draw different masks",
        r"leaves random number generators alone",
    ),
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "accumulation_9_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it.** The masks of `nn.functional.dropout(torch.ones(12), 0.5)` on 3 ranks, drawn after
# `torch.manual_seed(0)` on every rank and after building a DDP model
# (`course.lessons.accumulation.experiment.dropout_masks`, which can also seed each rank with its
# rank).

# %% nbgrader={"grade": false, "grade_id": "accumulation_9_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
masks = run(experiment.dropout_masks, 3, False)
print("seed = 0 on every rank: " + "\n                        ".join(
    f"rank {r} {m}" for r, m in enumerate(masks)))

# %% [markdown] nbgrader={"grade": false, "grade_id": "accumulation_10_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Question accumulation_10: clipping the gradient norm
#
# *Difficulty 2/3*
#
# Two ranks accumulate K = 3 micro-batches of **4** samples each with the loop of the first
# questions (`no_sync` on the first 2). Each micro-batch's loss is **summed** over its samples,
# `mse_loss(ddp(x), y, reduction="sum")` (the model has one output), and backpropagated as it
# is. Each rank then calls `nn.utils.clip_grad_norm_(model.parameters(), max_norm)` once,
# after the last backward and before `optimizer.step()`, with `max_norm` 6 times the norm of
# the large-batch gradient (the mean-loss gradient over all 24 samples of both ranks). By what
# factor does the clip multiply `.grad`?
#
# * a) By 1/2 on both ranks alike.
# * b) By 1 on both ranks alike.
# * c) By 1/4 on both ranks alike.
# * d) By a factor that differs by rank.

# %% nbgrader={"grade": false, "grade_id": "accumulation_10_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
answer_accumulation_10 = ""  # your answer: one letter, "a" to "d"
### BEGIN SOLUTION
answer_accumulation_10 = "a"
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "accumulation_10_check", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_answer("answer_accumulation_10", answer_accumulation_10, choices="abcd")
### BEGIN HIDDEN TESTS
check_answer(
    "answer_accumulation_10",
    answer_accumulation_10,
    choices="abcd",
    key="a",
    explanation="""
    Two effects combine. .grad adds up the 3 backward passes, each summed loss carries the
    gradients of its 4 samples, and DDP divides the sum over ranks by world_size only: .grad
    is the sum of all 24 per-sample gradients over 2, that is 12 times the large-batch
    gradient (measured: 12.0 for every element before the clip), and its norm 12 times the
    large-batch norm, above max_norm. clip_grad_norm_ multiplies .grad by max_norm / norm =
    6 / 12 = 1/2 (measured: 0.5 for every element, on both ranks). After the synced backward
    every rank's .grad holds the same averaged gradient, so clip_grad_norm_ computes the same
    norm on every rank without communicating (the cell: no collective during the clip, the
    large-batch norm on every rank): not d. b) reads the mean-loss law of question
    accumulation_2's cell (K times: 3, below max_norm) and forgets the 4 samples of each summed
    loss. c) 1/4 would need DDP to sum over the ranks (24 times). Clip after the last, synced
    backward: after a no_sync backward .grad is still local. The norm does need an all-reduce
    when each rank holds only a shard of the gradients (ZeRO, FSDP), not under DDP.
    """,
    giveaways=(
        r"max_norm / norm =",
        r"\b12 times the large-batch",
        r"sum of all 24 per-sample gradients",
    ),
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "accumulation_10_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it.** `course.lessons.accumulation.experiment.clipped_norms` on 3 ranks: the norm `clip_grad_norm_`
# returns, the rank's local gradient norm, the large-batch norm from one process, and the
# collectives recorded during the clip (`course.ring.recorder.Recorder`), after one plain DDP
# backward. `accumulation_counts(..., max_norm_ratio=..., samples=...)` clips after K
# accumulated micro-batches instead, and returns `.grad` before and after the clip.

# %% nbgrader={"grade": false, "grade_id": "accumulation_10_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
for r in run(experiment.clipped_norms, 3):
    print(f"rank {r['rank']}: clip_grad_norm_ saw {r['norm']:.4f}   local gradient norm "
          f"{r['local_norm']:.4f}   large-batch norm {r['large_batch_norm']:.4f}   "
          f"collectives during the clip: {r['collectives']}")

# %% [markdown] nbgrader={"grade": false, "grade_id": "accumulation_11_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Question accumulation_11: batch-norm buffers
#
# *Difficulty 3/3*
#
# A model with one `nn.BatchNorm1d(1)` (momentum 0.1, so each training forward sets
# `running_mean = 0.9 running_mean + 0.1 batch_mean`, starting at 0) is wrapped in `DDP(model)`
# with the default `broadcast_buffers=True` and trained on **4** ranks with the accumulation
# loop of the first questions, K = 2 micro-batches per step: the first forward and backward
# under `ddp.no_sync()`, the second outside it. Every micro-batch of rank r has mean
# `10 r + 1.5`. What is rank 3's `running_mean` after three steps (six forwards)?
#
# * a) 3.7028
# * b) 6.4028
# * c) 14.7596
# * d) 0.7028

# %% nbgrader={"grade": false, "grade_id": "accumulation_11_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
answer_accumulation_11 = ""  # your answer: one letter, "a" to "d"
### BEGIN SOLUTION
answer_accumulation_11 = "b"
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "accumulation_11_check", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
check_answer("answer_accumulation_11", answer_accumulation_11, choices="abcd")
### BEGIN HIDDEN TESTS
check_answer(
    "answer_accumulation_11",
    answer_accumulation_11,
    choices="abcd",
    key="b",
    explanation="""
    DDP averages gradients, not buffers. With broadcast_buffers=True it broadcasts rank 0's
    buffers at the start of a forward, but only of a forward that follows a synced one: a
    forward under no_sync sets DDP's require_forward_param_sync to False, the next forward's
    buffer broadcast checks it (will_sync_module_buffers), and a synced forward sets it back.
    So the first forward of each step broadcasts (the step before ended with a synced forward)
    and the second, after a no_sync forward, does not: each step, rank 3 (mean 31.5) starts
    from rank 0's value and updates twice with its own batch. Rank 0 goes 0.15, 0.285 |
    0.4065, 0.5159 | 0.6143, 0.7028 and rank 3 goes 3.15, 5.985 | 3.4065, 6.2158 | 3.6143,
    6.4028, measured on 4 ranks: 0.9 x 0.5159 + 3.15 = 3.6143, then 0.9 x 3.6143 + 3.15.
    a) 3.7028 = 0.9 x 0.6143 + 3.15 broadcasts before every forward: in the cell each step has
    one forward, and there the two rules agree. d) 0.7028 is rank 0's value: the buffers
    differ after every forward. c) 14.7596 = 31.5 x (1 - 0.9^6) is each rank on its own
    batches, broadcast_buffers=False (measured). Nothing averages buffers here: that needs
    nn.SyncBatchNorm, which runs only on accelerators: on a CPU tensor its forward raises
    "SyncBatchNorm expected input tensor to be on GPU or XPU or privateuseone", and DDP refuses
    to wrap it ("SyncBatchNorm layers only work with GPU modules"), so this course cannot
    measure it.
    """,
    giveaways=(
        r"\b6\.4028\b",
        r"require_forward_param_sync",
        r"0\.9 x 3\.6143",
        r"only of a forward that follows a synced one",
    ),
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "accumulation_11_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it.** `course.lessons.accumulation.experiment.batchnorm_buffers` on 2 ranks, with batch means
# 1.5 and 21.5: each rank's running mean after each of two steps of one forward and backward,
# with and without `broadcast_buffers`; then `nn.SyncBatchNorm` on this CPU.
# `batchnorm_buffers` returns the running mean after every forward, and its `micro_batches`
# runs that many forwards and backwards per step, all but the last under `no_sync`.

# %% nbgrader={"grade": false, "grade_id": "accumulation_11_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
for broadcast in (True, False):
    means = run(experiment.batchnorm_buffers, 2, broadcast, 2, 20.0)
    print(f"broadcast_buffers={broadcast!s:5}  running_mean after steps 1, 2: "
          + "   ".join(f"rank {r} {[round(m, 4) for m in ms]}" for r, ms in enumerate(means)))
print(f"nn.SyncBatchNorm on a CPU rank: {run(experiment.sync_batchnorm_on_cpu, 2)[0]}")

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

# %% tags=["raises-exception"] nbgrader={"grade": false, "grade_id": "sampler_try", "locked": true, "schema_version": 3, "solution": false, "task": false}
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

# %% tags=["raises-exception"] nbgrader={"grade": false, "grade_id": "accumulation_try", "locked": true, "schema_version": 3, "solution": false, "task": false}
from course.lessons.accumulation import try_accumulation_step

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
# Every rank has at least one batch. Every rank must end with the same weights: one SGD step
# per step of the loop, each with the local gradients of the ranks that still have a batch,
# summed and divided by the world size (the `.grad` that question accumulation_6's
# measurement shows).
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

# %% tags=["raises-exception"] nbgrader={"grade": false, "grade_id": "uneven_try", "locked": true, "schema_version": 3, "solution": false, "task": false}
def try_uneven(train):
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    ddp = DDP(model)
    g = torch.Generator().manual_seed(rank)
    batches = [(torch.randn(2, 3, generator=g), torch.randn(2, 1, generator=g)) for _ in range(3 - rank)]
    train(ddp, torch.optim.SGD(ddp.parameters(), lr=0.1), batches)
    return [round(v, 4) for p in model.parameters() for v in p.detach().flatten().tolist()]


from course.lessons.accumulation import not_implemented

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
# Finishes with uneven batches, without Join, with the weights of the steps described above.
print(check_train_uneven(train_uneven, world_sizes=(2,)))
### BEGIN HIDDEN TESTS
print(check_train_uneven(train_uneven, world_sizes=(3,)))
### END HIDDEN TESTS
