"""Graded ranks of one submission share nothing but the relay: no file, socket or memory.

Rank 0 leaves a message by every route it has outside torch.distributed (a file in its
working folder, in ``/tmp`` and in ``/dev/shm``, a TCP server on loopback, an abstract unix
socket, System V shared memory and a message queue, its process's name in ``/proc``, a lock
on a file both can read, opening a file rank 1 watches with inotify, a pty, a flag set on the
stdin both inherited); after a barrier, rank 1 looks for each, and signals the process it
found by that name. On the notebook's path
(ranks on one machine) it finds them and rank 0 gets the signal; graded, each rank has
namespaces and folders of its own (``course.ranks.isolation``: a PID namespace and a
``/proc`` of its own among them, locks, inotify and System V IPC refused, ptys covered and
inherited devices opened again) and finds none, no signal arrives, and neither rank can
unmount its folders to look under them.
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
import ctypes, fcntl, os, signal, socket, struct, time
import torch.distributed as dist

KEY = 0x5EED
NAME = b"course-note"
PTYS = "/dev/pts"
SIGNALLED = []

def named(name):
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/comm", "rb") as f:
                if f.read().strip() == name:
                    pids.append(int(pid))
        except OSError:
            pass
    return pids

def routes():
    libc = ctypes.CDLL(None, use_errno=True)
    paths = ["note", "/tmp/note", "/dev/shm/note"]
    held = []
    shared = os.open(os.__file__, os.O_RDONLY)  # a file every rank can read
    watch = libc.inotify_init1(os.O_NONBLOCK) if dist.get_rank() == 1 else -1
    if watch >= 0:
        libc.inotify_add_watch(watch, os.__file__.encode(), 0x20)  # IN_OPEN
    ptys = set(os.listdir(PTYS)) if os.path.isdir(PTYS) else set()
    stdin = fcntl.fcntl(0, fcntl.F_GETFL)
    dist.barrier()
    if dist.get_rank() == 0:
        os.close(os.open(os.__file__, os.O_RDONLY))  # an event for rank 1's watch
        libc.msgget(KEY, 0o1666)  # IPC_CREAT
        fcntl.fcntl(0, fcntl.F_SETFL, stdin | os.O_APPEND)
        try:
            pty = os.open("/dev/ptmx", os.O_RDWR | os.O_NOCTTY)
            libc.unlockpt(pty)
            held.append(pty)
        except OSError:
            pass
        try:
            fcntl.lockf(shared, fcntl.LOCK_SH | fcntl.LOCK_NB, 1, 4242)
        except OSError:
            pass
        signal.signal(signal.SIGUSR1, lambda *_: SIGNALLED.append(1))
        libc.prctl(15, NAME, 0, 0, 0)  # PR_SET_NAME: its name in /proc/<pid>/comm
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
        for pid in named(NAME):
            found.append("name")
            os.kill(pid, signal.SIGUSR1)
        try:
            asked = struct.pack("hhqqi", fcntl.F_WRLCK, 0, 0, 0, 0)
            if struct.unpack("hhqqi", fcntl.fcntl(shared, fcntl.F_GETLK, asked))[2] == 4242:
                found.append("lock")
        except OSError:
            pass
        if watch >= 0:
            try:
                if os.read(watch, 4096):
                    found.append("inotify")
            except BlockingIOError:
                pass
        if libc.msgget(KEY, 0o666) != -1:
            found.append("msg")
        if fcntl.fcntl(0, fcntl.F_GETFL) & os.O_APPEND:
            found.append("flags")
        for name in (set(os.listdir(PTYS)) if os.path.isdir(PTYS) else set()) - ptys:
            try:
                os.close(os.open(f"{PTYS}/{name}", os.O_RDWR | os.O_NOCTTY))
                found.append("pty")
            except OSError:
                pass
    dist.barrier()
    if dist.get_rank() == 0:
        time.sleep(0.2)  # a signal sent is delivered at once; a little slack all the same
        found += ["signal"] if SIGNALLED else []
    if dist.get_rank() == 0:  # leave the machine clean
        libc.shmctl(libc.shmget(KEY, 0, 0o666), 0, None)  # IPC_RMID
        libc.msgctl(libc.msgget(KEY, 0o666), 0, None)
        fcntl.fcntl(0, fcntl.F_SETFL, stdin)
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
    routes = {"note", "/tmp/note", "('127.0.0.1', 47613)", "shm", "name", "lock", "inotify"}
    routes |= {"msg", "flags", "pty"}
    assert routes <= set(found), found
    assert result.results[0] == ["signal"], result.results


def test_graded_ranks_share_no_file_socket_or_memory() -> None:
    """Graded, does rank 1 find none of rank 0's messages, nor signal it, and neither rank
    unmount its own folders?"""
    with RankBox(ddp=False):
        result = launch(StudentCode((("routes", ROUTES),), "routes"), 2, timeout=60)
    assert result.ok, result.failures
    assert result.results == [[], []], result.results
