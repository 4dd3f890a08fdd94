"""Benchmark: every notebook open at once in one JupyterLab, as on Binder (2 GB in all).

    .venv/bin/python benchmarks/binder.py                      # every notebook, in course order
    .venv/bin/python benchmarks/binder.py --only ring_allreduce --settle 5

Starts JupyterLab on fresh work copies of release/ (as ``make lab`` does), opens every
notebook's kernel through the server's REST API, then runs each notebook's code cells in
turn (as Run All does; a cell's error does not stop the rest) while the others sit idle,
sampling the PSS of the server and everything below it every 0.2 s. After each notebook it
waits ``--settle`` seconds (by default the launcher's idle time, so a forkserver it started
has gone), then opens the next. It prints each notebook's peak (its kernel and all it
started, and the cell running then) with the total at that moment, then everything idle:
the server, each kernel and what they keep for ranks, and the kernels' zygote. Targets: all
idle within 1.5 GB, 1.8 GB at the worst moment, no notebook's peak over 1 GB. The lab forks
its kernels from the zygote, as the students' lab does (``course.instructor.forkedkernels``);
``--fresh`` starts each as a fresh interpreter instead. Measured with the eight lessons, on
2 cores: 1,158 MB all idle (kernels 93 to 138 MB each, the zygote 97 MB) and 1,691 MB at the
worst moment, every peak within 1 GB (the largest 705 MB, fault_tolerance's torchrun job);
with ``--fresh``, 1,958 MB and 2,430 MB (kernels 204 to 288 MB each). The student view's lab
also shuts down a kernel idle for 20 minutes (``course.instructor.studentlab``); this
benchmark's lab keeps them all, the worst case.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
import psutil
from jupyter_client import BlockingKernelClient

from course.instructor.forkedkernels import LAB_OPTION
from course.instructor.workcopies import COURSE_ORDER, make_work_copies
from course.ranks.forkserver import IDLE_SHUTDOWN

REPO = Path(__file__).resolve().parents[1]
MB = 2**20
TARGETS = {"idle": 1536, "peak": 1024}  # MB: all five idle; one notebook's own peak
CELL_TIMEOUT = 300.0


@dataclass
class Server:
    """A running JupyterLab: its process, URL, token and runtime folder."""

    proc: subprocess.Popen
    url: str
    token: str
    runtime: Path

    def api(self, path: str, body: dict | None = None) -> object:
        """Call the REST API (POST when there is a body); return the decoded JSON."""
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(  # noqa: S310 - JupyterLab on localhost
            f"{self.url}{path}", data=data, headers={"Authorization": f"token {self.token}"}
        )
        with urllib.request.urlopen(request, timeout=30) as reply:  # noqa: S310 - localhost
            return json.loads(reply.read() or b"null")


@dataclass
class Peak:
    """The largest total PSS seen while one notebook ran, and its own share then; the cell
    that ran at its own peak."""

    own: float = 0.0
    total: float = 0.0
    processes: int = 0
    errors: list[str] = field(default_factory=list)
    running: str = ""  # the cell running now (its grade_id, or its first line)
    at: str = ""  # the cell running when ``own`` was seen


def pss(proc: psutil.Process) -> float:
    """One process's proportional set size in MB (0 if it is gone)."""
    try:
        return proc.memory_full_info().pss / MB
    except psutil.Error:
        return 0.0


def tree(pid: int) -> list[psutil.Process]:
    """A process and everything below it."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


@contextmanager
def jupyter_lab(root: Path, home: Path, fresh: bool = False) -> Iterator[Server]:
    """JupyterLab on a free port serving ``root``, stopped with all it started; its kernels
    forked from the zygote as in the students' lab, or each a fresh interpreter (``fresh``)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    token, runtime = secrets.token_hex(16), home / "runtime"
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(runtime)}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    cmd = [str(Path(sys.executable).parent / "jupyter"), "lab", "--no-browser"]
    cmd += [f"--port={port}", "--ServerApp.ip=127.0.0.1", f"--ServerApp.token={token}"]
    cmd += [f"--ServerApp.root_dir={root}", "--ServerApp.port_retries=0"]
    cmd += ["--allow-root"] if os.geteuid() == 0 else []
    cmd += [] if fresh else [LAB_OPTION]
    with (home / "lab.log").open("w") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=root)
    server = Server(proc, f"http://127.0.0.1:{port}/", token, runtime)
    try:
        for _ in range(240):
            try:
                server.api("api/status")
                break
            except OSError:
                time.sleep(0.25)
        yield server
    finally:
        family = tree(proc.pid)
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        for child in family:
            with contextlib.suppress(psutil.Error):
                child.kill()


def open_kernel(server: Server, path: str) -> tuple[int, BlockingKernelClient]:
    """Open ``path``'s session as JupyterLab does; return its kernel's pid and a client."""
    body = {"path": path, "type": "notebook", "name": path, "kernel": {"name": "python3"}}
    session = server.api("api/sessions", body)
    kernel_id = session["kernel"]["id"]
    connection = server.runtime / f"kernel-{kernel_id}.json"
    client = BlockingKernelClient(connection_file=str(connection))
    client.load_connection_file()
    client.start_channels()
    client.wait_for_ready(timeout=120)
    said: list[str] = []

    def hook(msg: dict) -> None:
        said.append(msg["content"].get("text", "") if msg["msg_type"] == "stream" else "")

    reply = client.execute_interactive("print(__import__('os').getpid())", output_hook=hook)
    assert reply["content"]["status"] == "ok"
    return int("".join(said)), client


def run_cells(client: BlockingKernelClient, nb: nbformat.NotebookNode, peak: Peak) -> None:
    """Execute every code cell in order, as Run All does, noting each error's first line."""

    def hook(msg: dict) -> None:
        if msg["header"]["msg_type"] == "error":
            peak.errors.append(f"{msg['content']['ename']}: {msg['content']['evalue'][:120]}")

    for cell in nb.cells:
        if cell.cell_type == "code" and cell.source.strip():
            grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
            peak.running = grade_id or cell.source.strip().splitlines()[0][:40]
            client.execute_interactive(cell.source, output_hook=hook, timeout=CELL_TIMEOUT)


def sample(server_pid: int, kernel_pid: int, peak: Peak, stop: threading.Event) -> None:
    """Keep the largest total PSS (and this kernel's tree's share then) until ``stop``."""
    while not stop.is_set():
        everyone = tree(server_pid)
        sizes = {p.pid: pss(p) for p in everyone}
        own = sum(sizes.get(p.pid, 0.0) for p in tree(kernel_pid))
        if own > peak.own:
            peak.own, peak.processes, peak.at = own, len(tree(kernel_pid)), peak.running
        peak.total = max(peak.total, sum(sizes.values()))
        stop.wait(0.2)


def idle_report(server: Server, kernels: dict[str, int]) -> float:
    """Print the PSS of the server, each kernel and what it keeps, and of the rest of what
    the server started (the kernels' zygote); return the total."""
    total = pss(psutil.Process(server.proc.pid))
    print(f"  {'jupyter server':<22} {total:7.0f} MB")
    counted = {server.proc.pid}
    for name, pid in kernels.items():
        family = tree(pid)
        own, kept = pss(family[0]) if family else 0.0, sum(pss(p) for p in family[1:])
        names = ", ".join(sorted({_label(p) for p in family[1:]})) or "nothing"
        print(f"  {name:<22} {own:7.0f} MB kernel + {kept:5.0f} MB kept ({names})")
        total += own + kept
        counted |= {p.pid for p in family}
    for proc in tree(server.proc.pid):
        if proc.pid not in counted:
            print(f"  {_label(proc):<22} {pss(proc):7.0f} MB")
            total += pss(proc)
    return total


def _label(proc: psutil.Process) -> str:
    try:
        line = " ".join(proc.cmdline())
    except psutil.Error:
        return "gone"
    if "forkserver" in line:
        return "forkserver"
    if "course.instructor.zygote" in line:
        return "kernels' zygote"
    return "resource tracker" if "resource_tracker" in line else "rank or other"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line: which notebooks, and how long each sits idle after its run."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=COURSE_ORDER, default=list(COURSE_ORDER))
    parser.add_argument(
        "--settle", type=float, default=IDLE_SHUTDOWN + 5, help="seconds of idling after a run"
    )
    parser.add_argument(
        "--fresh", action="store_true",
        help="start each kernel as a fresh interpreter, not forked from the zygote",
    )  # fmt: skip
    return parser.parse_args(argv)


def run_notebook(server: Server, pid: int, client: BlockingKernelClient, path: Path) -> Peak:
    """Run one notebook's cells while sampling the PSS; print how it went."""
    peak, stop = Peak(), threading.Event()
    watcher = threading.Thread(target=sample, args=(server.proc.pid, pid, peak, stop))
    watcher.start()
    start = time.monotonic()
    try:
        run_cells(client, nbformat.read(path, as_version=4), peak)
    finally:
        stop.set()
        watcher.join()
    took = time.monotonic() - start
    print(
        f"{path.stem}: ran in {took:.0f} s; peak {peak.own:.0f} MB for it ({peak.processes} "
        f"processes, in cell {peak.at}), {peak.total:.0f} MB in all; {len(peak.errors)} "
        "cells raised",
        flush=True,
    )
    for error in peak.errors[:3]:
        print(f"    {error}")
    return peak


def main(argv: list[str] | None = None) -> int:
    """Open every notebook, run them one at a time, and print the figures."""
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="binder-bench-") as tmp:
        root, home = Path(tmp) / "course", Path(tmp) / "home"
        home.mkdir()
        make_work_copies(root / "work", REPO / "release")
        with jupyter_lab(root, home, args.fresh) as server:
            opened = {name: open_kernel(server, f"work/{name}/{name}.ipynb") for name in args.only}
            kernels = {name: pid for name, (pid, _) in opened.items()}
            time.sleep(args.settle)
            print(f"{len(kernels)} notebooks open, none run yet:")
            print(f"  {'total':<22} {idle_report(server, kernels):7.0f} MB\n")
            peaks = []
            for name, (pid, client) in opened.items():
                path = root / "work" / name / f"{name}.ipynb"
                peaks.append(run_notebook(server, pid, client, path))
                time.sleep(args.settle)
            print(f"\nall {len(kernels)} run, then idle for {args.settle:.0f} s:")
            idle = idle_report(server, kernels)
            print(f"  {'total':<22} {idle:7.0f} MB")
            own, total = max(p.own for p in peaks), max(p.total for p in peaks)
            print(
                f"\nall idle {idle:.0f} MB (target {TARGETS['idle']}); largest peak {own:.0f} MB "
                f"(target {TARGETS['peak']}), {total:.0f} MB in all at the worst moment"
            )
            for _, client in opened.values():
                client.stop_channels()
    return 0


if __name__ == "__main__":
    sys.exit(main())
