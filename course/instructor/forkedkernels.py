"""Kernels forked from a warm zygote, so the notebooks open at once share what they imported.

    jupyter lab --KernelProvisionerFactory.default_provisioner_name=course-forked

A kernel provisioner (jupyter_client's ``LocalProvisioner``, registered as ``course-forked``)
that asks :mod:`course.instructor.zygote` for each kernel instead of starting a fresh
interpreter: the kernel starts with torch, the widgets and the course already imported, and
shares those pages with every other kernel. The eight lessons open and run, measured
(``benchmarks/binder.py``): 1,158 MB in all, kernels 93 to 138 MB each; 1,958 MB, 204 to
288 MB each, with fresh interpreters. The student's lab (Binder's and the hub's) and ``make
lab`` use it; nbgrader's graders do not (:mod:`course.grading` starts its own kernels).

Everything else is the local provisioner's: the connection file, the ports, the process
group the server signals (interrupt, restart, shutdown). A kernelspec that is not this
interpreter's ``ipykernel_launcher``, an environment that would change what the imports did
(``PYTHON*``, ``LD_*``, the thread pools' settings), or a zygote that cannot start: the
kernel starts as the local provisioner starts it, and the server's log says why.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from typing import Any, ClassVar

from jupyter_client.connect import KernelConnectionInfo
from jupyter_client.provisioning import LocalProvisioner

from course.instructor.zygote import kernel_args

__all__ = [
    "IMPORT_TIME_ENV", "LAB_OPTION", "PROVISIONER", "ForkedKernel", "ForkedProvisioner", "Zygote",
]  # fmt: skip

PROVISIONER = "course-forked"  # its entry point's name (pyproject.toml)
# What a `jupyter lab` command line adds for it (make lab, the browser tests, the benchmark).
LAB_OPTION = f"--KernelProvisionerFactory.default_provisioner_name={PROVISIONER}"
# Variables read while the zygote imported: a kernel asked for with other values than the
# zygote had would not be what its kernelspec says, so it starts fresh.
IMPORT_TIME_ENV = ("PYTHON", "LD_", "OMP_", "MKL_", "KMP_", "OPENBLAS", "TORCH", "PYTORCH")
START_WAIT = 120.0  # seconds the zygote may take to import everything (a cold disk)


class Zygote:
    """The server's zygote: started at the first kernel, again after it ended."""

    _current: ClassVar[Zygote | None] = None
    _lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self) -> None:
        ours, theirs = socket.socketpair()
        self.env = dict(os.environ)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "course.instructor.zygote", str(theirs.fileno())],
            pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, cwd="/", start_new_session=True,
        )  # fmt: skip
        theirs.close()
        self.sock, self.codes = ours, {}
        self.changed = threading.Condition()
        self.replies: list[dict] = []
        self.reader = self.sock.makefile("rb")
        ours.settimeout(START_WAIT)
        try:
            ready = json.loads(self.reader.readline() or b"{}")
        except OSError:
            ready = {}
        if "ready" not in ready:
            self.proc.kill()
            self.proc.wait()
            raise OSError(f"the zygote did not start (exit code {self.proc.returncode})")
        self.failed = ready["ready"]  # what it could not import: each kernel imports it itself
        ours.settimeout(None)
        threading.Thread(target=self._read, name="zygote-reader", daemon=True).start()

    @classmethod
    def get(cls) -> Zygote:
        """The running zygote, started if there is none."""
        with cls._lock:
            if cls._current is None or cls._current.proc.poll() is not None:
                cls._current = Zygote()
            return cls._current

    @classmethod
    def stop(cls) -> None:
        """End the running zygote, and the kernels it forked (its server is going)."""
        with cls._lock:
            zygote, cls._current = cls._current, None
        if zygote is not None:
            zygote.sock.shutdown(socket.SHUT_RDWR)  # its reader's file holds the socket open
            zygote.sock.close()
            zygote.proc.wait()

    def _read(self) -> None:
        """Sort what the zygote says into replies and exit codes, until it ends."""
        for line in self.reader:
            message = json.loads(line)
            with self.changed:
                if "exited" in message:
                    self.codes[message["exited"]] = message["code"]
                else:
                    self.replies.append(message)
                self.changed.notify_all()
        with self.changed:
            self.replies.append({"error": "the zygote ended"})
            self.changed.notify_all()

    def fork(self, argv: list[str], env: dict[str, str], cwd: str) -> int:
        """A kernel forked for ``argv`` in ``cwd`` with ``env``; its pid."""
        request = {"argv": argv, "env": env, "cwd": cwd}
        with self._lock, self.changed:
            self.sock.sendall(json.dumps(request).encode() + b"\n")
            if not self.changed.wait_for(lambda: self.replies, timeout=START_WAIT):
                raise OSError("the zygote did not answer")
            reply = self.replies.pop(0)
        if "pid" not in reply:
            raise OSError(reply.get("error", "no pid"))
        return reply["pid"]

    def returncode(self, pid: int, timeout: float | None = 0.0) -> int | None:
        """Kernel ``pid``'s exit code once the zygote reaped it (within ``timeout``)."""
        with self.changed:
            self.changed.wait_for(lambda: pid in self.codes or self.proc.poll() is not None,
                                  timeout=timeout)  # fmt: skip
            if pid in self.codes:
                return self.codes[pid]
            return -9 if self.proc.poll() is not None else None  # it died with the zygote


class ForkedKernel:
    """What the local provisioner needs of a ``Popen``, for a kernel the zygote forked."""

    stdin = stdout = stderr = None

    def __init__(self, zygote: Zygote, pid: int) -> None:
        self.zygote, self.pid, self.returncode = zygote, pid, None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.zygote.returncode(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        code = self.zygote.returncode(self.pid, timeout)
        if code is None:
            raise subprocess.TimeoutExpired(f"kernel {self.pid}", timeout or 0)
        self.returncode = code
        return code

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signum)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class ForkedProvisioner(LocalProvisioner):
    """The local provisioner, with kernels forked from the zygote where that is the same."""

    async def launch_kernel(self, cmd: list[str], **kwargs: Any) -> KernelConnectionInfo:
        env = {**(kwargs.get("env") or os.environ), "JPY_PARENT_PID": str(os.getpid())}
        cwd = str(kwargs.get("cwd") or os.getcwd())
        why = _why_not(cmd, env)
        if why is None:
            try:
                zygote = await asyncio.to_thread(Zygote.get)
                pid = await asyncio.to_thread(zygote.fork, cmd, env, cwd)
                self.process = ForkedKernel(zygote, pid)
            except OSError as error:
                why = f"the zygote failed: {error}"
        if why is not None:
            self.log.info("kernel %s starts fresh: %s", kwargs.get("kernel_id", ""), why)
            return await super().launch_kernel(cmd, **kwargs)
        self.pid = self.pgid = self.process.pid  # it leads a session of its own
        self.cwd = cwd
        return self.connection_info


def _why_not(cmd: list[str], env: dict[str, str]) -> str | None:
    """Why a kernel for ``cmd`` with ``env`` cannot be forked from the zygote, or None."""
    if kernel_args(cmd) is None:
        return "its kernelspec is not this interpreter's ipykernel"
    zygote = Zygote._current  # noqa: SLF001 - its environment, if one runs
    base = zygote.env if zygote is not None else dict(os.environ)
    for name in sorted(set(env) | set(base)):
        if name.startswith(IMPORT_TIME_ENV) and env.get(name) != base.get(name):
            return f"{name} differs from the server's"
    return None
