"""Are graded ranks confined? Each probe runs on ranks forked in the sandbox, as in grading."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import cloudpickle
import pytest
from marks import CONFINED

import course
from course.grading import sandbox
from course.grading.rankbox import RankBox
from course.grading.slots import lease_uid
from course.ranks import launch

pytestmark = [
    pytest.mark.slow,
    pytest.mark.ranks,
    CONFINED,
]
# Graded ranks see only Python and the course package: send this module's functions by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _attempt(fn: object) -> str:
    try:
        fn()
    except Exception as err:  # noqa: BLE001 - the probe reports any failure by its type
        return type(err).__name__
    return "ok"


def _bomb() -> int:
    procs = []
    try:
        for _ in range(1000):
            procs.append(subprocess.Popen(["sleep", "60"]))  # noqa: PERF401 - stops at the limit, keeping what started
    except OSError:
        pass
    for p in procs:
        p.kill()
        p.wait()
    return len(procs)


def _probe(root: str, port: int, pkg: str) -> dict:
    """On a graded rank: what can code there reach?"""
    import torch
    import torch.distributed as dist

    total = torch.ones(1) * (dist.get_rank() + 1)
    dist.all_reduce(total)
    return {
        "uid": os.getuid(),
        "internet": _attempt(lambda: socket.create_connection(("1.1.1.1", 80), timeout=3)),
        "host_port": _attempt(lambda: socket.create_connection(("127.0.0.1", port), timeout=3)),
        "source": _attempt(lambda: Path(root, "source/a/a.ipynb").read_text()),
        "gradebook": _attempt(lambda: Path(root, "gradebook.db").read_text()),
        "other_student": _attempt(lambda: os.listdir(root + "/submitted/bob/a")),
        "write_cwd": _attempt(lambda: Path("out.txt").write_text("x")),
        "write_course_package": _attempt(lambda: Path(pkg, "evil.py").write_text("x")),
        "write_course_root": _attempt(lambda: Path(root, "evil.txt").write_text("x")),
        "memory": _attempt(lambda: bytearray(8 * 2**30)),
        "processes": _bomb() if dist.get_rank() == 0 else 0,
        "ranks": total.item(),
    }


@pytest.fixture(scope="module")
def probed(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("sandbox") / "course"
    for folder in ("source/a", "submitted/bob/a"):
        (root / folder).mkdir(parents=True)
    (root / "source/a/a.ipynb").write_text('{"key": "b"}')
    (root / "submitted/bob/a/a.ipynb").write_text("{}")
    (root / "gradebook.db").write_text("secret grades")
    listener = socket.create_server(("127.0.0.1", 0))
    try:
        with RankBox(uid=sandbox.SANDBOX_UID, ddp=False):
            result = launch(_probe, 2, str(root), listener.getsockname()[1],
                            str(Path(course.__file__).parent), timeout=120)  # fmt: skip
    finally:
        listener.close()
    assert result.ok, result.failures
    return {**result.results[0], "_root": root, "_ranks": [r["ranks"] for r in result.results]}


def test_graded_code_is_not_root(probed: dict) -> None:
    """Does student code run as an unprivileged uid?"""
    assert probed["uid"] == sandbox.SANDBOX_UID != 0


def test_no_network(probed: dict) -> None:
    """Can graded code reach neither the internet nor a port on the host's loopback?"""
    assert probed["internet"] != "ok"
    assert probed["host_port"] != "ok"


def test_course_files_are_invisible(probed: dict) -> None:
    """Can graded code read neither source/, the gradebook nor another student's submission?"""
    assert probed["source"] == "FileNotFoundError"
    assert probed["gradebook"] == "FileNotFoundError"
    assert probed["other_student"] == "FileNotFoundError"


def test_writes_only_in_its_own_folder(probed: dict) -> None:
    """Can graded code write its scratch folder but not the course package or the course root?"""
    assert probed["write_cwd"] == "ok"
    assert probed["write_course_package"] in ("OSError", "PermissionError")
    assert probed["write_course_root"] in ("FileNotFoundError", "PermissionError", "OSError")
    assert not (probed["_root"] / "evil.txt").exists()


def test_memory_is_limited(probed: dict) -> None:
    """Does allocating beyond the address-space limit fail with MemoryError?"""
    assert probed["memory"] == "MemoryError"


def test_fork_bomb_is_bounded(probed: dict) -> None:
    """Does the process limit stop a loop that starts processes?"""
    assert probed["processes"] < sandbox.Limits().processes


def test_multi_rank_checks_still_work(probed: dict) -> None:
    """Do two gloo ranks still all-reduce inside the sandbox (their own loopback)?"""
    assert probed["_ranks"] == [3.0, 3.0]


def test_confine_builds_a_bwrap_command() -> None:
    """Does confine() unshare the network and drop to the sandbox uid before the command?"""
    argv = sandbox.confine(["python", "-c", "pass"], rw=["/tmp"])
    assert argv[0] == "bwrap" and "--unshare-net" in argv and "--clearenv" in argv
    assert argv[-3:] == ["python", "-c", "pass"]
    assert f"--reuid={sandbox.SANDBOX_UID}" in argv


def test_confine_runs_as_the_uid_the_environment_names(monkeypatch: pytest.MonkeyPatch) -> None:
    """Does confined code run as $COURSE_SANDBOX_UID (a class run's slot), else as nobody?"""
    monkeypatch.setenv(sandbox.UID_ENV, "62001")
    assert "--reuid=62001" in sandbox.confine(["true"])
    assert sandbox.sandbox_uid() == 62001
    monkeypatch.delenv(sandbox.UID_ENV)
    assert f"--reuid={sandbox.SANDBOX_UID}" in sandbox.confine(["true"])
    assert sandbox.sandbox_uid() == sandbox.SANDBOX_UID


def test_a_confined_command_runs_as_the_slot_uid(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run for real: does a confined `id` report the uid $COURSE_SANDBOX_UID names?"""
    with lease_uid() as lease:
        monkeypatch.setenv(sandbox.UID_ENV, str(lease.uid))
        cmd = sandbox.confine(["id", "-u"])
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == str(lease.uid)
