"""Graded ranks: confined, as another uid, sent their own inputs only, read as plain data."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import cloudpickle
import psutil
import pytest
from marks import CONFINED

from course.grading import sandbox, template
from course.grading.judge import judge_cell
from course.grading.rankbox import _EARLY, RankBox, discard_early, start_early
from course.grading.student import StudentCode
from course.ranks import PerRank, launch
from course.ranks.clock import WALL_FACTOR

pytestmark = [
    pytest.mark.ranks,
    CONFINED,
]

REPO = Path(__file__).resolve().parents[2]
# Graded ranks see only Python and the course package: send this module's functions by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _where_am_i() -> dict:
    import importlib
    import os

    try:
        importlib.import_module("course.instructor.reference")
        reference = "imported"
    except ImportError as err:
        reference = str(err)
    path = Path(importlib.import_module("course").__file__).parent / "instructor" / "reference.py"
    try:
        text = path.read_text()
    except OSError as err:
        text = f"unreadable: {err}"
    return {
        "uid": os.getuid(),
        "sources": os.path.exists(REPO / "source"),
        "gradebook": os.path.exists(REPO / "gradebook.db"),
        "reference": reference,
        "reference_text": text,
    }


def test_graded_ranks_are_confined_and_cannot_reach_the_reference() -> None:
    with RankBox(uid=sandbox.SANDBOX_UID, ddp=False):
        result = launch(_where_am_i, 2, timeout=30)
    assert result.ok, result.failures
    for seen in result.results:
        assert seen["uid"] == sandbox.SANDBOX_UID
        assert not seen["sources"] and not seen["gradebook"]
        assert "reference" in seen["reference"] and seen["reference"] != "imported"
        assert seen["reference_text"].startswith("unreadable")


def _secrets_in_memory() -> list[str]:
    import gc

    return sorted({o for o in gc.get_objects() if isinstance(o, str) and o.startswith("secret-")})


def _own_and_seen(mine: str) -> tuple:
    return mine, _secrets_in_memory()


def test_each_rank_is_sent_its_own_share_only() -> None:
    shares = PerRank([f"secret-{r}-{'x' * 20}" for r in range(3)])
    with RankBox(ddp=False):
        result = launch(_own_and_seen, 3, shares, timeout=30)
    assert result.ok, result.failures
    for rank, (mine, seen) in enumerate(result.results):
        assert mine == shares[rank]
        assert [s for s in seen if s.startswith("secret-") and s != mine] == []


def _swap_stdout_for(target: str) -> None:
    """Turn this rank's output file into a link (where its run folder is shared; a graded
    rank with folders of its own finds no file of that name, and leaves a link there)."""
    own = os.readlink("/proc/self/fd/1")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(own)
    os.symlink(target, own)


def test_a_file_a_rank_wrote_is_never_followed(tmp_path: Path) -> None:
    """A rank that turns its output file into a link gets nothing read through it."""
    secret = tmp_path / "secret.txt"
    secret.write_text("TOPSECRET")
    with RankBox(ddp=False):
        result = launch(_swap_stdout_for, 2, str(secret), timeout=30)
    assert result.ok, result.failures
    assert all("TOPSECRET" not in out for out in result.stdout)


def _not_plain() -> object:
    return object()


def test_a_value_that_is_not_plain_data_is_refused_on_the_rank() -> None:
    with RankBox(ddp=False):
        result = launch(_not_plain, 1, timeout=30)
    assert not result.ok
    assert "cannot be sent back" in result.failures[0].message


def test_student_code_is_defined_on_the_rank_only() -> None:
    cells = (("setup", "import torch"), ("mine", "def double(t):\n    return t * 2\n"))
    code = StudentCode(cells, "double")
    with pytest.raises(RuntimeError, match="runs only on ranks"):
        code(1)
    with RankBox(ddp=False):
        result = launch(_apply, 1, code, timeout=30)
    assert result.ok and result.results == [6]
    assert StudentCode(cells, "double").stub_message() is None
    stub = (("mine", 'def double(t):\n    """Double it."""\n    # YOUR CODE HERE\n'),)
    assert "double is not implemented yet" in StudentCode(stub, "double").stub_message()


def _imported(name: str) -> bool:
    return name in sys.modules


def test_a_preloaded_module_is_imported_once_for_every_rank() -> None:
    with RankBox(ddp=False):
        assert launch(_imported, 1, "tabnanny", timeout=30).results == [False]
    preload = ("tabnanny", "course.checks.check_answer")  # the second is no module
    with RankBox(preload=preload, ddp=False):
        result = launch(_imported, 2, "tabnanny", timeout=30)
    assert result.ok and result.results == [True, True]


def test_closing_a_box_kills_its_forkserver_at_once() -> None:
    box = RankBox(ddp=False)
    with box:
        assert launch(_imported, 1, "torch", timeout=30).results == [True]
        server = psutil.Process(box.server.pid()).children(recursive=True)
        for proc in server:  # stopped: it could not exit by itself, only be killed
            with contextlib.suppress(psutil.NoSuchProcess):  # a rank that just ended
                proc.suspend()
        started = time.monotonic()
    took = time.monotonic() - started
    assert server and not [p for p in server if p.is_running() and p.status() != "zombie"]
    assert took < 2.5, f"{took:.2f} s: the forkserver was waited for, not killed"


def test_a_box_started_early_is_taken_over_by_the_next_box_alike() -> None:
    start_early(preload=("tabnanny",), ddp=False)
    early = _EARLY[0].server.pid()
    with RankBox(ddp=False) as other:  # not alike (no preload): starts its own
        assert other.server.pid() != early
    with RankBox(preload=("tabnanny",), ddp=False) as box:
        assert box.server.pid() == early and not _EARLY
        assert launch(_imported, 1, "tabnanny", timeout=30).results == [True]
    start_early(ddp=False)
    left = psutil.Process(_EARLY[0].server.pid())
    discard_early()
    assert not _EARLY and not left.is_running()


def _apply(fn: object) -> int:
    return fn(3)


def _half_a_message() -> None:
    import gc
    import struct
    import time
    from multiprocessing.connection import Connection

    for conn in [o for o in gc.get_objects() if isinstance(o, Connection)]:
        os.write(conn.fileno(), struct.pack("!i", 1000) + b"x" * 10)
    time.sleep(60)


def test_a_rank_that_stops_halfway_through_a_message_cannot_hang_the_grader() -> None:
    with RankBox(ddp=False):
        result = launch(_half_a_message, 2, timeout=8)
    assert not result.ok
    assert result.elapsed < WALL_FACTOR * 8 + 2 * 5 + 5  # the deadline, each rank's message wait


FORGED_SHAPE = """
import gc, time
from multiprocessing.connection import Connection
from course.ranks import messages, plain

def ring_allreduce(tensor):
    for conn in [o for o in gc.get_objects() if isinstance(o, Connection)]:
        conn.send_bytes(messages.encode(("ok", plain.dumps([]))))
    time.sleep(30)
"""


def test_a_reply_of_the_wrong_shape_fails_the_cell_not_the_grader() -> None:
    setup = (
        "import torch\nimport torch.distributed as dist\n"
        "from course.lessons.ring_allreduce import check_ring_sums"
    )
    cells = (("setup", setup), ("ring_allreduce", FORGED_SHAPE))
    sub = SimpleNamespace(setup=[setup], student=list(cells))
    sub.code = lambda name: StudentCode(cells, name)
    with RankBox(ddp=False):
        passed, text = judge_cell(sub, "print(check_ring_sums(ring_allreduce, world_sizes=(2,)))")
    assert not passed
    assert "not what this check reads" in text


def _fill_the_disk() -> tuple[int, str]:
    written, chunk = 0, b"x" * 2**20
    try:
        for i in range(400):
            with open(f"fill-{i}", "wb") as f:
                for _ in range(60):
                    f.write(chunk)
                    written += len(chunk)
    except OSError as err:
        return written, type(err).__name__ + ": " + (err.strerror or "")
    return written, "wrote it all"


def test_what_a_submission_writes_is_capped() -> None:
    """Its only writable folder is a tmpfs of SCRATCH_SIZE; each file is capped too."""
    with RankBox(ddp=False):
        result = launch(_fill_the_disk, 1, timeout=60)
    written, stopped = result.results[0]
    assert written <= 256 * 2**20
    assert "No space left" in stopped


def _read_memory_of(pids: list[int]) -> list[str]:
    seen = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/mem", "rb") as f:
                f.read(1)
            seen.append("read")
        except OSError as err:
            seen.append(type(err).__name__)
    return seen


def _siblings_and_server() -> list[str]:
    import torch
    import torch.distributed as dist

    mine = torch.tensor([os.getpid()])
    pids = [torch.zeros(1, dtype=mine.dtype) for _ in range(dist.get_world_size())]
    dist.all_gather(pids, mine)
    others = [int(p) for p in pids if int(p) != os.getpid()]
    return _read_memory_of([*others, os.getppid()])


def test_a_rank_cannot_read_another_ranks_memory_or_the_forkservers() -> None:
    """Graded ranks and their forkserver are not dumpable: same uid, still closed."""
    with RankBox(ddp=False):
        result = launch(_siblings_and_server, 2, timeout=30)
    assert result.ok, result.failures
    for seen in result.results:
        assert seen and "read" not in seen, seen


def test_the_scratch_of_a_grader_that_died_is_swept_by_the_next(tmp_path) -> None:
    """A box's folder whose process is gone (its tmpfs still mounted), and one that never
    named its owner, long ago: are both unmounted and removed when a box starts, while a
    live one, and one just made, are kept?"""
    from course.grading import rankbox

    folders = {}
    for name, owner in (("dead", _dead_pid()), ("live", os.getpid()), ("old", 0), ("new", 0)):
        private = tmp_path / f"{rankbox.PREFIX}{name}"
        (private / "scratch").mkdir(parents=True)
        if owner:
            (private / rankbox.OWNER).write_text(str(owner))
        folders[name] = private
    assert rankbox._mount_tmpfs(folders["dead"] / "scratch")  # noqa: SLF001 - as a box mounts it
    old = time.time() - 2 * rankbox.UNOWNED_AGE
    os.utime(folders["old"], (old, old))
    gone = rankbox.sweep_stale_scratch(str(tmp_path))
    assert sorted(p.name for p in gone) == sorted(folders[k].name for k in ("dead", "old"))
    assert not folders["dead"].exists() and not folders["old"].exists()
    assert folders["live"].is_dir() and folders["new"].is_dir()
    assert str(folders["dead"]) not in Path("/proc/mounts").read_text()


def _dead_pid() -> int:
    """The pid of a process that has exited and been reaped."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def _sum_later() -> list[float]:
    import time

    import torch
    import torch.distributed as dist

    time.sleep(2)  # the forkserver is killed meanwhile
    t = torch.ones(2)
    dist.all_reduce(t)
    return t.tolist()


def _kill_forkserver_once_ranks_run(box: RankBox, killed: list[int]) -> None:
    """SIGKILL the box's forkserver as soon as it has forked both ranks (what the machine's
    OOM killer could do); note its pid in ``killed``."""
    deadline = time.monotonic() + 60
    while box.server.server_pid() is None and time.monotonic() < deadline:
        time.sleep(0.01)  # a cold one's Python is not there yet
    pid = box.server.server_pid()
    if pid is None:
        return
    server = psutil.Process(pid)
    while len(server.children()) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    server.kill()
    killed.append(pid)


@pytest.mark.parametrize("start", ["warm", "cold"])
def test_a_forkserver_killed_while_its_ranks_run(start: str, monkeypatch) -> None:
    """The ranks of a box forked from the template (its PID namespace outlives the
    forkserver) run on and report; those of a cold box (the forkserver's end ends its
    namespace) fail, saying their forkserver was killed: not "exited with code 255 without
    reporting", which multiprocessing makes up when a forkserver is gone and which blamed
    the student's code. The next launch gets a fresh forkserver."""
    if start == "cold":
        monkeypatch.setattr(template, "template", lambda: None)
    killed: list[int] = []
    with RankBox(ddp=False) as box:
        killer = threading.Thread(target=_kill_forkserver_once_ranks_run, args=(box, killed))
        killer.start()
        result = launch(_sum_later, 2, backend="relay", timeout=60)
        killer.join()
        again = launch(_sum_later, 2, backend="relay", timeout=60)
    assert killed, "the box's forkserver was not there to kill"
    if start == "warm":
        assert result.ok and result.results == [[2.0, 2.0], [2.0, 2.0]], result.failures
    else:
        assert not result.ok
        for failure in result.failures.values():
            assert "after the forkserver that started it was killed" in str(failure), failure
            assert "255" not in str(failure)
    assert again.ok and again.results == [[2.0, 2.0], [2.0, 2.0]], again.failures
