"""The kernels' zygote: one process imports what every lesson's kernel needs, then forks kernels.

    python -m course.instructor.zygote 3     # started by course.instructor.forkedkernels

A lesson's kernel imports torch, plotly, ipywidgets, IPython and the course: 204 to 288 MB
once its cells have run, most of it what the imports built, the same in every kernel. Eight
notebooks open at once (the whole course, on Binder's 2 GB) held eight copies. A kernel
forked from this process shares those pages with it and with every other kernel, copy on
write: what a kernel keeps of its own is what its cells made (``benchmarks/binder.py``).

The same trick as Android's zygote and the ranks' own forkserver
(:mod:`course.ranks.forkserver`). After the imports, ``gc.freeze()`` moves every object
made so far out of the collector's reach, so a collection in a kernel does not write to
(and so copy) the pages they sit on.

The protocol, one JSON object a line on the socket at the fd named on the command line:
``{"argv": [...], "env": {...}, "cwd": "..."}`` asks for a kernel, answered ``{"pid": N}``
(or ``{"error": "..."}``); ``{"exited": N, "code": C}`` says kernel N ended (``C`` as
``Popen.returncode`` has it). A kernel gets a session of its own (the server signals its
process group, as it does a kernel it started), ``/dev/null`` on stdin, this process's
stdout and stderr, and dies with this process (``PR_SET_PDEATHSIG``). This process ends when
the socket closes (its server is gone), killing the kernels it forked, or after
:data:`IDLE_EXIT` seconds with none alive (the server starts a new one when it needs it).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import gc
import importlib
import importlib.util
import json
import os
import pkgutil
import selectors
import signal
import socket
import sys
import threading
from collections.abc import Iterator

from course.ranks.isolation import die_with_parent

__all__ = ["IDLE_EXIT", "PRELOAD", "kernel_args", "main", "preload"]

# What a lesson's kernel imports: the kernel itself, torch, the widgets and figures, and every
# module of the course a notebook reaches (the lessons and what they stand on, which import
# the rest: FSDP's torch._dynamo and sympy, torchft), not the instructor's or the grader's.
PRELOAD = (
    "ipykernel.kernelapp",
    "torch",
    "torch.distributed",
    "ipywidgets",
    "plotly.graph_objects",
)
COURSE_ROOMS = ("ranks", "ring", "models", "exports", "checks", "pictures", "lessons")
IDLE_EXIT = 600.0  # seconds with no kernel alive before this process ends
PR_SET_NAME = 15


def kernel_args(argv: list[str]) -> list[str] | None:
    """The ipykernel arguments of a kernelspec command that runs this interpreter's
    ``ipykernel_launcher`` (``[python, "-m", "ipykernel_launcher", *args]``), else None: a
    command for anything else is not what this process preloaded."""
    if len(argv) < 3 or argv[1:3] != ["-m", "ipykernel_launcher"]:
        return None
    try:
        same = os.path.samefile(argv[0], sys.executable)
    except OSError:
        return None
    return argv[3:] if same else None


def preload() -> list[str]:
    """Import :data:`PRELOAD` and every module of :data:`COURSE_ROOMS`; return what would
    not import (a kernel that needs it imports it itself, as any kernel does)."""
    names = list(PRELOAD)
    for room in COURSE_ROOMS:
        package = f"course.{room}"
        names.append(package)
        if _imported(package):
            path = getattr(sys.modules[package], "__path__", [])
            names += [module.name for module in pkgutil.walk_packages(path, f"{package}.")]
    failed = [name for name in names if not _imported(name)]
    gc.collect()
    gc.freeze()
    return failed


def _imported(name: str) -> bool:
    try:
        importlib.import_module(name)
    except Exception:  # noqa: BLE001 - any failure: the kernel will meet it itself
        return False
    return True


def _become_kernel(request: dict, args: list[str], inherited: list[int], zygote: int) -> None:
    """In the forked child of ``zygote``: drop its fds (``inherited``), take the kernel's
    session, folder, environment and arguments, run ipykernel as ``python -m
    ipykernel_launcher`` would, and exit with its code."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        for fd in inherited:
            os.close(fd)
        os.setsid()
        die_with_parent()
        if os.getppid() != zygote:  # it died before the line above: so does this kernel
            os._exit(1)
        ctypes.CDLL(None).prctl(PR_SET_NAME, b"ipykernel")  # what ps and top call it
        for signum in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.path[0] = os.getcwd()  # as `python -m` puts the folder it starts in
        if "numpy" in sys.modules:
            sys.modules["numpy"].random.seed()  # its global generator was seeded here once
        from ipykernel import kernelapp

        # Read from the environment when ipykernel was imported here, so said again (a
        # kernel without it would think it runs without a server, and print so).
        parent = f"--IPKernelApp.parent_handle={int(os.environ.get('JPY_PARENT_PID') or 0)}"
        sys.argv = [importlib.util.find_spec("ipykernel_launcher").origin, *args]
        kernelapp.launch_new_instance([parent, *args])
        code = 0
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    except BaseException:  # noqa: BLE001 - a kernel's end is reported by its exit code
        import traceback

        traceback.print_exc()
    finally:
        with contextlib.suppress(BaseException):
            threading._shutdown()  # noqa: SLF001 - what the interpreter does at exit
            atexit._run_exitfuncs()  # noqa: SLF001
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _fork_kernel(request: dict, inherited: list[int]) -> dict:
    """Fork a kernel for ``request`` (the child closes ``inherited``); the server's reply."""
    args = kernel_args(request.get("argv", []))
    if args is None or not os.path.isdir(request.get("cwd", "")):
        return {"error": "not a kernel this zygote can start"}
    zygote = os.getpid()
    pid = os.fork()
    if pid == 0:
        _become_kernel(request, args, inherited, zygote)
    return {"pid": pid}


def _lines(server: socket.socket, buffer: bytearray) -> Iterator[dict]:
    """The complete requests read from ``server``; raises EOFError once it is closed."""
    data = server.recv(1 << 20)
    if not data:
        raise EOFError
    buffer += data
    while b"\n" in buffer:
        line, _, rest = bytes(buffer).partition(b"\n")
        buffer[:] = rest
        yield json.loads(line)


def _reap(kernels: set[int]) -> Iterator[tuple[int, int]]:
    """(pid, returncode as Popen has it) for every kernel that ended."""
    while kernels:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        kernels.discard(pid)
        yield pid, os.waitstatus_to_exitcode(status)


def serve(server: socket.socket) -> None:
    """Answer requests until the server goes (then kill the kernels) or none is alive for
    :data:`IDLE_EXIT` seconds."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w)
    kernels: set[int] = set()
    buffer = bytearray()
    with selectors.DefaultSelector() as selector:
        selector.register(server, selectors.EVENT_READ)
        selector.register(wake_r, selectors.EVENT_READ)
        try:
            while True:
                ready = selector.select(None if kernels else IDLE_EXIT)
                if not ready and not kernels:
                    return
                with contextlib.suppress(BlockingIOError):
                    os.read(wake_r, 4096)
                inherited = [server.fileno(), wake_r, wake_w, selector.fileno()]
                for request in _lines(server, buffer) if _readable(ready, server) else ():
                    reply = _fork_kernel(request, inherited)
                    kernels.update([reply["pid"]] if "pid" in reply else [])
                    server.sendall(json.dumps(reply).encode() + b"\n")
                for pid, code in _reap(kernels):
                    server.sendall(json.dumps({"exited": pid, "code": code}).encode() + b"\n")
        except (EOFError, OSError):
            for pid in kernels:
                with contextlib.suppress(OSError):
                    os.killpg(pid, signal.SIGKILL)


def _readable(ready: list, server: socket.socket) -> bool:
    return any(key.fileobj is server for key, _ in ready)


def main(argv: list[str] | None = None) -> int:
    """Preload, say so (``{"ready": [...what failed]}``), then serve."""
    fd = int((argv or sys.argv[1:])[0])
    server = socket.socket(fileno=fd)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the terminal's Ctrl-C is the server's
    failed = preload()
    server.sendall(json.dumps({"ready": failed}).encode() + b"\n")
    serve(server)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
