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
# 1. answer four questions about DDP's gradients, each next to a cell that **measures** what
#    it is about on real gloo ranks (PyTorch's own DDP, on this machine's CPU);
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

from course.lessons.ddp_gradients import (
    check_answer,
    check_reduce_hook,
    check_weighted_loss,
    experiment,
)
from course.ranks import run

# %% [markdown] nbgrader={"grade": false, "grade_id": "ddp_1_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Question ddp_1: summed losses on more ranks
#
# *Difficulty 2/3*
#
# A DDP run on 2 ranks takes, on each rank, the **summed** squared error over its local batch
# of 16 samples (PyTorch 2.x, gloo backend, no comm hook):
#
# ```python
# loss = ((ddp(x_local) - y_local) ** 2).sum()
# loss.backward()
# ```
#
# It moves to 3 ranks, which hold 8, 8 and 16 of the same 32 samples in each step, with the
# same model, weights and code. Compared with the 2-rank run, what does `.grad` hold after
# `backward()`?
#
# * a) The same values: the same 32 samples sum to the same gradient.
# * b) Two thirds of the values: the same total is divided among 3 ranks.
# * c) 1.5 times the values: 3 ranks add their gradients in instead of 2.
# * d) Half the values: the two 8-sample ranks' sums are half the old ones.

# %% nbgrader={"grade": false, "grade_id": "ddp_1_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
answer_ddp_1 = ""  # your answer: one letter, "a" to "d"
### BEGIN SOLUTION
answer_ddp_1 = "b"
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "ddp_1_check", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_answer("answer_ddp_1", answer_ddp_1, choices="abcd")
### BEGIN HIDDEN TESTS
check_answer(
    "answer_ddp_1",
    answer_ddp_1,
    choices="abcd",
    key="b",
    explanation="""
    DDP leaves in .grad the average of the ranks' local gradients: when a bucket of gradients
    is ready it multiplies it by 1/world_size and all-reduces it with SUM, on every rank. The
    cell shows it through a mean loss: on 4 equal local batches of 4 samples, .grad equals
    one process's gradient of the mean over all 16, and that is the average of the 4 local
    means (a sum of them would be 4 times as large). With a summed loss a rank's local
    gradient is the sum of its own samples' gradients, so the local gradients of all ranks
    add up to G, the summed gradient of all 32 samples, however they are split. .grad is
    G / 2 on 2 ranks and G / 3 on 3 ranks: two thirds of the values, on every rank. Measured:
    one step of a linear model on the same 32 samples, split 16 + 16 and 8 + 8 + 16, gives a
    .grad on 3 ranks that is 2/3 of .grad on 2 ranks in every element. a) is what a single
    process does with a summed loss, and what "DDP matches one process" suggests when carried
    over from the mean loss: G itself does not change, but DDP divides it by the world size.
    c) would hold if DDP summed the local gradients; it averages them. d) looks at the small
    ranks only: their local sums are half the old ones, but the third rank's is not, and the
    three still add up to G. The scaling comes before the sum: on 3 ranks .grad equals
    all_reduce(g * (1/3)) in every element, and all_reduce(g) / 3 differs from it in the last
    bit in 12,080 of 20,000 (1/3 is not exact in float32).
    """,
    giveaways=(
        r"two thirds of the values",
        r"divided among 3 ranks",
        r"G / 3 on 3 ranks",
        r"2/3 of \.grad on 2 ranks",
    ),
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "ddp_1_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it.** One DDP step of `nn.Linear(3, 1, bias=False)` on 4 ranks that share one data
# set of 16 samples, rank r holding rows `4r` to `4r + 3` as its local batch and taking the
# **mean** squared error over them. Each rank prints `m.weight.grad` after DDP's backward and,
# beside it, the gradient one process computes with the same weights and the mean loss over all
# 16 samples. For other losses and splits, `course.lessons.ddp_gradients.experiment.uneven_step(local_batch_sizes,
# reduction=...)` runs one DDP step of a linear model in which rank r holds
# `local_batch_sizes[r]` samples of one data set, with the loss reduced by `"mean"` or `"sum"`,
# and returns `.grad` beside each rank's local mean gradient and the pooled mean.

# %% nbgrader={"grade": false, "grade_id": "ddp_1_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
# %%ranks 4 --timeout 60
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from course.lessons.ddp_gradients import regression_data

x, y = regression_data(samples=16, features=3, seed=0)  # the same 16 samples on every rank
mine = slice(4 * rank, 4 * rank + 4)  # this rank's local batch
torch.manual_seed(0)
m = nn.Linear(3, 1, bias=False)
ddp = DDP(m)
nn.functional.mse_loss(ddp(x[mine]), y[mine]).backward()  # the mean over the local batch

one = nn.Linear(3, 1, bias=False)  # one process: the same weights, the mean over all 16
one.load_state_dict(m.state_dict())
nn.functional.mse_loss(one(x), y).backward()

fmt = lambda g: "[" + ", ".join(f"{v:8.4f}" for v in g.flatten().tolist()) + "]"  # noqa: E731
print(f"PyTorch {torch.__version__}, backend {dist.get_backend()}")
print(f"DDP, m.weight.grad:          {fmt(m.weight.grad)}")
print(f"one process, all 16 samples: {fmt(one.weight.grad)}")

# %% [markdown] nbgrader={"grade": false, "grade_id": "ddp_2_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Question ddp_2: a comm hook that sums, under Adam
#
# *Difficulty 3/3*
#
# A team moves a model from one process to 4-rank DDP, each rank taking the mean loss over its
# quarter of the batch. To keep the code "simple" they replace DDP's comm hook with their own,
# which calls `dist.all_reduce(bucket.buffer(), op=SUM)` and returns the result, so `.grad`
# holds what that SUM all-reduce leaves. Their optimizer is `torch.optim.Adam` with its
# defaults, at the learning rate tuned on one process. Compared with the same DDP run without
# their hook, what happens to the training steps?
#
# * a) Every step goes 4x too far, as with 4 times the learning rate.
# * b) Every step goes 2x too far: Adam's step grows as the gradient's root.
# * c) Losses agree step for step: Adam divides the gradient's scale out.
# * d) Only the first steps go 4x too far, until Adam's averages catch up.

# %% nbgrader={"grade": false, "grade_id": "ddp_2_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
answer_ddp_2 = ""  # your answer: one letter, "a" to "d"
### BEGIN SOLUTION
answer_ddp_2 = "c"
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "ddp_2_check", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
check_answer("answer_ddp_2", answer_ddp_2, choices="abcd")
### BEGIN HIDDEN TESTS
check_answer(
    "answer_ddp_2",
    answer_ddp_2,
    choices="abcd",
    key="c",
    explanation="""
    With the SUM hook every .grad is world_size = 4 times what DDP's default writes (measured:
    one step on 4 ranks, rank r's input r + 1, [10, 10] against [2.5, 2.5]). Under SGD,
    w -= lr * grad, that is a step 4 times too far, and at the same lr the run blows up (the
    cell's default output).
    Adam's step is lr * m / (sqrt(v) + eps), with m a running mean of the gradient and v a
    running mean of its square: 4 times every gradient makes m 4 times and v 16 times larger,
    so sqrt(v) is 4 times larger too, and the ratio stays. Only the small eps beside sqrt(v)
    keeps it from being exact. Measured on 4 ranks, 30 Adam steps at lr 0.2: the SUM hook's
    losses equal the default's to 1e-5 relative at every step, and match neither the default
    at 4 lr, at 2 lr nor at lr / 4. a) is SGD's symptom, whose step is proportional to the
    gradient; Adam's is not. b) takes the root of the gradient itself; Adam divides the mean
    gradient by the root of the mean square, and both grow 4 times. d) Adam's averages start
    at zero and its bias correction divides that out, so already the first step is
    lr * g / (|g| + eps), the same for g and 4 g: the losses agree from the first step on, and
    not those of the default at 4 lr. Adam's invariance hides the bug here, but anything
    that reads the gradient's size (clipping to a norm, a logged gradient norm, SGD after a
    switch) sees it 4 times too large.
    """,
    giveaways=(
        r"divides the gradient'?s scale out",
        r"losses agree step for step",
        r"the ratio stays",
        r"SUM hook'?s\s+losses equal the default'?s",
    ),
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "ddp_2_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it.** A short training run (linear regression, 64 samples split over 4 ranks,
# full-batch, 30 steps, fixed seed) with DDP's default and with the SUM hook below
# (`course.lessons.ddp_gradients.experiment.sum_hook`), both with the optimizer named in `optimizer` (`"sgd"` for
# `torch.optim.SGD`, `"adam"` for `torch.optim.Adam`) at the learning rate `lr`; with SGD, the
# same model trained in one process on all 64 samples too.

# %% nbgrader={"grade": false, "grade_id": "ddp_2_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
def sum_hook(state, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """The team's hook: a SUM all-reduce, returned as is (as course.lessons.ddp_gradients.experiment.sum_hook)."""
    dist.all_reduce(bucket.buffer(), op=dist.ReduceOp.SUM)
    done = torch.futures.Future()
    done.set_result(bucket.buffer())
    return done


optimizer, lr = "sgd", 0.2
curves = {"one process": experiment.train_single(lr)} if optimizer == "sgd" else {}
curves["DDP default"] = run(experiment.train, 4, lr, optimizer=optimizer)[0]
curves["DDP + SUM hook"] = run(experiment.train, 4, lr, experiment.sum_hook, optimizer=optimizer)[0]
for name, losses in curves.items():
    print(f"{name:16} loss at steps 0, 10, 20, 29: " + "  ".join(f"{losses[i]:.3g}" for i in (0, 10, 20, 29)))
experiment.loss_figure(curves, title=f"SUM hook against DDP's default, 4 ranks, {optimizer} at lr {lr}")

# %% [markdown] nbgrader={"grade": false, "grade_id": "ddp_3_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Question ddp_3: uneven local batches, trained to the end
#
# *Difficulty 2/3*
#
# A linear model `nn.Linear(3, 1, bias=False)` is fitted to a squared error with DDP on 2 ranks.
# Rank 0 always holds the same 2 samples and rank 1 the same 6 (a fixed uneven split). Each
# rank takes the usual mean loss over its own samples, and full-batch SGD runs for many steps
# at a small learning rate. What do the weights approach?
#
# * a) The least-squares fit of all 8 samples: the split only slows it.
# * b) A fit that weighs each of rank 1's samples 3x one of rank 0's.
# * c) No single point: the two ranks' pulls keep them going back and forth.
# * d) A fit that weighs each of rank 0's samples 3x one of rank 1's.

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
    DDP's .grad is the plain average of the two ranks' local mean gradients, 1/2 each,
    whatever their batch sizes: it divides by world_size and never sees a batch size. Written
    per sample, rank 0's 2 samples weigh 1/4 each and rank 1's 6 samples 1/12 each: .grad is
    the gradient of a weighted squared error in which each of rank 0's samples counts 3 times
    one of rank 1's. Full-batch SGD settles where .grad is zero, at the minimum of that
    weighted loss. Measured: 400 steps at lr 0.1 end within 1e-4 of the weighted
    least-squares fit (weights 3 and 1) in every weight, and more than 0.02 from the plain fit
    of all 8 samples. On the cell's even split, 4 + 4, the average of the two local means is
    the pooled mean, and the same run ends at the plain fit (within 1e-4): what an even split
    shows does not carry over to an uneven one. a) The split changes the loss being
    minimized, not only the speed: at the plain fit the pooled mean's gradient is zero, but
    DDP's .grad is not. b) turns the weights round: each rank's mean enters with 1/2, and
    rank 1's half is shared by 6 samples, rank 0's by 2, so a larger batch gives each of its
    samples less say, not more (the fit with rank 1's samples at 3x is more than 0.02 away).
    c) Both ranks apply the same averaged gradient, the full-batch gradient of one fixed loss,
    so at a small learning rate the weights converge; nothing alternates between the ranks'
    own fits. Weighting each rank's summed loss by world_size / (total number of samples)
    moves the fixed point to the plain fit: the second exercise below.
    """,
    giveaways=(
        r"counts 3 times one of rank 1'?s",
        r"weighs each of rank 0'?s samples 3x",
        r"weighted least-squares fit",
        r"1/12 each",
    ),
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "ddp_3_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it.** `course.lessons.ddp_gradients.experiment.uneven_fit(local_batch_sizes)` trains the question's
# model on 2 ranks: 8 fixed samples, rank r always holding the same `local_batch_sizes[r]` of
# them and taking the mean loss over its own, 400 steps of full-batch SGD at lr 0.1. It returns
# the weights it ends at, the last step's `.grad`, and the 8 samples (`x`, `y`, rank r's rows
# from `shards[r][0]` to `shards[r][1]`) for any fit you want to set beside it. The cell runs an
# even split, 4 + 4, and prints where DDP ends beside the least-squares fit of all 8 samples
# (`torch.linalg.lstsq`); the split 2 + 6 takes the same call.

# %% nbgrader={"grade": false, "grade_id": "ddp_3_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
local_batch_sizes = (4, 4)
fit = run(experiment.uneven_fit, 2, local_batch_sizes)[0]
x, y = torch.tensor(fit["x"]), torch.tensor(fit["y"]).unsqueeze(1)
plain = torch.linalg.lstsq(x, y).solution.flatten()  # minimizes the squared error of all 8
fmt = lambda v: "[" + ", ".join(f"{w:8.4f}" for w in v) + "]"  # noqa: E731
print(f"split {' + '.join(map(str, local_batch_sizes))}, DDP after 400 steps: {fmt(fit['weight'])}")
print(f"least-squares fit of all 8 samples:   {fmt(plain.tolist())}")

# %% [markdown] nbgrader={"grade": false, "grade_id": "ddp_4_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Question ddp_4: a replica that starts apart
#
# *Difficulty 1/3*
#
# Two ranks build `nn.Linear(2, 1)` from the same seed and wrap it: `DDP(m)`. Right after,
# rank 1 alone adds 1.0 to every parameter (say it loaded an old checkpoint by mistake). Then
# 10 steps of plain SGD follow (`torch.optim.SGD`, no momentum, no weight decay), each rank on
# its own data. What holds for the two ranks' parameters over those steps?
#
# * a) Rank 1's stay 1.0 above rank 0's, element for element, at every step.
# * b) The next forward sends out rank 0's parameters again: the gap is gone.
# * c) The averaged gradients pull rank 1 back a little closer at every step.
# * d) The gap grows: rank 1's own gradients push it further from rank 0.

# %% nbgrader={"grade": false, "grade_id": "ddp_4_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
answer_ddp_4 = ""  # your answer: one letter, "a" to "d"
### BEGIN SOLUTION
answer_ddp_4 = "a"
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "ddp_4_check", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
check_answer("answer_ddp_4", answer_ddp_4, choices="abcd")
### BEGIN HIDDEN TESTS
check_answer(
    "answer_ddp_4",
    answer_ddp_4,
    choices="abcd",
    key="a",
    explanation="""
    DDP copies parameters across ranks once, in its constructor, which broadcasts rank 0's
    parameters and buffers to every rank (the measurement: after DDP(m) all 4 ranks hold
    what rank 0 built). After that it only averages gradients: every rank gets the same
    .grad, and plain SGD subtracts lr * .grad, the same amount on both ranks, so whatever
    difference the replicas have is kept as it is. Measured on 2 ranks: after each of the
    10 steps, rank 1's parameters minus rank 0's are 1.0 in every element, to within 1e-6
    (float rounding). b) Each forward broadcasts rank 0's buffers (such as BatchNorm's running
    statistics, with broadcast_buffers=True), never its parameters; nn.Linear has no buffers.
    c) The average is the same on both ranks and moves both by the same amount; nothing
    pulls the replicas together. d) Rank 1's local gradient does differ, computed at its
    own weights, but it only enters the all-reduce, and both ranks apply the same average.
    This is why DDP makes the replicas start equal, and why loading a checkpoint on one rank
    after DDP(m) is a silent bug.
    """,
    giveaways=(
        r"stay 1\.0 above rank 0",
        r"difference the replicas have is kept",
        r"copies parameters across ranks once",
    ),
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "ddp_4_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it.** Four ranks, seeds 1000 to 1003 (`course.lessons.ddp_gradients.experiment.construction_step`):
# what each holds before and after `DDP(m)`. Then `course.lessons.ddp_gradients.experiment.offset_run` on 2
# ranks: `DDP(m)` from one seed, then `offset` added to rank 1's parameters alone, then 10 SGD
# steps, each rank on data of its own; rank 1 prints its parameters minus rank 0's after
# construction and after each step.

# %% nbgrader={"grade": false, "grade_id": "ddp_4_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
for rank, r in enumerate(run(experiment.construction_step, 4)):
    print(f"rank {rank}: before DDP(m) {[round(v, 4) for v in r['before']]}   after {[round(v, 4) for v in r['after']]}")

offset = 0.0
gaps = run(experiment.offset_run, 2, offset)[1]["gaps"]
for step, gap in enumerate(gaps):
    print(f"{'after DDP(m)' if step == 0 else f'after step {step}':13} rank 1 - rank 0: {[round(v, 6) for v in gap]}")

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
# One DDP step of `nn.Linear(2, 1, bias=False)` on 2 ranks, each rank on a random input of its
# own: your hook's `.grad` beside the `.grad` of the same step with DDP's default. They should
# be equal.

# %% tags=["raises-exception"] nbgrader={"grade": false, "grade_id": "hook_try", "locked": true, "schema_version": 3, "solution": false, "task": false}
# %%ranks 2 --timeout 60
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from course.lessons.ddp_gradients import guard_hook, say_if_unimplemented

grads = {}
for name in ("yours", "DDP's default"):
    torch.manual_seed(0)
    m = nn.Linear(2, 1, bias=False)
    ddp = DDP(m)
    problems = []  # what DDP would crash on (a hook that returns no Future...), in words
    if name == "yours":
        say_if_unimplemented(reduce_hook)  # a note if the cell above is still the empty stub
        ddp.register_comm_hook(None, guard_hook(reduce_hook, problems))
    ddp(torch.randn(1, 2, generator=torch.Generator().manual_seed(rank))).sum().backward()
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
# Question ddp_3 trained on ranks that hold batches of different sizes, each taking the mean loss
# over its own samples. Write `weighted_loss(loss_per_sample)`: it gets this rank's
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

# %% tags=["raises-exception"] nbgrader={"grade": false, "grade_id": "weighted_try", "locked": true, "schema_version": 3, "solution": false, "task": false}
# %%ranks 2 --timeout 60
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from course.lessons.ddp_gradients import regression_data, say_if_unimplemented

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
# * **`.grad` after backward**, on 4 ranks with a mean loss each, beside one process's gradient
#   on all their samples.
# * **A SUM comm hook** against DDP's default, 30 steps of training, with the optimizer and
#   learning rate set in the cell.
# * **A fixed split** of 8 samples over 2 ranks trained for 400 steps, beside the least-squares
#   fit of all 8.
# * **Construction**: each rank's weights before and after `DDP(m)`, and the gap between two
#   ranks when one of them changes its parameters afterwards.
# * **Your hook and your loss**, checked against DDP's own reduction and against a single
#   process that sees every sample. The explanations of the questions come with your feedback.
