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
# 1. answer eleven questions, each next to a cell that **measures** the answer on real gloo ranks
#    (PyTorch's own DDP, `DistributedSampler` and `Join`, on this machine's CPU);
# 2. write `sampler_indices`, the indices `DistributedSampler` gives each rank;
# 3. write `accumulation_step`, one optimizer step from K micro-batches with a single all-reduce;
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

from course.experiments import accumulation
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
# add up over K backward passes, and steps the optimizer once. Under DDP every backward
# all-reduces the gradients, unless it runs inside `ddp.no_sync()`, a context manager that
# skips DDP's communication and lets gradients accumulate locally (PyTorch docs,
# `DistributedDataParallel.no_sync`). A first attempt:
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
# * a) 4 times, once per backward; `no_sync` only delays writing the result into `.grad`.
# * b) 3 times, once for each backward inside `no_sync`.
# * c) Once, during the last backward, on the gradients accumulated over all 4 micro-batches.
# * d) Never: with `no_sync` in the loop, the ranks' gradients are not averaged at all.

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
    comm hook that all-reduces and counts: [1, 1, 1, 1] without no_sync, [0, 0, 0, 1] with it,
    and the accumulated .grad is the same either way (all-reducing a sum step by step or once
    gives the same sum). With K micro-batches no_sync saves K - 1 of every K all-reduces.
    """,
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "accumulation_1_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it.** `course.experiments.accumulation.accumulation_counts` runs the loop on 2 ranks with a
# counting comm hook (`course.experiments.accumulation.counting_hook`: DDP's averaging, plus a count), once
# without and once with `no_sync`, and prints the accumulated `.grad` of both runs.

# %% nbgrader={"grade": false, "grade_id": "accumulation_1_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
grads = {}
for use_no_sync in (False, True):
    r = run(accumulation.accumulation_counts, 2, use_no_sync)[0]
    grads[use_no_sync] = torch.tensor(r["grad"])
    print(f"no_sync on the first 3: {use_no_sync!s:5}  all-reduces per backward "
          f"{r['allreduces_per_backward']}  .grad starts {[round(v, 4) for v in r['grad'][:3]]}")
print(f"same .grad with and without no_sync: {torch.allclose(grads[False], grads[True], atol=1e-6)}")

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
# * b) 4 times the large-batch gradient.
# * c) 8 times the large-batch gradient (4 micro-batches times 2 ranks).
# * d) A quarter of the large-batch gradient: only the last micro-batch is all-reduced.

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
    only, which turns the sum over ranks into a mean over ranks; it knows nothing about
    micro-batches. The measured ratio of .grad to the large-batch gradient is 4.0 for every
    parameter. Nothing is lost either: the last all-reduce carries what the 3 no_sync passes
    accumulated. Divide each micro-batch's loss by K (or the learning rate by K) to get the
    large-batch step.
    """,
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "accumulation_2_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it.** The accumulated `.grad` of the loop above, against the mean-loss gradient
# of the whole global batch (2 ranks x 4 micro-batches x 2 samples) computed in one process.

# %% nbgrader={"grade": false, "grade_id": "accumulation_2_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
r = run(accumulation.accumulation_counts, 2, True)[0]
got, want = torch.tensor(r["grad"]), torch.tensor(r["large_batch_grad"])
print(f"all-reduces per backward {r['allreduces_per_backward']}")
ratio = (got / want)[want.abs() > 1e-3]  # elements of the large-batch gradient that are not ~0
print(f".grad / large-batch gradient over {ratio.numel()} elements: "
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
# * a) 3, 3, 2 and 2 samples: every sample exactly once.
# * b) 3 samples each: samples 0 and 1 are read twice in the epoch.
# * c) 2 samples each: samples 8 and 9 are left out of the epoch.
# * d) An error: 10 is not a multiple of 4.

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
    every rank runs the same number of steps (and so of all-reduces). It pads the index list
    to 12 by repeating it from the start and deals it round robin: rank 0 gets [0, 4, 8], rank 1
    [1, 5, 9], rank 2 [2, 6, 0], rank 3 [3, 7, 1]. Samples 0 and 1 count twice in the epoch's
    gradient. With drop_last=True it drops the tail instead: 2 samples each, [0, 4] to [3, 7],
    and samples 8 and 9 are not read. Even 3 samples over 4 ranks works: rank 3 reads sample 0.
    """,
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "accumulation_3_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it.** The indices of each rank (`course.experiments.accumulation.sampler_split`), with and
# without `drop_last`, and the picture (an x marks a sample read a second time).

# %% nbgrader={"grade": false, "grade_id": "accumulation_3_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
for drop_last in (False, True):
    print(f"drop_last={drop_last}: {accumulation.sampler_split(10, 4, drop_last=drop_last)}")
print(f"3 samples over 4 ranks: {accumulation.sampler_split(3, 4)}")
accumulation.sampler_figure(accumulation.sampler_split(10, 4), 10)

# %% [markdown] nbgrader={"grade": false, "grade_id": "accumulation_4_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Question accumulation_4: shuffling without `set_epoch`
#
# *Difficulty 1/3*
#
# A training script builds `DistributedSampler(ds, num_replicas=2, rank=r, shuffle=True)` once
# and loops over 3 epochs, but never calls `sampler.set_epoch(epoch)`. What order does rank 0
# read its samples in?
#
# * a) A new random order every epoch: `shuffle=True` reshuffles on every pass.
# * b) The same order in every epoch.
# * c) The data set's own order in every epoch: shuffling needs `set_epoch` to start.
# * d) A different order on every call, and on rank 1 an order that overlaps with rank 0's.

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
    set_epoch last set: 0 if it is never called. Every pass then draws the same permutation,
    so the measured orders are identical in all 3 epochs (and not the data set's order). With
    set_epoch(epoch) before each epoch they differ. Every rank draws the same permutation and
    takes its own positions of it, which is what keeps the ranks' shares disjoint: the seed must
    be the same on all ranks.
    """,
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "accumulation_4_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it.** Rank 0's order in 3 epochs, without and with `set_epoch`
# (`course.experiments.accumulation.epoch_orders`).

# %% nbgrader={"grade": false, "grade_id": "accumulation_4_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
for set_epoch in (False, True):
    print(f"set_epoch called: {set_epoch!s:5}  rank 0's order per epoch: "
          f"{accumulation.epoch_orders(10, 2, 3, set_epoch)}")

# %% [markdown] nbgrader={"grade": false, "grade_id": "uneven_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Uneven data and `Join`
#
# When ranks hold different numbers of batches (a data set split by hand, a filter applied per
# rank, `drop_last=False` with an iterable data set), one rank may finish its loop while another
# still calls `backward()`, whose all-reduce needs every rank. PyTorch's answer is the `Join`
# context manager (PyTorch docs, *Distributed training with uneven inputs using the Join context
# manager*): `with Join([ddp]):` around the loop lets a rank that is done *shadow* the
# collectives of the ranks still training. Questions accumulation_5 and 6 measure a loop without
# and with `Join`; in Exercise 3 you build the same agreement yourself, without `Join`.

# %% [markdown] nbgrader={"grade": false, "grade_id": "accumulation_5_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Question accumulation_5: one rank runs out of batches
#
# *Difficulty 2/3*
#
# Two ranks train with DDP in a plain loop (`zero_grad`, forward, `backward`, no `Join`). Rank 0
# has 3 batches, rank 1 has 2. What happens at rank 0's third batch?
#
# * a) Rank 0 steps with its own local gradient: DDP sees that rank 1 is gone.
# * b) DDP detects the uneven inputs and raises an error on both ranks at once.
# * c) Rank 0 waits in the all-reduce of its third backward, which rank 1 never joins: the run
#   hangs until the process group's timeout (30 minutes by default for gloo), then fails.
# * d) Rank 1 repeats its last batch so that rank 0 can finish.

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
    waits for a partner that is not coming. Rank 1 has left the loop, so no error is raised
    anywhere until gloo's timeout on the wait (here shortened to 5 s; by default it is 30
    minutes): the measured run fails on rank 0 with "Timed out waiting 5000ms for recv" inside
    backward(), while rank 1 finished normally after 2 steps. A real job would look hung. If
    rank 1's process exited instead, rank 0 would fail with a closed connection. Join, a loop
    in which the ranks agree each step whether anyone still has data (Exercise 3), or equal
    numbers of batches on every rank (DistributedSampler) prevents it.
    """,
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "accumulation_5_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it.** The loop of `course.experiments.accumulation.uneven_loop` on 2 ranks with batches
# (3, 2), no `Join`, launched with a 5 s gloo timeout (`pg_timeout`) so that the hang ends
# quickly. The launcher's report says what each rank was doing.

# %% nbgrader={"grade": false, "grade_id": "accumulation_5_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
result = launch(accumulation.uneven_loop, 2, (3, 2), False, timeout=60, pg_timeout=5)
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
# * a) `[3.0, 3.0]`: its own local gradient, since no other rank contributes.
# * b) `[1.5, 1.5]`: its local gradient divided by the world size of 2.
# * c) `[0.0, 0.0]`: the joined rank's zeros replace the gradient.
# * d) The average of `[3, 3]` and rank 1's last input `[12, 12]`: `[7.5, 7.5]`.

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
    by default). So rank 0 gets (3 + 0) / 2 = 1.5: the measured .grad is [1.5, 1.5], as if
    the missing rank had a zero gradient. That keeps the scale of an extra step consistent with
    the others; pass divide_by_initial_world_size=False to divide by the ranks still training.
    When the last rank leaves the Join context, DDP broadcasts its final parameters to the
    joined ranks, so all ranks end with the same weights.
    """,
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "accumulation_6_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it.** `uneven_loop` with `Join`: each rank's input and `.grad`, step by step.

# %% nbgrader={"grade": false, "grade_id": "accumulation_6_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
for rank, steps in enumerate(run(accumulation.uneven_loop, 2, (3, 2), True)):
    for i, s in enumerate(steps):
        print(f"rank {rank}, step {i + 1}: local gradient {s['local']}  .grad {s['grad']}")

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
# * b) Both steps work; `self.unused` just keeps `.grad = None`.
# * c) The first backward returns without an error, but `self.used.weight.grad` holds each
#   rank's local, un-averaged gradient; the second step raises an error.
# * d) Both steps work, and `.grad` is averaged as usual: DDP finds unused parameters itself.

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
    returns normally and leaves each rank's local gradient in .grad, [1, 1] on rank 0 and
    [2, 2] on rank 1, not the average [1.5, 1.5]. An optimizer step now would silently drive the
    replicas apart. Only the next forward notices the unfinished reduction and raises "Expected
    to have finished reduction in the prior iteration before starting a new one". With
    find_unused_parameters=True DDP marks unused parameters ready after each forward, and both
    steps give [1.5, 1.5].
    """,
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "accumulation_7_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it.** `course.experiments.accumulation.unused_parameter_steps`, with and without
# `find_unused_parameters`.

# %% nbgrader={"grade": false, "grade_id": "accumulation_7_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
for find in (False, True):
    print(f"find_unused_parameters={find}")
    for rank, steps in enumerate(run(accumulation.unused_parameter_steps, 2, find)):
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
# * a) Both ranks end with the right sums (loss 3, count 300): gloo matches the tensors by name.
# * b) The run hangs: each all-reduce waits for its own partner call.
# * c) An error on both ranks: the collectives do not match.
# * d) No error, no hang, and wrong numbers: rank 0's loss sum comes out as 201 and its count as
#   102, and rank 1 has them the other way round.

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
    Collectives are matched by their order on each rank, not by which tensor they carry. Rank
    0's first all_reduce pairs with rank 1's first, whatever the tensors mean: rank 0's loss 1
    is added to rank 1's count 200, giving 201, and rank 0's count 100 to rank 1's loss 2,
    giving 102. Same shapes, same dtypes, so gloo has nothing to complain about: measured, both
    ranks finish at once with swapped, wrong sums. Mismatches are only caught when something
    else differs: a different number of elements crashed the process (SIGABRT inside gloo), and
    all_reduce against broadcast hung until the timeout. Every rank must issue the same
    collectives in the same order.
    """,
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "accumulation_8_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it.** `course.experiments.accumulation.swapped_all_reduce` on 2 ranks, then two other
# mismatches for comparison: different sizes, and `all_reduce` against `broadcast` (5 s timeout).

# %% nbgrader={"grade": false, "grade_id": "accumulation_8_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
for r in run(accumulation.swapped_all_reduce, 2):
    print(f"rank {r['rank']}: loss sum {r['loss_sum']}  count {r['count']}  (right: 3.0 and 300.0)")


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
# Every rank runs `torch.manual_seed(0)` at start-up (so that the models start equal) and then
# trains a model with dropout under DDP, each rank on different data. How do the dropout masks
# of the ranks relate in the first step?
#
# * a) They are independent: each process has its own random number generator.
# * b) They are identical on every rank: the same seed draws the same masks.
# * c) DDP reseeds each rank with its rank number, so they differ.
# * d) DDP broadcasts rank 0's mask along with the weights.

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
    Each process has its own generator, but the same seed gives the same sequence, so every rank
    draws the same dropout mask for the same layer shape: measured, the masks of 2 ranks seeded
    with 0 are equal element for element. DDP does not touch random number generators (it
    broadcasts parameters and buffers, not RNG state). Because the ranks see different data the
    training still works, but the ranks drop the same units, which correlates them. To get
    independent masks, seed with seed + rank after building the model (DDP's construction already
    makes the weights equal, question ddp_4).
    """,
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "accumulation_9_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it.** The masks of `nn.functional.dropout(torch.ones(12), 0.5)` on 2 ranks, seeded
# alike and with their rank (`course.experiments.accumulation.dropout_masks`).

# %% nbgrader={"grade": false, "grade_id": "accumulation_9_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
for per_rank in (False, True):
    masks = run(accumulation.dropout_masks, 2, per_rank)
    seed = "seed = rank" if per_rank else "seed = 0   "
    print(f"{seed}: rank 0 {masks[0]}\n             rank 1 {masks[1]}  equal: {masks[0] == masks[1]}")

# %% [markdown] nbgrader={"grade": false, "grade_id": "accumulation_10_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Question accumulation_10: clipping by the global norm
#
# *Difficulty 2/3*
#
# Two ranks train with DDP and clip gradients with `nn.utils.clip_grad_norm_(model.parameters(),
# max_norm)` right after `backward()`. In a single-process run on all the data, the clip would
# use the norm of the large-batch gradient. What norm does each rank compute?
#
# * a) Each rank the norm of its own local gradient, so ranks clip by different factors and
#   their weights drift apart: all-reduce the norm first.
# * b) The norm of the averaged gradient, the same on every rank and equal to the large-batch
#   gradient's norm: no extra communication is needed.
# * c) The global norm, because `clip_grad_norm_` all-reduces the norm across ranks itself.
# * d) Nothing useful: clipping must happen inside a comm hook under DDP.

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
    ranks, so clip_grad_norm_ computes the same norm everywhere without communicating. Measured:
    both ranks compute 1.0091, the norm of the large-batch gradient computed in one process,
    while the ranks' local gradients have norms 1.97 and 2.47; the recorder saw no collective
    call inside clip_grad_norm_. So every rank scales by the same factor and the replicas stay
    in step. Under accumulation, clip once after the last (synced) backward, not after each
    no_sync backward, whose .grad is still local. The norm does need an all-reduce when each rank
    holds only a shard of the gradients (ZeRO, FSDP), not under DDP.
    """,
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "accumulation_10_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it.** `course.experiments.accumulation.clipped_norms` on 2 ranks: the norm `clip_grad_norm_`
# returns, the rank's local gradient norm, the large-batch norm from one process, and the
# collectives recorded during the clip (`course.ring.recorder.Recorder`).

# %% nbgrader={"grade": false, "grade_id": "accumulation_10_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
for r in run(accumulation.clipped_norms, 2):
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
# * a) 0.285: DDP keeps buffers identical on every rank, like the weights.
# * b) 2.185: its own statistics only, as if it trained alone.
# * c) 1.285: rank 0's running mean as of the start of step 2, updated with rank 1's own batch.
# * d) 1.235: the average of the two ranks' own running means.

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
    forward first overwrites that with rank 0's 0.15, then 0.9 x 0.15 + 0.1 x 11.5 = 1.285, the
    measured value. So the ranks' buffers differ after every step, and rank 1's history is
    thrown away at each forward; a checkpoint saved from rank 0 holds rank 0's statistics.
    With broadcast_buffers=False each rank keeps its own (2.185). Statistics over all ranks
    need nn.SyncBatchNorm, which runs only on a GPU: on this CPU it raises "SyncBatchNorm
    expected input tensor to be on GPU", so this course cannot measure it.
    """,
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "accumulation_11_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it.** `course.experiments.accumulation.batchnorm_buffers` on 2 ranks: the running mean after
# each step, with and without `broadcast_buffers`; then `nn.SyncBatchNorm` on this CPU.

# %% nbgrader={"grade": false, "grade_id": "accumulation_11_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
for broadcast in (True, False):
    means = run(accumulation.batchnorm_buffers, 2, broadcast)
    print(f"broadcast_buffers={broadcast!s:5}  running_mean after steps 1, 2: "
          + "   ".join(f"rank {r} {[round(m, 4) for m in ms]}" for r, ms in enumerate(means)))
print(f"nn.SyncBatchNorm on a CPU rank: {run(accumulation.sync_batchnorm_on_cpu, 2)[0]}")

# %% [markdown] nbgrader={"grade": false, "grade_id": "sampler_exercise_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Exercise 1: the sampler's indices
#
# Write `sampler_indices(dataset_len, num_replicas, rank, shuffle=True, seed=0, epoch=0,
# drop_last=False)`: the list of indices that
# `DistributedSampler(range(dataset_len), num_replicas, rank, shuffle, seed, drop_last)` yields
# after `set_epoch(epoch)`. Do not call `DistributedSampler` (the grader compares with it). The
# rule, measured in questions accumulation_3 and accumulation_4:
#
# 1. Start from `list(range(dataset_len))`, or, with `shuffle`, from
#    `torch.randperm(dataset_len, generator=g).tolist()` where `g = torch.Generator()` and
#    `g.manual_seed(seed + epoch)`.
# 2. Every rank gets the same number of samples: `ceil(dataset_len / num_replicas)`; with
#    `drop_last` (when the length does not divide), `ceil((dataset_len - num_replicas) /
#    num_replicas)`. Without `drop_last`, pad the list by repeating it from the start (more than
#    once if it is shorter than the padding); with it, cut the tail.
# 3. Rank `rank` takes the positions `rank, rank + num_replicas, rank + 2 * num_replicas, ...`
#
# It is graded in two parts (in order; shuffled), on cases that include a data set smaller than
# the number of ranks.

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
# Your indices beside `DistributedSampler`'s for 10 samples on 4 ranks (question accumulation_3).

# %% nbgrader={"grade": false, "grade_id": "sampler_try", "locked": true, "schema_version": 3, "solution": false, "task": false}
for r in range(4):
    mine = sampler_indices(10, 4, r, shuffle=False)
    theirs = list(DistributedSampler(range(10), 4, r, shuffle=False))
    print(f"rank {r}: yours {mine}  DistributedSampler {theirs}  {'ok' if mine == theirs else 'DIFFERENT'}")

# %% nbgrader={"grade": true, "grade_id": "sampler_indices_in_order", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
# Without shuffling: padding, drop_last, fewer samples than ranks.
print(check_sampler_indices(sampler_indices, "in order"))

# %% nbgrader={"grade": true, "grade_id": "sampler_indices_shuffled", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
# Shuffled, with seeds and epochs.
print(check_sampler_indices(sampler_indices, "shuffled"))

# %% [markdown] nbgrader={"grade": false, "grade_id": "accumulation_exercise_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Exercise 2: an accumulation step
#
# Write `accumulation_step(ddp, optimizer, micro_batches)`. `micro_batches` is this rank's list
# of K pairs `(x, y)`; the loss of a micro-batch is `nn.functional.mse_loss(ddp(x), y)`. The
# function must do **one** optimizer step such that:
#
# * the weights move exactly as one SGD step on the mean loss over **all** micro-batches of
#   **all** ranks (question accumulation_2: mind the scale);
# * DDP all-reduces **once** per step, in the last backward (question accumulation_1), and the
#   function makes no collective calls of its own.
#
# `.grad` is empty when it is called. It is graded on fresh ranks with K = 4, counting DDP's
# all-reduces with a comm hook and recording every collective call (`course.ring.recorder`): one
# part for the values, one for the communication.

# %% nbgrader={"grade": false, "grade_id": "accumulation_step", "locked": false, "schema_version": 3, "solution": true, "task": false}
def accumulation_step(ddp: DDP, optimizer: torch.optim.Optimizer, micro_batches: list) -> None:
    """One optimizer step from K micro-batches, with one all-reduce (in the last backward)."""
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
# Your step on 2 ranks, K = 4, with the counting hook: expect one all-reduce and an update equal
# to the large-batch step.

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

# %% nbgrader={"grade": true, "grade_id": "accumulation_step_syncs_once", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
# DDP all-reduces once per step, and the step makes no collective calls of its own.
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
#    `backward()`. A rank that has run out still takes part: it runs its **last** batch with the
#    loss multiplied by 0, so that DDP's all-reduce in `backward()` sees every rank and the rank
#    adds a zero gradient;
# 3. `optimizer.step()`, on every rank, also on a rank that has run out.
#
# Every rank has at least one batch. The result: the weights equal what `Join` gives (question
# accumulation_6): each step's gradient is the sum of the gradients of the ranks that still have
# data, divided by the world size the run started with, because DDP divides by the world size and
# the ranks that ran out add zeros. That is what `Join` does too: a rank that has joined shadows
# each all-reduce with zeros. Since every rank steps with the same averaged gradient, every rank
# ends with the same weights (`Join` gets there by copying the last rank's weights at the end).
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
