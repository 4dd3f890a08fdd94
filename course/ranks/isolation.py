"""Each graded rank a machine of its own: namespaces of its own, inside its submission's.

    isolate(conn, private, run_dir, before)   # the rank, first thing, still single-threaded
    map_ids(pid)                     # the launcher, as root, when the rank asks (its pipe)

The ranks of one submission share its sandbox (``course.grading.sandbox``). Before a graded
rank runs anything, still single-threaded (``unshare(CLONE_NEWUSER)`` refuses a process with
threads), it takes its own user, PID, network, IPC and mount namespaces (``unshare(2)``,
``user_namespaces(7)``, ``pid_namespaces(7)``): no loopback, abstract socket, System V or
POSIX shared memory is shared with a sibling rank. Its uid and gid are mapped into its user
namespace by the launcher (:func:`map_ids`, root outside the sandbox): the rank is not
dumpable, so it cannot write its own ``/proc/self/uid_map``, and making it dumpable for that
would let a sibling attach to it. A new PID namespace holds the rank's next child, not the
rank: the rank forks, the child (pid 1 there) runs the job, and the rank waits and ends as
it ended (:func:`mirror_exit`). As a namespace's init, the job ignores a signal it sends
itself that it has no handler for (``kill(getpid(), SIGTERM)``); a fault still ends it. No
sibling's pid is in the child's namespace, so it can neither signal nor name one, and
:func:`private_proc` puts a ``/proc`` over the sandbox's that shows this process alone (and
the system's own files: ``cpuinfo``, ``meminfo``...): no sibling's command line, name or
state to read. :func:`hide` binds ``/dev/null`` over the files of torch built-ins the check
refuses (``course.checks.refusals``: their source and bytecode), read before the student's
code runs: no second copy of them can be imported there. :func:`cover` puts a fresh tmpfs of
its own over every folder the ranks could write together (the sandbox's scratch folder,
``/tmp``, ``/dev/shm``; what the sandbox bound inside them, a course checked out under
``/tmp``, bound again on top), so a file one rank writes is not there for another. Last,
:func:`drop_capabilities` drops every capability the rank had in its new namespaces: it
cannot unmount what covers the sandbox's folders to look under (and in a namespace it makes
itself they are locked). :func:`isolate` does all of it, in that order, with the seccomp
filter of :mod:`course.ranks.seccomp` last but one. What the launcher reads a rank by (its
output files, opened before, its relay and result links) are descriptors it already holds.
Its only channel to a sibling is then the relay, which the grader records.
"""

from __future__ import annotations

import ctypes
import fcntl
import linecache
import os
import signal
import stat
import tempfile
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from typing import NoReturn

from course.ranks import seccomp

__all__ = [
    "CLONE_NEWPID",
    "PRIVATE_SIZE",
    "SANDBOX_SHARED",
    "cover",
    "die_with_parent",
    "drop_capabilities",
    "hide",
    "isolate",
    "map_ids",
    "mirror_exit",
    "own_descriptions",
    "private_proc",
    "unshare_own",
]  # fmt: skip

# Folders of the sandbox's own every rank of it could write (beside its scratch folder), and
# its ptys (``/dev/ptmx`` is ``pts/ptmx``): a pty one rank opens, another could open too.
SANDBOX_SHARED = ("/tmp", "/dev/shm", "/dev/pts")  # noqa: S108 - not used as temporary files: covered
PRIVATE_SIZE = 64 * 2**20  # bytes of each private tmpfs (charged to the submission's cgroup)
CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWUSER, CLONE_NEWNET = 0x20000, 0x8000000, 0x10000000, 0x40000000
CLONE_NEWPID = 0x20000000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_BIND, MS_REC = 0x2, 0x4, 0x8, 0x1000, 0x4000
MNT_DETACH = 0x2
PR_SET_PDEATHSIG = 1
# What a private /proc keeps of the sandbox's: the system's own files, not a process's.
PROC_SYSTEM = ("cpuinfo", "meminfo", "stat", "uptime", "loadavg", "version", "filesystems")
_CAP_VERSION_3 = 0x20080522


class _CapHeader(ctypes.Structure):
    _fields_ = (("version", ctypes.c_uint32), ("pid", ctypes.c_int))


class _CapData(ctypes.Structure):
    _fields_ = (
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    )


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def unshare_own() -> int:
    """Take user, PID, network, IPC and mount namespaces of this process's own (PID's holds
    its next child); the flags taken: 0 if the kernel gives none (the rank then runs on in
    its submission's sandbox), the rest without ``CLONE_NEWPID`` if it gives no PID one."""
    shared = CLONE_NEWUSER | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWNS
    for flags in (shared | CLONE_NEWPID, shared):
        if _libc().unshare(flags) == 0:
            return flags
    return 0


def mirror_exit(child: int) -> NoReturn:
    """Wait for ``child`` (the rank's job, in its own PID namespace), then end as it ended:
    with its exit code, or killed by the same signal."""
    _, status = os.waitpid(child, 0)
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    os._exit(os.waitstatus_to_exitcode(status))


def die_with_parent() -> None:
    """SIGKILL this process when the process that forked it ends."""
    _libc().prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def map_ids(pid: int) -> bool:
    """Map process ``pid``'s uid and gid to themselves in its new user namespace (run by
    the launcher, as root outside it); False if this process may not."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            ids = {ln[:4]: ln.split()[1] for ln in status if ln.startswith(("Uid:", "Gid:"))}
        for name, key in (("uid_map", "Uid:"), ("gid_map", "Gid:")):
            with open(f"/proc/{pid}/{name}", "w", encoding="ascii") as f:
                f.write(f"{ids[key]} {ids[key]} 1")
    except (OSError, KeyError, IndexError, ValueError):
        return False
    return True


def _mounts_below(path: str) -> list[str]:
    """The outermost mount points strictly inside ``path``, from this process's mountinfo."""
    with open("/proc/self/mountinfo", encoding="utf-8") as info:
        points = sorted({line.split()[4] for line in info})
    prefix = path.rstrip("/") + "/"
    inside = [p for p in points if p.startswith(prefix)]
    return [p for p in inside if not any(p.startswith(q + "/") for q in inside if q != p)]


def hide(files: Sequence[str]) -> str | None:
    """``/dev/null`` bound over each of ``files`` in this rank's mount namespace (it reads
    as empty); None, or what failed."""
    libc = _libc()
    for path in files:
        if libc.mount(b"/dev/null", path.encode(), None, MS_BIND, None):
            return f"{path} not hidden: mount: {os.strerror(ctypes.get_errno())}"
    return None


def cover(private: Sequence[str]) -> str | None:
    """A fresh tmpfs over each folder of ``private`` that exists; None, or what failed."""
    libc = _libc()
    options = f"size={PRIVATE_SIZE},mode=1777".encode()
    failed = None
    for path in private:
        if not os.path.isdir(path):
            continue
        below = _mounts_below(path)  # what the sandbox bound inside it (a course under /tmp)
        held = [os.open(m, os.O_PATH | os.O_DIRECTORY) for m in below]
        if libc.mount(b"tmpfs", path.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, options):
            failed = failed or f"no private {path}: mount: {os.strerror(ctypes.get_errno())}"
        else:
            for mount, fd in zip(below, held, strict=True):  # put them back, as they were
                os.makedirs(mount, exist_ok=True)
                source = f"/proc/self/fd/{fd}".encode()
                if libc.mount(source, mount.encode(), None, MS_BIND | MS_REC, None):
                    failed = failed or f"{mount} not bound again: {os.strerror(ctypes.get_errno())}"
        for fd in held:
            os.close(fd)
    return failed


def private_proc() -> str | None:
    """A ``/proc`` of this process alone over the sandbox's: ``self`` (and ``1``, its pid in
    its own PID namespace) this process's folder, the system's files of ``PROC_SYSTEM`` and
    ``sys`` as they were; None, or what failed. Built in a tmpfs of its own in ``/tmp``
    (private already), then bound over ``/proc``."""
    libc = _libc()
    me = os.readlink("/proc/self")  # its pid in the sandbox's /proc
    staging = tempfile.mkdtemp(prefix="proc-", dir="/tmp")
    flags = MS_NOSUID | MS_NODEV | MS_NOEXEC
    if libc.mount(b"tmpfs", staging.encode(), b"tmpfs", flags, b"size=64k"):
        return f"no private /proc: mount: {os.strerror(ctypes.get_errno())}"
    binds = [(f"/proc/{me}", "self")]
    binds += [(f"/proc/{n}", n) for n in (*PROC_SYSTEM, "sys") if os.path.exists(f"/proc/{n}")]
    for source, name in binds:
        target = os.path.join(staging, name)
        if os.path.isdir(source):
            os.mkdir(target)
        else:
            open(target, "w").close()  # an empty file to mount on
        if libc.mount(source.encode(), target.encode(), None, MS_BIND | MS_REC, None):
            return f"no private /proc: {source}: {os.strerror(ctypes.get_errno())}"
    for link, to in (("1", "self"), ("thread-self", "self"), ("mounts", "self/mounts")):
        os.symlink(to, os.path.join(staging, link))
    if libc.mount(staging.encode(), b"/proc", None, MS_BIND | MS_REC, None):
        return f"no private /proc: bind: {os.strerror(ctypes.get_errno())}"
    libc.umount2(staging.encode(), MNT_DETACH)
    os.rmdir(staging)
    return None


def own_descriptions() -> None:
    """Every device this process inherited open (its stdin, ``/dev/null`` stand-ins) opened
    again as its own, at the same descriptor: a description shared with a sibling holds
    flags either can set and read (``F_SETFL``, ``F_SETSIG``), a channel between them."""
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            path = os.readlink(f"/proc/self/fd/{fd}")
            device = stat.S_ISCHR(os.fstat(fd).st_mode)
            mode = fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE
        except OSError:  # the listing's own descriptor, closed by now
            continue
        if not device or not path.startswith("/dev/"):
            continue
        fresh = os.open(path, mode)
        os.dup2(fresh, fd, inheritable=os.get_inheritable(fd))
        os.close(fresh)


def drop_capabilities() -> str | None:
    """Drop every capability this process holds (those of its own user namespace)."""
    header, data = _CapHeader(_CAP_VERSION_3, 0), (_CapData * 2)()
    if _libc().capset(ctypes.byref(header), data) != 0:
        return f"its capabilities could not be dropped: {os.strerror(ctypes.get_errno())}"
    return None


def isolate(
    conn: Connection, private: tuple[str, ...], run_dir: str, before: Callable[[], list[str]]
) -> None:
    """A graded rank's first step: namespaces and folders of its own (module docstring), its
    ids mapped by the caller, asked on its pipe; then, where it has a PID namespace of its own,
    the job goes on in a child, pid 1 there (this process waits, and ends as it ends), with a
    ``/proc`` of its own; ``before`` run, and the files it names hidden; its working and run
    folders made again, empty, in its own tmpfs; its devices its own; the seccomp filter
    (:mod:`course.ranks.seccomp`). Where the kernel gives no namespaces the rank runs on in
    its submission's sandbox, shared with its siblings."""
    flags = unshare_own()  # before ``before``: an import could start a thread
    if not flags:
        conn.send_bytes(b"shared")
        before()
        return
    conn.send_bytes(b"map")
    if conn.recv_bytes() != b"mapped":  # a tmpfs of its own would take no file
        conn.send_bytes(b"same")
        before()
        drop_capabilities()
        return
    own_pids = bool(flags & CLONE_NEWPID)
    if own_pids:
        _go_on_in_a_child(conn)
    else:  # a kernel with no PID namespace for it: the job runs here, /proc stays shared
        conn.send_bytes(b"same")
    here = os.getcwd()
    hide(before())  # what it could not hide is still refused, only readable
    linecache.clearcache()
    cover(private)  # what it could not cover stays its submission's, shared
    if own_pids:
        private_proc()
    own_descriptions()
    seccomp.forbid_shared_objects()
    drop_capabilities()
    for folder in (here, run_dir):
        os.makedirs(folder, exist_ok=True)
    os.chdir(here)  # the old folder, under a new tmpfs, is no longer reachable


def _go_on_in_a_child(conn: Connection) -> None:
    """Fork: the child, pid 1 of this rank's new PID namespace, returns and runs the job;
    this process tells the caller it forked (the caller finds the child itself), lets the
    child go on, and ends as it ends."""
    go, let_go = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(let_go)
        die_with_parent()
        if not os.read(go, 1):  # the rank ended before letting it go
            os._exit(1)
        os.close(go)
        return
    os.close(go)
    conn.send_bytes(b"forked")
    conn.close()
    os.write(let_go, b"1")
    mirror_exit(child)
