"""Is each submission kept in its own box? Attacks from a graded rank on the grading machine."""

from __future__ import annotations

import contextlib
import os
import py_compile
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import cloudpickle
import psutil
import pytest
from marks import CONFINED

from course.grading import cgroups, sandbox
from course.grading.rankbox import RankBox
from course.grading.slots import lease_uid
from course.ranks import confined, forkserver, launch
from course.ranks.failures import RunResult
from course.ranks.supervisor import Supervisor

pytestmark = [
    pytest.mark.ranks,
    CONFINED,
]

REPO = Path(__file__).resolve().parents[2]
# Graded ranks see only Python and the course package: send this module's functions by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

# A grader that runs three launches, each rank writing a REGISTER line on the descriptor
# multiprocessing calls its resource tracker's: a tracker that reads it unlinks the named
# shared memory when it exits, as whoever runs it.
TRACKER_ATTACK = """
import sys
from course.grading.rankbox import RankBox
from course.ranks import launch

def register(name):
    from multiprocessing import resource_tracker
    import os
    try:
        fd = resource_tracker._resource_tracker._fd
        os.write(fd, f"REGISTER:{name}:shared_memory\\n".encode())
    except OSError as err:
        return str(err)
    return "written"

with RankBox(ddp=False):  # the uid is $COURSE_SANDBOX_UID's alone: cleaned after each launch
    for _ in range(3):
        result = launch(register, 1, sys.argv[1], timeout=60)
        assert result.ok, result.failures
print("launched")
"""


def test_a_rank_cannot_make_a_resource_tracker_outside_unlink_a_file() -> None:
    """A REGISTER line written by a rank on its tracker descriptor reaches no tracker outside
    the sandbox: root's shared memory of that name is still there once the grader exits."""
    name = f"course-victim-{secrets.token_hex(4)}"
    victim = Path("/dev/shm") / name
    victim.write_text("root's")
    victim.chmod(0o600)
    try:
        with lease_uid() as lease:
            env = {**os.environ, sandbox.UID_ENV: str(lease.uid)}
            done = subprocess.run(
                [sys.executable, "-c", TRACKER_ATTACK, "/" + name],
                capture_output=True, text=True, timeout=240, check=False, cwd=REPO, env=env,
            )  # fmt: skip
        assert "launched" in done.stdout, done.stderr[-3000:]
        assert victim.exists(), "a tracker outside the sandbox unlinked it"
    finally:
        victim.unlink(missing_ok=True)


def _tracker_descriptor() -> str:
    import stat
    from multiprocessing import resource_tracker

    fd = resource_tracker._resource_tracker._fd  # noqa: SLF001 - what the attack writes to
    return "pipe" if stat.S_ISFIFO(os.fstat(fd).st_mode) else os.readlink(f"/proc/self/fd/{fd}")


def test_no_rank_holds_a_pipe_to_a_resource_tracker() -> None:
    """Every launch, not only the first, hands ranks /dev/null as their tracker."""
    with RankBox(uid=sandbox.SANDBOX_UID, ddp=False):
        seen = [launch(_tracker_descriptor, 1, timeout=30).results[0] for _ in range(3)]
    assert seen == ["/dev/null"] * 3


def _swap_run_folder(victim: str) -> list[str]:
    """Replace this run's folder (and put a new entry beside it) with a link to ``victim``."""
    run = os.path.dirname(os.readlink("/proc/self/fd/1"))
    tried = []
    for attempt in (
        lambda: os.rename(run, run + "-moved"),
        lambda: os.symlink(victim, run + "-next"),
        lambda: os.mkdir(os.path.join(os.path.dirname(run), "mine")),
    ):
        try:
            attempt()
            tried.append("done")
        except OSError as err:
            tried.append(type(err).__name__)
    return tried


def test_a_rank_cannot_touch_the_folder_its_run_folders_are_made_in() -> None:
    """Run folders are made in a folder of root's: a rank can neither move its own nor add
    a link beside it for the next launch's folder to be swapped for. (A rank with a
    scratch folder of its own does all three there, out of the grader's sight.)"""
    with RankBox(uid=sandbox.SANDBOX_UID, ddp=False) as box:
        runs = box._runs  # noqa: SLF001 - the folder the box makes run folders in
        result = launch(_swap_run_folder, 1, "/etc/shadow", timeout=30)
        left = os.listdir(runs)
    assert result.ok, result.failures
    assert result.results[0] in (["PermissionError"] * 3, ["done"] * 3)
    assert not [name for name in left if name == "mine" or name.endswith(("-next", "-moved"))]


def test_a_run_folder_swapped_for_a_link_is_not_followed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Even if a link took a run folder's place before it is handed over, root does not
    chown the link's target to the sandbox uid."""
    victim = tmp_path / "root-only"
    victim.write_text("root's")
    victim.chmod(0o600)
    made = tempfile.mkdtemp

    def raced(*args: object, **kwargs: object) -> str:
        path = made(*args, **kwargs)
        os.rmdir(path)
        os.symlink(victim, path)  # what a racing rank does between mkdtemp and chown
        return path

    monkeypatch.setattr(tempfile, "mkdtemp", raced)
    box = RankBox(uid=sandbox.SANDBOX_UID, ddp=False)
    share = box._share  # noqa: SLF001 - the share a RankBox passes on to its launches
    links = r"Too many levels of symbolic links|Not a directory"
    with (
        confined.confined_launches(None, str(tmp_path), share),
        pytest.raises(OSError, match=links),
    ):
        confined.rank_dir("course-ranks-")
    assert victim.stat().st_uid == 0


def _load_the_reference(folder: str) -> dict:
    """What of the instructor's folder a rank can read, and whether the reference ring's
    bytecode loads as a module there."""
    import importlib.util
    from importlib.machinery import SourcelessFileLoader

    readable = []
    for root, _dirs, files in os.walk(folder):
        for name in files:
            with contextlib.suppress(OSError), open(os.path.join(root, name), "rb") as f:
                if f.read(1):
                    readable.append(name)
    pyc = importlib.util.cache_from_source(os.path.join(folder, "reference.py"))
    try:
        loader = SourcelessFileLoader("stolen_reference", pyc)
        spec = importlib.util.spec_from_loader("stolen_reference", loader)
        module = importlib.util.module_from_spec(spec)
        loader.exec_module(module)
        loaded = "ring_allreduce" in vars(module)
    except (ImportError, OSError) as err:
        loaded = type(err).__name__
    return {"readable": sorted(readable), "loaded": loaded}


def test_the_instructor_modules_and_their_bytecode_are_not_on_graded_ranks() -> None:
    """A ring that loads the reference's compiled bytecode finds none, nor any other
    instructor module or its bytecode."""
    import course.instructor

    folder = Path(course.instructor.__file__).parent
    pyc = py_compile.compile(str(folder / "reference.py"), doraise=True)  # as any import leaves
    assert Path(pyc).stat().st_size > 0
    with RankBox(uid=sandbox.SANDBOX_UID, ddp=False):
        result = launch(_load_the_reference, 1, str(folder), timeout=30)
    assert result.ok, result.failures
    assert result.results[0] == {"readable": [], "loaded": "FileNotFoundError"}


# Run in the sandbox from a course checked out elsewhere: what of the checkout is in view?
VIEW_PROBE = """
import json, os, sys
root = sys.argv[1]
print(json.dumps({
    "listing": sorted(os.listdir(root)),
    "package": os.path.exists(os.path.join(root, "course", "checks", "__init__.py")),
    "instructor": os.listdir(os.path.join(root, "course", "instructor")),
}))
"""
JUDGE_FROM_CHECKOUT = """
import subprocess, sys
import course
from course.grading import sandbox
assert course.__file__.startswith(sys.argv[1]), course.__file__
argv = sandbox.confine([sys.executable, "-c", sys.argv[2], sys.argv[1]], uid=sandbox.SANDBOX_UID,
                       hide=[sys.argv[1] + "/course/instructor"])
done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
print(done.stdout if done.returncode == 0 else done.stderr)
sys.exit(done.returncode)
"""


@pytest.mark.parametrize("parent", ["/opt", "/usr/local"])
def test_a_course_checked_out_under_a_system_folder_is_out_of_view(parent: str) -> None:
    """With the course checked out under /opt or /usr/local, a confined process sees its
    ``course`` package (the instructor's folder empty) and nothing else of the checkout:
    no ``source/``, gradebook or submissions."""
    import json
    import shutil

    root = Path(tempfile.mkdtemp(prefix="course-checkout-", dir=parent))
    root.chmod(0o755)  # as a checkout is
    try:
        shutil.copytree(REPO / "course", root / "course", ignore=shutil.ignore_patterns("*.pyc"))
        for folder in ("source/a", "submitted/bob/a"):
            (root / folder).mkdir(parents=True)
            (root / folder / "a.ipynb").write_text('{"key": "b"}')
        (root / "gradebook.db").write_text("secret grades")
        (root / "nbgrader_config.py").write_text("c = get_config()\n")
        env = {**os.environ, "PYTHONPATH": str(root)}
        done = subprocess.run(
            [sys.executable, "-c", JUDGE_FROM_CHECKOUT, str(root), VIEW_PROBE],
            capture_output=True, text=True, timeout=120, check=False, cwd=root, env=env,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        seen = json.loads(done.stdout)
    finally:
        shutil.rmtree(root)
    assert seen == {"listing": ["course"], "package": True, "instructor": []}


def _processes_in_view() -> list[str]:
    seen = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError), open(f"/proc/{entry}/cmdline", "rb") as f:
                seen.append(f.read().replace(b"\0", b" ").decode(errors="replace"))
    return seen


def test_a_rank_sees_no_process_outside_its_submission() -> None:
    """Graded ranks have a PID namespace of their own: no command line of the grader or of
    a submission graded beside them is in their view."""
    marker = f"course-neighbour-{secrets.token_hex(4)}"
    neighbour = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", marker])
    try:
        with RankBox(uid=sandbox.SANDBOX_UID, ddp=False):
            result = launch(_processes_in_view, 2, timeout=30)
    finally:
        neighbour.kill()
        neighbour.wait()
    assert result.ok, result.failures
    for seen in result.results:
        assert seen, "no process at all: /proc is not the namespace's"
        assert not [line for line in seen if marker in line or "pytest" in line]


def _stop_every_process_in_view() -> list[int]:
    """SIGSTOP every process this rank can see but itself and its threads (its forkserver,
    its parent, its siblings, if any were in view); the pids it signalled."""
    import signal

    mine = {os.getpid(), *(int(t) for t in os.listdir("/proc/self/task"))}
    stopped = []
    for pid in {os.getppid(), *(int(p) for p in os.listdir("/proc") if p.isdigit())}:
        if pid > 0 and pid not in mine:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGSTOP)
                stopped.append(pid)
    return stopped


def _pid() -> int:
    return os.getpid()


def _cwd() -> str:
    return os.getcwd()


@pytest.mark.timeout(180)
def test_a_rank_cannot_reach_its_forkserver() -> None:
    """A graded rank has a PID namespace of its own: its parent and its forkserver are not in
    view, so it stops nothing, and the next launch runs."""
    with RankBox(uid=sandbox.SANDBOX_UID, ddp=False):
        assert launch(_stop_every_process_in_view, 2, timeout=60).results == [[], []]
        assert launch(_pid, 2, timeout=30).ok


def test_a_stopped_forkserver_costs_the_next_launch_its_deadline_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The launch after the forkserver was stopped (SIGSTOP: by the machine, since graded ranks
    cannot see it) waits out its start-up deadline, not never, then runs on a fresh forkserver;
    a box whose forkservers all fail to fork fails the launch with the reason, tried twice; the
    scratch tmpfs is unmounted."""
    import signal

    with RankBox(uid=sandbox.SANDBOX_UID, ddp=False) as box:
        cwd = launch(_cwd, 1, timeout=60).results[0]  # warm: a cold start imports torch
        scratch = cwd[: cwd.index("/scratch") + len("/scratch")]
        stopped = box.server.server_pid()
        os.kill(stopped, signal.SIGSTOP)
        monkeypatch.setattr(forkserver, "START_WAIT", 5.0, raising=False)
        start = time.monotonic()
        again = launch(_pid, 2, timeout=30)
        assert 5.0 <= time.monotonic() - start < 5.0 + 30
        assert again.ok, again.failures
        assert box.server.server_pid() != stopped
        tries = []

        def refuse(self: object, fds: list[int]) -> tuple[int, int]:
            raise ConnectionError("the forkserver was stopped")

        def counted(self: Supervisor) -> RunResult:
            tries.append(self)
            return execute(self)

        execute = Supervisor.execute
        monkeypatch.setattr(forkserver.PrivateForkServer, "connect_to_new_process", refuse)
        monkeypatch.setattr(Supervisor, "execute", counted)
        refused = launch(_pid, 2, timeout=30)
        assert not refused.ok and len(tries) == 2  # tried twice, not more
        assert "could not be started" in refused.failures[0].message
        assert "on two forkservers in turn" in refused.failures[0].message
        monkeypatch.undo()
        assert launch(_pid, 2, timeout=60).ok  # a fresh forkserver
    with open("/proc/mounts") as f:
        assert f" {scratch} " not in f.read()


def _hide_a_daemon() -> str:
    """Start a daemon in a session of its own that holds 64 MB of System V shared memory and
    ends its main thread with a raw exit syscall (it then looks like a zombie)."""
    import ctypes
    import threading

    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.shmget(0, 64 * 2**20, 0o1000 | 0o600)  # IPC_PRIVATE, IPC_CREAT
            threading.Thread(target=time.sleep, args=(600,)).start()
            libc.syscall(60, 0)  # SYS_exit: this thread only; the process lives on
        os._exit(0)
    os.wait()
    time.sleep(0.5)
    return os.readlink("/proc/self/ns/ipc")


def _left_of(uid: int) -> list[int]:
    """Every process of ``uid``, zombies included."""
    return [
        p.pid for p in psutil.process_iter(["uids"]) if p.info["uids"] and uid in p.info["uids"]
    ]


def _ipc_namespaces() -> set[str]:
    """Every IPC namespace a thread is in (a process whose main thread ended shows its
    namespaces under its other threads only)."""
    found = set()
    for entry in os.listdir("/proc"):
        with contextlib.suppress(OSError):
            for task in os.listdir(f"/proc/{entry}/task"):
                with contextlib.suppress(OSError):
                    found.add(os.readlink(f"/proc/{entry}/task/{task}/ns/ipc"))
    return found


@pytest.mark.skipif(cgroups.unavailable() is not None, reason=str(cgroups.unavailable()))
def test_nothing_a_submission_started_outlives_it() -> None:
    """A daemon that hid (a new session, a zombie-looking main thread) dies with its rank's
    PID namespace when the launch ends, and its IPC namespace (with its shared memory) with
    it; what the box itself runs (its forkserver) is in the box's cgroups, killed with them
    when the box ends."""
    with lease_uid() as lease:
        with RankBox(uid=lease.uid, ddp=False) as box:
            namespace = launch(_hide_a_daemon, 1, timeout=60).results[0]
            end = time.monotonic() + 5.0  # SIGKILLed with its rank: gone once torn down
            while namespace in _ipc_namespaces() and time.monotonic() < end:
                time.sleep(0.1)
            assert namespace not in _ipc_namespaces()
            assert set(_left_of(lease.uid)) <= box.cgroups.pids()
            assert len(_left_of(lease.uid)) >= 1  # the forkserver
            written = {Path(p).name for p in box.cgroups.limits}
            assert {"pids.max"} <= written and written & {"memory.max", "memory.limit_in_bytes"}
        end = time.monotonic() + 5.0  # SIGKILLed: gone once the kernel has torn them down
        while _left_of(lease.uid) and time.monotonic() < end:
            time.sleep(0.1)
        assert _left_of(lease.uid) == []
        assert box.cgroups.pids() == set()
        assert not any(path.exists() for path in box.cgroups.dirs)


@pytest.mark.timeout(300)
def test_a_submission_whose_forkserver_stopped_is_graded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Graded through the judge: the cell whose forkserver was stopped is judged on a fresh
    one, after the stopped one's start-up deadline, and the grader does not fail."""
    import signal
    from types import SimpleNamespace

    from course.grading.judge import judge_cell
    from course.grading.student import StudentCode

    setup = "import torch\nfrom course.lessons.ring_allreduce import check_ring_sums"
    ring = "import torch.distributed as dist\ndef ring_allreduce(t):\n    dist.all_reduce(t)\n"
    cells = (("setup", setup), ("ring_allreduce", ring))
    sub = SimpleNamespace(setup=[setup], student=list(cells))
    sub.code = lambda name: StudentCode(cells, name)
    with RankBox(uid=sandbox.SANDBOX_UID, ddp=False) as box:
        assert launch(_pid, 1, timeout=60).ok  # warm: a cold start imports torch
        os.kill(box.server.server_pid(), signal.SIGSTOP)
        monkeypatch.setattr(forkserver, "START_WAIT", 5.0, raising=False)
        start = time.monotonic()
        passed, text = judge_cell(sub, "print(check_ring_sums(ring_allreduce, world_sizes=(2, 3)))")
        elapsed = time.monotonic() - start
    assert not passed, text
    assert "could not be started" not in text  # judged on a fresh forkserver
    assert "all_reduce" in text, text
    assert elapsed < 120, elapsed
