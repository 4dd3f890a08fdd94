"""Grading on a Dask cluster: a real scheduler, two real workers, grades as the samples' specs.

The sample class (autograde/submissions, ring_allreduce: model work, the naive exchange, a
deadlocking ring, a crashing ring) is graded twice, each in its own copy of one released
course: on the cluster, and on the cluster while one of its two workers is killed mid-task.
Each time every grade must be the one its spec expects, as the local pool's are
(``test_ring_samples_grade_as_their_specs_expect``, in ``tests/instructor``). Each worker
is its own process tree (no nanny) with its own scratch root (``TMPDIR``), started by the
test with ``dask scheduler`` and ``dask worker``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from course.grading.classrun import autograde_class
from course.grading.executors import DaskCluster
from course.instructor import pipeline
from course.instructor.commands import nbgrader
from course.instructor.grades import check_expectations, grade_rows
from course.instructor.submissions import SPECS, load_specs, submit

distributed = pytest.importorskip("distributed", reason="Dask distributed is not installed")

pytestmark = [
    pytest.mark.nbgrader,
    pytest.mark.ranks,
    pytest.mark.slow,
    pytest.mark.timeout(900),
]

RING = "ring_allreduce"
DASK = str(Path(sys.executable).parent / "dask")
START = 60.0  # seconds for the scheduler and its workers to come up


@pytest.fixture(scope="module")
def released(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A course with the ring released and the sample class submitted, copied per run."""
    root = pipeline.prepare_course(tmp_path_factory.mktemp("dask") / "course")
    nbgrader(root, "generate_assignment", RING, "--force")
    submit(root, [s for s in load_specs(SPECS) if s.assignment == RING])
    return root


def _copy(released: Path, name: str, students: tuple[str, ...] = ()) -> Path:
    """A copy of the released course, with only ``students``' submissions if they are named."""
    root = released.parent / name
    shutil.copytree(released, root, symlinks=True)
    for folder in (root / "submitted").iterdir() if students else ():
        if folder.name not in students:
            shutil.rmtree(folder)
    return root


def unexpected(root: Path) -> list[str]:
    """Where a grade of the ring's samples graded in ``root`` differs from its spec."""
    graded = {p.name for p in (root / "submitted").iterdir()}
    specs = [s for s in load_specs(SPECS) if s.assignment == RING and s.student in graded]
    return check_expectations(grade_rows(root), specs)


class Cluster:
    """A ``dask scheduler`` on loopback and two ``dask worker`` processes, each its own tree."""

    def __init__(self, work: Path) -> None:
        self.work, self.procs = work, []
        self.file = work / "scheduler.json"
        self.scheduler = self._start("scheduler", [DASK, "scheduler", "--host", "127.0.0.1",
                                     "--port", "0", "--no-dashboard",
                                     "--scheduler-file", str(self.file)])  # fmt: skip
        self.address = self._address()
        self.workers = {}
        for name in ("wa", "wb"):
            scratch = work / f"scratch-{name}"
            scratch.mkdir()
            cmd = [DASK, "worker", self.address, "--name", name, "--nthreads", "1",
                   "--no-nanny", "--no-dashboard", "--local-directory", str(scratch)]  # fmt: skip
            self.workers[name] = self._start(name, cmd, TMPDIR=str(scratch))
        self._wait_for_workers(2)

    def _start(self, name: str, cmd: list[str], **env: str) -> subprocess.Popen:
        log = (self.work / f"{name}.log").open("w")
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, **env}, start_new_session=True)  # fmt: skip
        self.procs.append(proc)
        return proc

    def _address(self) -> str:
        import json

        deadline = time.monotonic() + START
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError, ValueError):
                return json.loads(self.file.read_text())["address"]
            if self.scheduler.poll() is not None:
                pytest.fail(f"dask scheduler exited: {self.log('scheduler')}")
            time.sleep(0.2)
        pytest.fail(f"dask scheduler did not start: {self.log('scheduler')}")
        return ""

    def _wait_for_workers(self, n: int) -> None:
        with distributed.Client(self.address, timeout=START) as client:
            client.wait_for_workers(n, timeout=START)

    def log(self, name: str) -> str:
        return (self.work / f"{name}.log").read_text()[-3000:]

    def worker_running_a_task(self) -> tuple[str, str]:
        """(worker name, student) of a grading task in progress, a few seconds in."""
        with distributed.Client(self.address, timeout=START) as client:
            names = {addr: w["name"] for addr, w in client.scheduler_info()["workers"].items()}
            deadline = time.monotonic() + START
            while time.monotonic() < deadline:
                busy = [
                    (addr, key)
                    for addr, keys in client.processing().items()
                    for key in keys
                    if str(key).startswith("autograde-")
                ]
                if busy:
                    time.sleep(3)  # well into the task: its grader and ranks are running
                    addr, key = busy[0]
                    return names[addr], str(key).removeprefix(f"autograde-{RING}-")[:-9]
                time.sleep(0.2)
        pytest.fail("no worker started a grading task")
        return "", ""

    def kill(self, name: str) -> None:
        """SIGKILL a worker (its grader dies with it: a parent-death signal)."""
        self.workers[name].kill()
        self.workers[name].wait()

    def stop(self) -> None:
        for proc in reversed(self.procs):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    """A fresh cluster of two workers for one test; everything it started is killed after.
    Its folder is a short one of /tmp's: a worker's forkserver listens on a Unix socket in
    it, and such a path may hold 107 bytes at most, which pytest's own folders (under
    pytest-xdist, one more level deep) can exceed."""
    work = Path(tempfile.mkdtemp(prefix="dask-"))
    started = Cluster(work)
    try:
        yield started
    finally:
        started.stop()
        shutil.rmtree(work, ignore_errors=True)


def test_the_cluster_gives_the_grades_the_specs_expect(released, cluster) -> None:
    """Graded on a Dask scheduler's two workers, does the class get its specs' grades, each
    submission graded by one of them and merged here?"""
    root = _copy(released, "on-dask")
    outcomes = autograde_class(RING, root, executor=DaskCluster(cluster.address), progress=print)
    assert all(o.status == "graded" for o in outcomes), outcomes
    assert unexpected(root) == []
    assert all(o.worker for o in outcomes)
    assert len({o.worker for o in outcomes}) == 2  # both workers graded part of the class


def test_a_worker_killed_mid_task_costs_a_retry_not_a_grade(released, cluster) -> None:
    """With one of two workers killed while it grades, is its task graded by the other and
    is every grade still the one its spec expects? (Two quick samples: a right ring and the
    naive exchange, one per worker.)"""
    root = _copy(released, "killed", students=("ada", "ben"))
    box: dict = {}
    run = threading.Thread(
        target=lambda: box.update(
            outcomes=autograde_class(
                RING, root, executor=DaskCluster(cluster.address), progress=print
            )
        )
    )
    run.start()
    victim, student = cluster.worker_running_a_task()
    cluster.kill(victim)
    assert _all_gone(cluster.work / f"scratch-{victim}", 70)  # nothing outlives its worker
    run.join(timeout=600)
    assert not run.is_alive()
    outcomes = {o.student: o for o in box["outcomes"]}
    assert all(o.status == "graded" for o in outcomes.values()), outcomes
    assert unexpected(root) == []
    survivor = cluster.workers["wb" if victim == "wa" else "wa"].pid
    assert outcomes[student].worker.endswith(f":{survivor}")  # graded again, on the other


def _all_gone(scratch: Path, seconds: float) -> bool:
    """Wait until no process has ``scratch`` in its command line (the grader and its sandbox
    die with the worker; a rank forked there, deadlocked, may wait out gloo's timeout, 5 times
    a 10 s deadline, unless the uid is leased again first)."""
    deadline = time.monotonic() + seconds
    while _graders_in(scratch):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)
    return True


def _graders_in(scratch: Path) -> list[int]:
    """Pids of processes still running with ``scratch`` in their command line."""
    return [
        proc.pid
        for proc in psutil.process_iter(["cmdline"])
        if any(str(scratch) in part for part in proc.info["cmdline"] or [])
    ]
