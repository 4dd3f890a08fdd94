"""Failures over time: how often a synchronous job of N ranks stops, and what checkpoints save.

    from course.lessons.fault_tolerance.failures import Job, checkpoint_run, young_interval
    job = Job(ranks=4096, mtbf_h=50_000, checkpoint_s=60, interval_steps=60, restart_s=600)
    checkpoint_run(job, hours=24, seed=0).goodput        # one drawn day of that job
    young_interval(job.checkpoint_s, job.job_mtbf_s)     # sqrt(2 C M), in seconds

The model is the one the checkpoint-interval papers use. Each rank fails after an exponential
time of mean ``mtbf_h`` (its mean time between failures), independently of the others; a
synchronous job stops at the first failure of any of its N ranks, so its own time between
failures is the minimum of N such clocks, exponential of mean M = mtbf / N. The job trains
``interval_steps`` steps (tau seconds of work), then blocks ``checkpoint_s`` (C) writing a
checkpoint; a failure loses the work since the last checkpoint written (a checkpoint cut short
is lost too), then the job spends ``restart_s`` (R: rescheduling, reloading) before it trains
again, and a failure during the restart starts it over. J. W. Young ("A first order
approximation to the optimum checkpoint interval", CACM 17(9), 1974) minimised the time lost,
C / tau + (tau / 2 + R) / M, at tau = sqrt(2 C M); J. T. Daly ("A higher order estimate of the
optimum checkpoint interval for restart dumps", FGCS 22(3), 2006) solved this model exactly.

The alternative is a per-step quorum, as torchft's ``Manager`` keeps (torchft docs,
``Manager.should_commit``): N replicas train on; one that fails is left out of the next step's
quorum, restarts in R and rejoins from a live peer. The step in flight when it failed is
discarded by every replica in it (their all-reduce with the lost replica errors, and
``should_commit`` returns False), so a failure costs one step of the job plus R of one replica.

Pure: plain data, :mod:`random` and numpy, no torch and no globals; every draw takes its
``seed``.
"""

from __future__ import annotations

import heapq
import math
import random
from dataclasses import dataclass, field, replace

import numpy as np

__all__ = [
    "HOUR",
    "Job",
    "Run",
    "checkpoint_run",
    "daly_interval",
    "expected_goodput",
    "failure_free_fraction",
    "first_failures",
    "goodput_curve",
    "quorum_goodput",
    "quorum_run",
    "survival",
    "young_interval",
]

HOUR = 3600.0


@dataclass(frozen=True)
class Job:
    """A synchronous job: N ranks, each failing on average every ``mtbf_h`` hours; a
    checkpoint of ``checkpoint_s`` seconds every ``interval_steps`` steps of ``step_s``."""

    ranks: int = 4096
    mtbf_h: float = 50_000.0
    checkpoint_s: float = 60.0
    interval_steps: int = 60
    restart_s: float = 600.0
    step_s: float = 10.0

    @property
    def interval_s(self) -> float:
        """Seconds of training between two checkpoints (tau)."""
        return self.interval_steps * self.step_s

    @property
    def job_mtbf_s(self) -> float:
        """The job's mean time between failures, M = mtbf / N, in seconds."""
        return self.mtbf_h * HOUR / self.ranks

    def every(self, interval_s: float) -> Job:
        """The job with a checkpoint every ``interval_s`` seconds of training (a step at least)."""
        return replace(self, interval_steps=max(1, round(interval_s / self.step_s)))


@dataclass
class Run:
    """What a simulated run did: ``spans`` are ``(kind, row, start_s, end_s)`` with kind
    ``work``, ``checkpoint``, ``lost`` or ``restart`` (row -1: every rank), ``failures`` are
    ``(time_s, rank)``, ``struck`` those that struck training (the others struck a restart and
    started it over); the totals are in seconds (for a quorum, in replica-seconds)."""

    wall_s: float
    capacity_s: float = 0.0
    work_s: float = 0.0
    lost_s: float = 0.0
    checkpoint_s: float = 0.0
    restart_s: float = 0.0
    spans: list[tuple[str, int, float, float]] = field(default_factory=list)
    failures: list[tuple[float, int]] = field(default_factory=list)
    struck: int = 0

    @property
    def goodput(self) -> float:
        """Work kept over the time paid for it: the share of the job that trained."""
        return self.work_s / (self.capacity_s or self.wall_s)

    @property
    def lost_per_failure_s(self) -> float:
        """Training thrown away per failure that struck it, on average (0 if none did)."""
        return self.lost_s / self.struck if self.struck else 0.0


def survival(ranks: int, mtbf_h: float, hours: float) -> float:
    """P(no rank of N fails in ``hours``) = exp(-N t / mtbf): each rank's exp(-t / mtbf), N times
    over (the ranks fail independently)."""
    return math.exp(-ranks * hours / mtbf_h)


def young_interval(checkpoint_s: float, job_mtbf_s: float) -> float:
    """Young's optimum seconds of training between checkpoints, sqrt(2 C M) (CACM 1974)."""
    return math.sqrt(2 * checkpoint_s * job_mtbf_s)


def daly_interval(checkpoint_s: float, job_mtbf_s: float) -> float:
    """Daly's higher-order optimum (FGCS 2006, eq. 37): Young's with a correction, M past C = 2M."""
    c, m = checkpoint_s, job_mtbf_s
    if c >= 2 * m:
        return m
    x = c / (2 * m)
    return math.sqrt(2 * c * m) * (1 + math.sqrt(x) / 3 + x / 9) - c


def expected_goodput(
    interval_s: float, checkpoint_s: float, restart_s: float, job_mtbf_s: float
) -> float:
    """Long-run share of time that trains: tau / (M e^(R/M) (e^((tau + C)/M) - 1)), Daly's
    exact expected time of one interval and its checkpoint when failures also strike C and R."""
    m, power = job_mtbf_s, (restart_s + interval_s + checkpoint_s) / job_mtbf_s
    if power > 700:  # e^700 overflows soon after: the job (almost) never ends an interval
        return 0.0
    return interval_s / (m * math.exp(restart_s / m) * math.expm1((interval_s + checkpoint_s) / m))


def _restart(rng: random.Random, t: float, job: Job, run: Run) -> float:
    """The time the job trains again after a failure at ``t``: R, started over at each failure
    (each added to ``run``), or the window's end if that is sooner: with R many MTBFs long, a
    restart may never finish."""
    while t < run.wall_s:
        gap = rng.expovariate(1 / job.job_mtbf_s)
        if gap >= job.restart_s:
            return t + job.restart_s
        t += gap
        if t < run.wall_s:
            run.failures.append((t, rng.randrange(job.ranks)))
    return run.wall_s


def checkpoint_run(job: Job, hours: float, seed: int = 0, record: bool = True) -> Run:
    """``hours`` of a checkpoint/restart job, drawn: failures, checkpoints, lost work, restarts
    (with ``record`` the spans and each failure's rank, for the timeline)."""
    rng = random.Random(seed)  # noqa: S311 - a simulation's draws, not a secret
    tau, c = job.interval_s, job.checkpoint_s
    m, horizon, period = job.job_mtbf_s, hours * HOUR, tau + c
    run, t = Run(wall_s=horizon), 0.0
    while t < horizon:
        failure = t + rng.expovariate(1 / m)
        stop = min(failure, horizon)
        kept = math.floor((stop - t) / period)  # intervals and their checkpoints completed
        run.work_s += kept * tau
        run.checkpoint_s += kept * c
        if record:
            _spans(run, t, kept, tau, c)
        since = t + kept * period  # the last checkpoint written
        if failure >= horizon:  # the window ends first: what it trained since counts
            trained = min(horizon, since + tau)
            run.work_s += trained - since
            run.checkpoint_s += horizon - trained
            if record:
                run.spans += [("work", -1, since, trained), ("checkpoint", -1, trained, horizon)]
            break
        run.lost_s += failure - since
        run.failures.append((failure, rng.randrange(job.ranks)))
        run.struck += 1
        t = _restart(rng, failure, job, run)
        run.restart_s += min(t, horizon) - failure
        if record:
            run.spans.append(("lost", -1, since, failure))
            run.spans.append(("restart", -1, failure, min(t, horizon)))
    return run


def _spans(run: Run, t: float, kept: int, tau: float, c: float) -> None:
    """The ``kept`` intervals of training and their checkpoints from ``t``, as spans."""
    for i in range(kept):
        start = t + i * (tau + c)
        run.spans.append(("work", -1, start, start + tau))
        run.spans.append(("checkpoint", -1, start + tau, start + tau + c))


def goodput_curve(
    job: Job, intervals_s: list[float], hours: float, seed: int = 0
) -> list[tuple[float, float, float]]:
    """``(interval_s, simulated, expected)`` goodput per interval: each a ``hours`` run drawn
    with the same ``seed`` (the same failure clock), beside Daly's exact expectation."""
    out = []
    for interval in intervals_s:
        j = job.every(interval)
        run = checkpoint_run(j, hours, seed, record=False)
        expected = expected_goodput(j.interval_s, j.checkpoint_s, j.restart_s, j.job_mtbf_s)
        out.append((j.interval_s, run.goodput, expected))
    return out


def first_failures(ranks: int, mtbf_h: float, trials: int, seed: int = 0) -> np.ndarray:
    """When the first of N ranks fails, in hours, in each of ``trials`` drawn jobs: each rank
    its own exponential clock (drawn, not computed from the closed form)."""
    rng, out = np.random.default_rng(seed), []
    chunk = max(1, (1 << 20) // ranks)  # about 8 MB of clocks at a time
    for start in range(0, trials, chunk):
        n = min(chunk, trials - start)
        out.append(rng.exponential(mtbf_h, size=(n, ranks)).min(axis=1))
    return np.concatenate(out) if out else np.empty(0)


def failure_free_fraction(
    ranks: int, mtbf_h: float, hours: float, trials: int, seed: int = 0
) -> float:
    """The share of ``trials`` drawn windows of ``hours`` in which none of N ranks failed, each
    rank its own exponential clock (counted, not computed from the closed form)."""
    return float((first_failures(ranks, mtbf_h, trials, seed) > hours).mean())


def quorum_run(
    replicas: int,
    mtbf_h: float,
    step_s: float,
    restart_s: float,
    hours: float,
    seed: int = 0,
    record: bool = True,
) -> Run:
    """``hours`` of N replicas under a per-step quorum (torchft-like), drawn: a failure discards
    the step in flight on every replica in it; the failed replica is down for R, then rejoins at
    the next step. Totals in replica-seconds; with ``record``, spans per replica row."""
    rng = random.Random(seed)  # noqa: S311 - a simulation's draws, not a secret
    horizon, rate = hours * HOUR, 1 / (mtbf_h * HOUR)
    run = Run(wall_s=horizon, capacity_s=replicas * horizon)
    alive, back = list(range(replicas)), []  # back: (rejoin time, replica)
    t, discarded = 0.0, -1
    while True:
        nxt = t + rng.expovariate(rate * len(alive)) if alive else math.inf
        if back and back[0][0] <= min(nxt, horizon):  # a rejoin first: draw again (memoryless)
            t, replica = heapq.heappop(back)
            alive.append(replica)
            continue
        if nxt >= horizon:
            break
        t, slot = nxt, math.floor(nxt / step_s)
        start, end = slot * step_s, min((slot + 1) * step_s, horizon)
        if slot != discarded:  # every replica in this step loses it
            discarded = slot
            run.lost_s += len(alive) * (end - start)
            run.spans += [("lost", r, start, end) for r in alive] if record else []
        replica = alive.pop(rng.randrange(len(alive)))
        alive_again = math.ceil((t + restart_s) / step_s) * step_s
        heapq.heappush(back, (alive_again, replica))
        run.lost_s -= end - t  # the failed replica's rest of the step is down time instead
        run.restart_s += min(alive_again, horizon) - t
        run.failures.append((t, replica))
        run.struck += 1
        run.spans += [("restart", replica, t, min(alive_again, horizon))] if record else []
    run.work_s = run.capacity_s - run.lost_s - run.restart_s
    return run


def quorum_goodput(replicas: int, mtbf_h: float, step_s: float, restart_s: float) -> float:
    """First-order share of replica time that trains under a per-step quorum: each failure
    (N / mtbf per second) costs about N steps' replica-seconds and R, of N per second."""
    return 1 - (replicas * step_s + restart_s) / (mtbf_h * HOUR)
