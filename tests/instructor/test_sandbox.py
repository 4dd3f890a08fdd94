"""Is a grading kernel confined? Each probe runs as notebook code inside the sandboxed kernel."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

import course
from course.instructor import sandbox

pytestmark = [
    pytest.mark.slow,
    pytest.mark.ranks,
    pytest.mark.skipif(
        not sandbox.available() or os.geteuid() != 0,
        reason="needs bubblewrap, setpriv and prlimit, and root to drop to the sandbox uid",
    ),
]

PROBE = """
import json, os, socket, subprocess
ROOT, PORT, PKG = {root!r}, {port!r}, {pkg!r}

def attempt(fn):
    try:
        fn()
        return "ok"
    except Exception as err:
        return type(err).__name__

def bomb():
    procs = []
    try:
        for _ in range(1000):
            procs.append(subprocess.Popen(["sleep", "60"]))
    except OSError:
        pass
    for p in procs:
        p.kill()
        p.wait()
    return len(procs)

def two_ranks():
    import torch
    import torch.distributed as dist
    from course.ranks import run

    def total():
        t = torch.ones(1) * (dist.get_rank() + 1)
        dist.all_reduce(t)
        return t.item()

    return run(total, 2, timeout=60)

r = {{
    "uid": os.getuid(),
    "internet": attempt(lambda: socket.create_connection(("1.1.1.1", 80), timeout=3)),
    "host_port": attempt(lambda: socket.create_connection(("127.0.0.1", PORT), timeout=3)),
    "source": attempt(lambda: open(ROOT + "/source/a/a.ipynb").read()),
    "gradebook": attempt(lambda: open(ROOT + "/gradebook.db").read()),
    "other_student": attempt(lambda: os.listdir(ROOT + "/submitted/bob/a")),
    "write_cwd": attempt(lambda: open("out.txt", "w").write("x")),
    "write_course_package": attempt(lambda: open(PKG + "/evil.py", "w").write("x")),
    "write_course_root": attempt(lambda: open(ROOT + "/evil.txt", "w").write("x")),
    "memory": attempt(lambda: bytearray(8 * 2**30)),
    "processes": bomb(),
    "ranks": two_ranks(),
}}
print(json.dumps(r))
"""


@pytest.fixture(scope="module")
def probed(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("sandbox") / "course"
    for folder in ("source/a", "submitted/bob/a", "autograded/alice/a"):
        (root / folder).mkdir(parents=True)
    (root / "source/a/a.ipynb").write_text('{"key": "b"}')
    (root / "submitted/bob/a/a.ipynb").write_text("{}")
    (root / "gradebook.db").write_text("secret grades")
    listener = socket.create_server(("127.0.0.1", 0))
    code = PROBE.format(
        root=str(root), port=listener.getsockname()[1], pkg=str(Path(course.__file__).parent)
    )
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code)])
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    cwd = root / "autograded/alice/a"
    client = NotebookClient(
        nb,
        timeout=300,
        kernel_manager_class=sandbox.SandboxKernelManager,
        resources={"metadata": {"path": str(cwd)}},
    )
    try:
        client.execute()
    finally:
        listener.close()
    outputs = [o for o in nb.cells[0].outputs if o.get("name") == "stdout"]
    assert outputs, nb.cells[0].outputs
    result = json.loads(outputs[-1]["text"].strip().splitlines()[-1])
    result["_root"], result["_cwd"] = root, cwd
    return result


def test_kernel_is_not_root(probed: dict) -> None:
    """Does student code run as an unprivileged uid?"""
    assert probed["uid"] == sandbox.SANDBOX_UID != 0


def test_no_network(probed: dict) -> None:
    """Can the kernel reach neither the internet nor a port on the host's loopback?"""
    assert probed["internet"] != "ok"
    assert probed["host_port"] != "ok"


def test_course_files_are_invisible(probed: dict) -> None:
    """Can the kernel read neither source/, the gradebook nor another student's submission?"""
    assert probed["source"] == "FileNotFoundError"
    assert probed["gradebook"] == "FileNotFoundError"
    assert probed["other_student"] == "FileNotFoundError"


def test_writes_only_in_its_own_folder(probed: dict) -> None:
    """Can the kernel write its working dir but not the course package or the course root?"""
    assert probed["write_cwd"] == "ok" and (probed["_cwd"] / "out.txt").exists()
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
    """Do two gloo ranks still all-reduce inside the sandbox (unix sockets, own loopback)?"""
    assert probed["ranks"] == [3.0, 3.0]


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
    assert sandbox.SandboxKernelManager().sandbox_uid == 62001
    monkeypatch.delenv(sandbox.UID_ENV)
    assert f"--reuid={sandbox.SANDBOX_UID}" in sandbox.confine(["true"])
    assert sandbox.SandboxKernelManager().sandbox_uid == sandbox.SANDBOX_UID


def test_a_confined_command_runs_as_the_slot_uid(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run for real: does a confined `id` report the uid $COURSE_SANDBOX_UID names?"""
    monkeypatch.setenv(sandbox.UID_ENV, "62001")
    cmd = sandbox.confine(["id", "-u"])
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "62001"
