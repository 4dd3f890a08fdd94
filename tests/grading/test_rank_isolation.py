"""Graded ranks of one submission share nothing but the relay: no file, socket or memory.

Rank 0 leaves a message by every route it has outside torch.distributed (a file in its
working folder, in ``/tmp`` and in ``/dev/shm``, a TCP server on loopback, an abstract unix
socket, System V shared memory); after a barrier, rank 1 looks for each. On the notebook's
path (ranks on one machine) it finds them; graded, each rank has namespaces and folders of
its own (``course.ranks.isolation``) and finds none, and cannot unmount its folders to look
under them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from course.grading import sandbox
from course.grading.rankbox import RankBox
from course.grading.student import StudentCode
from course.ranks import launch

pytestmark = [
    pytest.mark.ranks,
    pytest.mark.slow,
    pytest.mark.skipif(not sandbox.available(), reason="needs bubblewrap, setpriv and prlimit"),
]

ROUTES = """
import ctypes, os, socket
import torch.distributed as dist

KEY = 0x5EED

def routes():
    libc = ctypes.CDLL(None, use_errno=True)
    paths = ["note", "/tmp/note", "/dev/shm/note"]
    held = []
    if dist.get_rank() == 0:
        for path in paths:
            try:
                with open(path, "w") as f:
                    f.write("sum")
            except OSError:
                pass
        for family, address in ((socket.AF_INET, ("127.0.0.1", 47613)),
                                (socket.AF_UNIX, "\\0course-note")):
            try:
                server = socket.socket(family, socket.SOCK_STREAM)
                server.bind(address)
                server.listen()
                held.append(server)
            except OSError:
                pass
        libc.shmget(KEY, 4096, 0o1666)
    dist.barrier()
    found = []
    if dist.get_rank() == 1:
        found += [path for path in paths if os.path.exists(path)]
        for family, address in ((socket.AF_INET, ("127.0.0.1", 47613)),
                                (socket.AF_UNIX, "\\0course-note")):
            try:
                socket.create_connection(address, 1) if family == socket.AF_INET else (
                    socket.socket(family).connect(address))
                found.append(str(address))
            except OSError:
                pass
        if libc.shmget(KEY, 0, 0o666) != -1:
            found.append("shm")
    dist.barrier()
    if dist.get_rank() == 0:  # leave the machine clean
        libc.shmctl(libc.shmget(KEY, 0, 0o666), 0, None)  # IPC_RMID
        for path in paths:
            if os.path.exists(path):
                os.unlink(path)
    for path in ["/tmp", os.path.dirname(os.getcwd())]:
        if libc.umount2(path.encode(), 2) == 0:  # MNT_DETACH
            found.append(f"unmounted {path}")
    return found
"""


def test_ranks_find_each_others_messages_on_the_notebooks_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Do the routes work where ranks are not isolated (so the graded test can fail)?"""
    monkeypatch.chdir(tmp_path)  # the ranks' working folder is the caller's
    namespace: dict = {}
    exec(ROUTES, namespace)  # noqa: S102 - the routes, run where nothing isolates the ranks
    result = launch(namespace["routes"], 2, timeout=60)
    assert result.ok, result.failures
    found = result.results[1]
    assert {"note", "/tmp/note", "('127.0.0.1', 47613)", "shm"} <= set(found), found


def test_graded_ranks_share_no_file_socket_or_memory() -> None:
    """Graded, does rank 1 find none of rank 0's messages, and neither rank unmount its own
    folders?"""
    with RankBox():
        result = launch(StudentCode((("routes", ROUTES),), "routes"), 2, timeout=60)
    assert result.ok, result.failures
    assert result.results == [[], []], result.results
