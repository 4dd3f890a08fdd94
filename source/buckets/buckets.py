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
# # Buckets and overlap
#
# DDP does not all-reduce each parameter's gradient on its own. It packs gradients into
# **buckets** of about `bucket_cap_mb` MiB and reduces one bucket per call. This notebook
# measures why, which gradients go into which bucket, and when each bucket's all-reduce starts.
#
# In this notebook you will
#
# 1. time the same gradients averaged in 1 to 200 all-reduce calls, and look at where DDP keeps
#    its gradients;
# 2. watch DDP's own buckets through a comm hook, for several `bucket_cap_mb`, and a timeline of
#    backward against communication;
# 3. write `bucketed_allreduce`, then a small DDP of your own, `OverlappingDDP`, that starts
#    each bucket's all-reduce from a gradient hook, during backward.
#
# `course.ranks.run(fn, N, ...)` runs `fn` on N real gloo ranks and returns each rank's value;
# a cell that starts with `%%ranks N` runs its code on N ranks.

# %% nbgrader={"grade": false, "grade_id": "setup", "locked": true, "schema_version": 3, "solution": false, "task": false}
# %load_ext course
import torch
import torch.distributed as dist
from torch import nn

from course.lessons.buckets import (
    check_answer,
    check_bucketed_allreduce,
    check_overlapping_ddp,
    experiment,
)
from course.ranks import run

# %% [markdown] nbgrader={"grade": false, "grade_id": "buckets_1_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Question buckets_1: what is left after backward
#
# *Difficulty 2/3*
#
# DDP packs gradients into buckets of about `bucket_cap_mb` MiB and runs one all-reduce per
# bucket. Take the model of the timeline below, 8 layers `Linear(512, 512)` in an
# `nn.Sequential` (each layer 1 MiB of weight and 2 KiB of bias), trained on 2 ranks with
# `DDP(model, bucket_cap_mb=4.5)`. From the second step on, how much gradient lies in buckets
# whose all-reduce DDP queues only after the last gradient is ready, when backward has no work
# left to hide it behind?
#
# * a) 1 MiB: layer 0 alone, the one gradient that comes after all others.
# * b) 4 MiB: layers 3 to 0, the four whole layers that fit under the cap.
# * c) 3 MiB: layers 2 to 0, the rest once a bucket of five layers is full.
# * d) 5 MiB: layers 0 to 4, one bucket filled up to the cap from layer 0.

# %% nbgrader={"grade": false, "grade_id": "buckets_1_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
answer_buckets_1 = ""  # your answer: one letter, "a" to "d"
### BEGIN SOLUTION
answer_buckets_1 = "c"
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "buckets_1_check", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_answer("answer_buckets_1", answer_buckets_1, choices="abcd")
### BEGIN HIDDEN TESTS
check_answer(
    "answer_buckets_1",
    answer_buckets_1,
    choices="abcd",
    key="c",
    explanation="""
    A bucket's all-reduce is one collective call over one flat buffer: DDP queues it when
    the last gradient of that bucket is ready, and from the second step on it fills its
    buckets in the order backward produces gradients, the last layer first. A bucket closes
    at the first tensor that takes it to the cap or beyond; with layers of 1.002 MiB and a cap
    of 4.5 MiB that makes layers 7 to 3 (5.010 MiB), then what is left, layers 2 to 0
    (3.006 MiB). The first bucket is queued while layers 2 to 0 still run their backward; the
    last one holds the last gradient of backward (layer 0's weight), so its 3.006 MiB are
    queued after it, with nothing of backward left to hide them. a) carries the timeline's
    1 MiB cap over: there a bucket holds one layer, and only layer 0's 1.002 MiB came after
    the last gradient; a larger cap makes the last bucket larger. b) takes a bucket to hold
    the whole layers that fit under the cap, four of them; DDP closes a bucket only once it
    reaches the cap, so the first holds five. d) fills buckets from layer 0, in registration
    order; DDP starts from the layer whose gradients are ready first, so the remainder lands
    in the last bucket. The same rule at its limit: a cap above the whole model (8.016 MiB) makes one
    bucket, and all of it is queued after the last gradient; the calls cell measures the
    other side of the trade-off, the cost of each call beyond its bytes.
    """,
    giveaways=(
        r"layers 7 to 3",
        r"5\.010 MiB",
        r"3\.006 MiB",
        r"layers 2 to 0",
    ),
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "buckets_1_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it (1): calls.** 200 gradients of 1000 floats each (800 kB in all) on 2 ranks,
# averaged in 1, 8, 50 and 200 `dist.all_reduce` calls (200: one per gradient). The same bytes
# every time; like DDP, the buffers are allocated once, and each row is the median of 5 runs.
# What does a call cost beyond its bytes?

# %% nbgrader={"grade": false, "grade_id": "buckets_1_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
timing = run(experiment.allreduce_timing, 2, 200, 1000, (1, 8, 50, 200), 5)[0]
for row in timing["rows"]:
    calls, seconds = row["calls"], row["seconds"]
    print(f"{calls:3} all-reduce calls: {1000 * seconds:7.2f} ms, {1e6 * seconds / calls:7.1f} us per call")
print(f"the same averaged values every time: {timing['same']}")

# %% [markdown] nbgrader={"grade": false, "grade_id": "buckets_1_measure_timeline_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it (2): overlap.** One DDP training step of 8 layers `Linear(512, 512)` on 2 ranks,
# `bucket_cap_mb=1` (about one layer per bucket). A comm hook records when each bucket's
# all-reduce starts and finishes; a hook on each parameter records when its gradient is ready.
# Ticks on the top row: gradients becoming ready during backward. One row per bucket, from
# the moment DDP queued its all-reduce to the moment it was done; the light part is time it
# spent queued while the bucket before it was still in flight, so the rows are a queue, not
# all-reduces running side by side. The dashed line: the last gradient ready. The dotted
# line: `backward()` returning, later than the last gradient because DDP's backward waits
# for every bucket's all-reduce, then writes the averages into `.grad`.

# %% nbgrader={"grade": false, "grade_id": "buckets_1_measure_timeline", "locked": true, "schema_version": 3, "solution": false, "task": false}
timeline = run(experiment.overlap_timeline, 2, 1.0)[0]
last_ready = max(t for _, t in timeline["grad_ready"])
first = timeline["buckets"][0]
print(f"{len(timeline['buckets'])} buckets; bucket 0 (params {first['params']}) started at "
      f"{1000 * first['start']:.1f} ms; last gradient ready at {1000 * last_ready:.1f} ms; "
      f"backward() returned at {1000 * timeline['backward_returned']:.1f} ms")
experiment.timeline_figure(timeline)

# %% [markdown] nbgrader={"grade": false, "grade_id": "buckets_1_measure_memory_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it (3): memory.** Where DDP keeps the gradients, on 2 ranks (4 layers
# `Linear(256, 256)`): the bytes of its bucket buffers, the bytes of the parameters' `.grad`,
# and how many `.grad` tensors lie inside a bucket buffer, with the default and with
# `gradient_as_bucket_view=True`.

# %% nbgrader={"grade": false, "grade_id": "buckets_1_measure_memory", "locked": true, "schema_version": 3, "solution": false, "task": false}
for as_view in (False, True):
    r = run(experiment.grad_storage, 2, as_view)[0]
    print(f"gradient_as_bucket_view={as_view!s:5}: buckets {r['bucket_bytes'] / experiment.MB:.3f} MiB, "
          f".grad {r['grad_bytes'] / experiment.MB:.3f} MiB, {r['grads_in_buckets']} of {r['params']} "
          ".grad tensors inside a bucket")

# %% [markdown] nbgrader={"grade": false, "grade_id": "buckets_2_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Question buckets_2: DDP's buckets, from the second step on
#
# *Difficulty 2/3*
#
# A model holds 8 layers `Linear(256, 256)` in an `nn.ModuleList`, registered as layers 0 to
# 7 (16 parameters, each layer 256 KiB of weight and 1 KiB of bias), but its `forward` runs
# them from layer 7 down to layer 0. It is wrapped in `DDP(model, bucket_cap_mb=0.5)` and
# trained for a few steps. From the second step on, what does bucket 0 (the first bucket
# reduced) hold?
#
# * a) Layers 7 and 6: the two registered last, as in a plain stack.
# * b) Layers 0 and 1: the two whose gradients backward produces first.
# * c) All 8 layers: one bucket, since forward does not follow registration.
# * d) Layer 7 alone: a bucket per layer, in the order forward runs them.

# %% nbgrader={"grade": false, "grade_id": "buckets_2_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
answer_buckets_2 = ""  # your answer: one letter, "a" to "d"
### BEGIN SOLUTION
answer_buckets_2 = "b"
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "buckets_2_check", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_answer("answer_buckets_2", answer_buckets_2, choices="abcd")
### BEGIN HIDDEN TESTS
check_answer(
    "answer_buckets_2",
    answer_buckets_2,
    choices="abcd",
    key="b",
    explanation="""
    DDP fills its buckets in the order backward produces gradients: during the first
    backward it records the order the gradients become ready, and before the second forward
    it rebuilds its buckets in that order, so that the first bucket reduced is the first
    one complete, which is what lets it overlap backward. Backward runs the layers in the
    reverse of the order forward used them; forward runs layer 0 last, so layer 0's
    gradients come first, then layer 1's. A bucket closes at the first tensor that takes it
    to the cap or beyond, and two layers, 2 x (256 KiB + 1 KiB), just pass 0.5 MiB: bucket 0
    holds layers 0 and 1 (parameters 0 to 3), measured from the second step on. In an
    nn.Sequential the gradient order and the reverse of registration coincide (the cell: the
    last layers first), which is why a) looks right there; here layers 7 and 6 are what
    backward produces last. d) A bucket holds layers until the cap is reached, not one layer
    each: the cell has one layer per bucket at 0.25 MiB and four at 1 MiB; and forward's
    order is not the order gradients come in: layer 7, run first, is ready last. c) DDP does
    not need forward to follow registration: it builds one bucket only in the very first
    backward, before it knows the order. experiment.reversed_stack_buckets(0.5, 3) runs this
    model with the cell's recording hook.
    """,
    giveaways=(
        r"holds layers 0 and 1",
        r"layer 0's\s+gradients come first",
        r"rebuilds its buckets in that order",
        r"parameters 0 to 3",
    ),
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "buckets_2_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it.** A plain `nn.Sequential` of 8 layers `Linear(256, 256)`, wrapped in DDP with
# a recording comm hook, for three steps, with `bucket_cap_mb` of 0.25 and of 1. Parameters
# are numbered in `model.parameters()` order: 0 is the first layer's weight, 15 the last
# layer's bias.

# %% nbgrader={"grade": false, "grade_id": "buckets_2_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
for cap in (0.25, 1.0):
    steps = run(experiment.ddp_buckets, 2, cap, 3)[0]
    print(f"\nbucket_cap_mb={cap}")
    for i, step in enumerate(steps):
        seen = "  ".join(f"#{b['bucket']}: {b['nbytes'] / experiment.MB:.3f} MiB {b['params']}" for b in step)
        print(f"  step {i + 1}: {len(step)} bucket(s)  {seen}")

# %% [markdown] nbgrader={"grade": false, "grade_id": "buckets_3_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Question buckets_3: the default cap
#
# *Difficulty 3/3*
#
# A larger model: 10 layers `Linear(1024, 1024, bias=False)` in an `nn.Sequential`, 4 MiB of
# gradient each, 40 MiB in all, wrapped with the defaults: `DDP(model)` (no `bucket_cap_mb`,
# no `find_unused_parameters`, no `static_graph`), on PyTorch 2.13. In each backward from the
# second on, how many all-reduce calls (buckets) does DDP make, and what does each hold?
#
# * a) 10 calls: one layer per bucket, since each layer passes the cap.
# * b) 3 calls: the last layer, the next seven, then the first two.
# * c) 2 calls: the last layer, then the other nine in one bucket.
# * d) 2 calls: the last seven layers, then the first three.

# %% nbgrader={"grade": false, "grade_id": "buckets_3_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
answer_buckets_3 = ""  # your answer: one letter, "a" to "d"
### BEGIN SOLUTION
answer_buckets_3 = "b"
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "buckets_3_check", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
check_answer("answer_buckets_3", answer_buckets_3, choices="abcd")
### BEGIN HIDDEN TESTS
check_answer(
    "answer_buckets_3",
    answer_buckets_3,
    choices="abcd",
    key="b",
    explanation="""
    Before the first backward DDP cannot know the order gradients will come in, so it starts
    with every parameter in one bucket, and before the second forward it rebuilds its
    buckets in the order that backward produced them. When bucket_cap_mb is not given, DDP's
    constructor passes two limits: dist._DEFAULT_FIRST_BUCKET_BYTES, 1 MiB, for the first
    bucket, so that the last layers' gradients start travelling early, and the documented
    default, 25 MiB for every other bucket; a bucket closes at the first tensor that takes
    it to its cap or beyond. Here the last layer alone (4 MiB) closes the first bucket, the
    next 7 layers (28 MiB) the second, and the first 2 layers (8 MiB) make a third: 3 calls
    from step 2 on. The cell's 2 MiB model cannot tell this rule from a) or c): after a
    first bucket of 1.004 MiB only 1.004 MiB is left, and each of the three makes it one
    more bucket. a) reads the default as a 1 MiB cap on every bucket; then every 4 MiB layer
    would be a bucket of its own. c) keeps the small first bucket but caps nothing after it.
    d) is the 25 MiB cap without the small first bucket, which is what bucket_cap_mb=25
    given explicitly does (28 MiB, then 12 MiB): an explicit cap holds from the first bucket
    on, as the cell's 0.5 shows. With static_graph=True the rebuild waits one more step, and
    find_unused_parameters=True builds the buckets by size from step 1 and never rebuilds
    them (both measured by the course's tests on the 2 MiB model).
    """,
    giveaways=(
        r"3 calls\s+from step 2 on",
        r"\b28 MiB\)? the second",
        r"7 layers \(28",
        r"25 MiB for every other bucket",
        r"first 2 layers \(8 MiB\)",
    ),
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "buckets_3_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it.** The 2 MiB `nn.Sequential` of question buckets_2's cell (8 layers
# `Linear(256, 256)`) with the defaults, and with `bucket_cap_mb=0.5` given explicitly: the
# number of all-reduce calls and their sizes in each of the first three steps.

# %% nbgrader={"grade": false, "grade_id": "buckets_3_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
print(f"PyTorch {torch.__version__}")
for cap in (None, 0.5):
    print(f"\nbucket_cap_mb={'not given' if cap is None else cap}")
    for i, step in enumerate(run(experiment.ddp_buckets, 2, cap, 3)[0]):
        print(f"  step {i + 1}: {len(step)} all-reduce call(s) of {[round(b['nbytes'] / experiment.MB, 3) for b in step]} MiB")

# %% [markdown] nbgrader={"grade": false, "grade_id": "bucketed_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Exercise 1: `bucketed_allreduce(grads, bucket_cap_mb)`
#
# Average a list of gradient tensors across ranks, **in place**, with one `dist.all_reduce`
# per bucket, using the rule DDP uses for its buckets from the second step on when
# `bucket_cap_mb` is given: the order and the closing size you measured for the
# `nn.Sequential` in question buckets_2's cell (`grads` is in registration order, like
# `model.parameters()` of such a stack, whose forward runs its layers in that order; sizes in
# bytes are `numel() * element_size()`, and 1 MiB = 1024 * 1024 bytes). For each bucket: pack
# its tensors into one flat tensor (`torch.cat` of `t.flatten()`), `dist.all_reduce` it, turn
# the sum into what DDP leaves in `.grad` (question ddp_1), and copy each slice back into its
# tensor (`t.copy_(...)`, so the caller's tensors hold the result).
#
# All the tensors of one call have the same dtype. The grader checks the values against
# `dist.all_reduce`, the number of calls and each call's size against DDP's own rule (its
# messages name the buckets it expected), on 2 and 3 ranks (and more cases in the hidden tests:
# a tensor larger than the cap, a cap larger than everything, float64). torch's own bucketing
# function, `dist._compute_bucket_assignment_by_size`, is refused on the grading ranks.

# %% nbgrader={"grade": false, "grade_id": "bucketed_allreduce", "locked": false, "schema_version": 3, "solution": true, "task": false}
def bucketed_allreduce(grads: list[torch.Tensor], bucket_cap_mb: float) -> None:
    """Reduce ``grads`` across ranks in place as DDP does: one all-reduce per bucket."""
    ### BEGIN SOLUTION
    cap = bucket_cap_mb * 1024 * 1024
    groups, current, size = [], [], 0
    for g in reversed(grads):
        current.append(g)
        size += g.numel() * g.element_size()
        if size >= cap:
            groups.append(current)
            current, size = [], 0
    if current:
        groups.append(current)
    for group in groups:
        flat = torch.cat([g.flatten() for g in group])
        dist.all_reduce(flat)
        flat /= dist.get_world_size()
        offset = 0
        for g in group:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()
    ### END SOLUTION


# %% [markdown] nbgrader={"grade": false, "grade_id": "bucketed_try_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### Test as you go
#
# Four tensors of 100 floats (400 bytes each), rank r holding `r + 1`, cap 800 bytes: the
# rule gives 2 calls of 200 elements, and every element should end up as what DDP's `.grad`
# would hold.

# %% tags=["raises-exception"] nbgrader={"grade": false, "grade_id": "bucketed_try", "locked": true, "schema_version": 3, "solution": false, "task": false}
# %%ranks 2 --timeout 20
from course.lessons.buckets import say_if_unimplemented

say_if_unimplemented(bucketed_allreduce)  # a note if the cell above is still the empty stub
grads = [torch.full((100,), rank + 1.0) for _ in range(4)]
calls = []
real_all_reduce = dist.all_reduce
dist.all_reduce = lambda t, *a, **k: calls.append(t.numel()) or real_all_reduce(t, *a, **k)
try:
    bucketed_allreduce(grads, 800 / 1024 / 1024)
finally:
    dist.all_reduce = real_all_reduce
print(f"calls of {calls} elements; values {sorted({v for g in grads for v in g.tolist()})}")

# %% nbgrader={"grade": true, "grade_id": "bucketed_allreduce_check", "locked": true, "points": 4, "schema_version": 3, "solution": false, "task": false}
# Averages, number of calls and bucket sizes, on fresh ranks with fresh random gradients.
print(check_bucketed_allreduce(bucketed_allreduce, world_sizes=(2, 3)))
### BEGIN HIDDEN TESTS
from course.lessons.buckets import HIDDEN_CASES

print(check_bucketed_allreduce(bucketed_allreduce, world_sizes=(2, 3, 4), cases=HIDDEN_CASES))
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "overlap_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Exercise 2: overlap, your own small DDP
#
# Write `OverlappingDDP(module, bucket_cap_mb)`, a minimal data-parallel wrapper in the style
# of picotron's `Bucket`/`BucketManager`:
#
# * `__init__` groups the module's parameters into buckets by the rule of exercise 1 and
#   registers a hook on every parameter with `p.register_post_accumulate_grad_hook(hook)`; autograd calls
#   `hook(p)` as soon as `p.grad` holds this backward's gradient.
# * When the last missing gradient of a bucket arrives, the hook packs the bucket's gradients
#   and **starts** its all-reduce with `dist.all_reduce(flat, async_op=True)`, keeping the
#   returned `Work`; backward goes on with the earlier layers meanwhile.
# * `finish()`, called after `loss.backward()` and before `optimizer.step()`, waits for every
#   pending all-reduce (`work.wait()`), divides by the world size, copies the averages into the
#   parameters' `.grad`, and resets the wrapper for the next step.
#
# The grader trains a 6-layer model for 2 steps on fresh ranks (`model.zero_grad()`, forward
# through the module, `loss.backward()`, `wrapper.finish()`), and checks `.grad` against the
# average of the ranks' gradients (what DDP gives), that every call is asynchronous, one per
# bucket, and that each bucket's all-reduce started **during** backward, as soon as the bucket
# was full.

# %% nbgrader={"grade": false, "grade_id": "OverlappingDDP", "locked": false, "schema_version": 3, "solution": true, "task": false}
class OverlappingDDP:
    """Average gradients like DDP, starting each bucket's all-reduce during backward."""

    def __init__(self, module: nn.Module, bucket_cap_mb: float) -> None:
        """Group the parameters into buckets by DDP's rule and register a hook on each."""
        ### BEGIN SOLUTION
        self.module = module
        params = [p for p in module.parameters() if p.requires_grad]
        cap = bucket_cap_mb * 1024 * 1024
        self.buckets, current, size = [], [], 0
        for p in reversed(params):
            current.append(p)
            size += p.numel() * p.element_size()
            if size >= cap:
                self.buckets.append(current)
                current, size = [], 0
        if current:
            self.buckets.append(current)
        self.bucket_of = {id(p): i for i, bucket in enumerate(self.buckets) for p in bucket}
        self.ready = [0] * len(self.buckets)
        self.pending = []
        for p in params:
            p.register_post_accumulate_grad_hook(self._grad_ready)
        ### END SOLUTION

    ### BEGIN SOLUTION
    def _grad_ready(self, p: torch.Tensor) -> None:
        i = self.bucket_of[id(p)]
        self.ready[i] += 1
        if self.ready[i] == len(self.buckets[i]):  # the bucket is full: start its all-reduce
            flat = torch.cat([q.grad.flatten() for q in self.buckets[i]])
            self.pending.append((i, flat, dist.all_reduce(flat, async_op=True)))
    ### END SOLUTION

    def finish(self) -> None:
        """Wait for every bucket's all-reduce, write the averages into .grad, reset."""
        ### BEGIN SOLUTION
        for i, flat, work in self.pending:
            work.wait()
            flat /= dist.get_world_size()
            offset = 0
            for q in self.buckets[i]:
                q.grad.copy_(flat[offset : offset + q.numel()].view_as(q.grad))
                offset += q.numel()
        self.pending, self.ready = [], [0] * len(self.buckets)
        ### END SOLUTION


# %% [markdown] nbgrader={"grade": false, "grade_id": "overlap_try_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### Test as you go
#
# Two steps of a small model on 2 ranks, against the average of the ranks' own gradients
# computed with one plain all-reduce; it prints the largest difference (should be ~1e-8).

# %% tags=["raises-exception"] nbgrader={"grade": false, "grade_id": "overlap_try", "locked": true, "schema_version": 3, "solution": false, "task": false}
# %%ranks 2 --timeout 20
import copy

from course.lessons.buckets import say_if_unimplemented

say_if_unimplemented(OverlappingDDP)  # a note if the class above is still the empty stub

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 4))
reference = copy.deepcopy(model)
wrapper = OverlappingDDP(model, bucket_cap_mb=0.002)
torch.manual_seed(rank + 1)  # different data on each rank
for step in range(2):
    x = torch.randn(8, 32)
    for m in (model, reference):
        m.zero_grad()
        m(x).square().mean().backward()
    wrapper.finish()
    flat = torch.cat([p.grad.flatten() for p in reference.parameters()])
    dist.all_reduce(flat)
    mine = torch.cat([p.grad.flatten() for p in model.parameters()])
    print(f"step {step + 1}: max |yours - average| = {(mine - flat / world_size).abs().max():.2e}")

# %% nbgrader={"grade": true, "grade_id": "OverlappingDDP_check", "locked": true, "points": 4, "schema_version": 3, "solution": false, "task": false}
# DDP's averaged gradients; asynchronous all-reduces, one per bucket, started during backward.
print(check_overlapping_ddp(OverlappingDDP, world_sizes=(2,)))
### BEGIN HIDDEN TESTS
print(check_overlapping_ddp(OverlappingDDP, world_sizes=(3, 4), bucket_cap_mb=0.02))
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "summary", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## What you measured
#
# * **Calls**: the same 800 kB averaged in 1 to 200 all-reduce calls; look at what each call
#   costs, and at whether the values change.
# * **Overlap**: when each bucket's all-reduce was queued and done, against the gradients
#   becoming ready and `backward()` returning.
# * **Memory**: DDP's bucket buffers against the parameters' `.grad`, with and without
#   `gradient_as_bucket_view`.
# * **DDP's buckets** at several caps and with the default, step by step.
# * **Your code**: `bucketed_allreduce` checked for its values, its calls and their sizes;
#   `OverlappingDDP` for DDP's gradients, with every bucket's all-reduce started during
#   backward. The explanations of the questions come with your feedback.

