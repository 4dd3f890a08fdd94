"""Each graded rank a machine of its own: namespaces of its own, inside its submission's.

    asked = unshare_own()            # the rank, first thing, still single-threaded
    map_ids(pid)                     # the launcher, as root, when the rank asks
    cover([scratch, *SANDBOX_SHARED])  # the rank, once its ids are mapped

The ranks of one submission share its sandbox (``course.grading.sandbox``). Before a graded
rank runs anything, still single-threaded (``unshare(CLONE_NEWUSER)`` refuses a process with
threads), it takes its own user, network, IPC and mount namespaces (``unshare(2)``,
``user_namespaces(7)``): no loopback, abstract socket, System V or POSIX shared memory is
shared with a sibling rank. Its uid and gid are mapped into its user namespace by the
launcher (:func:`map_ids`, root outside the sandbox): the rank is not dumpable, so it cannot
write its own ``/proc/self/uid_map``, and making it dumpable for that would let a sibling
attach to it. Then :func:`cover` puts a fresh tmpfs of its own over every folder the ranks
could write together (the sandbox's scratch folder, ``/tmp``, ``/dev/shm``; what the sandbox
bound inside them, a course checked out under ``/tmp``, bound again on top), so a file one
rank writes is not there for another, and drops every capability the rank had in its new
namespace: it cannot unmount them to look under (and in a namespace it makes itself they
are locked). What the launcher reads a rank by (its output files, opened before, its relay
and result links) are descriptors it already holds. Its only channel to a sibling is then
the relay, which the grader records.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Sequence

__all__ = ["PRIVATE_SIZE", "SANDBOX_SHARED", "cover", "map_ids", "unshare_own"]

# Folders of the sandbox's own every rank of it could write (beside its scratch folder).
SANDBOX_SHARED = ("/tmp", "/dev/shm")  # noqa: S108 - not used as temporary files: covered
PRIVATE_SIZE = 64 * 2**20  # bytes of each private tmpfs (charged to the submission's cgroup)
CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWUSER, CLONE_NEWNET = 0x20000, 0x8000000, 0x10000000, 0x40000000
MS_NOSUID, MS_NODEV, MS_BIND, MS_REC = 0x2, 0x4, 0x1000, 0x4000
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


def unshare_own() -> bool:
    """Take user, network, IPC and mount namespaces of this process's own; False if the
    kernel gives none (the rank then runs on in its submission's sandbox)."""
    flags = CLONE_NEWUSER | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWNS
    return _libc().unshare(flags) == 0


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


def cover(private: Sequence[str]) -> str | None:
    """A fresh tmpfs over each folder of ``private`` that exists, then no capabilities
    (dropped whatever else failed); None, or what failed."""
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
    header, data = _CapHeader(_CAP_VERSION_3, 0), (_CapData * 2)()
    if libc.capset(ctypes.byref(header), data) != 0:
        return f"its capabilities could not be dropped: {os.strerror(ctypes.get_errno())}"
    return failed
