"""Tests for course.ranks: real gloo ranks, every failure mode, nothing left behind."""

from __future__ import annotations

import _thread
import glob
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Iterator

import psutil
import pytest
import torch
import torch.distributed as dist

from course import ranks
from course.ranks import RankError, forkserver, launch, launcher, run, run_source
from course.ranks.clock import WALL_FACTOR

pytestmark = pytest.mark.usefixtures("no_leftovers", "by_value")


# --- what the ranks run (module level: pickled by reference, imported by each rank) --


def rank_and_sum(offset: int) -> tuple[int, int, float]:
    t = torch.tensor([float(dist.get_rank() + offset)])
    dist.all_reduce(t)
    return dist.get_rank(), dist.get_world_size(), t.item()


def one_rank_raises() -> None:
    t = torch.zeros(1)
    if dist.get_rank() == 1:
        raise ZeroDivisionError("rank 1 divided by zero")
    dist.recv(t, src=1)


def everyone_receives() -> None:
    t = torch.zeros(1)
    dist.recv(t, src=(dist.get_rank() + 1) % dist.get_world_size())


def one_rank_os_exits() -> None:
    if dist.get_rank() == 1:
        os._exit(3)
    dist.barrier()


def one_rank_sys_exits() -> None:
    if dist.get_rank() == 0:
        sys.exit(2)
    dist.barrier()


def one_rank_spins() -> None:
    if dist.get_rank() == 0:
        while True:
            pass
    dist.barrier()


def one_rank_segfaults() -> None:
    if dist.get_rank() == 1:
        os.kill(os.getpid(), signal.SIGSEGV)
    dist.barrier()


def returns_generator() -> object:
    return (i for i in range(3))


def prints(text: str) -> None:
    print(f"{text} {dist.get_rank()}")
    print(f"err {dist.get_rank()}", file=sys.stderr)
    os.write(1, b"raw fd write\n")


def sums_tensor(t: torch.Tensor) -> torch.Tensor:
    t = t * (dist.get_rank() + 1)
    dist.all_reduce(t)
    return t


def starts_child_then_blocks(pid_dir: str) -> None:
    child = subprocess.Popen(["sleep", "60"])
    with open(os.path.join(pid_dir, f"{dist.get_rank()}.pid"), "w") as f:
        f.write(f"{os.getpid()} {child.pid}")
    everyone_receives()


def _dead(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _pids(pid_dir: str, world_size: int, wait: float = 20.0) -> list[int]:
    """Pids written by starts_child_then_blocks, once every rank has written them."""
    end = time.monotonic() + wait
    paths = [os.path.join(pid_dir, f"{r}.pid") for r in range(world_size)]
    while not all(os.path.exists(p) and os.path.getsize(p) for p in paths):
        assert time.monotonic() < end, "ranks never started"
        time.sleep(0.05)
    return [int(x) for p in paths for x in open(p).read().split()]


# --- inputs -------------------------------------------------------------------------


@pytest.mark.parametrize("world_size", [0, -1, 1000])
def test_bad_world_size(world_size: int) -> None:
    """Does a world size below 1 or beyond the machine's limit fail before starting anything?"""
    with pytest.raises(ValueError, match="world_size"):
        run(rank_and_sum, world_size, 0)


@pytest.mark.parametrize("world_size", [2.0, "2", True, None])
def test_world_size_type(world_size: object) -> None:
    """Is a world size that is not an int a TypeError?"""
    with pytest.raises(TypeError, match="world_size must be an int"):
        run(rank_and_sum, world_size, 0)


def test_max_world_size() -> None:
    """Is the cap at most 64 ranks and at least 1?"""
    assert 1 <= ranks.max_world_size() <= launcher.HARD_MAX_RANKS


def test_not_callable() -> None:
    """Does passing something that is not a function say so?"""
    with pytest.raises(TypeError, match="needs a function"):
        run(42, 2)


@pytest.mark.parametrize("timeout", [0, -1, "5", float("nan")])
def test_bad_timeout(timeout: object) -> None:
    """Is a deadline that is not a positive number rejected?"""
    with pytest.raises(ValueError, match="timeout"):
        run(rank_and_sum, 2, 0, timeout=timeout)


def test_unpicklable_argument() -> None:
    """Does an argument that cannot be sent to the ranks name itself?"""
    with pytest.raises(TypeError, match=r"argument 2 \(a lock\) cannot be sent"):
        run(rank_and_sum, 2, 0, threading.Lock())


def test_source_syntax_error() -> None:
    """Does cell text that does not parse fail in the caller, before any rank starts?"""
    with pytest.raises(SyntaxError):
        run_source("for", 2)


# --- results ------------------------------------------------------------------------


@pytest.mark.ranks
@pytest.mark.parametrize("world_size", [1, 3, 5])
def test_values_in_rank_order(world_size: int) -> None:
    """Does run() return every rank's value, in rank order, after a real all_reduce?"""
    total = float(sum(range(world_size)) + 10 * world_size)
    expected = [(r, world_size, total) for r in range(world_size)]
    assert run(rank_and_sum, world_size, 10) == expected


@pytest.mark.ranks
def test_notebook_style_function() -> None:
    """Does a function defined on the fly (a closure, like a notebook cell's) run by value?"""
    scale = 3

    def scaled() -> int:
        return dist.get_rank() * scale

    assert run(scaled, 3) == [0, 3, 6]
    assert run(lambda a, b=0: a + b + dist.get_rank(), 2, 1, b=5) == [6, 7]


@pytest.mark.ranks
def test_tensors_both_ways() -> None:
    """Do tensors travel to the ranks and back, and match the single-process oracle?"""
    t = torch.arange(6, dtype=torch.float64).reshape(2, 3)
    out = run(sums_tensor, 3, t)
    for value in out:
        torch.testing.assert_close(value, t * 6)


@pytest.mark.ranks
def test_output_captured_per_rank() -> None:
    """Does launch() bring back each rank's stdout and stderr, fd-level writes included?"""
    result = launch(prints, 2, "hello")
    assert result.ok and result.results == [None, None]
    for r in range(2):
        assert f"hello {r}" in result.stdout[r] and "raw fd write" in result.stdout[r]
        assert result.stderr[r].strip() == f"err {r}"


@pytest.mark.ranks
def test_run_source() -> None:
    """Does cell text see rank, world_size, dist and variables, and return its last expression?"""
    source = "t = torch.tensor([float(rank)])\ndist.all_reduce(t)\nt.item() + offset + world_size"
    assert run_source(source, 3, offset=100) == [106.0] * 3
    assert run_source("timeout", 1, variables={"timeout": 7}) == [7]
    assert run_source("x = rank", 2) == [None, None]


@pytest.mark.ranks
def test_warm_runs_back_to_back() -> None:
    """Does a second run in the same process reuse the warm forkserver?"""
    run(rank_and_sum, 2, 0)
    start = time.monotonic()
    for _ in range(3):
        run(rank_and_sum, 2, 0)
    print(f"warm 2-rank run: {(time.monotonic() - start) / 3:.3f} s")  # a figure, not a test


def sees_benchmark_module() -> bool:
    t = torch.tensor([1.0]) if True else torch.utils.benchmark  # names utils.benchmark
    dist.all_reduce(t)
    return "torch.utils.benchmark" in sys.modules


@pytest.mark.ranks
def test_ranks_skip_callers_torch_submodules() -> None:
    """Do ranks stay warm when the caller imported a torch submodule the function names?"""
    import torch.utils.benchmark  # noqa: F401 - cloudpickle would send it along, by name

    assert run(sees_benchmark_module, 2) == [False, False]


# --- failures -----------------------------------------------------------------------


@pytest.mark.ranks
def test_raise_on_one_rank() -> None:
    """Does one rank's exception name that rank with its traceback, and the others as blocked?"""
    start = time.monotonic()
    with pytest.raises(RankError) as info:
        run(one_rank_raises, 3, timeout=30)
    assert time.monotonic() - start < 10, "the others should be stopped, not waited for"
    failures = info.value.failures
    assert failures[1].kind == "raised"
    assert "ZeroDivisionError: rank 1 divided by zero" in failures[1].traceback
    assert 'raise ZeroDivisionError("rank 1 divided by zero")' in failures[1].traceback
    assert "_rank_main" not in str(info.value) and "multiprocessing" not in str(info.value)
    assert {failures[0].kind, failures[2].kind} == {"blocked"}
    assert "dist.recv" in failures[0].message and "waiting on rank 1" in failures[0].message
    assert str(info.value).splitlines()[1].startswith("  rank 1 raised ZeroDivisionError")


@pytest.mark.ranks
@pytest.mark.parametrize("pg_timeout", [1.0, 30.0], ids=["gloo-timeout", "deadline"])
def test_deadlock(pg_timeout: float) -> None:
    """Does a deadlock on every rank become a clear error naming where each rank was blocked?"""
    start = time.monotonic()
    with pytest.raises(RankError) as info:
        run(everyone_receives, 3, timeout=2.5, pg_timeout=pg_timeout)
    assert time.monotonic() - start < 6
    for failure in info.value.failures.values():
        assert failure.kind == "deadlock"
        assert failure.where.startswith("dist.recv at test_launcher.py line")
    assert "deadlocked in dist.recv" in str(info.value)


@pytest.mark.ranks
def test_os_exit() -> None:
    """Is a rank that calls os._exit reported as exited, with where it called it?"""
    with pytest.raises(RankError) as info:
        run(one_rank_os_exits, 3)
    failure = info.value.failures[1]
    assert failure.kind == "exited" and failure.exitcode == 3
    assert "called os._exit(3) at test_launcher.py" in failure.message
    assert {info.value.failures[r].kind for r in (0, 2)} == {"blocked"}


@pytest.mark.ranks
def test_sys_exit() -> None:
    """Is a rank that calls sys.exit reported as exited (not as a hang)?"""
    with pytest.raises(RankError) as info:
        run(one_rank_sys_exits, 2)
    assert info.value.failures[0].kind == "exited"
    assert "sys.exit(2)" in info.value.failures[0].message


@pytest.mark.ranks
def test_spin() -> None:
    """Is a rank stuck in a pure Python loop reported as spinning, at its line, by the deadline?"""
    start = time.monotonic()
    with pytest.raises(RankError) as info:
        run(one_rank_spins, 2, timeout=2)
    assert time.monotonic() - start < WALL_FACTOR * 2 + 3  # however loaded the machine is
    spin = info.value.failures[0]
    assert spin.kind == "spin" and "test_launcher.py line" in spin.where
    assert info.value.failures[1].kind == "blocked"
    assert "dist.barrier" in info.value.failures[1].where


@pytest.mark.ranks
def test_killed_by_signal() -> None:
    """Is a rank that crashes in native code reported as killed, with its name of the signal
    and faulthandler's word for the crash, and its dump of every thread's stack cut away?"""
    result = launch(one_rank_segfaults, 2)
    assert result.failures[1].kind == "killed"
    assert "SIGSEGV: it crashed in native code (Segmentation fault)" in result.failures[1].message
    assert "Fatal Python error" not in result.stderr[1] and "File " not in result.stderr[1]


@pytest.mark.ranks
def test_unreturnable_value() -> None:
    """Does a return value that cannot be sent back say what to return instead?"""
    with pytest.raises(RankError, match=r"return value \(a generator\) cannot be sent back"):
        run(returns_generator, 2)


@pytest.mark.ranks
def test_launch_never_raises_rank_error() -> None:
    """Can a grader inspect a failed run (values, output, failures) without an exception?"""
    result = launch(one_rank_raises, 2)
    assert not result.ok and set(result.failures) == {0, 1}
    with pytest.raises(RankError):
        result.check()


@pytest.mark.ranks
def test_children_of_ranks_die(tmp_path: object) -> None:
    """Are processes that a rank started killed along with the rank?"""
    with pytest.raises(RankError):
        run(starts_child_then_blocks, 2, str(tmp_path), timeout=2, pg_timeout=30)
    pids = _pids(str(tmp_path), 2)
    time.sleep(0.2)  # the kernel's init reaps the orphans
    assert all(_dead(p) for p in pids)


@pytest.fixture
def sigint_interrupts() -> Iterator[None]:
    """SIGINT raises KeyboardInterrupt here, as in a terminal or a kernel, even where the tests
    were started with it ignored (a background job), which Python then keeps."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.mark.ranks
@pytest.mark.usefixtures("sigint_interrupts")
def test_interrupt_kills_the_run(tmp_path: object) -> None:
    """Does interrupting the caller (KeyboardInterrupt) kill every rank, and the next run work?"""
    run(rank_and_sum, 2, 0)  # a warm forkserver: the ranks are up before the interrupt
    timer = threading.Timer(1.0, _thread.interrupt_main)
    start = time.monotonic()
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt) as interrupt:
            run(starts_child_then_blocks, 2, str(tmp_path), timeout=30, pg_timeout=30)
    finally:
        timer.cancel()
    assert time.monotonic() - start < 5
    (line,) = interrupt.value._render_traceback_()  # what IPython shows: one line
    assert line.startswith("KeyboardInterrupt: interrupted after") and "2 ranks" in line
    assert all(_dead(p) for p in _pids(str(tmp_path), 2))
    assert run(rank_and_sum, 2, 0)[0] == (0, 2, 1.0)


def test_an_idle_forkserver_stops_by_itself() -> None:
    """Does a forkserver with an idle time stop once unused that long, but not while a run
    holds it, and does the next use start a fresh one?"""
    server = forkserver.Server(idle_shutdown=0.4)
    try:
        server.get()
        first = server.pid()
        with server.in_use():
            time.sleep(1.0)
            assert server.pid() == first and not _dead(first)
        end = time.monotonic() + 10
        while server.pid() is not None and time.monotonic() < end:
            time.sleep(0.05)
        assert server.pid() is None
        assert _wait_dead([first])
        server.get()
        assert server.pid() not in (None, first)
    finally:
        server.stop()


def gloo_times_out_in_backward() -> list[float]:
    """Rank 0 takes one more DDP step than rank 1: its all-reduce in backward waits, alone."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(torch.nn.Linear(2, 1))
    for _ in range(2 - dist.get_rank()):
        model(torch.ones(1, 2)).sum().backward()
    return [p.grad.sum().item() for p in model.parameters()]


@pytest.mark.ranks
@pytest.mark.slow
def test_gloo_giving_up_in_ddp_is_worded_without_its_internals() -> None:
    """When gloo gives up inside DDP's backward (no dist frame of its own), is the rank
    blocked on a peer that had finished, said in plain words, with no torch frame?"""
    result = launch(gloo_times_out_in_backward, 2, timeout=30, pg_timeout=3)
    assert result.results[1] is not None and list(result.failures) == [0]
    failure = result.failures[0]
    assert failure.kind == "blocked" and "rank 1 had already finished" in failure.message
    report = str(RankError(result))
    for internal in ("unbound_buffer.cc", "_tensor.py", "graph.py", "Timed out waiting"):
        assert internal not in report, report


@pytest.mark.ranks
def test_dead_forkserver_is_replaced() -> None:
    """Does a killed forkserver get restarted transparently on the next run?"""
    run(rank_and_sum, 2, 0)
    pid = forkserver.SERVER.pid()
    os.kill(pid, signal.SIGKILL)
    _wait_until_dead(pid)  # a loaded machine takes its time to end it
    assert run(rank_and_sum, 2, 0) == [(0, 2, 1.0), (1, 2, 1.0)]
    assert forkserver.SERVER.pid() != pid


def _wait_until_dead(pid: int, timeout: float = 30.0) -> None:
    """Return once ``pid`` has ended (a zombie, or gone); fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return
        except psutil.NoSuchProcess:
            return
        time.sleep(0.05)
    pytest.fail(f"process {pid} still runs {timeout:.0f} s after SIGKILL")


# --- other processes: signals, parents dying, two notebooks at once ------------------

SCRIPT = textwrap.dedent(
    """
    import os, signal, sys
    from course import ranks
    from course.ranks import forkserver

    signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal or a kernel

    def total():
        import torch, torch.distributed as dist
        t = torch.ones(1)
        dist.all_reduce(t)
        return t.item()

    def block(pid_dir):
        import subprocess, torch, torch.distributed as dist
        with open(os.path.join(pid_dir, f"{dist.get_rank()}.pid"), "w") as f:
            f.write(f"{os.getpid()} {subprocess.Popen(['sleep', '60']).pid}")
        dist.recv(torch.zeros(1), src=1 - dist.get_rank())

    print(ranks.run(total, 4) == [4.0] * 4, forkserver.SERVER.pid(), flush=True)
    ranks.run(block, 2, sys.argv[1], timeout=60, pg_timeout=60)
    """
)


def _script(pid_dir: str) -> subprocess.Popen:
    """A caller in its own process (a second notebook): runs ranks, then blocks in a run."""
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    cmd = [sys.executable, "-c", SCRIPT, pid_dir]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _wait_dead(pids: list[int], seconds: float = 10.0) -> bool:
    end = time.monotonic() + seconds
    while not all(_dead(p) for p in pids):
        if time.monotonic() > end:
            return False
        time.sleep(0.05)
    return True


@pytest.mark.ranks
@pytest.mark.slow
def test_two_callers_then_sigint_and_sigkill(tmp_path: object) -> None:
    """Do two callers run ranks at once, and do SIGINT or SIGKILL of a caller take its ranks and forkserver down?"""  # noqa: E501
    dirs = [tmp_path / "int", tmp_path / "kill"]
    procs = []
    for d in dirs:
        d.mkdir()
        procs.append(_script(str(d)))
    firsts = [p.stdout.readline().split() for p in procs]
    assert [f[0] for f in firsts] == ["True", "True"], [p.communicate() for p in procs]
    pids = [_pids(str(d), 2) for d in dirs]
    procs[0].send_signal(signal.SIGINT)
    procs[1].send_signal(signal.SIGKILL)
    _, err = procs[0].communicate(timeout=10)
    procs[1].communicate(timeout=10)
    assert "RanksInterrupted: interrupted after" in err.splitlines()[-1], err
    servers = [int(f[1]) for f in firsts]
    assert _wait_dead(pids[0] + pids[1] + servers), "ranks or forkservers outlived their caller"
    forkserver.sweep_stale_run_dirs()  # what the next forkserver start does
    killed = os.path.join(tempfile.gettempdir(), f"{forkserver.RUN_DIR_PREFIX}{procs[1].pid}-*")
    assert not glob.glob(killed), "the killed caller's run directory was not swept"
