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
# # What DDP does to your gradients
#
# `DistributedDataParallel` (DDP) runs one copy of the model on every rank. Each rank computes
# gradients on its own slice of the batch, and during `backward()` DDP communicates them with
# an all-reduce. *Which* value ends up in each rank's `.grad` decides how the learning rate, the
# batch size and an uneven split of the data behave.
#
# In this notebook you will
#
# 1. answer four questions about DDP's gradients, each next to a cell that **measures** the
#    answer on real gloo ranks (PyTorch's own DDP, on this machine's CPU);
# 2. write a **comm hook**, the function DDP calls to reduce each bucket of gradients;
# 3. write a **loss** that gives the true per-sample mean gradient when ranks hold batches of
#    different sizes.
#
# A cell that starts with `%%ranks N` runs on N processes, each a real rank, with `rank`,
# `world_size`, `torch` and `dist` ready. The first DDP cell takes a few seconds longer: each
# rank loads parts of PyTorch that DDP needs.

# %% nbgrader={"grade": false, "grade_id": "setup", "locked": true, "schema_version": 3, "solution": false, "task": false}
# %load_ext course
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from course.experiments import ddp
from course.checks import check_answer, check_reduce_hook, check_weighted_loss
from course.ranks import run

# %% [markdown] nbgrader={"grade": false, "grade_id": "ddp_1_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Question ddp_1: what does `.grad` hold after a DDP backward?
#
# *Difficulty 2/3*
#
# Two ranks run this DDP training step (PyTorch 2.x, gloo backend):
#
# ```python
# torch.manual_seed(0)
# m = nn.Linear(2, 1, bias=False)
# ddp = DDP(m)
# ddp(torch.full((1, 2), float(rank + 1))).sum().backward()
# ```
#
# Rank 0's local (unsynced) gradient would be `[1, 1]` and rank 1's would be `[2, 2]`. What
# does `m.weight.grad` hold on both ranks after `backward()` returns?
#
# * a) `[1.5, 1.5]` on both ranks, the averaged value.
# * b) `[3.0, 3.0]` on both ranks, the summed value.
# * c) `[1.0, 1.0]` on rank 0 and `[2.0, 2.0]` on rank 1, unsynced.
# * d) `[1.5, 1.5]` on rank 0 only; rank 1 keeps `[2.0, 2.0]`.

# %% nbgrader={"grade": false, "grade_id": "ddp_1_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
answer_ddp_1 = ""  # your answer: one letter, "a" to "d"
### BEGIN SOLUTION
answer_ddp_1 = "a"
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "ddp_1_check", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_answer("answer_ddp_1", answer_ddp_1, choices="abcd")
### BEGIN HIDDEN TESTS
check_answer(
    "answer_ddp_1",
    answer_ddp_1,
    choices="abcd",
    key="a",
    explanation="""
    DDP registers a hook on every parameter's gradient. When a bucket of gradients is ready it
    multiplies it by 1/world_size, all-reduces it with SUM, and writes the result into .grad
    during backward, on every rank: the average of the local gradients, (1 + 2) / 2 = 1.5 in
    each element here. The measurement on 4 ranks shows both numbers side by side: a plain
    dist.all_reduce of the local gradients [1, 1] to [4, 4] gives [10, 10], DDP's .grad is
    [2.5, 2.5] on every rank. b) [3, 3] is that plain SUM: DDP divides. c) and d) leave a
    rank unsynced, but the all-reduce leaves the same value on every rank that takes part.
    Averaging (not summing) keeps the gradient's scale independent of the number of ranks,
    so a learning rate tuned on one process still fits. The scaling comes before the sum: on
    3 ranks .grad equals all_reduce(g * (1/3)) in every element, and all_reduce(g) / 3
    differs from it in the last bit in 12,080 of 20,000 (1/3 is not exact in float32).
    """,
    giveaways=(
        r"\[1\.5, 1\.5\]",
        r"the average of the local gradients",
        r"\.grad\b[^.]{0,60}\baverag",
        r"multiplies it by 1/world_?size",
        r"\bDDP averages",
    ),
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "ddp_1_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it.** The step from the question, on 4 ranks (rank r's input is `r + 1`, so its
# local gradient is `[r + 1, r + 1]`), with what a plain `dist.all_reduce(SUM)` of the local
# gradients gives printed beside `.grad`. What law turns the local gradients into `.grad`, and
# what does it give on the question's 2 ranks?

# %% nbgrader={"grade": false, "grade_id": "ddp_1_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
# %%ranks 4 --timeout 60
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

torch.manual_seed(0)
m = nn.Linear(2, 1, bias=False)
ddp = DDP(m)
x = torch.full((1, 2), float(rank + 1))
ddp(x).sum().backward()

local = x.sum(dim=0)  # this rank's own gradient: d(w . x)/dw = x
summed = local.clone()
dist.all_reduce(summed, op=dist.ReduceOp.SUM)
print(f"PyTorch {torch.__version__}, backend {dist.get_backend()}")
print(f"local gradient {local.tolist()}   all_reduce(SUM) {summed.tolist()}   "
      f"m.weight.grad {m.weight.grad.flatten().tolist()}")

# %% [markdown] nbgrader={"grade": false, "grade_id": "ddp_2_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Question ddp_2: a comm hook that sums
#
# *Difficulty 3/3*
#
# A team moves from single-GPU training to 4-rank DDP. To keep the code "simple" they replace
# DDP's comm hook with their own, which calls `dist.all_reduce(bucket.buffer(), op=SUM)` and
# returns the result, so `.grad` holds what that SUM all-reduce leaves. Keeping the same
# learning rate as the single-GPU run, what is the most likely immediate symptom?
#
# * a) No change: a SUM all-reduce is what DDP's own reduction does anyway.
# * b) Each step is 4x too small: every rank holds a quarter of the batch.
# * c) Only rank 0 steps too far; the other replicas drift away from it.
# * d) Every rank steps 4x too far, as if the learning rate were 4x larger.

# %% nbgrader={"grade": false, "grade_id": "ddp_2_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
answer_ddp_2 = ""  # your answer: one letter, "a" to "d"
### BEGIN SOLUTION
answer_ddp_2 = "d"
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "ddp_2_check", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
check_answer("answer_ddp_2", answer_ddp_2, choices="abcd")
### BEGIN HIDDEN TESTS
check_answer(
    "answer_ddp_2",
    answer_ddp_2,
    choices="abcd",
    key="d",
    explanation="""
    SGD updates w -= lr * grad. With the SUM hook every .grad is world_size = 4 times the
    average that DDP would have written (measured: 10 against 2.5), so each step moves the
    weights 4 times further: the same as running with 4 * lr. Nothing in PyTorch rescales
    the learning rate for you. In the measured run the same lr that converges with DDP's
    default makes the SUM run blow up; the SUM run at lr / 4 follows the default run's curve
    step for step, and DDP's default at 4 * lr follows the SUM run. a) DDP's own reduction
    averages (question ddp_1), and a sum of 4 local means is 4 times a mean, not a mean. b)
    Each rank's local mean already has the single-GPU gradient's scale; summing 4 of them
    makes it larger, not a quarter. c) The all-reduce leaves the same sum on every rank, so
    all replicas take the same too-large step and stay identical.
    """,
    giveaways=(r"4 ?(x|times) (too|further|larger)", r"as if the learning rate were"),
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "ddp_2_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it.** First one step on 4 ranks, rank r holding input `r + 1`, with DDP's default
# and with the SUM hook below (`course.experiments.ddp.sum_hook`). Then a short training run
# (linear regression, 64 samples split over 4 ranks, full-batch SGD, 30 steps, fixed seed): the
# same model trained in one process on all 64 samples, DDP's default and the SUM hook, each at
# the learning rate lr, at 4 lr and at lr / 4. Which curves coincide, and what does that say
# about the SUM hook's step?

# %% nbgrader={"grade": false, "grade_id": "ddp_2_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
def sum_hook(state, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """The team's hook: all-reduce with SUM, no division (the same as course.experiments.ddp.sum_hook)."""
    dist.all_reduce(bucket.buffer(), op=dist.ReduceOp.SUM)
    done = torch.futures.Future()
    done.set_result(bucket.buffer())
    return done


default_step = run(ddp.seed_step, 4)
sum_step = run(ddp.seed_step, 4, ddp.sum_hook)
for d, s in zip(default_step, sum_step):
    print(f"rank {d['rank']}: local {d['local']}  default .grad {d['grad']}  SUM hook .grad {s['grad']}")

lr = 0.2
curves = {"one process, lr": ddp.train_single(lr)}
for name, scale in (("lr", 1), ("4 lr", 4), ("lr / 4", 1 / 4)):
    curves[f"DDP default, {name}"] = run(ddp.train, 4, lr * scale)[0]
    curves[f"DDP + SUM hook, {name}"] = run(ddp.train, 4, lr * scale, ddp.sum_hook)[0]
for name, losses in curves.items():
    print(f"{name:24} loss at steps 0, 10, 20, 29: " + "  ".join(f"{losses[i]:.3g}" for i in (0, 10, 20, 29)))
ddp.loss_figure(curves, title="SUM hook against DDP's default, 4 ranks, three learning rates")

# %% [markdown] nbgrader={"grade": false, "grade_id": "ddp_3_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Question ddp_3: uneven local batches
#
# *Difficulty 2/3*
#
# Rank 0 processes a local batch of 1 sample and rank 1 a local batch of 3 samples in the same
# DDP step (an uneven split), each with the usual mean loss over its own samples. Compare
# DDP's synced `.grad` with the gradient of the mean loss over all 4 samples pooled together.
# Which is true?
#
# * a) They are equal: DDP weights each rank's gradient by its batch size.
# * b) `.grad` is the sum of the two local means: twice the pooled mean.
# * c) `.grad` is rank 1's local mean: the larger local batch wins.
# * d) `.grad` weighs both local means equally: rank 1's samples count less.

# %% nbgrader={"grade": false, "grade_id": "ddp_3_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
answer_ddp_3 = ""  # your answer: one letter, "a" to "d"
### BEGIN SOLUTION
answer_ddp_3 = "d"
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "ddp_3_check", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_answer("answer_ddp_3", answer_ddp_3, choices="abcd")
### BEGIN HIDDEN TESTS
check_answer(
    "answer_ddp_3",
    answer_ddp_3,
    choices="abcd",
    key="d",
    explanation="""
    The pooled mean over 1 + 3 = 4 samples gives every sample the weight 1/4, so rank 1's
    three samples carry 3/4 of it. DDP averages the two local means with 1/2 each: rank 0's
    single sample gets 1/2 and each of rank 1's samples gets 1/6. Rank 1's samples are
    under-represented and rank 0's over-represented. The measurement, with 2 and 5 samples,
    finds .grad exactly halfway between the two local means, and away from the pooled mean.
    a) DDP never looks at batch sizes: it scales every rank's gradient by the same
    1/world_size. b) It averages, it does not sum (question ddp_1). c) Both ranks' gradients
    enter the all-reduce; the larger batch has no say. To get the pooled mean, weight each
    rank's summed loss by world_size / (total number of samples), which needs an all-reduce
    of the sample count: the second exercise below.
    """,
    giveaways=(
        r"samples count less",
        r"weighs? (the two|both) local means equally",
        r"halfway between",
        r"under-?(represented|weighted)",
    ),
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "ddp_3_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it.** One DDP step of a 3-input linear model with an MSE loss, with 2 samples on
# rank 0 and 5 on rank 1 (`course.experiments.ddp.uneven_step`). Beside DDP's `.grad`, what
# one process computes on the same samples: each rank's local mean gradient, and the pooled
# per-sample mean over all 7. Which combination of the local means is `.grad`?

# %% nbgrader={"grade": false, "grade_id": "ddp_3_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
uneven = run(ddp.uneven_step, 2, (2, 5))
fmt = lambda v: "[" + ", ".join(f"{x:8.3f}" for x in v) + "]"  # noqa: E731
for r in uneven:
    print(f"rank {r['rank']} (local batch {r['local_batch_sizes'][r['rank']]}): DDP .grad {fmt(r['grad'])}")
print(f"local mean, rank 0 (2 samples):  {fmt(uneven[0]['local_means'][0])}")
print(f"local mean, rank 1 (5 samples):  {fmt(uneven[0]['local_means'][1])}")
print(f"pooled mean over all 7 samples:  {fmt(uneven[0]['pooled_mean'])}")

# %% [markdown] nbgrader={"grade": false, "grade_id": "ddp_4_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Question ddp_4: whose weights?
#
# *Difficulty 1/3*
#
# Three ranks each build `nn.Linear(2, 1)` with a **different** random seed, so their initial
# weights differ, and then wrap it: `DDP(m)`. What do the three ranks' weights hold right
# after `DDP(m)` returns, before any forward or backward?
#
# * a) Each rank keeps its own weights until the first optimizer step syncs them.
# * b) Every rank holds the average of the 3 ranks' initial weights.
# * c) Every rank holds rank 0's initial weights, which DDP sends out.
# * d) Every rank holds rank 2's initial weights, the last to arrive.

# %% nbgrader={"grade": false, "grade_id": "ddp_4_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
answer_ddp_4 = ""  # your answer: one letter, "a" to "d"
### BEGIN SOLUTION
answer_ddp_4 = "c"
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "ddp_4_check", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
check_answer("answer_ddp_4", answer_ddp_4, choices="abcd")
### BEGIN HIDDEN TESTS
check_answer(
    "answer_ddp_4",
    answer_ddp_4,
    choices="abcd",
    key="c",
    explanation="""
    The DDP constructor broadcasts the module's parameters and buffers from rank 0 to every
    other rank, so all replicas start identical. Averaged gradients only keep replicas in
    step if they start in step. The measurement prints each of 4 ranks' weights before and
    after the constructor: after it, all of them hold what rank 0 built. a) Waiting for the
    first step would let the replicas start apart, and nothing after construction ever
    copies weights again. b) Nothing is averaged: the other ranks' initial weights are simply
    overwritten. d) The last rank is not special; rank 0 is the source of the broadcast.
    """,
    giveaways=(r"broadcasts? (the module's )?(parameters|weights)", r"what rank 0 built", r"simply overwritten"),
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "ddp_4_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it.** Four ranks, seeds 1000 to 1003 (`course.experiments.ddp.construction_step`): what
# does each hold before and after `DDP(m)`, and what does that say for the question's three?

# %% nbgrader={"grade": false, "grade_id": "ddp_4_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
for rank, r in enumerate(run(ddp.construction_step, 4)):
    print(f"rank {rank}: before DDP(m) {[round(v, 4) for v in r['before']]}   after {[round(v, 4) for v in r['after']]}")

# %% [markdown] nbgrader={"grade": false, "grade_id": "hook_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Exercise 1: DDP's reduction, as a comm hook
#
# DDP groups gradients into **buckets** and, for each bucket that is ready, calls its comm hook
# (see the PyTorch docs, *DDP Communication Hooks*):
#
# ```python
# ddp.register_comm_hook(state, hook)   # DDP then calls hook(state, bucket) for every bucket
# ```
#
# `bucket` is a `dist.GradBucket`: `bucket.buffer()` is one flat tensor holding this rank's
# gradients for the bucket, `bucket.index()` its number, `bucket.parameters()` the parameters in
# it. The hook must **return a `torch.futures.Future` whose value is one tensor** shaped like
# `bucket.buffer()`: DDP waits on it and copies its value into the parameters' `.grad`.
#
# Write `reduce_hook(state, bucket)` so that `.grad` ends up exactly as with DDP's default (what
# question ddp_1 measured), with `dist.all_reduce` and your own arithmetic. It is graded on fresh
# ranks (2 to 4, fresh random data, several buckets per step) against DDP's own result; torch's
# ready-made hooks (`torch.distributed.algorithms.ddp_comm_hooks`) are refused.
#
# Hints: `dist.all_reduce(tensor, async_op=True)` returns a `Work`; `work.get_future()` is a
# future whose value is a **list** holding the reduced tensor; `fut.then(fn)` returns a new
# future whose value is `fn(fut)`. Keep the parameter names `state` and `bucket` (DDP looks
# `bucket` up by name) and, if you annotate, use `dist.GradBucket` and
# `torch.futures.Future[torch.Tensor]`.

# %% nbgrader={"grade": false, "grade_id": "reduce_hook", "locked": false, "schema_version": 3, "solution": true, "task": false}
def reduce_hook(state, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Reduce one bucket across ranks as DDP's default does, as a comm hook."""
    ### BEGIN SOLUTION
    buffer = bucket.buffer().div_(dist.get_world_size())
    work = dist.all_reduce(buffer, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])
    ### END SOLUTION


# %% [markdown] nbgrader={"grade": false, "grade_id": "hook_try_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### Test as you go
#
# One step of question ddp_1's model on 2 ranks, rank r holding input `r + 2`: your hook's
# `.grad` beside the `.grad` of the same step with DDP's default. They should be equal.

# %% nbgrader={"grade": false, "grade_id": "hook_try", "locked": true, "schema_version": 3, "solution": false, "task": false}
# %%ranks 2 --timeout 60
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from course.checks.hooks import guard_hook
from course.checks.teaching import say_if_unimplemented

grads = {}
for name in ("yours", "DDP's default"):
    torch.manual_seed(0)
    m = nn.Linear(2, 1, bias=False)
    ddp = DDP(m)
    problems = []  # what DDP would crash on (a hook that returns no Future...), in words
    if name == "yours":
        say_if_unimplemented(reduce_hook)  # a note if the cell above is still the empty stub
        ddp.register_comm_hook(None, guard_hook(reduce_hook, problems))
    ddp(torch.full((1, 2), float(rank + 2))).sum().backward()
    grads[name] = problems[0] if problems else m.weight.grad.tolist()
print(grads)

# %% nbgrader={"grade": true, "grade_id": "reduce_hook_matches_ddp", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
# .grad with your hook equals DDP's default, on fresh ranks with fresh random data.
print(check_reduce_hook(reduce_hook, world_sizes=(2,)))
### BEGIN HIDDEN TESTS
print(check_reduce_hook(reduce_hook, world_sizes=(3, 4)))
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "weighted_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Exercise 2: the pooled mean under uneven batches
#
# Question ddp_3 measured what `.grad` holds when ranks hold batches of different sizes and each
# takes the mean loss over its own samples. Write `weighted_loss(loss_per_sample)`: it gets this rank's
# per-sample losses (a 1-d tensor, one entry per local sample; ranks may hold different
# numbers of samples) and returns the scalar loss to call `backward()` on, such that after
# DDP's backward **`.grad` equals the gradient of the mean loss over all samples of all ranks**
# (the pooled per-sample mean), on every rank.
#
# The grader calls it inside a real DDP step, on 2 to 4 ranks with random local batch sizes
# from 1 to 5, and compares `.grad` with a single-process run on all the samples:
#
# ```python
# loss_per_sample = ((ddp(x_local) - y_local) ** 2).mean(dim=1)   # shape [local batch size]
# weighted_loss(loss_per_sample).backward()
# ```
#
# Remember what DDP does to the gradients after your loss (question ddp_1), and that no rank
# knows the other ranks' batch sizes unless you tell it (`dist.all_reduce`, on every rank).

# %% nbgrader={"grade": false, "grade_id": "weighted_loss", "locked": false, "schema_version": 3, "solution": true, "task": false}
def weighted_loss(loss_per_sample: torch.Tensor) -> torch.Tensor:
    """This rank's share of the pooled mean loss: after DDP's backward, .grad is the pooled mean."""
    ### BEGIN SOLUTION
    count = torch.tensor([float(loss_per_sample.numel())])
    dist.all_reduce(count)
    return loss_per_sample.sum() * dist.get_world_size() / count.squeeze()
    ### END SOLUTION


# %% [markdown] nbgrader={"grade": false, "grade_id": "weighted_try_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### Test as you go
#
# Rank 0 with 1 sample, rank 1 with 3: `.grad` on both ranks should equal the pooled mean,
# which the cell computes in one process on all 4 samples and prints below yours.

# %% nbgrader={"grade": false, "grade_id": "weighted_try", "locked": true, "schema_version": 3, "solution": false, "task": false}
# %%ranks 2 --timeout 60
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from course.checks.teaching import say_if_unimplemented
from course.experiments.ddp import regression_data

x, y = regression_data(samples=4, features=3, seed=0)
lo, hi = [(0, 1), (1, 4)][rank]
model = nn.Linear(3, 1, bias=False)
torch.manual_seed(0)
nn.init.normal_(model.weight)
ddp = DDP(model)
loss_per_sample = ((ddp(x[lo:hi]) - y[lo:hi]) ** 2).mean(dim=1)
say_if_unimplemented(weighted_loss)  # a note if the cell above is still the empty stub
loss = weighted_loss(loss_per_sample)
if isinstance(loss, torch.Tensor):
    loss.backward()
    print(f"yours:       {[round(v, 3) for v in model.weight.grad.flatten().tolist()]}")
    oracle = nn.Linear(3, 1, bias=False)
    torch.manual_seed(0)
    nn.init.normal_(oracle.weight)
    ((oracle(x) - y) ** 2).mean().backward()
    print(f"pooled mean: {[round(v, 3) for v in oracle.weight.grad.flatten().tolist()]}")
else:
    print(f"weighted_loss returned {type(loss).__name__}, not a tensor: implement it above")

# %% nbgrader={"grade": true, "grade_id": "weighted_loss_pooled_mean", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
# After DDP's backward, .grad equals the pooled per-sample mean gradient, with uneven batches.
print(check_weighted_loss(weighted_loss, world_sizes=(2,)))
### BEGIN HIDDEN TESTS
print(check_weighted_loss(weighted_loss, world_sizes=(3, 4)))
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "summary", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## What you measured
#
# * **`.grad` after backward**, on 4 ranks, beside a plain SUM all-reduce of the same local
#   gradients.
# * **A SUM comm hook** against DDP's default, one step and 30 steps of training at three
#   learning rates: look at which curves coincide.
# * **Uneven batches** of 2 and 5 samples: `.grad` beside the local means and the pooled mean.
# * **Construction**: each rank's weights before and after `DDP(m)`.
# * **Your hook and your loss**, checked against DDP's own reduction and against a single
#   process that sees every sample. The explanations of the questions come with your feedback.
