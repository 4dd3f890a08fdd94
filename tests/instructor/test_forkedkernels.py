"""Kernels forked from the zygote: are they the kernels their kernelspec asks for, and do they
go when they should?"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest
from jupyter_client.manager import AsyncKernelManager
from jupyter_client.provisioning import KernelProvisionerFactory

from course.instructor.forkedkernels import PROVISIONER, ForkedKernel, Zygote
from course.instructor.lab import lab_command
from course.instructor.studentlab import student_config

pytestmark = pytest.mark.timeout(180)


async def _started(cwd: Path, **env: str) -> AsyncKernelManager:
    manager = AsyncKernelManager(kernel_name="python3")
    await manager.start_kernel(cwd=str(cwd), env={**os.environ, **env})
    return manager


async def _run(manager: AsyncKernelManager, code: str) -> str:
    """What ``code`` prints in the kernel (its error's name if it raised)."""
    client = manager.client()
    client.start_channels()
    said: list[str] = []

    def hook(msg: dict) -> None:
        if msg["msg_type"] == "stream":
            said.append(msg["content"]["text"])
        elif msg["msg_type"] == "error":
            said.append(msg["content"]["ename"])

    try:
        await client.wait_for_ready(timeout=60)
        await client.execute_interactive(code, output_hook=hook, timeout=60)
    finally:
        client.stop_channels()
    return "".join(said).strip()


def _run_apart(scenario: Coroutine) -> None:
    """Run ``scenario`` in an event loop of its own thread (a test before may have left this
    thread's loop running, and asyncio.run refuses one there)."""
    with ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, scenario).result()


@pytest.fixture
def forked() -> Iterator[None]:
    """Kernels forked from the zygote in this process, as a server configured so has them
    (the factory is a process-wide singleton: left as it was)."""
    factory = KernelProvisionerFactory.instance()
    before, factory.default_provisioner_name = factory.default_provisioner_name, PROVISIONER
    yield
    factory.default_provisioner_name = before
    Zygote.stop()


STATE = textwrap.dedent("""
    import os, sys, numpy
    print(os.getppid(), os.getcwd(), sys.path[0], os.environ["COURSE_TEST_VALUE"],
          "torch" in sys.modules, "course.lessons.fsdp.check" in sys.modules,
          numpy.random.randint(2**31), os.getpgid(0) == os.getpid())
""")


def test_a_forked_kernel_is_the_kernel_its_kernelspec_asks_for(tmp_path, forked) -> None:
    """Do two kernels forked from one zygote each run in the folder and environment the
    server gave them (``sys.path[0]`` that folder, as ``python -m`` has it), in a session of
    their own, with the course already imported and numpy's global generator seeded apart;
    and are they interrupted, restarted and shut down as the server asks?"""

    async def scenario() -> None:
        one, two = tmp_path / "one", tmp_path / "two"
        one.mkdir(), two.mkdir()
        first = await _started(one, COURSE_TEST_VALUE="first")
        second = await _started(two, COURSE_TEST_VALUE="second")
        assert isinstance(first.provisioner.process, ForkedKernel)
        a, b = (await _run(first, STATE)).split(), (await _run(second, STATE)).split()
        zygote = psutil.Process(int(a[0]))
        assert "course.instructor.zygote" in " ".join(zygote.cmdline())
        assert a[0] == b[0]
        assert a[1:6] == [str(one), str(one), "first", "True", "True"]
        assert b[1:6] == [str(two), str(two), "second", "True", "True"]
        assert a[6] != b[6] and a[7] == b[7] == "True"
        client = first.client()
        client.start_channels()
        client.execute("import time; time.sleep(60)")
        await asyncio.sleep(1)
        await first.interrupt_kernel()
        assert await _run(first, "print('after')") == "after"
        client.stop_channels()
        old = first.provisioner.pid
        await first.restart_kernel()
        assert first.provisioner.pid != old and not psutil.pid_exists(old)
        assert (await _run(first, STATE)).split()[1] == str(one)
        pids = [first.provisioner.pid, second.provisioner.pid]
        await first.shutdown_kernel()
        await second.shutdown_kernel()
        assert not [p for p in pids if psutil.pid_exists(p)]

    _run_apart(scenario())


def test_a_kernel_that_would_differ_starts_fresh(tmp_path, forked) -> None:
    """Asked for with a thread-pool setting other than the zygote imported torch with, is the
    kernel a fresh interpreter started by the server, as the local provisioner starts it?"""

    async def scenario() -> None:
        manager = await _started(tmp_path, OMP_NUM_THREADS="3", COURSE_TEST_VALUE="x")
        try:
            assert not isinstance(manager.provisioner.process, ForkedKernel)
            said = await _run(manager, "import os; print(os.getppid())")
            assert said == str(os.getpid())
        finally:
            await manager.shutdown_kernel()

    _run_apart(scenario())


SERVER = textwrap.dedent("""
    import asyncio, os, sys
    from jupyter_client.manager import AsyncKernelManager
    from jupyter_client.provisioning import KernelProvisionerFactory
    from course.instructor.forkedkernels import PROVISIONER

    async def main():
        KernelProvisionerFactory.instance().default_provisioner_name = PROVISIONER
        manager = AsyncKernelManager(kernel_name="python3")
        await manager.start_kernel(cwd=sys.argv[1])
        print(manager.provisioner.pid, flush=True)
        await asyncio.sleep(600)

    asyncio.run(main())
""")


def test_kernels_and_their_zygote_go_with_their_server(tmp_path) -> None:
    """When the process that asked for a kernel is killed (a server's SIGKILL), does the
    zygote end, and the kernel with it, leaving no process behind?"""
    script = tmp_path / "server.py"
    script.write_text(SERVER)
    server = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        kernel = psutil.Process(int(server.stdout.readline()))
        zygote = kernel.parent()
        assert "course.instructor.zygote" in " ".join(zygote.cmdline())
        server.send_signal(signal.SIGKILL)
        server.wait()
        _, alive = psutil.wait_procs([kernel, zygote], timeout=20)
        assert not alive, f"still running: {alive}"
    finally:
        server.kill()
        server.wait()


def test_the_students_lab_and_make_lab_fork_their_kernels(tmp_path) -> None:
    """Do the student view's settings (Binder's and the hub's) and ``make lab``'s command name
    the zygote's provisioner, keeping a setting the file had?"""
    config = tmp_path / "etc"
    config.mkdir()
    (config / "jupyter_server_config.json").write_text('{"ServerApp": {"port": 8899}}')
    written = json.loads((student_config(config) / "jupyter_server_config.json").read_text())
    assert written["KernelProvisionerFactory"] == {"default_provisioner_name": PROVISIONER}
    assert written["ServerApp"]["port"] == 8899
    first = Path("work/ring_allreduce/ring_allreduce.ipynb")
    cmd, _ = lab_command(tmp_path, first)
    assert f"--KernelProvisionerFactory.default_provisioner_name={PROVISIONER}" in cmd
