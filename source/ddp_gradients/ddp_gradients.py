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
# gradients on its own slice of the batch, and during `backward()` DDP all-reduces them so that
# every rank steps its optimizer with the same `.grad`. *Which* value ends up in `.grad` decides
# how the learning rate, the batch size and an uneven split of the data behave.
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
from course.checks import check_answer, check_average_hook, check_weighted_loss
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
    all-reduces the bucket with SUM and divides by world_size, and it writes that result into
    .grad during backward, on every rank. The measurement shows both numbers side by side: a
    plain dist.all_reduce of the local gradients gives [3, 3], DDP's .grad is [1.5, 1.5] on
    rank 0 and on rank 1. Averaging (not summing) keeps the gradient's scale independent of
    the number of ranks, so a learning rate tuned on one process still fits.
    """,
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "ddp_1_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it.** The exact step from the question, on 2 ranks, with what a plain
# `dist.all_reduce(SUM)` of the local gradients gives printed beside `.grad`.

# %% nbgrader={"grade": false, "grade_id": "ddp_1_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
# %%ranks 2 --timeout 60
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
# does not divide by the world size, so `.grad` holds the raw cross-rank sum, not the average.
# Keeping the same learning rate as the single-GPU run, what is the most likely immediate
# symptom?
#
# * a) No visible change: each rank's gradient is already a mean over its own samples, so a
#   sum of such means behaves like a mean.
# * b) Each step is about 4x too small: every rank holds only a quarter of the batch, so its
#   share of the summed gradient is a quarter of the single-GPU gradient.
# * c) Only rank 0 steps 4x too far; the other ranks keep their local gradients, so the
#   replicas drift apart.
# * d) Every rank steps about 4x too far, as if the learning rate were 4x larger.

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
    default makes the SUM run blow up, while the SUM run at lr / 4 follows the default run's
    curve step for step. A sum of local means is not a mean: with 4 ranks it is 4 times one.
    The all-reduce leaves the same sum on every rank, so all replicas take the same too-large
    step and stay identical; nothing is a quarter of the usual size either.
    """,
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "ddp_2_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it.** First one step on 4 ranks, rank r holding input `r + 1`, with DDP's default
# and with the SUM hook below (`course.experiments.ddp.sum_hook`). Then a short training run (linear
# regression, 64 samples split over 4 ranks, full-batch SGD, 30 steps, fixed seed): DDP's
# default, the SUM hook at the same learning rate, the SUM hook at lr / 4, and the same model
# trained in one process on all 64 samples.

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
curves = {
    "one process, lr": ddp.train_single(lr),
    "DDP default, lr": run(ddp.train, 4, lr)[0],
    "DDP + SUM hook, lr": run(ddp.train, 4, lr, ddp.sum_hook)[0],
    "DDP + SUM hook, lr / 4": run(ddp.train, 4, lr / 4, ddp.sum_hook)[0],
}
for name, losses in curves.items():
    print(f"{name:24} loss at steps 0, 10, 20, 29: " + "  ".join(f"{losses[i]:.3g}" for i in (0, 10, 20, 29)))
ddp.loss_figure(curves, title="SUM hook against DDP's default (4 ranks): three curves coincide")

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
# * a) They are equal: DDP weights each rank's gradient by its local batch size.
# * b) `.grad` is the sum of the two local mean gradients, so it is about twice the pooled
#   mean.
# * c) `.grad` is rank 1's local mean gradient: the larger batch's gradient wins.
# * d) `.grad` weighs the two local means equally, so rank 1's 3 samples count for less than
#   in the pooled mean.

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
    under-represented and rank 0's over-represented. DDP does not look at batch sizes, and
    it averages, it does not sum: the measured gradient lies between the two local means,
    halfway. To get the pooled
    mean, weight each rank's summed loss by world_size / (total number of samples), which
    needs an all-reduce of the sample count: the second exercise below.
    """,
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "ddp_3_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it.** One DDP step of a 3-input linear model with an MSE loss, rank 0 on sample 0
# and rank 1 on samples 1 to 3 (`course.experiments.ddp.uneven_step`). Beside DDP's `.grad`, two
# single-process oracles on the same 4 samples: the pooled per-sample mean gradient, and the
# flat average of the two local means.

# %% nbgrader={"grade": false, "grade_id": "ddp_3_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
uneven = run(ddp.uneven_step, 2, (1, 3))
fmt = lambda v: "[" + ", ".join(f"{x:8.3f}" for x in v) + "]"  # noqa: E731
for r in uneven:
    print(f"rank {r['rank']} (local batch {r['local_batch_sizes'][r['rank']]}): DDP .grad {fmt(r['grad'])}")
print(f"local mean, rank 0 (1 sample):   {fmt(uneven[0]['local_means'][0])}")
print(f"local mean, rank 1 (3 samples):  {fmt(uneven[0]['local_means'][1])}")
print(f"flat average of the local means: {fmt(uneven[0]['flat_average'])}")
print(f"sum of the two local means:      {fmt([a + b for a, b in zip(*uneven[0]['local_means'])])}")
print(f"pooled mean over all 4 samples:  {fmt(uneven[0]['pooled_mean'])}")

# %% [markdown] nbgrader={"grade": false, "grade_id": "ddp_4_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Question ddp_4: whose weights?
#
# *Difficulty 1/3*
#
# Three ranks each build `nn.Linear(2, 1)` with a **different** random seed, so their initial
# weights differ, and then wrap it: `DDP(m)`. What do the three ranks' weights hold right
# after `DDP(m)` returns, before any forward or backward?
#
# * a) Each rank keeps its own initial weights until the first optimizer step.
# * b) The average of the three ranks' initial weights, on every rank.
# * c) Rank 0's initial weights, on every rank.
# * d) The last rank's initial weights, on every rank.

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
    step if they start in step. The measurement prints each rank's weights before and after
    the constructor: after it, all three hold what rank 0 built. Nothing is averaged, and the
    other ranks' initial weights are simply overwritten.
    """,
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "ddp_4_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it.** Three ranks, seeds 1000, 1001 and 1002 (`course.experiments.ddp.broadcast_step`).

# %% nbgrader={"grade": false, "grade_id": "ddp_4_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
for rank, r in enumerate(run(ddp.broadcast_step, 3)):
    print(f"rank {rank}: before DDP(m) {[round(v, 4) for v in r['before']]}   after {[round(v, 4) for v in r['after']]}")

# %% [markdown] nbgrader={"grade": false, "grade_id": "hook_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Exercise 1: an averaging comm hook
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
# Write `average_hook(state, bucket)` so that `.grad` ends up exactly as with DDP's default:
# the average over ranks. It is graded on fresh ranks (2 to 4, fresh random data, several
# buckets per step) against DDP's own result.
#
# Hints: `dist.all_reduce(tensor, async_op=True)` returns a `Work`; `work.get_future()` is a
# future whose value is a **list** holding the reduced tensor; `fut.then(fn)` returns a new
# future whose value is `fn(fut)`. Keep the parameter names `state` and `bucket` (DDP looks
# `bucket` up by name) and, if you annotate, use `dist.GradBucket` and
# `torch.futures.Future[torch.Tensor]`.

# %% nbgrader={"grade": false, "grade_id": "average_hook", "locked": false, "schema_version": 3, "solution": true, "task": false}
def average_hook(state, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """All-reduce the bucket and divide by world_size: DDP's default averaging, as a comm hook."""
    ### BEGIN SOLUTION
    buffer = bucket.buffer().div_(dist.get_world_size())
    work = dist.all_reduce(buffer, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])
    ### END SOLUTION


# %% [markdown] nbgrader={"grade": false, "grade_id": "hook_try_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### Test as you go
#
# The step of question ddp_1 with your hook: both ranks should print `[[1.5, 1.5]]`.

# %% nbgrader={"grade": false, "grade_id": "hook_try", "locked": true, "schema_version": 3, "solution": false, "task": false}
# %%ranks 2 --timeout 60
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from course.checks.hooks import guard_hook
from course.checks.teaching import say_if_unimplemented

torch.manual_seed(0)
m = nn.Linear(2, 1, bias=False)
ddp = DDP(m)
problems = []  # what DDP would crash on (a hook that returns no Future...), in words
ddp.register_comm_hook(None, guard_hook(average_hook, problems))
say_if_unimplemented(average_hook)  # a note if the cell above is still the empty stub
ddp(torch.full((1, 2), float(rank + 1))).sum().backward()
print(problems[0] if problems else m.weight.grad.tolist())

# %% nbgrader={"grade": true, "grade_id": "average_hook_matches_ddp", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
# .grad with your hook equals DDP's default, on fresh ranks with fresh random data.
print(check_average_hook(average_hook, world_sizes=(2,)))
### BEGIN HIDDEN TESTS
print(check_average_hook(average_hook, world_sizes=(3, 4)))
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "weighted_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Exercise 2: the pooled mean under uneven batches
#
# Question ddp_3 measured that with a per-rank mean loss, uneven local batches give the flat
# average of the local means. Write `weighted_loss(loss_per_sample)`: it gets this rank's
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
    """This rank's share of the pooled mean loss, scaled so DDP's averaged .grad is the pooled mean."""
    ### BEGIN SOLUTION
    count = torch.tensor([float(loss_per_sample.numel())])
    dist.all_reduce(count)
    return loss_per_sample.sum() * dist.get_world_size() / count.squeeze()
    ### END SOLUTION


# %% [markdown] nbgrader={"grade": false, "grade_id": "weighted_try_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### Test as you go
#
# Rank 0 with 1 sample, rank 1 with 3: `.grad` should match the pooled mean printed by
# question ddp_3's measurement, not the flat average.

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
    print([round(v, 3) for v in model.weight.grad.flatten().tolist()])
else:
    print(f"weighted_loss returned {type(loss).__name__}, not a tensor: implement it above")

# %% nbgrader={"grade": true, "grade_id": "weighted_loss_pooled_mean", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
# After DDP's backward, .grad equals the pooled per-sample mean gradient, with uneven batches.
print(check_weighted_loss(weighted_loss, world_sizes=(2,)))
### BEGIN HIDDEN TESTS
print(check_weighted_loss(weighted_loss, world_sizes=(3, 4)))
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "summary", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## What the measurements showed
#
# * **`.grad` after backward** held the same value on every rank, the local gradients'
#   average (a plain `all_reduce` would have left their sum).
# * **A SUM hook** made every `.grad` 4 times DDP's on 4 ranks; at the same learning rate the
#   loss blew up, and at a quarter of it the run matched DDP's default step for step.
# * **Uneven batches** (1 and 3 samples): `.grad` was the flat average of the two local
#   means, not the mean over the 4 samples; only a loss that all-reduces the sample count
#   gives the pooled mean.
# * **Construction**: right after `DDP(m)` every rank held rank 0's initial weights.
# * **Your hook and your loss** were checked against DDP's own averaging and against a
#   single process that sees every sample.
