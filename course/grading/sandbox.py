"""Confinement for code a submission runs: no network, no view of the course, another uid.

Grading runs a submission's code only on ranks (:mod:`course.grading.rankbox`), forked
from a forkserver that :func:`confine` starts inside bubblewrap
(https://github.com/containers/bubblewrap) with:

* its own network namespace (only its own loopback: no internet, no host ports);
* a read-only view of the system (``/usr``, ``/etc``, ``/lib``: not ``/opt``), the Python
  install and the ``course`` package only (``hide`` blanks files in it and empties
  folders): a course checkout any of these cover (the one the ``course`` package or the
  working folder is in, found by its ``source/``, ``gradebook.db``...) is empty there but
  for its virtualenv and ``course`` package, so ``source/``, ``gradebook.db`` and other
  students' folders are not in its file system, wherever the course is checked out;
* write access to the folders it is given and a private ``/tmp`` (tmpfs, size-capped);
* its own PID namespace, unless asked to keep the caller's pids;
* an unprivileged uid and resource limits (prlimit): address space per process, number of
  processes, open files, file size. The uid is ``$COURSE_SANDBOX_UID`` (``nobody``, 65534,
  when unset): a class run gives each worker slot its own (62000 + slot), so the process
  limit, which the kernel counts per uid, is per submission, and whatever a submission left
  running can be stopped without touching the others (:mod:`course.grading.slots`).

Confine any command: ``python -m course.grading.sandbox --rw DIR -- python script.py``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "SANDBOX_UID",
    "SLOT_UID_BASE",
    "UID_ENV",
    "Limits",
    "SandboxUnavailable",
    "available",
    "confine",
    "give_to_sandbox",
    "sandbox_env",
    "sandbox_uid",
]

UID_ENV = "COURSE_SANDBOX_UID"  # the uid confined code runs as; set per slot by classrun
SANDBOX_UID = 65534  # nobody: the uid when COURSE_SANDBOX_UID is unset
# Class runs: worker slot i grades as uid 62000 + i. These uids must belong to no account:
# every process they own is killed after each submission (course.grading.slots).
SLOT_UID_BASE = 62000
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/etc")
PACKAGE = Path(__file__).resolve().parents[1]  # the course package
# What marks a course checkout's root (never in the sandbox's view, wherever it lives).
COURSE_MARKERS = ("source", "gradebook.db", "submitted", "autograded", "nbgrader_config.py")
ENV_KEEP = ("LANG", "LC_ALL", "LC_CTYPE", "TZ", "NBGRADER_EXECUTION", "OMP_NUM_THREADS")


class SandboxUnavailable(RuntimeError):  # noqa: N818 - says what it means; not an error of the caller's
    """bubblewrap or setpriv is missing, or this user cannot drop to the sandbox uid."""


def sandbox_uid() -> int:
    """The uid confined code runs as: ``$COURSE_SANDBOX_UID``, else ``nobody``; never root."""
    raw = os.environ.get(UID_ENV, "").strip()
    if not raw:
        return SANDBOX_UID
    if not (raw.isascii() and raw.isdigit()) or int(raw) == 0:
        raise SandboxUnavailable(f"{UID_ENV}={raw!r} is not an unprivileged uid (an integer > 0)")
    return int(raw)


@dataclass(frozen=True)
class Limits:
    """Resource limits applied with prlimit to every process in the sandbox."""

    address_space: int = 6 * 2**30  # bytes per process (torch + gloo reserve ~1.5 GB virtual)
    processes: int = 256  # per uid, threads included: bounds a fork bomb
    open_files: int = 1024
    file_size: int = 512 * 2**20  # largest file a process may write
    tmp_size: int = 512 * 2**20  # the private /tmp (tmpfs)


def available() -> bool:
    """Can this machine confine code (bwrap, setpriv and prlimit present)?"""
    return bool(shutil.which("bwrap") and shutil.which("setpriv") and shutil.which("prlimit"))


def _ro_paths() -> list[str]:
    """What the sandbox may read: system dirs, the Python install, the ``course`` package."""
    paths = [p for p in SYSTEM_DIRS if os.path.exists(p) and not os.path.islink(p)]
    paths += [sys.base_prefix, sys.prefix, str(PACKAGE)]
    # Other sys.path entries (editable installs) but never the cwd or a course checkout root.
    for entry in sys.path:
        if entry and os.path.isdir(entry) and not _is_course_root(entry):
            paths.append(entry)
    return sorted({os.path.realpath(p) for p in paths})


def _is_course_root(path: str) -> bool:
    """Does ``path`` hold a course's instructor side (``source/``, a gradebook...)?"""
    return any(os.path.lexists(os.path.join(path, name)) for name in COURSE_MARKERS)


def _course_roots(cwd: str | None) -> list[str]:
    """The course checkouts this grader runs from: the one around the ``course`` package, and
    the one the grader's (or the sandbox's) working folder is in, wherever they live."""
    starts = [PACKAGE, Path.cwd().resolve()]
    starts += [Path(cwd).resolve()] if cwd else []
    roots = {str(d) for start in starts for d in (start, *start.parents) if _is_course_root(str(d))}
    return sorted(roots - {"/"})


def _inside(path: str, folder: str) -> bool:
    """Is ``path`` strictly inside ``folder``?"""
    return path.startswith(folder.rstrip("/") + "/")


def _outermost(paths: Sequence[str]) -> list[str]:
    """Drop paths already covered by another one (binding both would be redundant)."""
    real = sorted({os.path.realpath(p) for p in paths})
    kept: list[str] = []
    for p in real:
        if not any(p == k or _inside(p, k) for k in kept):
            kept.append(p)
    return kept


def _view_args(ro_paths: Sequence[str], cwd: str | None) -> list[str]:
    """Bind ``ro_paths`` read-only, with every course checkout they cover emptied, then what
    of ``ro_paths`` lies inside one (its virtualenv, the ``course`` package) bound again."""
    outer = _outermost(ro_paths)
    masks = _outermost([m for m in _course_roots(cwd) if any(_inside(m, p) for p in outer)])
    args: list[str] = []
    for p in outer:
        args += ["--ro-bind", p, p]
    for mask in masks:
        again = _outermost([p for p in ro_paths if _inside(p, mask)])
        args += ["--tmpfs", mask, *_dirs_args(again, below=mask)]
        for p in again:
            args += ["--ro-bind", p, p]
        args += ["--remount-ro", mask]
    return args


def _dirs_args(paths: Sequence[str], below: str = "/") -> list[str]:
    """Create every parent of ``paths`` (inside ``below``) world-traversable (bwrap makes
    them 0700)."""
    parents: set[str] = set()
    for p in paths:
        for parent in Path(p).parents:
            # /tmp is the sandbox's own tmpfs
            if str(parent) not in ("/", "", "/tmp") and _inside(str(parent), below):
                parents.add(str(parent))
    args: list[str] = []
    for parent in sorted(parents, key=lambda s: s.count("/")):
        args += ["--perms", "0755", "--dir", parent]
    return args


def confine(
    cmd: Sequence[str],
    *,
    rw: Sequence[str] = (),
    ro: Sequence[str] = (),
    cwd: str | None = None,
    env: dict[str, str] | None = None,
    limits: Limits = Limits(),
    uid: int | None = None,
    pid_namespace: bool = True,
    hide: Sequence[str] = (),
) -> list[str]:
    """Return the argv that runs ``cmd`` confined (bwrap + prlimit + setpriv), as ``uid``.

    ``uid`` defaults to :func:`sandbox_uid` (``$COURSE_SANDBOX_UID``, else ``nobody``);
    ``hide`` files cannot be read inside (a folder in it is empty: no module, no bytecode
    of one, no name of either); without ``pid_namespace`` the confined processes
    keep the caller's pids (a forkserver's children are then killable by the pid it reports).
    """
    uid = sandbox_uid() if uid is None else uid
    if not available():
        raise SandboxUnavailable(
            "bubblewrap (bwrap), setpriv and prlimit are needed to confine grading: "
            "install them (Debian: apt-get install bubblewrap util-linux) or grade unconfined."
        )
    ro_paths = _ro_paths() + [os.path.realpath(p) for p in ro]
    rw_paths = [os.path.realpath(p) for p in rw]
    argv = ["bwrap", "--die-with-parent", "--new-session", "--unshare-net"]
    argv += ["--unshare-pid"] if pid_namespace else []
    argv += ["--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try", "--hostname", "grader"]
    argv += ["--proc", "/proc", "--dev", "/dev"]
    argv += ["--size", str(limits.tmp_size), "--perms", "1777", "--tmpfs", "/tmp"]
    argv += _dirs_args(ro_paths + rw_paths + ([cwd] if cwd else []))
    argv += _view_args(ro_paths, cwd)
    for p in SYSTEM_DIRS:  # merged-/usr systems: /bin -> usr/bin, /lib64 -> usr/lib64
        if os.path.islink(p):
            argv += ["--symlink", os.readlink(p), p]
    for p in rw_paths:
        argv += ["--bind", p, p]
    for p in map(os.path.realpath, hide):  # a folder: empty, with its bytecode and all
        argv += (
            ["--tmpfs", p, "--remount-ro", p] if os.path.isdir(p) else ["--ro-bind", "/dev/null", p]
        )
    argv += ["--chdir", os.path.realpath(cwd) if cwd else "/tmp", "--clearenv"]
    for key, value in sandbox_env(env).items():
        argv += ["--setenv", key, value]
    argv += ["prlimit", f"--as={limits.address_space}", f"--nproc={limits.processes}"]
    argv += [f"--nofile={limits.open_files}", f"--fsize={limits.file_size}", "--core=0", "--"]
    if os.geteuid() == 0:
        argv += ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
        argv += ["--no-new-privs", "--"]
    return argv + list(cmd)


def sandbox_env(extra: dict[str, str] | None) -> dict[str, str]:
    """A clean environment: a whitelist of the caller's, plus writable homes in /tmp."""
    env = {k: os.environ[k] for k in ENV_KEEP if k in os.environ}
    env["PATH"] = f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin"
    env.update(HOME="/tmp", TMPDIR="/tmp", IPYTHONDIR="/tmp/.ipython", MPLCONFIGDIR="/tmp")
    env.update(JUPYTER_RUNTIME_DIR="/tmp/.jupyter", GLOO_SOCKET_IFNAME="lo")
    env.update(PYTHONDONTWRITEBYTECODE="1")
    env.update(extra or {})
    return env


def give_to_sandbox(path: str, uid: int | None = None) -> None:
    """Let the sandbox uid write the folder ``path``: fchown when running as root.

    Never through a link: the folder is opened with ``O_NOFOLLOW | O_DIRECTORY`` and the
    descriptor is chowned, so a link swapped in at ``path`` fails with ``OSError`` (ELOOP or
    ENOTDIR) instead of handing its target to the sandbox.
    """
    if os.geteuid() != 0:
        return
    uid = sandbox_uid() if uid is None else uid
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.fchown(fd, uid, uid)
    finally:
        os.close(fd)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m course.grading.sandbox [--rw DIR]... [--cwd DIR] -- CMD``: confine CMD"""
    parser = argparse.ArgumentParser(
        prog="python -m course.grading.sandbox", description=main.__doc__
    )
    parser.add_argument("--rw", action="append", default=[], help="dir the command may write")
    parser.add_argument("--ro", action="append", default=[], help="extra dir it may read")
    parser.add_argument("--cwd", default=None)
    parser.add_argument("cmd", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        parser.error("give a command after --")
    argv_ = confine(cmd, rw=args.rw, ro=args.ro, cwd=args.cwd)
    os.execvp(argv_[0], argv_)  # noqa: S606 - replaces this process with the confined command
    return 127  # not reached


if __name__ == "__main__":
    raise SystemExit(main())
