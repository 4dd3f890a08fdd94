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
# # Fully sharded data parallelism (FSDP), with mixed precision
#
# Your ZeRO-2 optimizer sharded the gradients and Adam's state, but every rank still held
# every parameter. **Fully sharded data parallelism** (ZeRO stage 3; Zhao et al. 2023,
# "PyTorch FSDP"; `torch.distributed.fsdp.fully_shard` in PyTorch 2.13) shards the parameters
# too: each rank keeps 1/N of them, and a parameter exists in full only while it is needed.
#
# FSDP cuts the model into **units**, usually one per block. For each unit, in a step:
#
# 1. before the unit's forward, **all-gather** its shards: every rank now holds the unit's
#    full parameters;
# 2. after the unit's forward, **free** them: back to the shard;
# 3. before the unit's backward, all-gather them again;
# 4. after the unit's backward, **reduce-scatter** its gradient: each rank keeps its shard of
#    the mean gradient, and frees the rest.
#
# Then each rank's optimizer steps its own shards, as in ZeRO. The two halves of your ring
# carry all of it; here you use torch's own, `dist.all_gather_single` and
# `dist.reduce_scatter_single`.
#
# In this notebook you will
#
# 1. watch one FSDP step, unit by unit, on every rank;
# 2. measure what units cost and save: memory per rank, and the traffic of gathering twice;
# 3. write `fully_shard(module)`, graded against a single process, on a model with a tied
#    weight, a frozen parameter and units whose size N does not divide;
# 4. measure what prefetching the next unit buys and costs;
# 5. add mixed precision: one dtype to compute in, another to reduce the gradients in;
# 6. measure what PyTorch's own `fully_shard` does on this machine.
#
# As before, `%%ranks N` runs a cell on N gloo ranks, and `course.ranks.run(fn, N, ...)` runs a
# function on N ranks and returns each rank's value in rank order.

# %% nbgrader={"grade": false, "grade_id": "setup", "locked": true, "schema_version": 3, "solution": false, "task": false}
# %load_ext course
import math

import torch
import torch.distributed as dist
from torch import nn

from course.lessons.fsdp import (
    animate_fully_shard,
    check_answer,
    check_fsdp_memory,
    check_fsdp_mixed_precision,
    check_fsdp_traffic,
    check_fully_shard,
    experiment,
    picture,
    precision,
    timeline,
)
from course.ranks import run

# %% [markdown] nbgrader={"grade": false, "grade_id": "part_1_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 1. One step, unit by unit
#
# A model of 3 units on 4 ranks. Each rank's band has a row for parameters and one for
# gradients, and each unit a slot per rank: slot k is rank k's shard. Press play, or step
# through it: in forward each unit is gathered, computes and is freed; in backward, in reverse
# order, it is gathered again, computes its gradient, and the gradient is reduce-scattered so
# that each rank keeps its shard of the mean. The panel on the right follows what one rank
# holds, as a fraction of the model's size.

# %% nbgrader={"grade": false, "grade_id": "watch_step", "locked": true, "schema_version": 3, "solution": false, "task": false}
picture.fsdp_figure(units=3, world_size=4)

# %% [markdown] nbgrader={"grade": false, "grade_id": "part_2_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 2. What a rank holds
#
# The items below measure what a rank holds between steps and inside a step on torch's own
# `fully_shard` (FSDP2), a model of 8 equal `nn.Linear` layers in fp32, each layer a unit of
# its own unless said otherwise. What FSDP2 holds unsharded is summed before every operation
# a rank runs (`course.lessons.fsdp.experiment.UnshardedPeak`).

# %% [markdown] nbgrader={"grade": false, "grade_id": "fsdp_1_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Question fsdp_1: one weight on six ranks
#
# *Difficulty 1/3*
#
# torch's `fully_shard` shards an `nn.Linear` weight of shape (7, 5) over 6 ranks (FSDP2, as
# `zero` used it). 7 rows do not split evenly over 6 ranks. How many of the 6 ranks keep not
# a single row of the weight?
#
# * a) 2: ranks 4 and 5 keep an empty shard of 0 rows.
# * b) 0: every rank keeps at least one of the 7 rows.
# * c) 6: each keeps 6 or 5 of its 35 elements, flattened.
# * d) 1: rank 5 alone keeps a shard of 0 rows, padded.
#
# Set `answer_fsdp_1` to your letter and run the cell below it.

# %% nbgrader={"grade": false, "grade_id": "fsdp_1_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
answer_fsdp_1 = ""  # your answer: one letter, "a" to "d"
### BEGIN SOLUTION
answer_fsdp_1 = "a"
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "fsdp_1_check", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
check_answer("answer_fsdp_1", answer_fsdp_1, choices="abcd")
### BEGIN HIDDEN TESTS
check_answer(
    "answer_fsdp_1",
    answer_fsdp_1,
    choices="abcd",
    key="a",
    explanation="""
    Measured local shapes on 6 ranks: (2, 5) on ranks 0 to 2, (1, 5) on rank 3, (0, 5) on ranks 4
    and 5, each a view into 40 bytes of storage (2 rows of 5 float32), the empty ones too. The
    weight becomes a DTensor with placement Shard(0): it is cut along dim 0 into pieces of
    ceil(7 / 6) = 2 rows, rank after rank, until the rows run out; FSDP2 pads every shard to the
    same size so that its all-gather moves equal pieces. b) is numpy's array_split (2, 1, 1,
    1, 1, 1 rows). c) is FSDP1's flat parameter (and the `fully_shard` you write here: one
    flat, padded shard per unit), not FSDP2's per-parameter sharding. d) has one rank empty,
    but pieces of 2 rows hold the 7 rows in 4 ranks, which leaves two. This is FSDP2's own
    layout, the same on GPUs with NCCL.
    """,
    giveaways=(
        r"\(0, 5\) on ranks 4\s+and 5",
        r"rows run out",
        r"40 bytes of storage",
    ),
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "fsdp_1_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it**, for a weight of shape (5, 3) on 3 ranks: the placement, each rank's local
# shape, and the bytes of the storage behind it.

# %% nbgrader={"grade": false, "grade_id": "fsdp_1_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
layout = run(experiment.shard_layout, 3, (5, 3))
for rank, shard in enumerate(layout):
    print(rank, shard["placements"], shard["global"], "->", shard["local"], shard["storage"], "B")

# %% [markdown] nbgrader={"grade": false, "grade_id": "fsdp_2_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Question fsdp_2: what a unit covers
#
# *Difficulty 2/3*
#
# A model of 8 equal fp32 layers (an `nn.Sequential`, no biases) trains with Adam on 64 ranks,
# each rank on its own batch. `fully_shard` is called on layers 0 to 3, one unit each, and on
# nothing else: not on layers 4 to 7, not on the model. Between two steps, what do a rank's
# parameters, gradients and Adam state come to, per parameter of the model?
#
# * a) 0.25 bytes: every layer is cut into shards, as with one unit on the model.
# * b) 8.13 bytes: layers 4 to 7 are whole on each rank, the other four are shards.
# * c) 2.22 bytes: layers 4 to 7 keep whole weights, with gradients and state in shards.
# * d) 16 bytes: without a call on the model itself, no layer is cut into shards.
#
# Set `answer_fsdp_2` to your letter and run the cell below it.

# %% nbgrader={"grade": false, "grade_id": "fsdp_2_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
answer_fsdp_2 = ""  # your answer: one letter, "a" to "d"
### BEGIN SOLUTION
answer_fsdp_2 = "b"
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "fsdp_2_check", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_answer("answer_fsdp_2", answer_fsdp_2, choices="abcd")
### BEGIN HIDDEN TESTS
check_answer(
    "answer_fsdp_2",
    answer_fsdp_2,
    choices="abcd",
    key="b",
    explanation="""
    Measured on 2 and 4 ranks: 12 and 10 bytes per parameter of the model, 8 + 8 / N. Each of
    layers 0 to 3 is a unit and holds 16 / N (shards of its weight, its gradient and Adam's two
    moments); each of layers 4 to 7 is in no unit and holds 16, as on one process: 8 + 0.125 =
    8.13 bytes on 64 ranks. fully_shard acts on the module it is given and what that module
    contains, never on the model around it, and needs no call on the model to shard what it
    was given: each of layers 0 to 3 is a unit of its own. A parameter no unit manages stays a
    plain tensor, and so do its gradient and Adam's moments. Nothing averages those gradients
    either: with each rank's own batch, the ranks' copies of layers 4 to 7 differ after one
    step, while the sharded layers agree. a) takes a call on some layers to shard them all.
    c) shards the gradient and state of weights FSDP never saw. d) takes the call on the model
    for what switches sharding on. The same holds on GPUs with NCCL.
    """,
    giveaways=(
        r"8 \+ 0\.125",
        r"in no unit",
        r"never on the model around it",
    ),
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "fsdp_2_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it**, on 2 ranks, with this model and `fully_shard` called two other ways: on the
# model alone (one unit), and on every layer and then the model. After one Adam step on each
# rank's own batch: each layer's weight as rank 0 has it (a `DTensor` with its placement, or a
# plain tensor) and the part of it rank 0 holds, and what a rank holds per parameter of the
# model (its parameters, gradients and Adam state).

# %% nbgrader={"grade": false, "grade_id": "fsdp_2_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
for called, options in (("the model", {"wrapped": 0}), ("every layer, then the model", {"wrapped": 8})):
    held = experiment.partly_sharded_on_ranks(2, root=True, **options)[0]
    kinds = {(" ".join([layer["type"], *layer["placements"]]), layer["held"]) for layer in held["layers"]}
    per_parameter = (held["params"] + held["grads"] + held["state"]) / (held["model"] / 4)
    print(f"fully_shard on {called}: layers {sorted(kinds)}; {per_parameter:.2f} bytes per parameter")

# %% [markdown] nbgrader={"grade": false, "grade_id": "fsdp_3_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Question fsdp_3: what a unit's size decides
#
# *Difficulty 3/3*
#
# The same model, 8 equal fp32 layers, on 4 ranks, every `fully_shard` call with
# `reshard_after_forward=True`. Instead of a unit per layer, each call now takes 4 consecutive
# layers, `fully_shard(layers[0:4])` and `fully_shard(layers[4:8])`, then the root. Against a
# unit per layer, what becomes of the peak of unsharded parameter bytes a rank holds in a
# forward and backward, and of the bytes it sends in them?
#
# * a) The bytes sent fall about 4 times, while the peak stays the same.
# * b) The peak grows about 4 times, while the bytes sent stay the same.
# * c) Both fall about 4 times: fewer, larger gathers cost less of each.
# * d) Neither moves: grouping changes only how many collectives run.
#
# Set `answer_fsdp_3` to your letter and run the cell below it.

# %% nbgrader={"grade": false, "grade_id": "fsdp_3_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
answer_fsdp_3 = ""  # your answer: one letter, "a" to "d"
### BEGIN SOLUTION
answer_fsdp_3 = "b"
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "fsdp_3_check", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
check_answer("answer_fsdp_3", answer_fsdp_3, choices="abcd")
### BEGIN HIDDEN TESTS
check_answer(
    "answer_fsdp_3",
    answer_fsdp_3,
    choices="abcd",
    key="b",
    explanation="""
    Measured on 4 ranks: the peak of unsharded bytes went from 2 layers with a unit per layer to
    8 with units of 4 layers, 4 times as much; the bytes sent from 3.05 to 3.01 model sizes; the
    collectives from 16 all-gathers and 8 reduce-scatters to 4 all-gathers and 2. A unit is
    gathered whole before it computes, so its size sets what a rank must hold at once (FSDP2
    held two units' worth both ways: the unit that computes and the buffer it was gathered
    into). Every parameter is still gathered twice and reduce-scattered once per step, whatever
    the grouping, so the bytes stay. What larger units buy is fewer, larger collectives: fewer
    fixed costs per call, and on GPUs more compute to hide each gather behind. a) and c) take
    the number of calls for the bytes. d) the calls do fall 4 times, but the gathered unit
    grows with them. On GPUs with NCCL the bytes are likewise the same for any grouping.
    """,
    giveaways=(
        r"2 layers with a unit per layer to\s+8",
        r"to 4 all-gathers and 2",
        r"peak grows about 4 times",
    ),
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "fsdp_3_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it**, on 4 ranks with a unit per layer: the peak of unsharded parameter bytes,
# sampled before every op of a forward and backward (`fsdp.UnshardedPeak`), in layers; the
# bytes rank 0 sent in them, in model sizes; and the collectives FSDP2 called.

# %% nbgrader={"grade": false, "grade_id": "fsdp_3_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
held = experiment.unit_size_on_ranks(4)[0]
print(f"peak unsharded: {held['peak unsharded'] / held['layer']:.2f} layers of 8")
print(f"sent: {held['sent']:.3f} model sizes", held["calls"])

# %% [markdown] nbgrader={"grade": false, "grade_id": "part_3_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 3. Resharding after forward
#
# `fully_shard(..., reshard_after_forward=...)` says whether a unit's gathered parameters are
# freed right after the unit's forward (`True`) or not (`False`). The bytes here are read
# from the kernel's TCP counters of each rank's sockets (`course.ring.wire.WireMeter`), so they
# count what gloo really sends.

# %% [markdown] nbgrader={"grade": false, "grade_id": "fsdp_4_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Question fsdp_4: what resharding costs on the wire
#
# *Difficulty 2/3*
#
# On 4 gloo ranks, a model of 4 layers, each a unit of its own, each with a single fp32 weight
# of shape (5, 8192) and no bias (`fsdp.LowRank`, a residual layer x + (x Wᵀ) W). How many model
# sizes (the 4 weights' bytes) more does a rank send in one forward and backward with
# `reshard_after_forward=True` than with `reshard_after_forward=False`?
#
# * a) About 0.75: a second gather per layer, (N-1)/N of its bytes.
# * b) None: the flag moves each layer's gather to another time.
# * c) About 1.20: one more all-gather of each, in padded shards.
# * d) About 2.40: each layer gathered again in both passes, padded.
#
# Set `answer_fsdp_4` to your letter and run the cell below it.

# %% nbgrader={"grade": false, "grade_id": "fsdp_4_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
answer_fsdp_4 = ""  # your answer: one letter, "a" to "d"
### BEGIN SOLUTION
answer_fsdp_4 = "c"
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "fsdp_4_check", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_answer("answer_fsdp_4", answer_fsdp_4, choices="abcd")
### BEGIN HIDDEN TESTS
check_answer(
    "answer_fsdp_4",
    answer_fsdp_4,
    choices="abcd",
    key="c",
    explanation="""
    Measured on 4 ranks: resharding added 1.20 model sizes per step on every rank, rank 3 too,
    and 0.80 on 3 ranks, with 8 all-gathers for 4 layers instead of 4 and the same 4
    reduce-scatters. The difference is the backward's gather of each layer, and its size is
    set by FSDP2's layout (question fsdp_1): a (5, 8192) weight is cut into pieces of ceil(5 /
    4) = 2 rows and every shard is padded to 2 rows, the empty one too, so that the all-gather
    moves equal pieces, 8 rows in all. In gloo's all-gather each rank sends N - 1 = 3 such
    pieces, 6 rows of a 5-row layer: 6/5 = 1.20 of the model (on 3 ranks 2 pieces of 2 rows,
    4/5). a) is (N-1)/N of the unpadded weight, 3/4, what a gather sends when N divides the
    rows (0.50 on 2 ranks with the cell's square layers). b) a layer freed after its
    forward is not there for its backward, which needs its parameters: it must be gathered a
    second time. d) counts the forward's padded gather too, 2 x 6/5, but it runs either way:
    between steps a rank holds only its shards, whatever the flag. The reduce-scatters do not
    change. The cell's 1.50 model sizes on 2 ranks without resharding are a gather of each
    layer (0.50) and its reduce-scatter, which gloo runs as an all-reduce (1.00). FSDP2 pads
    the same way on GPUs, and NCCL's ring all-gather also sends N - 1 pieces per rank.
    """,
    giveaways=(
        r"added 1\.20 model sizes",
        r"6/5 = 1\.20",
        r"padded to 2 rows, the empty one",
    ),
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "fsdp_4_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it**, on 2 ranks without resharding after forward, each of 4 square (256, 256)
# layers a unit: the bytes a rank sent in one forward and backward, in model sizes.

# %% nbgrader={"grade": false, "grade_id": "fsdp_4_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
sent = experiment.traffic_on_ranks(2, reshard_after_forward=False)
print(f"one step, reshard_after_forward=False: {sent['forward'] + sent['backward']:.2f} model sizes sent")

# %% [markdown] nbgrader={"grade": false, "grade_id": "fsdp_5_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Question fsdp_5: what resharding saves in memory
#
# *Difficulty 2/3*
#
# The model of 8 equal fp32 layers, a unit per layer, trains with Adam on 64 ranks, with
# `reshard_after_forward=False` on every layer. The peak of unsharded parameter bytes a rank
# holds during a forward and backward is how many times what it holds between steps (its
# shards of the parameters, of their gradients and of Adam's state)?
#
# * a) About 32 times.
# * b) About 18 times.
# * c) About 4 times.
# * d) About 1.1 times.
#
# Set `answer_fsdp_5` to your letter and run the cell below it.

# %% nbgrader={"grade": false, "grade_id": "fsdp_5_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
answer_fsdp_5 = ""  # your answer: one letter, "a" to "d"
### BEGIN SOLUTION
answer_fsdp_5 = "b"
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "fsdp_5_check", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_answer("answer_fsdp_5", answer_fsdp_5, choices="abcd")
### BEGIN HIDDEN TESTS
check_answer(
    "answer_fsdp_5",
    answer_fsdp_5,
    choices="abcd",
    key="b",
    explanation="""
    Measured without resharding: a peak of 9 layers of 8 on 4 ranks (589824 bytes, against
    524288 held between steps: 1.125 times), and of 5 layers of 4 on 2 ranks (327680 against
    524288: 0.625 times); with resharding 2 layers. Without resharding every layer's gathered
    parameters stay from its forward to its backward, so the forward ends with all of them
    gathered, and a gathered layer is the whole layer on every rank, whatever the number of
    ranks: the L layers of the model, M bytes in fp32, and FSDP2 held one layer's worth more on
    top, as it does with resharding (2 layers where one computes): L + 1 layers of L. Between
    steps a rank holds 16 / N bytes per parameter, resharded after backward either way
    (question fsdp_2): M / 16 on 64 ranks. With 8 layers the peak is 9/8 M, 18 times that.
    That is the trade: one all-gather per layer fewer (question fsdp_4) for a full replica of
    the parameters in the step, while gradients and Adam state stay sharded. a) counts two
    layers for each layer kept, 2 M: the extra layer is one in all, not one per layer (5 of 4
    and 9 of 8, not 8 and 16). c) is the peak with resharding, 2 layers of 8, M / 4: the flag
    changes the peak, not only the moment a layer is freed. d) keeps the parameters gathered
    between steps too, as DDP does, 4 bytes per parameter whole and 12 / 64 in gradient and Adam
    shards against 9/8 of 4 at the peak; the bytes held after a step were 16 / N. The peaks were
    measured on CPU; on GPUs the caching allocator can keep more reserved.
    """,
    giveaways=(
        r"9 layers of 8",
        r"0\.625 times",
        r"forward ends with all of\s+them",
    ),
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "fsdp_5_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it**, on a model of 4 layers (2 ranks), with resharding after forward: the peak of
# unsharded parameter bytes, in layers and in bytes, and the bytes a rank holds between steps.

# %% nbgrader={"grade": false, "grade_id": "fsdp_5_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
held = experiment.memory_on_ranks(2, reshard_after_forward=True, depth=4)[0]
print(f"peak unsharded: {held['peak unsharded'] / held['layer']:.2f} layers of 4")
print({k: held[k] for k in ("peak unsharded", "params", "grads", "state")})

# %% [markdown] nbgrader={"grade": false, "grade_id": "exercise_1_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Exercise 1: `fully_shard`
#
# Write `fully_shard(module, *, param_dtype=None, reduce_dtype=None)`, called first on each
# unit of a model (each block), then on the root, on the default process group of N ranks.
# It shards `module` in place and returns it. Leave `param_dtype` and `reduce_dtype` aside
# until exercise 2.
#
# **The shard.** The unit's *managed* parameters are its trainable (`requires_grad=True`)
# parameters that no submodule sharded before it manages, each counted **once** (a tied
# weight, one parameter reached under two names, is one parameter), in the order they first
# appear in `module.named_parameters()`. Concatenate them flattened (float32) and zero-pad to
# N·s elements, s = ceil(total / N): rank r keeps elements [r·s, (r+1)·s) as
# `module.flat_shard`, an `nn.Parameter` registered on `module`. The original parameters stop
# being parameters of any module, so `model.parameters()` yields the shards (and any frozen
# parameter), and any `torch.optim` optimizer built on it steps the shards. Frozen parameters
# (`requires_grad=False`) stay where they are, unsharded and untouched.
#
# **A step.** Before the unit's forward, all-gather the full flat parameters
# (`dist.all_gather_single`), and put views of the gathered tensor in place of **every**
# original parameter, under every name it had (a tied weight has two); after the forward,
# free the gathered storage. Before the unit's backward, gather again. When the unit's
# gradient is complete, reduce-scatter it (`dist.reduce_scatter_single`) and divide by N, so
# that after `loss.backward()` each rank's `flat_shard.grad` is its shard of the **mean**
# gradient over ranks (what DDP leaves in `.grad`, cut to the shard); free the rest.
#
# The torch pieces you need:
#
# * `module.register_forward_pre_hook`, `module.register_forward_hook` and
#   `module.register_full_backward_pre_hook` run your code before a unit's forward, after
#   it, and before its backward (the root's input is token ids, with no gradient, so torch
#   warns that the root's backward hook fires on its outputs: that is what you want);
# * `del sub._parameters[name]` unregisters a parameter; `setattr(sub, name, view)` then
#   sets a plain tensor in its place, which the module's forward uses as it would the
#   parameter;
# * a gathered tensor made a leaf (`requires_grad=True`) collects the gradients of all its
#   views in its own `.grad`, and `tensor.register_post_accumulate_grad_hook(fn)` runs `fn`
#   once that gradient is complete;
# * `tensor.untyped_storage().resize_(0)` frees a tensor's memory and keeps the tensor (and the
#   views autograd saved for backward); `resize_(nbytes)` gives it memory back, to gather
#   into. Gather into `tensor.data`: an in-place write through `.data` does not count as a
#   change of the tensor autograd saved.
#
# Graded in four parts on 2 to 4 ranks, each run with fresh batches (a race shows as a run
# that differs): training matches one process (6 points): 5 steps with SGD and 5 with Adam,
# twice on each world size, every parameter within 1e-4 of the largest, the frozen one
# unchanged, the tied one trained as one; the collectives (3 points): per unit and step, two
# all-gathers of the shard and one reduce-scatter of the padded unit, nothing else, read from
# a record of the run; the memory (2 points): on a larger model, at most the root and two
# blocks gathered at any moment (a reference you keep to the original parameters, in a
# closure, a list or a dict, keeps them allocated, and they count as gathered: keep only
# where each view goes); and mixed precision (exercise 2).

# %% nbgrader={"grade": false, "grade_id": "fully_shard", "locked": false, "schema_version": 3, "solution": true, "task": false}
def fully_shard(module, *, param_dtype=None, reduce_dtype=None):
    """Shard ``module``'s managed parameters over the default group; gather them per use."""
    ### BEGIN SOLUTION
    n, rank = dist.get_world_size(), dist.get_rank()

    def own_modules(mod):  # mod and its submodules, none inside one sharded before
        yield mod
        for child in mod.children():
            if not hasattr(child, "flat_shard"):
                yield from own_modules(child)

    places = [  # every (module, name) of a managed parameter
        (mod, name, p)
        for mod in own_modules(module)
        for name, p in mod._parameters.items()
        if p is not None and p.requires_grad
    ]
    order = list({id(p): p for _, _, p in places}.values())  # each parameter once, in order
    total = sum(p.numel() for p in order)
    s = math.ceil(total / n)
    flat = torch.zeros(n * s)
    flat[:total] = torch.cat([p.detach().float().reshape(-1) for p in order])
    module.flat_shard = nn.Parameter(flat[rank * s : (rank + 1) * s].clone())
    offsets, start = {}, 0
    for p in order:
        offsets[id(p)] = (start, p.numel(), p.shape)
        start += p.numel()
    places = [(mod, name, *offsets[id(p)]) for mod, name, p in places]
    for mod, name, *_ in places:
        del mod._parameters[name]  # no longer a parameter: the shard is
    del order, offsets, flat  # keep no reference to the full parameters
    dtype = param_dtype or torch.float32
    state = {"full": None}

    def gather():
        if state["full"] is None:
            state["full"] = torch.empty(n * s, dtype=dtype, requires_grad=True)
            state["full"].register_post_accumulate_grad_hook(reduce)
        full = state["full"]
        full.untyped_storage().resize_(n * s * full.element_size())
        dist.all_gather_single(full.data, module.flat_shard.detach().to(dtype))
        for mod, name, lo, numel, shape in places:
            setattr(mod, name, full[lo : lo + numel].view(shape))

    def free():
        state["full"].untyped_storage().resize_(0)

    def reduce(full):
        grad = full.grad.to(reduce_dtype or full.grad.dtype) / n
        shard = torch.empty(s, dtype=grad.dtype)
        dist.reduce_scatter_single(shard, grad)
        shard = shard.float()
        g = module.flat_shard.grad
        module.flat_shard.grad = shard if g is None else g + shard
        full.grad = None
        free()

    module.register_forward_pre_hook(lambda mod, args: gather())
    module.register_forward_hook(lambda mod, args, out: free())
    module.register_full_backward_pre_hook(lambda mod, grad_out: gather())
    return module
    ### END SOLUTION

# %% [markdown] nbgrader={"grade": false, "grade_id": "try_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### Test as you go
#
# On 2 ranks, the check's own model (`course.lessons.fsdp.model.tiny_lm`: an embedding
# tied to the output head, a frozen table of positions, 3 blocks and a gain vector), each
# block a unit, then the root. The cell prints what `model.parameters()` yields, one SGD
# step's loss, and the shapes of the gradients the shards got: with a right `fully_shard`,
# only flat shards of ceil(P / 2) elements (and the frozen table, with no gradient).

# %% tags=["raises-exception"] nbgrader={"grade": false, "grade_id": "try_fully_shard", "locked": true, "schema_version": 3, "solution": false, "task": false}
# %%ranks 2 --timeout 60
import warnings

from course.lessons.fsdp import loss_of, make_batches, say_if_unimplemented, tiny_lm

# The root's input is token ids, which need no gradient; torch warns of it at every backward.
warnings.filterwarnings("ignore", "Full backward hook is firing")

say_if_unimplemented(fully_shard)  # a note if the cell above is still the empty stub
model = tiny_lm(0)
for block in model.blocks:
    fully_shard(block)
fully_shard(model)
print({name: tuple(p.shape) for name, p in model.named_parameters()})
opt = torch.optim.SGD(model.parameters(), lr=0.1)
batch = make_batches(1, torch.Generator().manual_seed(rank))[0]
loss = loss_of(model, batch)
loss.backward()
opt.step()
print(f"loss {loss.item():.4f}, gradients:", [tuple(p.grad.shape) for p in model.parameters() if p.grad is not None])

# %% [markdown] nbgrader={"grade": false, "grade_id": "visible_fsdp_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# The grader's checks, on fewer cases. Each stops within its deadline and says which unit,
# rank and step went wrong.

# %% nbgrader={"grade": false, "grade_id": "visible_fsdp", "locked": true, "schema_version": 3, "solution": false, "task": false}
print(check_fully_shard(fully_shard, world_sizes=(2,), repeats=1))
print(check_fsdp_traffic(fully_shard, world_sizes=(2,)))
print(check_fsdp_memory(fully_shard))

# %% nbgrader={"grade": true, "grade_id": "fully_shard_matches", "locked": true, "points": 6, "schema_version": 3, "solution": false, "task": false}
# Trains like one process on the mean gradient: SGD and Adam, 5 steps, 2 to 4 ranks, twice.
print(check_fully_shard(fully_shard, world_sizes=(2,), repeats=1))
### BEGIN HIDDEN TESTS
print(check_fully_shard(fully_shard))
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "fully_shard_traffic", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
# Per unit and step: two all-gathers and one reduce-scatter of the padded unit, nothing else;
# and the backward computes with what its own all-gather brought (the check changes what one
# step's backward gathers receive, and the gradients must show it).
print(check_fsdp_traffic(fully_shard, world_sizes=(2,)))
### BEGIN HIDDEN TESTS
print(check_fsdp_traffic(fully_shard))
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "fully_shard_memory", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
# At most the root and two blocks gathered at once, forward and backward, on a larger model
# (measured from outside the ranks when graded).
print(check_fsdp_memory(fully_shard))

# %% [markdown] nbgrader={"grade": false, "grade_id": "watch_yours_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### Your step, animated
#
# The same picture, drawn from **your** `fully_shard`, recorded on 3 real ranks: each
# all-gather and reduce-scatter your code called, in order, matched to the units by size. A
# call that fits no unit is listed under the figure.

# %% nbgrader={"grade": false, "grade_id": "watch_yours", "locked": true, "schema_version": 3, "solution": false, "task": false}
animate_fully_shard(fully_shard, world_size=3)

# %% [markdown] nbgrader={"grade": false, "grade_id": "part_4_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 4. Prefetching the next unit
#
# A unit's gather and its compute need not take turns: FSDP can issue the next unit's
# all-gather before the current one computes, so that the bytes move while the arithmetic
# runs. torch's `fully_shard` has two switches for it, `set_modules_to_forward_prefetch` and
# `set_modules_to_backward_prefetch`, each naming the units to gather ahead. The items below
# read the order of FSDP2's own gathers and of each layer's compute from a timeline of one step
# (`course.lessons.fsdp.timeline`).

# %% [markdown] nbgrader={"grade": false, "grade_id": "fsdp_6_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Question fsdp_6: what a prefetch costs
#
# *Difficulty 2/3*
#
# `layer.set_modules_to_forward_prefetch(later_layers)` makes torch's `fully_shard` issue the
# all-gathers of the layers named before the layer's forward computes. A model of 6 layers,
# each a unit, on 2 gloo ranks: each layer now names the **two** layers after it. Against no
# prefetch, how many more layers' worth of unsharded parameter bytes does a rank hold at the
# peak of the forward?
#
# * a) 0: a prefetched gather only starts earlier, into a freed buffer.
# * b) 1: a rank gathers only one layer ahead, whatever the list says.
# * c) 4: the first layer's list starts the gather of every later layer.
# * d) 2: each layer gathered ahead is held whole until it has computed.
#
# Set `answer_fsdp_6` to your letter and run the cell below it.

# %% nbgrader={"grade": false, "grade_id": "fsdp_6_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
answer_fsdp_6 = ""  # your answer: one letter, "a" to "d"
### BEGIN SOLUTION
answer_fsdp_6 = "d"
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "fsdp_6_check", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_answer("answer_fsdp_6", answer_fsdp_6, choices="abcd")
### BEGIN HIDDEN TESTS
check_answer(
    "answer_fsdp_6",
    answer_fsdp_6,
    choices="abcd",
    key="d",
    explanation="""
    Measured on CPU ranks (gloo): a forward peak of 2 layers without a prefetch, 3 with the next
    layer named, 4 with the next two, and 2 in backward each time; with two named, rank 0 issued
    the gathers of units 0, 2 and 4 before unit 0 computed. A prefetched gather's output exists
    from its issue until its layer has computed and is freed: naming k layers ahead keeps k
    more gathered layers alive at once. That is what a prefetch costs, memory; what it buys is
    overlap of the gather with the current layer's compute, which needs hardware to spare for
    the gather (on GPUs NCCL's own stream; gloo's threads share the CPU with the matmuls). a)
    FSDP2 allocates each gather's output afresh. b) the rank issued both gathers. c) each list
    names two layers, and only those are gathered ahead. On GPUs the peak was not measured
    here, and even the default forward overlaps the next gather there (the CPU issues it while
    the GPU still computes); the explicit prefetch issues it earlier, per torch's docstring.
    """,
    giveaways=(
        r"4 with the next two",
        r"k\s+more gathered layers",
        r"3 with the next\s+layer named",
    ),
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "fsdp_6_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it**, without the prefetch: the order in which rank 0 issued all-gathers and ran
# each unit's matmuls in forward (units named by their index in the `nn.Sequential`), and the
# peak of unsharded bytes in each pass, in layers.

# %% nbgrader={"grade": false, "grade_id": "fsdp_6_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
measured = timeline.prefetch_on_ranks(2)[0]
events = measured["events"]
backward_start = min(start for what, _, start, _ in events if what == "pre_backward")
print(timeline.gather_order(events, backward_start))
print({phase: peak / measured["layer"] for phase, peak in measured["peak"].items()})

# %% [markdown] nbgrader={"grade": false, "grade_id": "fsdp_7_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Question fsdp_7: gathers in backward
#
# *Difficulty 2/3*
#
# Backward runs the layers last to first, and with resharding after forward each layer must be
# gathered again. With no `set_modules_to_backward_prefetch` call at all, when does a rank issue
# the all-gather of the layer that comes next in backward, on 2 gloo ranks?
#
# * a) Before the current layer's backward: one layer ahead of need.
# * b) After the current layer's backward: only once it is needed.
# * c) All at the start of backward, so every layer is ready when needed.
# * d) Never: backward reuses the parameters gathered during forward.
#
# Set `answer_fsdp_7` to your letter and run the cell below it.

# %% nbgrader={"grade": false, "grade_id": "fsdp_7_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
answer_fsdp_7 = ""  # your answer: one letter, "a" to "d"
### BEGIN SOLUTION
answer_fsdp_7 = "a"
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "fsdp_7_check", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_answer("answer_fsdp_7", answer_fsdp_7, choices="abcd")
### BEGIN HIDDEN TESTS
check_answer(
    "answer_fsdp_7",
    answer_fsdp_7,
    choices="abcd",
    key="a",
    explanation="""
    Measured order in backward on 6 layers (units 0, 2, ..., 10 of the Sequential): gather 10,
    gather 8, compute 10, gather 6, compute 8, ... : FSDP2 prefetches one unit ahead in backward
    implicitly, in the reverse of forward's order, while in forward the CPU issues a unit's
    gather as the unit's forward starts (measured: gather 0, compute 0, gather 2, ...) unless
    told to prefetch. So the backward peak is 2 layers (measured on CPU). b) is forward's order
    of issue, not backward's; on GPUs that forward order already overlaps, since the CPU issues
    the next gather while the GPU still computes (torch's set_modules_to_forward_prefetch
    docstring). c) would hold every layer at once, the memory of no sharding. d) is
    reshard_after_forward=False. On gloo the prefetched gather overlaps little: gloo runs it on
    its own threads, which compete with the matmuls for the same CPU cores.
    """,
    giveaways=(
        r"gather 10,\s+gather 8, compute 10",
        r"prefetches one unit ahead in backward",
        r"implicitly",
    ),
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "fsdp_7_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it**, with forward prefetch set: the order of gathers and matmuls in the forward
# (units named by their index in the `nn.Sequential`), and how much of the gathers' time rank 0
# spent computing.

# %% nbgrader={"grade": false, "grade_id": "fsdp_7_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
measured = timeline.prefetch_on_ranks(2, forward_prefetch=True, memory=False)[0]
events = measured["events"]
backward_start = min(start for what, _, start, _ in events if what == "pre_backward")
print(timeline.gather_order(events, backward_start))
print(timeline.overlap([e for e in events if e[2] < backward_start]))

# %% [markdown] nbgrader={"grade": false, "grade_id": "widget_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### All of it, with the switches
#
# The step of part 1 again, with the settings of part 3: the world size, the number of units
# and `reshard_after_forward`. The panel shows the textbook's count (what the gathered units
# and gradients take); set it beside what you measured of torch's `fully_shard` above.

# %% nbgrader={"grade": false, "grade_id": "watch_widget", "locked": true, "schema_version": 3, "solution": false, "task": false}
picture.fsdp_widget(units=4, world_size=4, prefetch_control=False)

# %% [markdown] nbgrader={"grade": false, "grade_id": "part_5_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 5. Mixed precision
#
# On GPUs, bf16 matmuls run several times faster than fp32 ones; the updates still need fp32,
# or small steps are lost to rounding. torch's `fully_shard` takes a policy for it:
# `fully_shard(layer, mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16,
# reduce_dtype=torch.float32))`, where `param_dtype` is the dtype the forward and backward
# compute with and `reduce_dtype` the dtype of the gradients' reduce-scatter. The ZeRO paper
# counts a mixed-precision model with Adam at 2 + 2 + 12 bytes per parameter replicated: a
# bf16 parameter, a bf16 gradient, and an fp32 master copy with Adam's two fp32 moments.

# %% [markdown] nbgrader={"grade": false, "grade_id": "fsdp_8_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Question fsdp_8: what mixed precision changes in memory
#
# *Difficulty 2/3*
#
# Against plain fp32 `fully_shard` on the same 4 ranks, what does
# `MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)` change in a
# rank's memory: in what it holds between steps (parameters, gradients, Adam state), and in
# the peak of unsharded parameter bytes during a step?
#
# * a) The peak halves, while what it holds between steps is the same fp32.
# * b) Both halve: every tensor of the step is kept in bf16 instead of fp32.
# * c) Between steps it holds more: a bf16 copy of each shard for the gathers.
# * d) The gradient shards halve: they come out of backward in bf16 and stay.
#
# Set `answer_fsdp_8` to your letter and run the cell below it.

# %% nbgrader={"grade": false, "grade_id": "fsdp_8_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
answer_fsdp_8 = ""  # your answer: one letter, "a" to "d"
### BEGIN SOLUTION
answer_fsdp_8 = "a"
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "fsdp_8_check", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_answer("answer_fsdp_8", answer_fsdp_8, choices="abcd")
### BEGIN HIDDEN TESTS
check_answer(
    "answer_fsdp_8",
    answer_fsdp_8,
    choices="abcd",
    key="a",
    explanation="""
    Measured on 4 ranks: 1 + 1 + 2 bytes per model parameter between steps (parameters,
    gradients, Adam state), all float32 local shards, with the policy and without; and a peak
    of unsharded parameters of 1 byte per model parameter with the policy against 2 without.
    FSDP2 keeps the fp32 shard as the master, casts it to bf16 as it gathers (so the gathered
    unit takes half the bytes), computes in bf16, casts the bf16 gradient to fp32 for the
    reduce-scatter, and keeps nothing in bf16 between steps. b) the master shards and Adam's
    moments must stay fp32, or small updates are lost to rounding. c) the bf16 copy is made for
    each gather and freed with it. d) the gradient does come out of backward in bf16, but it is
    cast to fp32 before the reduce-scatter, and its shard is fp32. The same holds on GPUs.
    """,
    giveaways=(
        r"1 byte per model parameter with the policy",
        r"keeps nothing in\s+bf16",
        r"the same fp32",
    ),
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "fsdp_8_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it**, on 2 ranks without the policy: the bytes per model parameter a rank holds
# after an Adam step, their dtypes, and the peak of unsharded bytes per model parameter during
# the next step.

# %% nbgrader={"grade": false, "grade_id": "fsdp_8_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
held = precision.held_on_ranks(2)[0]
print({k: held[k] for k in ("params", "grads", "state", "peak unsharded")}, "bytes per parameter")
print("dtypes held:", held["dtypes"])

# %% [markdown] nbgrader={"grade": false, "grade_id": "fsdp_9_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Question fsdp_9: reducing in bf16
#
# *Difficulty 3/3*
#
# With `param_dtype=torch.bfloat16` each rank's gradients come out of backward in bf16, and
# `reduce_dtype` sets the dtype of their reduce-scatter. Against the fp64 mean of the ranks'
# very same bf16 gradients, the averaged gradient `fully_shard` leaves in the shards is off
# (relative L2 error) by about 2e-3 reduced in bf16 on 2 gloo ranks, about 3e-3 on 4, and by
# less than 1e-9 reduced in fp32. What causes the error of the bf16 reduction?
#
# * a) The bf16 gradients lost their low bits before the reduction began.
# * b) Dividing each sum by the number of ranks rounds in bf16.
# * c) Small sums fall below bf16's range and are flushed to 0.
# * d) Every sum the reduction forms is rounded to 8 significant bits.
#
# Set `answer_fsdp_9` to your letter and run the cell below it.

# %% nbgrader={"grade": false, "grade_id": "fsdp_9_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
answer_fsdp_9 = ""  # your answer: one letter, "a" to "d"
### BEGIN SOLUTION
answer_fsdp_9 = "d"
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "fsdp_9_check", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
check_answer("answer_fsdp_9", answer_fsdp_9, choices="abcd")
### BEGIN HIDDEN TESTS
check_answer(
    "answer_fsdp_9",
    answer_fsdp_9,
    choices="abcd",
    key="d",
    explanation="""
    Measured: 1.8e-3 reduced in bf16 on 2 ranks, 2.6e-3 on 4, and below 1e-9 in fp32 from the
    same bf16 gradients. bf16 keeps 8 significant bits (a relative rounding step of 2^-8,
    3.9e-3), and a bf16 reduction rounds each sum it forms to them: on 2 ranks the one sum, on
    more ranks every partial sum, so the error grows with the ranks. bf16 values are exact in
    fp32, and a sum of a few of them rounds at 2^-24 if at all. a) is the usual worry, but the
    reference is the mean of the same bf16 gradients, and reducing them in fp32 leaves less
    than 1e-9: the inputs lost nothing the reference keeps. b) dividing by a power of 2 is
    exact in bf16 (measured: no value changed). c) bf16 has fp32's range: the smallest non-zero
    mean here was above 1e-10, far above bf16's 1.2e-38; the hundred or so elements that came
    out 0 on 4 ranks are gradients that cancel to within a rounding step. This is why FSDP's
    mixed-precision recipes reduce in fp32. NCCL's reductions also add partial sums in the
    tensor's dtype, so bf16 rounds there too.
    """,
    giveaways=(
        r"2\.6e-3 on 4",
        r"rounds each sum it forms",
        r"cancel to within a rounding step",
    ),
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "fsdp_9_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it**, on 2 ranks, reducing in bf16 and in fp32: the relative error of the averaged
# gradient against the fp64 mean of the ranks' own bf16 gradients (each rank recomputes its
# gradient with a plain bf16 copy of the model).

# %% nbgrader={"grade": false, "grade_id": "fsdp_9_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
for reduce_dtype in ("bf16", "fp32"):
    print(reduce_dtype, f"{precision.reduce_on_ranks(2, reduce_dtype=reduce_dtype):.2e}")

# %% [markdown] nbgrader={"grade": false, "grade_id": "fsdp_10_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Question fsdp_10: small gradients in 16 bits
#
# *Difficulty 2/3*
#
# A small model (6 tanh layers of 64, inputs and targets of standard deviation 0.03, the mean
# squared error over 256 samples) has small gradients, many near 1e-7. Run in bf16 without any
# loss scaling, what share of the gradient elements that are non-zero in fp32 come out 0?
#
# * a) More than in fp16: bf16 keeps 8 significant bits to fp16's 11.
# * b) About as many as in fp16: both formats store 16 bits a number.
# * c) 0 of them: bf16 reaches as far down as fp32, to about 1e-38.
# * d) All of them: bf16 flushes what is below 2^-8 of the loss to 0.
#
# Set `answer_fsdp_10` to your letter and run the cell below it.

# %% nbgrader={"grade": false, "grade_id": "fsdp_10_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
answer_fsdp_10 = ""  # your answer: one letter, "a" to "d"
### BEGIN SOLUTION
answer_fsdp_10 = "c"
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "fsdp_10_check", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_answer("answer_fsdp_10", answer_fsdp_10, choices="abcd")
### BEGIN HIDDEN TESTS
check_answer(
    "answer_fsdp_10",
    answer_fsdp_10,
    choices="abcd",
    key="c",
    explanation="""
    Measured: 0 in bf16, where fp16 zeroed 22% of them (0.02% with the loss times 1024). fp16's
    smallest number is 2^-24, about 6e-8 (its smallest normal one 6.1e-5), and the median
    gradient here is 7e-8: without scaling, fp16 loses what it cannot reach. bf16 has fp32's 8
    exponent bits, down to 1.2e-38, and gives up significand bits instead: it rounds more (a)
    holds for rounding, not for underflow) but flushes nothing here. That is why bf16 training
    needs no loss scaler. The scale itself can overflow: 2^16 = 65536 is above fp16's largest
    number, 65504, so backward, which carries the scale into the fp16 loss's gradient, makes it
    infinity there, and every gradient came out NaN (2^15 gave none). torch's GradScaler starts
    at 2^16 but scales an fp32 loss under autocast, and lowers the scale when it sees infinities
    or NaNs. Formats are the same on GPUs.
    """,
    giveaways=(
        r"0 in bf16",
        r"fp32's 8\s+exponent bits",
        r"needs no loss scaler",
    ),
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "fsdp_10_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it**, in fp16, without and with a loss scale of 1024: the share of non-zero fp32
# gradient elements that come out 0, how many come out not finite (inf or NaN), and the median
# gradient's size.

# %% nbgrader={"grade": false, "grade_id": "fsdp_10_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
for scale in (1.0, 1024.0):
    print(scale, precision.underflow(scale))

# %% [markdown] nbgrader={"grade": false, "grade_id": "exercise_2_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Exercise 2: mixed precision
#
# Give your `fully_shard` its two dtypes (edit the cell of exercise 1; a grader runs that one):
#
# * `param_dtype`: gather the shard cast to `param_dtype` (the gather moves 2 bytes per
#   element in bf16), and compute with those parameters; the gradient then comes out in
#   `param_dtype` too;
# * `reduce_dtype`: cast the unit's gradient to `reduce_dtype` before the reduce-scatter;
# * the master shard, `flat_shard`, and its `.grad` stay float32 whatever the two are.
#
# Graded (4 points) with `param_dtype=torch.bfloat16, reduce_dtype=torch.float32` on 2 and 3
# ranks, against a single process that does the same arithmetic (bf16 compute on bf16 copies of
# the fp32 masters, gradients averaged in fp32, an fp32 step), and by the dtypes of the
# collectives in a record of the run: all-gathers of 2 bytes per element, reduce-scatters of 4.

# %% nbgrader={"grade": false, "grade_id": "visible_mixed", "locked": true, "schema_version": 3, "solution": false, "task": false}
print(check_fsdp_mixed_precision(fully_shard, world_sizes=(2,)))

# %% nbgrader={"grade": true, "grade_id": "fully_shard_mixed_precision", "locked": true, "points": 4, "schema_version": 3, "solution": false, "task": false}
# bf16 gathers and compute, fp32 reduce-scatters and master shards: 2 and 3 ranks.
print(check_fsdp_mixed_precision(fully_shard, world_sizes=(2,)))
### BEGIN HIDDEN TESTS
print(check_fsdp_mixed_precision(fully_shard))
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "gpu_notes", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## What changes on GPUs
#
# Everything above ran on CPU ranks talking gloo over loopback. The layouts, the bytes held
# between steps and the order in which FSDP2 issues its calls are FSDP2's own: they hold on
# GPUs. The peaks of unsharded bytes were measured on CPU only. What does not carry:
#
# * **overlap**: with NCCL, collectives run on their own CUDA stream, and the CPU runs ahead of
#   the GPU: even without `set_modules_to_forward_prefetch`, the CPU issues the next unit's
#   all-gather while the GPU still computes the current one, and the two overlap (torch's
#   docstring: prefetching the one next unit gives the default's overlap, issued earlier from
#   the CPU). On CPU, without a prefetch, a unit's matmuls end before the next unit's gather
#   is issued, and gloo's threads share the cores with them;
# * **bytes on the wire**: what each collective sends is the backend's algorithm; NCCL's
#   reduce-scatter and all-gather are ring halves, (N-1)/N of the tensor each;
# * **memory**: the CUDA caching allocator keeps freed blocks reserved, so
#   `torch.cuda.memory_reserved` runs above what is allocated, and a freed block is reused
#   only on the stream that allocated it; FSDP2 keeps each collective's buffers alive by
#   waiting on events between streams (it calls no `record_stream`). A GPU's peak can differ
#   from the peaks measured here;
# * **speed of bf16**: on CPU, bf16 matmuls are emulated on many machines and can be slower than
#   fp32; on tensor cores they are several times faster.
