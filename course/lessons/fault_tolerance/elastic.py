"""torchrun's elastic agent restarting a job: who is restarted, and which steps are done again.

    python -m torch.distributed.run --standalone --nproc-per-node 2 --max-restarts 1 \\
        -m course.lessons.fault_tolerance.elastic LOG --steps 12 --every 5 --fail 1:8

A worker trains a toy model by SGD on its own fixed data, all-reducing gradients; rank 0
saves a checkpoint (the model, the optimizer and the step) after every ``--every`` steps, and
a worker starting looks for the newest one. ``--fail R:S`` makes rank R raise at step S in
the job's first attempt only (``TORCHELASTIC_RESTART_COUNT`` is 0): a one-off fault. Each
worker appends one line per event to ``LOG/<attempt>.<rank>.jsonl`` (its pid, the step it
started from, each step it finished, the loss), so :func:`run_elastic` reads who ran what.
See https://pytorch.org/docs/stable/elastic/run.html for the agent.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import torch
import torch.distributed as dist

__all__ = ["ElasticRun", "Event", "main", "report", "run_elastic"]

DEADLINE = 120.0  # seconds for a whole torchrun job (start-up, attempts and restarts)


@dataclass(frozen=True)
class Event:
    """One line of a worker's log: ``kind`` is start (from ``step``), step (finished) or end."""

    attempt: int
    rank: int
    pid: int
    kind: str
    step: int
    loss: float | None = None


@dataclass(frozen=True)
class ElasticRun:
    """What a torchrun job did: its exit code, every worker's events in order, and the exit
    code of each worker of the attempt that ended the job with a failure (by rank; -15: the
    agent stopped it with SIGTERM), from the agent's own summary."""

    returncode: int
    events: tuple[Event, ...]
    exits: dict[int, int]

    def attempts(self) -> list[int]:
        """The attempts that ran (0 first; one more for each restart)."""
        return sorted({e.attempt for e in self.events})

    def of(self, attempt: int, kind: str) -> list[Event]:
        """The events of one attempt and one kind."""
        return [e for e in self.events if e.attempt == attempt and e.kind == kind]


def _checkpoint(directory: Path) -> Path | None:
    """The newest checkpoint in ``directory`` (by step), or None."""
    found = sorted(directory.glob("step-*.pt"), key=lambda p: int(p.stem.split("-")[1]))
    return found[-1] if found else None


def _train(args: argparse.Namespace, log: Path) -> None:
    rank, attempt = dist.get_rank(), int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    start = 0
    saved = _checkpoint(log / "checkpoints")
    if saved is not None:
        state = torch.load(saved)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        start = state["step"]
    g = torch.Generator().manual_seed(rank)
    x, y = torch.randn(64, 8, generator=g), torch.randn(64, 1, generator=g)
    fail_rank, fail_step = args.fail
    out = (log / f"{attempt}.{rank}.jsonl").open("a")

    def say(kind: str, step: int, loss: float | None = None) -> None:
        event = {"attempt": attempt, "rank": rank, "pid": os.getpid(), "kind": kind}
        out.write(json.dumps({**event, "step": step, "loss": loss}) + "\n")
        out.flush()

    say("start", start)
    for step in range(start + 1, args.steps + 1):
        if attempt == 0 and (rank, step) == (fail_rank, fail_step):
            raise RuntimeError(f"rank {rank}: a fault injected at step {step}")
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x[step % 8 :: 8]), y[step % 8 :: 8])
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= dist.get_world_size()
        opt.step()
        say("step", step, loss.item())
        if step % args.every == 0 and rank == 0:
            (log / "checkpoints").mkdir(exist_ok=True)
            state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step}
            torch.save(state, log / "checkpoints" / f"step-{step}.pt")
        if step % args.every == 0:
            dist.barrier()  # every worker knows the checkpoint is written before going on
    # No worker tears its group down while a peer still reads from it: a connection closed
    # under a peer's last all-reduce aborts that peer (SIGABRT), and fails a finished job.
    dist.barrier()
    say("end", args.steps)


def main(argv: list[str] | None = None) -> NoReturn:
    """A worker, as torchrun starts it."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log", type=Path)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--every", type=int, default=5)
    parser.add_argument("--fail", type=lambda s: tuple(map(int, s.split(":"))), default=(-1, -1))
    args = parser.parse_args(argv)
    # Each attempt's own keys in torchrun's store: seen on torch 2.13, a restarted gloo worker
    # could read the address a peer had in the attempt before, and never connect.
    store, rank, world_size = next(dist.rendezvous("env://"))
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    store = dist.PrefixStore(f"attempt-{attempt}", store)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size)
    try:
        _train(args, args.log)
    finally:
        dist.destroy_process_group()
    # A worker whose job finished leaves as multiprocessing's children do, without the
    # interpreter's teardown: under load, torch 2.13's C++ teardown at exit aborted such a
    # worker after its last step was logged ("terminate called without an active exception",
    # SIGABRT; 4 runs of 35 on 2 busy cores), and the agent took the finished job for a
    # failed one. A worker that raised ends as Python ends it, with its traceback, code 1.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_elastic(
    log: Path, nproc: int, max_restarts: int, steps: int, every: int, fail: tuple[int, int]
) -> ElasticRun:
    """Run the job under torchrun (``--standalone``, on loopback); read every worker's log."""
    log.mkdir(parents=True, exist_ok=True)
    command = [
        *(sys.executable, "-m", "torch.distributed.run", "--standalone"),
        *(f"--nproc-per-node={nproc}", f"--max-restarts={max_restarts}", "--monitor-interval=0.1"),
        *("-m", __name__, str(log), f"--steps={steps}", f"--every={every}"),
        f"--fail={fail[0]}:{fail[1]}",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    job = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        start_new_session=True,  # its workers and the agent: one process group to stop
    )  # fmt: skip
    try:
        _, stderr = job.communicate(timeout=DEADLINE)
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGKILL)
        job.communicate()
        raise RuntimeError(f"the torchrun job did not end within {DEADLINE:g} s") from None
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(job.pid, signal.SIGKILL)  # nothing of the job outlives it
    events = []
    for path in sorted(log.glob("*.jsonl")):
        events += [Event(**json.loads(line)) for line in path.read_text().splitlines()]
    events.sort(key=lambda e: (e.attempt, e.rank, e.kind != "start", e.step))
    return ElasticRun(job.returncode, tuple(events), _exits(stderr))


def _exits(stderr: str) -> dict[int, int]:
    """Each failed worker's rank and exit code, from the agent's ``ChildFailedError`` summary."""
    found = re.findall(r"rank\s*:\s*(\d+)\s*\(local_rank.*?\n\s*exitcode\s*:\s*(-?\d+)", stderr)
    return {int(rank): int(code) for rank, code in found}


if __name__ == "__main__":
    main()


def report(run: ElasticRun) -> str:
    """Each attempt's workers: pid, the step each started from and the steps it finished,
    how it ended; and torchrun's own exit code."""
    lines = []
    for attempt in run.attempts():
        lines.append(f"attempt {attempt}:")
        for start in run.of(attempt, "start"):
            steps = [e.step for e in run.of(attempt, "step") if e.rank == start.rank]
            done = f"steps {steps[0]} to {steps[-1]}" if steps else "no step"
            ended = any(e.rank == start.rank for e in run.of(attempt, "end"))
            code = run.exits.get(start.rank) if attempt == run.attempts()[-1] else None
            how = "finished" if ended else _ended(code)
            lines.append(
                f"  rank {start.rank} (pid {start.pid}): from step {start.step}, {done}; {how}"
            )
    lines.append(f"torchrun exited with code {run.returncode}")
    return "\n".join(lines)


def _ended(code: int | None) -> str:
    if code is None:
        return "ended: its attempt failed"
    if code < 0:
        return f"ended by signal {-code} ({signal.Signals(-code).name})"
    return f"exited with code {code}"
