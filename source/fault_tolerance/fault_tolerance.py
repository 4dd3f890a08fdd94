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
# # When a rank fails
#
# Synchronous data parallelism has a weak link the earlier notebooks did not measure: every
# step needs every rank, so one rank that fails stops them all. Meta's Llama 3 report counts
# 419 unexpected interruptions in a 54-day snapshot of its 405B training run on 16,384 GPUs,
# and says that "the synchronous nature of training makes it less fault-tolerant - a single
# GPU failure may require a restart of the entire job". This notebook measures, on real gloo
# ranks, what engineers do about it:
#
# 1. **a peer that fails**: what a collective does when a rank is killed or stops answering,
#    and what the process group is worth afterwards;
# 2. **restarting the job**: what torchrun's elastic agent restarts, and what is done again;
# 3. **how often to checkpoint**: failures drawn over time, the work they cost, and the
#    interval that costs least;
# 4. **a checkpoint of a sharded state**: what each rank writes with
#    `torch.distributed.checkpoint`, and what it reads back on another number of ranks; you
#    write a sharded save and a load on another number of ranks, `save_sharded` and
#    `load_resharded`;
# 5. **keeping the healthy replicas**: torchft's per-step quorum, and a replica that comes back;
#    you write a step that outlives a rank, `fault_tolerant_step`, and the catching up of ranks
#    that come back, `heal`;
# 6. **synchronising less often**: LocalSGD and DiLoCo; you write DiLoCo's outer step,
#    `diloco_outer_step`.
#
# As before, `%%ranks N` runs a cell on N gloo ranks, and `course.ranks.run(fn, N, ...)` runs a
# function on N ranks and returns each rank's value in rank order.

# %% nbgrader={"grade": false, "grade_id": "setup", "locked": true, "schema_version": 3, "solution": false, "task": false}
# %load_ext course
import torch
import torch.distributed as dist

from course.lessons.fault_tolerance import (
    check_answer,
    check_diloco_outer_step,
    check_fault_tolerant_step,
    check_heal,
    check_resharding,
    chunk_bounds,
)
from course.ranks import run

# %% [markdown] nbgrader={"grade": false, "grade_id": "part_1_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 1. A peer that fails
#
# A rank can fail in two ways that look alike from outside. It can be **killed**: a
# segfault, the kernel's OOM killer, a lost node; its process is gone. Or it can **hang**:
# alive, but it stops calling collectives (a deadlocked data loader, a read from a stuck
# file system). `init_process_group(timeout=...)` sets how long gloo waits for a peer before
# it gives up (30 minutes unless you say otherwise).
#
# `peers.report(how, world_size, pg_timeout)` runs one all-reduce on every rank; then the last
# rank fails, killed or silent, and each other rank calls `dist.all_reduce` twice more on the
# same group, catching what gloo raises. It prints, for each survivor, the TCP connections
# it holds (gloo's ranks connect to each other when the group is made), and how each of the
# two calls ended: `ok`, `timed out`, or `peer closed` (a connection was reset or closed
# under it), after how long, in gloo's own words.

# %% [markdown] nbgrader={"grade": false, "grade_id": "fault_tolerance_1_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Question fault_tolerance_1: a rank killed in the middle of an all-reduce
#
# *Difficulty 3/3*
#
# Eight ranks train with gloo, `init_process_group("gloo", timeout=timedelta(minutes=30))`.
# Just after step 999 the kernel's OOM killer kills rank 7 (SIGKILL); the seven others enter
# step 1,000's `dist.all_reduce` of the gradients. Each catches what the call raises and stays
# up. What happens on ranks 0 to 6?
#
# * a) All seven wait out the 30 minutes, then raise: gloo learns of a lost peer by its timeout.
# * b) All seven raise at once: the kernel closes rank 7's connections to each one of them.
# * c) Ranks 0 and 6 raise at once; ranks 1 to 5 raise only when the 30 minutes are up.
# * d) Ranks 1 to 5 raise at once; ranks 0 and 6, waiting on rank 7, when the 30 minutes are up.
#
# Set `answer_fault_tolerance_1` to your letter and run the cell below it.

# %% nbgrader={"grade": false, "grade_id": "fault_tolerance_1_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
answer_fault_tolerance_1 = ""  # your answer: one letter, "a" to "d"
### BEGIN SOLUTION
answer_fault_tolerance_1 = "c"
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "fault_tolerance_1_check", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
check_answer("answer_fault_tolerance_1", answer_fault_tolerance_1, choices="abcd")
### BEGIN HIDDEN TESTS
check_answer(
    "answer_fault_tolerance_1",
    answer_fault_tolerance_1,
    choices="abcd",
    key="c",
    explanation="""
    gloo's all-reduce runs as a ring, and in it each rank waits only on its two neighbours.
    Measured on 8 gloo ranks, gloo's timeout 3 s, tensors of 64 K and 4 M floats, rank 7 killed
    before the others' second all-reduce: ranks 0 and 6, its neighbours, raised "Connection
    closed by peer" (or "reset") within a tenth of a second; ranks 1 to 5 raised when the
    timeout was up, "Timed out waiting 3000ms" (or, on a loaded machine, a closed connection
    from a neighbour whose own timeout closed it); on every survivor, each later call on the
    group failed at once. The kernel does close all seven of rank 7's connections (each rank
    holds one to every other), but a closed connection is found only by a rank that waits on it:
    rank 6 sends to rank 7, rank 0 receives from it, and ranks 1 to 5 wait on live neighbours
    who will never send again. a) is what a silent rank does (the cell's 3 ranks): a killed one
    is found at once by those that talk to it. b) the connections close everywhere, but ranks 1
    to 5 are not reading them. d) is the other way round: the ranks that wait on rank 7 itself
    are the ones reading its closed connections, so they learn first; ranks 1 to 5 wait on
    live neighbours, which catch the error and stay up with their connections open. A group's
    ranks are fixed when it is made, so without rank 7's share the sum cannot end, and the
    group is of no more use. So a job must stop its survivors from outside (torchrun's agent
    does, part 2), or it waits the whole timeout. On GPUs, NCCL
    behaves otherwise (its watchdog aborts a collective that outlives the timeout); that is not
    measured here.
    """,
    giveaways=(
        r"ranks 0 and 6, its neighbours",
        r"each rank waits only on its two neighbours",
        r"Ranks 0 and 6 raise at once",
    ),
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "fault_tolerance_1_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it**: a rank killed on 2 ranks, and a rank silent on 3, gloo's timeout 2 s.

# %% nbgrader={"grade": false, "grade_id": "fault_tolerance_1_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
from course.lessons.fault_tolerance import peers

print(peers.report("killed", 2, pg_timeout=2.0))
print(peers.report("hangs", 3, pg_timeout=2.0))

# %% [markdown] nbgrader={"grade": false, "grade_id": "part_2_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 2. Restarting the job
#
# `torchrun` starts each worker of a job as a process, and its **elastic agent** watches
# them (https://pytorch.org/docs/stable/elastic/run.html). `--max-restarts K` says how many
# failures it may recover from before it gives up, and a worker reads
# `TORCHELASTIC_RESTART_COUNT` to know which attempt it is in. The job below,
# `python -m torch.distributed.run --standalone --nproc-per-node 1 --max-restarts 1
# -m course.lessons.fault_tolerance.elastic ...`, trains a small model by SGD for 12 steps;
# rank 0 saves a checkpoint after every 5th step, and a worker that starts loads the newest
# one. The worker raises an exception in step 8 of the first attempt. `elastic.report` prints, per
# attempt, each worker's process id, the step it started from, the steps it finished and how
# it ended, then torchrun's own exit code.

# %% [markdown] nbgrader={"grade": false, "grade_id": "fault_tolerance_2_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Question fault_tolerance_2: what torchrun starts again
#
# *Difficulty 2/3*
#
# A job runs as `torchrun --nproc-per-node 8 --max-restarts 3 train.py` on one machine. Its
# rank 0 saves a checkpoint after steps 100, 200, 300 and so on, and a worker that starts
# loads the newest checkpoint there is. In step 250 rank 5 raises an exception, a one-off
# fault; the seven others had finished step 249. What happens next?
#
# * a) The agent starts a new rank 5 alone; it loads step 200 and catches up as the others wait.
# * b) The agent stops the seven others and starts eight new workers, which go back to step 201.
# * c) The agent starts a new rank 5 alone; rank 0 sends it the weights of step 249 to go on.
# * d) The job ends: the agent restarts workers when a node is lost, not when a script raises.
#
# Set `answer_fault_tolerance_2` to your letter and run the cell below it.

# %% nbgrader={"grade": false, "grade_id": "fault_tolerance_2_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
answer_fault_tolerance_2 = ""  # your answer: one letter, "a" to "d"
### BEGIN SOLUTION
answer_fault_tolerance_2 = "b"
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "fault_tolerance_2_check", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_answer("answer_fault_tolerance_2", answer_fault_tolerance_2, choices="abcd")
### BEGIN HIDDEN TESTS
check_answer(
    "answer_fault_tolerance_2",
    answer_fault_tolerance_2,
    choices="abcd",
    key="b",
    explanation="""
    The agent treats its workers as one group: when one fails it stops the rest (SIGTERM) and,
    while restarts are left, starts a whole new group, every worker a new process. Measured with
    torchrun on 3 workers, --max-restarts 1, a checkpoint after every 5th step, rank 1 raising
    in step 8: attempt 1 ran 3 new processes (none kept its process id), each started from step
    5's checkpoint and finished steps 6 to 12, with the same losses in steps 6 and 7 as the
    first attempt, bit for bit; torchrun exited with 0. With --max-restarts 0 on 4 workers, rank
    2 raising, the agent ended rank 0 by SIGTERM (its neighbours 1 and 3 may raise first on
    their own, from the closed connection, as in part 1). In the question: eight new workers
    load step 200, and steps 201 to 249 are done twice. a) and c) a new rank 5 alone could not
    join the others' group (a group's ranks and connections are fixed when it is made), and
    torchrun restarts the group; c) is what torchft does (part 5), not torchrun. d) an exception
    in the script is a failure like any other: the cell's worker raised, and the agent started
    it again. The work lost per failure is the steps since the last checkpoint, plus the
    restart: what part 3 prices.
    """,
    giveaways=(
        r"starts a whole new group",
        r"steps 201 to 249 are done twice",
        r"eight new workers, which go back",
    ),
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "fault_tolerance_2_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it**: one worker under torchrun, one restart allowed.
# `elastic.run_elastic(log, nproc, max_restarts, steps, every, fail=(rank, step))` runs others.

# %% nbgrader={"grade": false, "grade_id": "fault_tolerance_2_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
import tempfile
from pathlib import Path

from course.lessons.fault_tolerance import elastic

with tempfile.TemporaryDirectory() as log:
    job = elastic.run_elastic(Path(log), 1, max_restarts=1, steps=12, every=5, fail=(0, 8))
print(elastic.report(job))

# %% [markdown] nbgrader={"grade": false, "grade_id": "failures_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Failures over time, and how often to checkpoint
#
# A synchronous job needs every rank at every step: when one fails, the others stop with it.
# Take each rank to fail after a random time, on average once per **MTBF** (its mean time
# between failures), independently of the others. A job that writes a checkpoint every K steps
# then pays three ways:
#
# 1. **checkpoints**: each blocks training for C seconds while it is written;
# 2. **lost work**: a failure throws away what was trained since the last checkpoint written;
# 3. **restarts**: after a failure the job is rescheduled and reloads its checkpoint, R seconds.
#
# **Goodput** is the share of the job's time that trains and is kept. Checkpoint often and
# the checkpoints eat it; rarely, and the rework does. J. W. Young (CACM, 1974) found the
# interval that balances the two to first order, and J. T. Daly (FGCS, 2006) refined it.
# A per-step quorum, as torchft keeps, does without the restart: a failed replica is left out
# of the next step while the others train on, and it rejoins from a live peer.


# %% [markdown] nbgrader={"grade": false, "grade_id": "fault_tolerance_3_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Question fault_tolerance_3: a day without a failure
#
# *Difficulty 2/3*
#
# Meta's Llama 3 report (2024) counts 419 unexpected interruptions in a 54-day snapshot of
# pre-training on 16,384 GPUs, about one every 3 hours, and notes that "the synchronous nature
# of training makes it less fault-tolerant - a single GPU failure may require a restart of the
# entire job". Take each interruption to be one GPU failing, every GPU failing independently
# at the same constant rate. A synchronous job runs on **1,024** of these GPUs. What is the
# probability that it trains for a whole day (24 hours) without a failure?
#
# * a) About 52%: it expects 0.48 failures a day, and 1 - 0.48 of days are clean.
# * b) About 0.04%: a day still holds about 8 of the report's 3-hour gaps.
# * c) About 99.95%: each GPU fails once in 5.8 years, and a day is far shorter.
# * d) About 62%: one GPU's chance of a clean day, multiplied over 1,024 GPUs.
#
# Set `answer_fault_tolerance_3` to your letter and run the cell below it.

# %% nbgrader={"grade": false, "grade_id": "fault_tolerance_3_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
answer_fault_tolerance_3 = ""  # your answer: one letter, "a" to "d"
### BEGIN SOLUTION
answer_fault_tolerance_3 = "d"
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "fault_tolerance_3_check", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_answer("answer_fault_tolerance_3", answer_fault_tolerance_3, choices="abcd")
### BEGIN HIDDEN TESTS
check_answer(
    "answer_fault_tolerance_3",
    answer_fault_tolerance_3,
    choices="abcd",
    key="d",
    explanation="""
    The report's rate per GPU is 419 failures in 54 x 24 x 16,384 GPU-hours: one GPU fails on
    average every 50,677 h, 5.8 years. A synchronous job has a clean day only if every one of
    its GPUs does, so the chance is one GPU's exp(-24 / 50,677) = 0.99953 raised to the 1,024th
    power, exp(-1,024 x 24 / 50,677) = exp(-0.485) = 0.616. Drawn with every GPU its own
    exponential clock, 61.6% of 40,000 days on 1,024 GPUs had no failure. a) 1 - 0.485 = 51.5%
    is the first term of that exponential: it subtracts the expected count of failures, so a day
    with two failures is taken off twice; it holds only while N t / MTBF is small (at 16,384
    GPUs it would give 1 - 7.76, below zero). c) 99.95% is one GPU's clean day (99.957% of
    200,000 drawn days); the job needs all 1,024 of them. b) 0.04% is the clean day of the
    report's 16,384 GPUs (2 of 4,000 drawn days): the job's MTBF is the GPU's over N, 3.1 h on
    16,384 GPUs but 49.5 h on 1,024. The same law is why a job of 16,384 GPUs that each fail
    once in 5.8 years stops every 3 hours.
    """,
    giveaways=(
        r"exp\(-0\.485\)",
        r"0\.616",
        r"61\.6 ?%",
        r"multiplied over 1,024 GPUs",
    ),
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "fault_tolerance_3_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it**, at the report's rate per GPU: every GPU its own exponential clock, and how
# long 16, 64 and 256 GPUs run, on average, until the first of them fails.
# `first_failures(n, mtbf_h, trials)` draws those times for any other case, and
# `failure_free_fraction(n, mtbf_h, hours, trials)` the share of windows with none.

# %% nbgrader={"grade": false, "grade_id": "fault_tolerance_3_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
from course.lessons.fault_tolerance import first_failures

mtbf_h = 54 * 24 * 16_384 / 419  # one GPU's mean time between failures, from the report
print(f"one GPU: a failure every {mtbf_h:,.0f} h on average ({mtbf_h / 24 / 365:.1f} years)")
jobs = 4_000
for n in (16, 64, 256):
    first = first_failures(n, mtbf_h, trials=jobs, seed=0)  # hours to each job's first failure
    print(f"{n:>4} GPUs: the first failure after {first.mean():6,.0f} h on average "
          f"({jobs:,} drawn jobs)")

# %% [markdown] nbgrader={"grade": false, "grade_id": "fault_tolerance_4_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Question fault_tolerance_4: how often to checkpoint
#
# *Difficulty 3/3*
#
# A job fails on average every **5 hours** (the first failure of any of its ranks; failures
# independent, at a constant rate). Writing a checkpoint blocks its training for **40 s**.
# After a failure the job loses the training done since its last checkpoint written, then
# spends **10 minutes** restarting (rescheduling, reloading that checkpoint) before it trains
# again. How many minutes of training between two checkpoints keep the largest share of the
# job's time training?
#
# * a) About 14 min: a failure throws away the whole interval since the last checkpoint.
# * b) About 80 min: each failure's 10-minute restart adds to a checkpoint's 40 s cost.
# * c) About 20 min: a failure throws away half an interval since the last checkpoint.
# * d) About 5 h: one checkpoint for each failure, so one in each 5 hours of training.
#
# Set `answer_fault_tolerance_4` to your letter and run the cell below it.

# %% nbgrader={"grade": false, "grade_id": "fault_tolerance_4_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
answer_fault_tolerance_4 = ""  # your answer: one letter, "a" to "d"
### BEGIN SOLUTION
answer_fault_tolerance_4 = "c"
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "fault_tolerance_4_check", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
check_answer("answer_fault_tolerance_4", answer_fault_tolerance_4, choices="abcd")
### BEGIN HIDDEN TESTS
check_answer(
    "answer_fault_tolerance_4",
    answer_fault_tolerance_4,
    choices="abcd",
    key="c",
    explanation="""
    With an interval tau, checkpoints take C / tau of the time, and each failure (one per
    M = 5 h) costs the training since the last checkpoint, on average half an interval, plus
    the restart: (tau / 2 + R) / M. The sum is least at tau = sqrt(2 C M) =
    sqrt(2 x 40 s x 18,000 s) = 1,200 s = 20 min (Young, 1974; Daly's higher-order estimate,
    19.6 min), where the checkpoints' 3.3% equals the rework's 3.3%. Drawn over 100,000 hours
    (19,987 failures, the same for every interval), the job trained 90.42% of its time at
    20 min, the best of every whole minute from 8 to 40, and lost 10.2 min of training per
    failure that struck it, half the interval and half a checkpoint. a) 14.1 min, sqrt(C M),
    assumes a failure loses the whole interval; counted, it loses 7.3 min of the 14.1, and
    the extra checkpoints leave 90.12%. b) The restart is paid once per failure whatever the
    interval, and failures come every 5 h of wall time either way: R does not move the
    optimum (with no restart at all the best is still 18 to 20 min, 93.5%). Counted with C
    it stretches the interval to 80 min, where the job keeps 83.56%. d) Once per MTBF, a
    failure throws away 126 min of training on average and the job keeps 56.06%. On a real
    cluster C is the part of the checkpoint that blocks training (asynchronous checkpointing
    hides the rest), and a job's M falls as its rank count grows, so its best interval
    shrinks with the job.
    """,
    giveaways=(
        r"half an interval",
        r"1,200 s = 20 min",
        r"sqrt\(2 x 40 s",
        r"90\.42 ?%",
    ),
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "fault_tolerance_4_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it**, with the simulation the widget below draws, over about 5,000 drawn
# failures: a checkpoint every 1, 5 and 25 minutes, and the share of the time that trained.
# `checkpoint_run(job.every(seconds), hours, seed)` draws any other case (its
# `lost_per_failure_s`, `restart_s` and `checkpoint_s` say where the rest went).

# %% nbgrader={"grade": false, "grade_id": "fault_tolerance_4_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
from course.lessons.fault_tolerance import Job, checkpoint_run

settings = {  # (checkpoint cost in s, job MTBF in h): minutes of training between checkpoints
    (10, 2): (1, 5, 25),
}
for (cost_s, mtbf_h), minutes in settings.items():
    # one "rank" whose MTBF is the job's (a job's clock is the first of its ranks to fail)
    job = Job(ranks=1, mtbf_h=mtbf_h, checkpoint_s=cost_s, restart_s=600, step_s=1)
    hours = 5_000 * mtbf_h  # about 5,000 failures drawn
    print(f"checkpoint {cost_s} s, job MTBF {mtbf_h} h, restart 10 min ({hours:,} h drawn):")
    for m in minutes:
        drawn = checkpoint_run(job.every(60 * m), hours, seed=0, record=False)
        print(f"  every {m:2d} min: goodput {drawn.goodput:.2%} ({len(drawn.failures):,} failures)")

# %% [markdown] nbgrader={"grade": false, "grade_id": "failures_widget_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### The widget
#
# It draws a day of such a job (a row per rank up to 8 ranks, one row beyond): training in
# green, checkpoints as blue ticks, the training a failure threw away in red, the restart in
# grey. Below, the goodput against the interval between checkpoints: the expectation as a
# line, runs drawn with the same seed as dots, Young's optimum, this job's interval, and what
# a per-step quorum keeps. Change the seed to draw another day.

# %% nbgrader={"grade": false, "grade_id": "failures_widget", "locked": true, "schema_version": 3, "solution": false, "task": false}
from course.lessons.fault_tolerance import failures_widget

failures_widget(ranks=4096, mtbf_h=50_000, checkpoint_s=60, interval_steps=60, restart_s=600)

# %% [markdown] nbgrader={"grade": false, "grade_id": "checkpoint_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## A checkpoint of a sharded state
#
# A job that lost a rank restarts from its last checkpoint, often on another number of ranks:
# a node is gone for good, or a spare has joined. With sharded training (ZeRO, FSDP) no rank
# holds the whole state, so no rank can simply `torch.save` it. `torch.distributed.checkpoint`
# (DCP) saves it from all the ranks at once: every rank calls
# `dcp.save(state_dict, checkpoint_id=directory)` with its own state dict, in which a sharded
# tensor is a `DTensor` (here with `Shard(0)`: each rank holds a block of rows), and they all
# name the same directory. Later, `dcp.load(state_dict, checkpoint_id=directory)` fills a state
# dict in place, each rank's tensors laid out as that rank holds them, on any number of ranks.
#
# Two experiments record what DCP does, with torch's own `FileSystemWriter` and
# `FileSystemReader` noting every item written and every byte range read:
#
# * `save_state(n, rows, cols, bias=0, flat=0)` runs `dcp.save` on n gloo ranks. Its state
#   dict holds `weight`, rows x cols floats with `Shard(0)` over the ranks; with `bias=k`, a
#   plain tensor of k floats, the same on every rank, as DDP keeps its parameters; with
#   `flat=k`, `exp_avg`: each rank's own piece of a flat tensor of k floats, kept as a plain
#   tensor. It prints each file of the checkpoint, its bytes, the rank that wrote it and what
#   it holds, then the chunks that `.metadata` lists for each key.
# * `reshard(rows, cols, saved_on, loaded_on)` saves the weight on `saved_on` ranks and loads
#   it on `loaded_on`, each loading rank asking for its own rows; it prints what each rank
#   asked for, the files it opened, the bytes it read from each, and whether its values came
#   back exactly.
#
# Each uses a fresh directory and removes it; the values they return (`.files`, `.written`,
# `.chunks`, `.contents`; `.shards`) hold what they print.

# %% [markdown] nbgrader={"grade": false, "grade_id": "fault_tolerance_5_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Question fault_tolerance_5: ZeRO-1 by hand, saved with DCP
#
# *Difficulty 2/3*
#
# Four ranks run ZeRO-1 written by hand: each keeps its own quarter of Adam's `exp_avg` (a
# flat tensor of 4M floats) as a plain `torch.Tensor`, and each passes
# `{"exp_avg": its_quarter}` to `dcp.save`, the four ranks calling it together on one
# directory. What does the checkpoint hold of `exp_avg`?
#
# * a) All four quarters, each one written by its own rank to its own file.
# * b) One rank's quarter only: DCP takes the other three for copies of it.
# * c) Nothing: `dcp.save` raises, as the four tensors under one key differ.
# * d) All four quarters, gathered by rank 0 and written with the `.metadata`.
#
# Set `answer_fault_tolerance_5` to your letter and run the cell below it.

# %% nbgrader={"grade": false, "grade_id": "fault_tolerance_5_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
answer_fault_tolerance_5 = ""  # your answer: one letter, "a" to "d"
### BEGIN SOLUTION
answer_fault_tolerance_5 = "b"
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "fault_tolerance_5_check", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_answer("answer_fault_tolerance_5", answer_fault_tolerance_5, choices="abcd")
### BEGIN HIDDEN TESTS
check_answer(
    "answer_fault_tolerance_5",
    answer_fault_tolerance_5,
    choices="abcd",
    key="b",
    explanation="""
    To DCP a plain tensor is a replicated one: every rank's plan holds an item under the same
    key and index ("exp_avg", offset 0), and the coordinator keeps each such item in one rank's
    plan only (the one with the least planned so far) before anyone writes. It compares neither
    values nor shapes. Measured on 4 gloo ranks, a flat exp_avg of 4096 floats in quarters of
    1024: no rank raised; .metadata lists one chunk of exp_avg, 1024 floats at offset 0, in
    __0_0.distcp (5,673 B), and the files of ranks 1 to 3 are empty (0 B); read back, it is rank
    0's quarter bit for bit. With a sharded weight before it in the state dict, rank 1's quarter
    was the one kept (its file 19,538 B, the others 13,865 B); with unequal pieces (10 floats on
    3 ranks: 4, 4 and 2) one chunk of 4 floats, rank 0's. A bias the same on every rank
    (save_state's bias=) is that case with equal values, where dropping copies is right: one
    item, in rank 1's file. a) is what a DTensor gets: the cell's weight, with Shard(0), is one
    chunk per rank, each in its own rank's file; a plain tensor says nothing of where it lies in
    a whole, so the four items look alike. c) nothing checks that the copies agree: three
    quarters are lost in silence, and a restart gives every rank the kept one. d) no rank
    gathers: each rank writes its own items to its own file, and rank 0 adds the .metadata (856
    B here). A sharded optimizer state goes to DCP as DTensors (or under one key per rank, which
    ties the checkpoint to that number of ranks).
    """,
    giveaways=(
        r"other three for copies",
        r"one rank's quarter",
        r"compares\s+neither values",
    ),
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "fault_tolerance_5_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it**, on 2 ranks: a weight of 12 x 1024 floats with `Shard(0)`. Change the
# arguments of `save_state` to save other states (`bias=`, `flat=`) on other numbers of ranks.

# %% nbgrader={"grade": false, "grade_id": "fault_tolerance_5_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
from course.lessons.fault_tolerance import save_state

print(save_state(2, rows=12, cols=1024))

# %% [markdown] nbgrader={"grade": false, "grade_id": "fault_tolerance_6_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Question fault_tolerance_6: restarting on fewer ranks
#
# *Difficulty 3/3*
#
# A 12 GB float32 weight, sharded by rows (`Shard(0)`) over 4 ranks, is saved with `dcp.save`
# (DCP's default file storage). The job restarts on 3 ranks, and each rank loads its own third
# of the rows with `dcp.load` into a `DTensor` sharded the same way. How many bytes does rank 1
# read from the checkpoint's files?
#
# * a) About 4 GB: only its own rows, read at their offsets in two files.
# * b) About 12 GB: all four files, from which it keeps its own rows.
# * c) About 6 GB: the two saved shards its rows overlap, each one whole.
# * d) About 3 GB: one saved shard, and a peer sends it the rest of its rows.
#
# Set `answer_fault_tolerance_6` to your letter and run the cell below it.

# %% nbgrader={"grade": false, "grade_id": "fault_tolerance_6_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
answer_fault_tolerance_6 = ""  # your answer: one letter, "a" to "d"
### BEGIN SOLUTION
answer_fault_tolerance_6 = "c"
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "fault_tolerance_6_check", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
check_answer("answer_fault_tolerance_6", answer_fault_tolerance_6, choices="abcd")
### BEGIN HIDDEN TESTS
check_answer(
    "answer_fault_tolerance_6",
    answer_fault_tolerance_6,
    choices="abcd",
    key="c",
    explanation="""
    DCP's FileSystemReader reads each stored chunk whole, one torch.save record, and only then
    cuts out the rows the load plan asked for (torch.load, then narrow). Measured: a 12 x 1024
    float32 weight saved on 4 gloo ranks (rows 0-2, 3-5, 6-8 and 9-11, a 13,865 B record each)
    and loaded on 3. Rank 1 asks for rows 4-7 (16,384 B); its plan wants 2 rows of the chunk
    in __1_0.distcp and 2 of the one in __2_0.distcp, and it reads 13,477 B of each record,
    every data byte of both: 26,954 B, 1.6 times its shard (6 rows for 4, and the headers),
    its values exact. Ranks 0 and 2 read two whole records too. At 12 GB the saved shards are
    3 GB each and rank 1's rows (4 to 8 GB into the tensor) overlap the second and the third:
    it reads those two saved shards, each one whole, 6 GB to keep 4 GB. a) the plan does ask
    for its rows only, but the default reader does not seek inside a record: reading byte
    ranges would take another storage reader. b) the .metadata says which chunk holds which
    rows, and a rank opens only the ones it needs: 2 of the 4 files. d) no rank sends another
    one checkpoint data: each reads every row it needs itself (and the .metadata, once each);
    nor is there a consolidation step: the 4-rank checkpoint loads on 3 ranks as it is. On 2
    ranks the same checkpoint costs nothing extra: each rank's rows are two whole chunks.
    """,
    giveaways=(
        r"two saved shards",
        r"each one whole",
        r"reads each stored chunk whole",
    ),
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "fault_tolerance_6_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it**: a weight of 12 x 1024 floats saved on 4 ranks and loaded on 2, each loading
# rank asking for its own rows. `reshard(rows, cols, saved_on, loaded_on)` runs other cases.

# %% nbgrader={"grade": false, "grade_id": "fault_tolerance_6_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
from course.lessons.fault_tolerance import reshard

print(reshard(rows=12, cols=1024, saved_on=4, loaded_on=2))

# %% [markdown] nbgrader={"grade": false, "grade_id": "resharding_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### Exercise: a sharded checkpoint, loaded on another number of ranks
#
# Now write the part of DCP that matters here: a ZeRO-style state saved by N ranks and loaded
# by M, no rank reading more than it needs. The state is the Adam state of a flattened model:
# a few flat float32 tensors of `numel` elements (`param`, `exp_avg`, `exp_avg_sq`), of which
# rank r of N holds elements `chunk_bounds(numel, N)[r]` (the ZeRO notebook's shards,
# `lo, hi = chunk_bounds(numel, world_size)[rank]`).
#
# The checkpoint lives in a `Storage`, as an object store keeps it:
#
# * `storage.put(key, tensor)` writes a tensor's elements as one object, replacing one there;
# * `storage.list()` returns every object's key, sorted;
# * `storage.get(key, start, stop)` returns elements `start:stop` of one object as a new 1-D
#   tensor, reading only those (`storage.get(key)` reads the whole object).
#
# Write, for every rank to call:
#
# * `save_sharded(shards, numel, storage)`: `shards` maps each tensor's name to this rank's
#   shard of it. Write each shard as one object named by the global elements it holds,
#   `f"{name}/{lo}-{hi}"` (DCP's metadata names each chunk by its offsets the same way), and
#   nothing else.
# * `load_resharded(names, numel, storage)`, on a world size that may differ from the save's:
#   return a dict of each name to this rank's range of that tensor, elements
#   `chunk_bounds(numel, world_size)[rank]`, pieced together from the saved objects that
#   overlap it. Find them from the keys; the number of ranks that saved is not given.
#
# Nothing travels between ranks in either call (a barrier is allowed; it moves no data). The
# grader saves 3 tensors of 29 elements on 3 ranks and loads them on 2 and on 4. Before each
# load it writes new values under the same keys, so the values must come from the storage.
# Every rank's range must be exact, bit for bit. A rank may read no more than the objects
# its range overlaps, and reading only the elements it needs is better. Write it yourself:
# the grader refuses `torch.distributed.checkpoint`'s save and load.

# %% nbgrader={"grade": false, "grade_id": "resharding", "locked": false, "schema_version": 3, "solution": true, "task": false}
def save_sharded(shards, numel, storage):
    """Write this rank's shard of each tensor as one object, f"{name}/{lo}-{hi}"."""
    ### BEGIN SOLUTION
    lo, hi = chunk_bounds(numel, dist.get_world_size())[dist.get_rank()]
    for name in shards:
        storage.put(f"{name}/{lo}-{hi}", shards[name])
    ### END SOLUTION


def load_resharded(names, numel, storage):
    """This rank's range of each tensor, read from the saved objects that overlap it."""
    ### BEGIN SOLUTION
    lo, hi = chunk_bounds(numel, dist.get_world_size())[dist.get_rank()]
    out = {}
    for name in names:
        pieces = []
        for key in storage.list():
            stem, _, span = key.rpartition("/")
            if stem != name:
                continue
            a, b = (int(x) for x in span.split("-"))
            start, stop = max(a, lo), min(b, hi)
            if start < stop:
                pieces.append((start, storage.get(key, start - a, stop - a)))
        out[name] = torch.cat([t for _, t in sorted(pieces, key=lambda p: p[0])])
    return out
    ### END SOLUTION


# %% [markdown] nbgrader={"grade": false, "grade_id": "try_resharding_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### Test as you go
#
# Two tensors of 10 elements, `param` holding 0, 1, ..., 9 and `exp_avg` its negative, saved
# on 3 ranks and loaded on 2 and on 4. The cell prints the objects the save left, then each
# loading rank's `param` and the bytes its copy of the storage read.

# %% tags=["raises-exception"] nbgrader={"grade": false, "grade_id": "try_resharding", "locked": true, "schema_version": 3, "solution": false, "task": false}
import tempfile

from course.lessons.fault_tolerance import Storage, not_implemented


def save_on_ranks(storage, numel):
    lo, hi = chunk_bounds(numel, dist.get_world_size())[dist.get_rank()]
    whole = torch.arange(numel, dtype=torch.float32)
    save_sharded({"param": whole[lo:hi], "exp_avg": -whole[lo:hi]}, numel, storage)


def load_on_ranks(storage, numel):
    got = load_resharded(["param", "exp_avg"], numel, storage)
    return got["param"].tolist(), storage.got


stub = not_implemented(save_sharded) or not_implemented(load_resharded)
if stub:
    print(f"Note: {stub}")
else:
    with tempfile.TemporaryDirectory() as path:
        storage = Storage(path)
        run(save_on_ranks, 3, storage, 10)
        print("saved on 3 ranks:", storage.list())
        for m in (2, 4):
            for rank, (param, read) in enumerate(run(load_on_ranks, m, storage, 10)):
                print(f"rank {rank} of {m}: param {param}, {read} bytes read")

# %% [markdown] nbgrader={"grade": false, "grade_id": "visible_resharding_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# The grader's check, loading on 2 ranks. It stops within its deadline and says which rank,
# tensor and elements went wrong, or what a rank read.

# %% nbgrader={"grade": false, "grade_id": "visible_resharding", "locked": true, "schema_version": 3, "solution": false, "task": false}
print(check_resharding(save_sharded, load_resharded, loaded_on=(2,)))

# %% nbgrader={"grade": true, "grade_id": "resharding_check", "locked": true, "points": 6, "schema_version": 3, "solution": false, "task": false}
# Saved on 3 ranks, loaded on 2 and on 4: every rank's range, its reads, nothing between ranks.
print(check_resharding(save_sharded, load_resharded, loaded_on=(2,)))
### BEGIN HIDDEN TESTS
print(check_resharding(save_sharded, load_resharded))
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "quorum_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Keeping the healthy replicas
#
# Restarting the whole job from a checkpoint throws away the work of every rank that did not
# fail. [torchft](https://github.com/pytorch/torchft) keeps them. The job is split into
# **replica groups**, each a whole copy of the model (here one process each), and before every
# step each group's `torchft.Manager` asks a central **Lighthouse** for a **quorum**: the
# groups that take part in this step. The Lighthouse forms one from the groups that ask, once
# at least `min_replicas` of them do, and treats a group whose heartbeats stop as gone. A step
# is torchft's loop:
#
# ```python
# manager.start_quorum()                 # torchft.Optimizer's zero_grad() calls it
# loss(model(x), y).backward()
# for p in model.parameters():
#     manager.allreduce(p.grad).wait()   # among the quorum's groups only
# if manager.should_commit():            # torchft.Optimizer's step() asks it
#     optimizer.step()
# ```
#
# A group that starts late, or comes back after a failure, finds a quorum whose members are
# steps ahead of it and **heals** from a live peer, over HTTP, before it takes part in a step
# again. Each group hands its Manager two functions for that, `state_dict` and
# `load_state_dict`.
#
# `fail_and_recover(replicas, steps, leave_at, back_at, when, optimizer)` starts a Lighthouse
# on a free loopback port and `replicas` groups (2 to 4), each training the same 4-layer model
# (4096 parameters, 16 KiB in float32) on batches of its own, with SGD (lr 0.1) or Adam. The
# last group leaves at step `leave_at`: with `when="before quorum"` it stops before asking for
# that step's quorum; with `when="mid-step"` it is in that step's quorum, computes its
# gradients, and closes its connections before the all-reduce, as a process that dies does.
# With `back_at`, it comes back, with a freshly initialised model, once the others have
# committed `back_at` steps. It returns what each group saw. `steps_table(record)` prints
# each step of each group: the quorum's id, `num_participants()`, what
# `should_commit()` returned, and the largest difference between the group's parameters and one
# process taking an SGD step on the batches of the groups in that quorum, put together.
# `recovery_report(record)` prints what the group that came back received, and how it compares
# with group 0. Each run stops its processes and its Lighthouse before it returns.

# %% [markdown] nbgrader={"grade": false, "grade_id": "fault_tolerance_7_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Question fault_tolerance_7: a crash inside a step
#
# *Difficulty 2/3*
#
# Eight replica groups of one process each train with SGD under torchft, the Lighthouse's
# `min_replicas` 2. At step k all eight are in the quorum; group 7 computes its gradients, then
# its process dies before the all-reduce. What do the other seven groups do with step k?
#
# * a) Commit it, with the average of the seven gradients that arrived.
# * b) Throw it away, then run step k again in a quorum of the seven.
# * c) Commit it, with the sum of the seven gradients divided by eight.
# * d) Hold it until a replacement for group 7 joins the quorum.
#
# Set `answer_fault_tolerance_7` to your letter and run the cell below it.

# %% nbgrader={"grade": false, "grade_id": "fault_tolerance_7_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
answer_fault_tolerance_7 = ""  # your answer: one letter, "a" to "d"
### BEGIN SOLUTION
answer_fault_tolerance_7 = "b"
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "fault_tolerance_7_check", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
check_answer("answer_fault_tolerance_7", answer_fault_tolerance_7, choices="abcd")
### BEGIN HIDDEN TESTS
check_answer(
    "answer_fault_tolerance_7",
    answer_fault_tolerance_7,
    choices="abcd",
    key="b",
    explanation="""
    The all-reduce of step k was set up among the eight groups of its quorum, and no sum can
    finish without group 7's part: it fails on every survivor, torchft records the error, and
    should_commit() returns False on every survivor, so none steps its optimizer and its step
    counter stays at k. Measured on 3 and 4 gloo replica groups, the last one in step 2's
    quorum and gone before the all-reduce (its connections closed and its heartbeats stopped,
    as when its process dies): each survivor's all-reduce raised (gloo's
    "Connection closed by peer", or its 5 s timeout for a survivor waiting on a live
    neighbour), and every survivor's should_commit() returned False. At their next try the
    Lighthouse formed a new quorum of the survivors (once the lost group's heartbeats were
    2 s old here; torchft's default is 5 s), num_participants() 2 (3 of 4), and they ran step 2
    again on the same batches: their parameters equal one process's SGD step over the
    survivors' batches to 1.5e-8, and all finished the 4 steps. a) no survivor ever holds an
    average of what arrived: a collective that lost a member fails as a whole, and torchft
    commits no step that saw an error. c) torchft divides by num_participants(), the quorum's
    size, not the size the job started with: the survivors' step is 3e-4 away from their
    gradients' sum over 3 (the update itself is 9e-4). d) the Lighthouse needs only
    min_replicas groups that ask; no replacement is waited for. After the crash the global
    batch is the seven survivors' batches, at the same learning rate: torchft does not rescale
    it. The rule is the same on GPUs with NCCL: should_commit() is False wherever an error was
    reported during the step.
    """,
    giveaways=(
        r"run step k again",
        r"[Tt]hrow it away",
        r"should_commit\(\) returns False on every survivor",
    ),
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "fault_tolerance_7_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it**, on 3 replica groups: group 2 leaves before it asks for step 2's quorum.
# `when="mid-step"` puts it in step 2's quorum first; `replicas` runs 2 to 4 groups.

# %% nbgrader={"grade": false, "grade_id": "fault_tolerance_7_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
from course.lessons.fault_tolerance import fail_and_recover, steps_table

record = fail_and_recover(replicas=3, steps=4, leave_at=2, when="before quorum")
print(steps_table(record))

# %% [markdown] nbgrader={"grade": false, "grade_id": "fault_tolerance_8_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Question fault_tolerance_8: what a returning replica is sent
#
# *Difficulty 3/3*
#
# A model whose float32 parameters take P bytes trains with `torch.optim.Adam` under torchft,
# each replica group registering its model's and its optimizer's state dicts, as in the cells.
# One group leaves and comes back with a fresh model: in one run after missing 1 step, in
# another after missing 100. How many bytes does it receive from a live peer when it heals?
#
# * a) About 3P each time: the parameters and both of Adam's moment estimates.
# * b) About P each time: the parameters; Adam's state dict holds its settings, not tensors.
# * c) About 3P per step missed: the state dicts after each missed step, applied in turn.
# * d) About P per step missed: each missed step's averaged gradient, replayed.
#
# Set `answer_fault_tolerance_8` to your letter and run the cell below it.

# %% nbgrader={"grade": false, "grade_id": "fault_tolerance_8_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
answer_fault_tolerance_8 = ""  # your answer: one letter, "a" to "d"
### BEGIN SOLUTION
answer_fault_tolerance_8 = "a"
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "fault_tolerance_8_check", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
check_answer("answer_fault_tolerance_8", answer_fault_tolerance_8, choices="abcd")
### BEGIN HIDDEN TESTS
check_answer(
    "answer_fault_tolerance_8",
    answer_fault_tolerance_8,
    choices="abcd",
    key="a",
    explanation="""
    Live recovery sends a snapshot of the peer's whole current state, whatever its registered
    state_dict function returns (here the model's and the optimizer's state dicts) and
    torchft's step counters, and replays nothing. Measured on 3 gloo replica groups, a model of
    4096 float32 parameters (P = 16,384 B): under SGD the returning group received 17,515 B
    (the parameters, an empty optimizer state, the serialisation's framing); under Adam
    51,468 B, 3.14 P, after missing 1 step and after missing 3 alike: 16,384 B of parameters
    and 32,784 B of optimizer state, Adam's exp_avg and exp_avg_sq (16,384 B each) and a step
    count per tensor. After healing, its parameters, both moments and step counters equal its
    peer's bit for bit. b) Adam's state dict holds tensors: exp_avg and exp_avg_sq, each the
    size of the parameters, and a step count per tensor; its settings are the small part. c)
    and d) nothing is replayed, neither states nor gradients: the peer's current state
    already holds the effect of the missed steps, and the bytes were the same after 1 missed
    step as after 3. Gradients are in no state dict, and the returning group needs none: its
    own gradient in its first step back is zeroed (participating False, num_participants() 2),
    and it steps with the average of the others', all-reduced in that step. An absence costs
    the group its work, not more bytes: it ran no step while away, and the batch of its first
    step back was computed and dropped. On GPUs the same state travels; torchft also has a
    process-group transport that sends it GPU to GPU instead of over HTTP.
    """,
    giveaways=(
        r"About 3P each time",
        r"exp_avg and exp_avg_sq",
        r"51,468 B",
    ),
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "fault_tolerance_8_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it**, on 3 replica groups with SGD: group 2 leaves before step 2 and comes back,
# with a freshly initialised model, for step 3. `optimizer="adam"`, `leave_at` and `back_at`
# change the run.

# %% nbgrader={"grade": false, "grade_id": "fault_tolerance_8_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
from course.lessons.fault_tolerance import fail_and_recover, recovery_report, steps_table

record = fail_and_recover(replicas=3, steps=6, leave_at=2, back_at=3, optimizer="sgd")
print(steps_table(record))
print(recovery_report(record))

# %% [markdown] nbgrader={"grade": false, "grade_id": "survive_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### Exercise: a step that outlives a rank
#
# Write the step that keeps the healthy ranks training, without torchft, with the course's
# ranks. `fault_tolerant_step(model, x, y, lr, group, lighthouse)` runs on every rank, one call
# per step. It computes this rank's gradient of `F.mse_loss(model(x), y)` (zero the old
# gradients first), averages the gradients over the ranks of `group` with `dist.all_reduce`,
# moves every parameter by `-lr` times its averaged gradient (plain SGD, in place), and returns
# the group the next step is to use. The first step gets `dist.group.WORLD`.
#
# In one step, a rank dies inside its all-reduce. From then on, the step and every later one
# must use the gradients of the ranks that are left, averaged over those ranks, and each step
# returns the group of the ranks left. You have:
#
# * the error: a collective that cannot complete raises a `RuntimeError` on every rank in it
#   (part 1 measured when), and leaves the tensors it was given in no defined state;
# * `lighthouse.quorum()`, as torchft's Lighthouse: it returns the sorted list of the ranks
#   alive, once every one of them has called it (each rank's n-th call is round n);
# * `dist.new_group(ranks)`, called by every rank left with the same list, which makes a group
#   of those ranks.
#
# The grader trains a 128-parameter model for 3 steps on 3 ranks, rank 1 dying in step 1, and
# on 4 ranks, rank 0 dying in step 2, each rank on batches of its own. It compares every
# surviving rank's parameters after each step with one process taking the same SGD steps on
# the mean gradient of the ranks of that step. The rank dies at a step the grader picks and no
# rank is told; a rank that waits forever fails at the run's deadline.

# %% nbgrader={"grade": false, "grade_id": "survive", "locked": false, "schema_version": 3, "solution": true, "task": false}
import torch.nn.functional as F


def fault_tolerant_step(model, x, y, lr, group, lighthouse):
    """One SGD step, its gradients averaged over the ranks alive; the group for the next."""
    ### BEGIN SOLUTION
    model.zero_grad()
    F.mse_loss(model(x), y).backward()
    params = list(model.parameters())
    grads = torch.cat([p.grad.reshape(-1) for p in params])
    summed = grads.clone()
    size = dist.get_world_size(group)
    try:
        dist.all_reduce(summed, group=group)
    except RuntimeError:
        members = lighthouse.quorum()
        group = dist.new_group(members)
        summed = grads.clone()  # the failed all-reduce left its buffer partly summed
        dist.all_reduce(summed, group=group)
        size = len(members)
    with torch.no_grad():
        at = 0
        for p in params:
            p.sub_(lr * summed[at : at + p.numel()].view_as(p) / size)
            at += p.numel()
    return group
    ### END SOLUTION


# %% [markdown] nbgrader={"grade": false, "grade_id": "try_survive_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### Test as you go
#
# Three ranks, rank 1 dying in step 1's all-reduce. The cell prints, for each rank and step,
# the size of the group your step returned and the first parameters after it.

# %% tags=["raises-exception"] nbgrader={"grade": false, "grade_id": "try_survive", "locked": true, "schema_version": 3, "solution": false, "task": false}
from course.lessons.fault_tolerance import not_implemented, try_steps

stub = not_implemented(fault_tolerant_step)
if stub:
    print(f"Note: {stub}")
else:
    print(try_steps(fault_tolerant_step, world_size=3, dies=1, step=1))

# %% [markdown] nbgrader={"grade": false, "grade_id": "visible_survive_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# The grader's check, on 3 ranks. It stops within its deadline and says which rank and step
# went wrong.

# %% nbgrader={"grade": false, "grade_id": "visible_survive", "locked": true, "schema_version": 3, "solution": false, "task": false}
print(check_fault_tolerant_step(fault_tolerant_step, world_sizes=(3,)))

# %% nbgrader={"grade": true, "grade_id": "survive_check", "locked": true, "points": 6, "schema_version": 3, "solution": false, "task": false}
# Graded: 3 ranks, rank 1 dying in step 1 (above) and, hidden, 4 ranks, rank 0 dying in step 2.
print(check_fault_tolerant_step(fault_tolerant_step, world_sizes=(3,)))
### BEGIN HIDDEN TESTS
print(check_fault_tolerant_step(fault_tolerant_step))
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "heal_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### Exercise: catching up from a peer
#
# A rank whose process died comes back as a new process. It builds its model afresh (step 0),
# or loads the last checkpoint it finds, and meets ranks that kept training. Before it takes
# part in a step, it must hold what they hold, as torchft's healing does.
#
# `heal(model, step)` runs on every rank, once, when ranks come back; `step` is the number of
# SGD steps this rank's model has taken. It leaves every rank's parameters a copy, bit for
# bit, of those of a rank furthest ahead, and returns that rank's step (an int): the step this
# rank trains from next. Every rank calls it, behind or not, in the default group, and no
# rank knows the others' steps before it does. You have the collectives of
# `torch.distributed`; `torch.nn.utils.parameters_to_vector` and `vector_to_parameters` turn
# a model's parameters into one flat tensor and back.
#
# Plain SGD keeps no state but the parameters, so they and the step are all a rank needs. The
# grader runs `heal` in three cases, ranks back at different places in the ranks' order and
# from different steps: two on 3 ranks (the visible check's) and one on 4. It compares every
# rank's parameters with those of the ranks ahead, and reads what each collective carried:
# the parameters are to travel as a copy from one peer, one rank's data sent to the others,
# not in a collective that mixes or gathers every rank's; the steps, a few bytes, may go to
# every rank.

# %% nbgrader={"grade": false, "grade_id": "heal", "locked": false, "schema_version": 3, "solution": true, "task": false}
def heal(model, step):
    """Make this rank's parameters a copy of those of a rank furthest ahead; return its step."""
    ### BEGIN SOLUTION
    steps = [torch.zeros(1, dtype=torch.int64) for _ in range(dist.get_world_size())]
    dist.all_gather(steps, torch.tensor([step]))
    steps = [int(s) for s in steps]
    ahead = max(steps)
    flat = torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone()
    dist.broadcast(flat, src=steps.index(ahead))  # every rank picks the same source
    with torch.no_grad():
        torch.nn.utils.vector_to_parameters(flat, model.parameters())
    return ahead
    ### END SOLUTION


# %% [markdown] nbgrader={"grade": false, "grade_id": "try_heal_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### Test as you go
#
# Three ranks, rank 0 back with a fresh model. The cell prints, for each rank, its step, the
# step your `heal` returned, and its first parameters before and after (the states are drawn
# afresh in every run).

# %% tags=["raises-exception"] nbgrader={"grade": false, "grade_id": "try_heal", "locked": true, "schema_version": 3, "solution": false, "task": false}
from course.lessons.fault_tolerance import not_implemented, try_heal

stub = not_implemented(heal)
if stub:
    print(f"Note: {stub}")
else:
    print(try_heal(heal, world_size=3))

# %% [markdown] nbgrader={"grade": false, "grade_id": "visible_heal_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# The grader's check, on its two cases of 3 ranks.

# %% nbgrader={"grade": false, "grade_id": "visible_heal", "locked": true, "schema_version": 3, "solution": false, "task": false}
print(check_heal(heal, world_sizes=(3,)))

# %% nbgrader={"grade": true, "grade_id": "heal_check", "locked": true, "points": 4, "schema_version": 3, "solution": false, "task": false}
# Graded: the two cases on 3 ranks above and, hidden, one on 4: every rank's parameters and step.
print(check_heal(heal, world_sizes=(3,)))
### BEGIN HIDDEN TESTS
print(check_heal(heal))
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "part_6_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## 6. Synchronising less often
#
# A step that needs every rank is exposed to every rank's failures, and pays an all-reduce of
# the whole gradient. **LocalSGD** (Stich 2019) lets each worker take H steps alone, then
# averages the workers' parameters. **DiLoCo** (Douillard et al. 2023, arXiv:2311.08105) keeps
# the H inner steps (AdamW in the paper) and replaces the average by an **outer step**: each
# worker's **pseudo-gradient** is the global parameters the round started from minus its own
# parameters after its H steps; their mean over the workers, all-reduced, is handed to an
# outer SGD with Nesterov momentum (learning rate 0.7, momentum 0.9 in the paper), which moves
# the global parameters; every worker starts its next round from them. The paper trains on 8
# workers with H = 500 and reports 500 times less communication than synchronous training.
#
# `local_sgd.train(method, steps, every, outer_step)` fits a small network on each rank's own
# shard of one regression problem with AdamW (lr 1e-2): `"ddp"` all-reduces the gradients
# every step, `"local_sgd"` averages the parameters every `every` steps, `"diloco"` calls
# `outer_step` every `every` steps. Each rank returns the loss over all ranks' data after each
# synchronisation, the bytes it put into collectives and its parameters at the end
# (`"weights"`, flattened). `inner="sgd"`, `"momentum"` (SGD with momentum 0.9) or `"adagrad"`
# trains with another optimizer; under LocalSGD each worker keeps its own optimizer state,
# which nothing averages.

# %% [markdown] nbgrader={"grade": false, "grade_id": "fault_tolerance_9_question", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## Question fault_tolerance_9: averaging after every step
#
# *Difficulty 3/3*
#
# LocalSGD with H = 1 averages the workers' parameters after every step; DDP averages their
# gradients before it. Same model, data shards, seed and learning rate on 8 workers; under
# LocalSGD each worker keeps its own optimizer state. With AdamW the two runs part from the
# first step. Of plain SGD, SGD with momentum 0.9 and Adagrad, which give DDP's parameters
# after every step, to float rounding?
#
# * a) SGD, and SGD with momentum; not Adagrad.
# * b) SGD only; not SGD with momentum, nor Adagrad.
# * c) SGD and Adagrad; not SGD with momentum.
# * d) None: averaged weights are not averaged gradients.
#
# Set `answer_fault_tolerance_9` to your letter and run the cell below it.

# %% nbgrader={"grade": false, "grade_id": "fault_tolerance_9_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
answer_fault_tolerance_9 = ""  # your answer: one letter, "a" to "d"
### BEGIN SOLUTION
answer_fault_tolerance_9 = "a"
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "fault_tolerance_9_check", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
check_answer("answer_fault_tolerance_9", answer_fault_tolerance_9, choices="abcd")
### BEGIN HIDDEN TESTS
check_answer(
    "answer_fault_tolerance_9",
    answer_fault_tolerance_9,
    choices="abcd",
    key="a",
    explanation="""
    Where the optimizer's update is linear in the gradient, the mean of the workers'
    parameters after their own steps is the step with the mean gradient. SGD: the mean of
    p - lr g_i is p - lr mean(g_i), DDP's step. SGD with momentum: each worker's buffer
    m_i = 0.9 m_i + g_i differs from the others' and nothing averages it, but the parameters
    become p - lr mean(m_i), and the mean of the buffers follows 0.9 mean(m) + mean(g), which
    is DDP's one buffer, step after step. Adagrad divides each worker's gradient by the root of
    its own sum of squared gradients, and AdamW each worker's first moment by the root of its
    own second: the mean of g_i / sqrt(G_i) is not mean(g) / sqrt(G), so the runs part at the
    first step. Measured on 3 gloo ranks over 32 steps, each rank's shard drawn from a shifted
    input distribution: the largest difference from DDP's parameters was 1.3e-6 for SGD and
    1.8e-6 with momentum (the order of float additions), 0.66 for Adagrad and 0.57 for AdamW,
    whose losses over all the data end at 6.24 against DDP's 6.00, and 8.03 against 7.54.
    b) the buffers differ from worker to worker, but only their mean reaches the averaged
    parameters, and that mean is DDP's buffer. c) Adagrad has no momentum, but its scaling is
    per worker and not linear. d) for a linear update, averaging after the step and before it
    are the same sums in another order. The same holds on GPUs with NCCL: it is arithmetic.
    """,
    giveaways=(
        r"linear in the gradient",
        r"only their mean reaches",
        r"DDP's one buffer",
    ),
)
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "fault_tolerance_9_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it**: 2 ranks, 64 steps with AdamW, DDP against LocalSGD with H = 1.

# %% nbgrader={"grade": false, "grade_id": "fault_tolerance_9_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
from course.lessons.fault_tolerance import local_sgd

ddp, local = (run(local_sgd.train, 2, method, 64, 1)[0] for method in ("ddp", "local_sgd"))
gap = (ddp["weights"] - local["weights"]).abs().max().item()
print(f"AdamW: parameters {gap:.2e} apart at most after 64 steps; loss over all the data: DDP "
      f"{ddp['losses'][-1][1]:.3f}, LocalSGD every step {local['losses'][-1][1]:.3f}")

# %% [markdown] nbgrader={"grade": false, "grade_id": "local_sgd_measure_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# **Measure it**: 2 ranks, 64 steps, DDP against LocalSGD every 4 and every 16 steps.

# %% nbgrader={"grade": false, "grade_id": "local_sgd_measure", "locked": true, "schema_version": 3, "solution": false, "task": false}
from course.lessons.fault_tolerance import local_sgd

for method, every in (("ddp", 1), ("local_sgd", 4), ("local_sgd", 16)):
    got = run(local_sgd.train, 2, method, 64, every)[0]
    print(f"{method:9} every {every:2}: {got['sent']:7,} B into collectives, loss after step "
          f"{got['losses'][-1][0]}: {got['losses'][-1][1]:.3f}")

# %% [markdown] nbgrader={"grade": false, "grade_id": "diloco_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### Exercise: DiLoCo's outer step
#
# Write `diloco_outer_step(params, global_params, momentum, outer_lr, mu)`. Every rank calls it
# at the end of a round, with
#
# * `params`: this worker's parameters after its H inner steps (a list of tensors);
# * `global_params`: the parameters every worker started the round from, the same on every
#   rank (a list of tensors of the same shapes);
# * `momentum`: the outer momentum, one tensor per parameter, the same on every rank (zeros
#   before the first round);
# * `outer_lr` and `mu`: the outer learning rate and momentum.
#
# In place, on every rank: the mean over the workers of `global_params - params`, in one
# all-reduce of the model's size (nothing else needs to travel: the global parameters and the
# momentum are the same everywhere); then the outer step with Nesterov momentum, the rule of
# `torch.optim.SGD(nesterov=True)` (dampening 0), on `global_params` and `momentum`; then
# `params` set to the new global parameters. Write the step yourself: the grader refuses torch's
# SGD. It checks every rank's `params`, `global_params` and `momentum` after two outer steps on
# 2 and 3 ranks against its own, and the bytes the step all-reduced.

# %% nbgrader={"grade": false, "grade_id": "diloco_outer_step", "locked": false, "schema_version": 3, "solution": true, "task": false}
def diloco_outer_step(params, global_params, momentum, outer_lr, mu):
    """DiLoCo's outer step, in place: all-reduced mean pseudo-gradient, Nesterov momentum."""
    ### BEGIN SOLUTION
    world_size = dist.get_world_size()
    for p, g, m in zip(params, global_params, momentum, strict=True):
        delta = g - p
        dist.all_reduce(delta)
        delta /= world_size
        m.mul_(mu).add_(delta)
        g.sub_(outer_lr * (delta + mu * m))
        p.copy_(g)
    ### END SOLUTION


# %% [markdown] nbgrader={"grade": false, "grade_id": "try_diloco_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### Test as you go
#
# On 2 ranks, one parameter of 3 elements starting at 1: rank r's inner steps left it at
# `1 - (r + 1) / 10`, so the pseudo-gradients are 0.1 and 0.2 and their mean 0.15. With zero
# momentum, `outer_lr=1` and `mu=0` the step is plain averaging (0.85 everywhere); with
# `mu=0.9`, Nesterov's step is 0.15 + 0.9 x 0.15 = 0.285, to 0.715.

# %% tags=["raises-exception"] nbgrader={"grade": false, "grade_id": "try_diloco", "locked": true, "schema_version": 3, "solution": false, "task": false}
# %%ranks 2 --timeout 20
from course.lessons.fault_tolerance import say_if_unimplemented

say_if_unimplemented(diloco_outer_step)  # a note if the cell above is still the empty stub
for mu in (0.0, 0.9):
    g, m = [torch.ones(3)], [torch.zeros(3)]
    p = [torch.ones(3) - (rank + 1) / 10]
    diloco_outer_step(p, g, m, 1.0, mu)
    print(f"mu={mu}: global {g[0].tolist()}, params {p[0].tolist()}, momentum {m[0].tolist()}")

# %% [markdown] nbgrader={"grade": false, "grade_id": "visible_diloco_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# The grader's check, on 2 ranks. It stops within its deadline and says which rank, tensor and
# step went wrong.

# %% nbgrader={"grade": false, "grade_id": "visible_diloco", "locked": true, "schema_version": 3, "solution": false, "task": false}
print(check_diloco_outer_step(diloco_outer_step, world_sizes=(2,)))

# %% nbgrader={"grade": true, "grade_id": "diloco_outer_step_check", "locked": true, "points": 6, "schema_version": 3, "solution": false, "task": false}
# Two outer steps on 2 and 3 ranks: every rank's tensors, and one all-reduce of the model.
print(check_diloco_outer_step(diloco_outer_step, world_sizes=(2,)))
### BEGIN HIDDEN TESTS
print(check_diloco_outer_step(diloco_outer_step))
### END HIDDEN TESTS

# %% [markdown] nbgrader={"grade": false, "grade_id": "diloco_race_intro", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ### Yours against LocalSGD
#
# The same 64 steps on 2 ranks, synchronising every 4 and every 16 steps: LocalSGD's average
# against your outer step, with the paper's outer learning rate and momentum. Which does better
# here, at which H, and why might the paper's settings (tuned for H = 500 on language models)
# not carry to 64 steps of a small regression? Pass `outer_lr=` and `mu=` of your own to
# `local_sgd.train` to find out.

# %% nbgrader={"grade": false, "grade_id": "diloco_race", "locked": true, "schema_version": 3, "solution": false, "task": false}
from course.lessons.fault_tolerance import not_implemented

if not_implemented(diloco_outer_step):
    print(f"Note: {not_implemented(diloco_outer_step)}")
else:
    for every in (4, 16):
        for method in ("local_sgd", "diloco"):
            got = run(local_sgd.train, 2, method, 64, every, diloco_outer_step)[0]
            curve = ", ".join(f"{loss:.2f}" for _, loss in got["losses"][-4:])
            print(f"{method:9} every {every:2}: {got['sent']:6,} B, last losses {curve}")

# %% [markdown] nbgrader={"grade": false, "grade_id": "closing", "locked": true, "schema_version": 3, "solution": false, "task": false}
# ## What was measured
#
# * Part 1: how the survivors of a killed rank and of a silent one end their next calls, on
#   gloo, and what a process group is worth after a failure.
# * Part 2: what torchrun's agent does to a job's workers when one raises.
# * Part 3: failures drawn from a per-rank MTBF, and the work each checkpoint interval costs.
# * Part 4: the files `torch.distributed.checkpoint` writes and the bytes each rank reads; your
#   own sharded checkpoint, loaded on fewer and on more ranks.
# * Part 5: what torchft's replicas average over when one is gone, and what one that comes
#   back receives; your step that outlives a rank, and your catching up of ranks that come
#   back.
# * Part 6: when averaging the parameters after every step is DDP, and the bytes and the loss
#   of synchronising every step, every H steps, and with an outer optimizer.
#
# Where to look next: PyTorch's elastic documentation (torchrun), the
# `torch.distributed.checkpoint` tutorial, torchft's README and its `local_sgd.py`, and the
# DiLoCo paper.
