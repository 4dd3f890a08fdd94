"""A submission's control groups: its memory, processes and CPU share, killed as a whole.

Every process a submission's sandbox starts (its forkserver, ranks, whatever they start)
is in the cgroups of its :class:`~course.grading.rankbox.RankBox`: the sandbox's wrapper
moves itself in before it runs bubblewrap, and an unprivileged process cannot move out.
When the box ends, every process in them is killed, whatever it did to hide (a new session,
a main thread ended with a raw ``exit`` syscall, which leaves a zombie-looking process
running), and with the last of them its IPC namespace (System V shared memory) goes too.

What the kernel gives, found at run time (Linux cgroup v2, https://docs.kernel.org/admin-guide/cgroup-v2.html,
and the v1 controllers):

* a cgroup v2 (``/sys/fs/cgroup``, or the hybrid layout's ``/sys/fs/cgroup/unified``) with
  ``cgroup.kill``: one write kills every process in it; with its ``memory``, ``pids`` and
  ``cpu`` controllers enabled, ``memory.max``, ``pids.max`` and ``cpu.weight`` too;
* otherwise, or for the controllers a hybrid v2 lacks, the v1 hierarchies
  ``/sys/fs/cgroup/{memory,pids,cpu}``: ``memory.limit_in_bytes``, ``pids.max`` and
  ``cpu.shares``; their ``cgroup.procs`` are killed process by process until empty.

A machine with a hybrid layout (v1 controllers, a v2 hierarchy with none of them, as on a
kernel booted without ``cgroup_no_v1``) gets both: v2 for the kill, v1 for the limits.
Without root, or with no writable hierarchy, there are none, and :func:`unavailable` says
why; the PID namespace (bubblewrap's) still ends every process when the forkserver ends.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Self

__all__ = ["CGROUP_ROOT", "Cgroups", "Quota", "unavailable"]

CGROUP_ROOT = Path("/sys/fs/cgroup")
GROUP = "course-grading"  # the parent of every submission's cgroup, in each hierarchy
KILL_WAIT = 10.0  # seconds for the processes of a killed cgroup to be gone


@dataclass(frozen=True)
class Quota:
    """What one submission's processes may use, all together."""

    memory: int = 8 * 2**30  # bytes of memory (RSS and page cache) for the whole submission
    pids: int = 512  # processes and threads
    cpu_weight: int = 100  # v2 cpu.weight (v1 cpu.shares = weight * 1024 / 100): even shares


def _v2_root() -> Path | None:
    """The cgroup v2 hierarchy's root, if there is one."""
    for root in (CGROUP_ROOT, CGROUP_ROOT / "unified"):
        if (root / "cgroup.controllers").is_file():
            return root
    return None


def unavailable() -> str | None:
    """Why this process cannot give submissions cgroups, or None if it can."""
    if os.geteuid() != 0:
        return "only root can make cgroups and move processes into them"
    if _v2_root() is None and not (CGROUP_ROOT / "memory" / "cgroup.procs").is_file():
        return f"no cgroup hierarchy is mounted under {CGROUP_ROOT}"
    return None


@dataclass
class Cgroups:
    """The cgroups of one submission, for the duration of a ``with`` (none if unavailable)."""

    quota: Quota = Quota()
    name: str = field(default_factory=lambda: f"s-{os.getpid()}-{secrets.token_hex(4)}")
    dirs: list[Path] = field(default_factory=list)  # each a cgroup the processes are in
    limits: dict[str, str] = field(default_factory=dict)  # file written -> value

    def __enter__(self) -> Self:
        if unavailable() is None:
            self._make()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.kill()
        for path in self.dirs:
            with contextlib.suppress(OSError):
                path.rmdir()

    @property
    def procs(self) -> list[str]:
        """The ``cgroup.procs`` files a process writes its pid to, to join every cgroup."""
        return [str(path / "cgroup.procs") for path in self.dirs]

    def _make(self) -> None:
        """Create the cgroups and set the quota, in whatever hierarchies this kernel has."""
        v2 = _v2_root()
        controlled: set[str] = set()
        if v2 is not None:
            path = self._mkdir(v2)
            if path is not None and (path / "cgroup.kill").exists():
                self.dirs.append(path)
                controlled = self._v2_limits(path)
            elif path is not None:
                path.rmdir()
        v1 = {
            "memory": ("memory.limit_in_bytes", str(self.quota.memory)),
            "pids": ("pids.max", str(self.quota.pids)),
            "cpu": ("cpu.shares", str(self.quota.cpu_weight * 1024 // 100)),
        }
        for controller, (limit, value) in v1.items():
            root = CGROUP_ROOT / controller
            if controller in controlled or not (root / "cgroup.procs").is_file():
                continue
            path = self._mkdir(root)
            if path is not None:
                self.dirs.append(path)
                self._write(path / limit, value)

    def _mkdir(self, root: Path) -> Path | None:
        """This submission's cgroup under ``root``'s course folder, or None if not allowed."""
        try:
            (root / GROUP).mkdir(exist_ok=True)
            path = root / GROUP / self.name
            path.mkdir()
        except OSError:
            return None
        return path

    def _v2_limits(self, path: Path) -> set[str]:
        """Set the v2 limits the parent lets this cgroup have; return those controllers."""
        parent = path.parent
        wanted = {
            "memory": ("memory.max", str(self.quota.memory)),
            "pids": ("pids.max", str(self.quota.pids)),
            "cpu": ("cpu.weight", str(self.quota.cpu_weight)),
        }
        done = set()
        for controller, (limit, value) in wanted.items():
            with contextlib.suppress(OSError):
                (parent / "cgroup.subtree_control").write_text(f"+{controller}")
            if (path / limit).exists() and self._write(path / limit, value):
                done.add(controller)
        return done

    def _write(self, path: Path, value: str) -> bool:
        try:
            path.write_text(value)
        except OSError:
            return False
        self.limits[str(path)] = value
        return True

    def pids(self) -> set[int]:
        """Every process in this submission's cgroups now."""
        found: set[int] = set()
        for path in self.dirs:
            with contextlib.suppress(OSError):
                found |= {int(p) for p in (path / "cgroup.procs").read_text().split()}
        return found

    def memory_used(self) -> int | None:
        """Bytes this submission holds now, or None without a memory cgroup: all that is
        charged to it (its processes' memory, the kernel's for them: pipe and socket
        buffers..., what is swapped out) but the page cache of files, with its shared memory
        (the files it wrote to a tmpfs) counted back in: not torch's libraries, charged to
        whoever read them first, which come and go as code runs."""
        for path in self.dirs:
            stat = _memory_stat(path)
            if "file" in stat:  # v2: "file" holds shmem
                charged = _number(path / "memory.current") + _number(path / "memory.swap.current")
                return charged - stat["file"] + stat.get("shmem", 0)
            if "total_cache" in stat:  # v1: "cache" holds shmem; usage holds the kernel's
                charged = _number(path / "memory.memsw.usage_in_bytes") or _number(
                    path / "memory.usage_in_bytes"
                )
                return charged - stat["total_cache"] + stat.get("total_shmem", 0)
        return None

    def kill(self) -> None:
        """Kill every process in the cgroups (``cgroup.kill`` where there is one); wait,
        with a deadline, until none is left."""
        for path in self.dirs:
            with contextlib.suppress(OSError):
                if (path / "cgroup.kill").exists():
                    (path / "cgroup.kill").write_text("1")
        end = time.monotonic() + KILL_WAIT
        while (left := self.pids()) and time.monotonic() < end:
            for pid in left:  # v1 has no cgroup.kill: what forks meanwhile is found next round
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.02)


def _memory_stat(path: Path) -> dict[str, int]:
    """The cgroup's ``memory.stat`` as {field: value} ({} where it has none)."""
    try:
        lines = (path / "memory.stat").read_text().splitlines()
    except OSError:
        return {}
    pairs = (line.split() for line in lines)
    return {k: int(v) for k, v, *_ in pairs if v.isdigit()}


def _number(path: Path) -> int:
    """The number a cgroup file holds (0 where there is none, or none to read)."""
    try:
        return int(path.read_text())
    except (OSError, ValueError):
        return 0
