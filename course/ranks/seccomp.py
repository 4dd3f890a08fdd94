"""A graded rank's seccomp filter: no kernel object a sibling reaches through a shared file.

    forbid_shared_objects()      # on the rank, before its job: for it and all it starts

Ranks of one submission have namespaces of their own (:mod:`course.ranks.isolation`), but
they read the same files (Python, torch, the ``course`` package), and a few objects of the
kernel hang on a file rather than on a namespace: an advisory lock (whose range ``F_GETLK``
reads back: data), an inotify or dnotify watch (which sees a sibling open the file), a
keyring. The filter refuses those calls with ``EPERM`` (``seccomp(2)``, ``SECCOMP_RET_ERRNO``),
and every call of another ABI (i386, x32), whose numbers it does not know. Nothing a rank of
the course runs needs them.
"""

from __future__ import annotations

import ctypes
import os
import platform

__all__ = ["forbid_shared_objects"]

# What a rank may not call, per architecture (``AUDIT_ARCH_*``: the syscalls' numbers): the
# objects of the kernel that two ranks reach by a file they can both read, with no namespace
# of their own. Advisory locks (``flock``, ``fcntl``'s lock commands: a lock's range, read
# with ``F_GETLK``, carries data), inotify and dnotify (a sibling's opening of a shared file
# is an event), keyrings; and System V's shared memory, semaphores and message queues and
# POSIX message queues, which no rank needs and whose memory is the kernel's, not the
# process's (``shmget``, ``semget``, ``msgget``, ``mq_open``). A call of another ABI (i386,
# x32) is refused whole.
_SYSCALLS = {
    "x86_64": (0xC000003E, {"fcntl": 72, "flock": 73, "inotify": (253, 254, 294),
                            "keys": (248, 249, 250), "ipc": (29, 64, 68, 240)}),
    "aarch64": (0xC00000B7, {"fcntl": 25, "flock": 32, "inotify": (26, 27),
                             "keys": (217, 218, 219), "ipc": (194, 190, 186, 180)}),
}  # fmt: skip
# The commands of fcntl refused: the get, set and set-and-wait of locks, classic and per open
# file, then leases and directory notices (dnotify).
_FCNTL_REFUSED = (5, 6, 7, 36, 37, 38, 1024, 1026)
PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2


class _SockFilter(ctypes.Structure):
    _fields_ = (
        ("code", ctypes.c_ushort),
        ("jt", ctypes.c_ubyte),
        ("jf", ctypes.c_ubyte),
        ("k", ctypes.c_uint32),
    )


class _SockFprog(ctypes.Structure):
    _fields_ = (("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter)))


def _seccomp_program(arch: int, calls: dict) -> list[tuple[int, int, int, int]]:
    """The filter, as (code, jt, jf, k): refuse ``calls`` with EPERM, allow the rest."""
    load, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06
    allow, refuse = 0x7FFF0000, 0x00050000 | 1  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | EPERM
    program = [(load, 0, 0, 4), (jeq, 1, 0, arch), (ret, 0, 0, refuse)]  # its own ABI only
    program += [(load, 0, 0, 0), (jge, 0, 1, 0x40000000), (ret, 0, 0, refuse)]  # not x32's
    for nr in (calls["flock"], *calls["inotify"], *calls["keys"], *calls["ipc"]):
        program += [(jeq, 0, 1, nr), (ret, 0, 0, refuse)]
    program += [(jeq, 1, 0, calls["fcntl"]), (ret, 0, 0, allow), (load, 0, 0, 24)]  # its cmd
    for cmd in _FCNTL_REFUSED:
        program += [(jeq, 0, 1, cmd), (ret, 0, 0, refuse)]
    return [*program, (ret, 0, 0, allow)]


def forbid_shared_objects() -> str | None:
    """A seccomp filter on this process and all it starts (``seccomp(2)``): the calls of
    ``_SYSCALLS`` refused with EPERM; None, or why there is none (another architecture)."""
    arch, calls = _SYSCALLS.get(platform.machine(), (None, None))
    if arch is None:
        return f"no seccomp filter for {platform.machine()}"
    program = _seccomp_program(arch, calls)
    filters = (_SockFilter * len(program))(*(_SockFilter(*op) for op in program))
    prog = _SockFprog(len(program), filters)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0):
        return f"no seccomp filter: {os.strerror(ctypes.get_errno())}"
    return None
