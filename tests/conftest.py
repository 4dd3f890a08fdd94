"""Shared fixtures: real ranks that leave nothing behind.

Use ``run_ranks`` to run a function on gloo ranks from any test:

    @pytest.mark.ranks
    def test_sum(run_ranks):
        assert run_ranks(my_allreduce_check, 4) == [True] * 4
"""

from __future__ import annotations

import glob
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import cloudpickle
import psutil
import pytest

from course import ranks
from course.ranks import forkserver, launcher

# The catalogues of right and wrong solutions, and the quiz's helpers, for every test folder.
CATALOGUES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "catalogues")
sys.path.insert(0, CATALOGUES)


def _descendants() -> set[int]:
    """Live processes below this one, except the launcher's long-lived forkserver and the
    browser tests' Chromium, which lives as long as the session and starts helper processes
    of its own whenever it likes."""
    helpers = {forkserver.SERVER.pid()}
    alive = set()
    for proc in psutil.Process().children(recursive=True):
        try:
            browser = os.path.basename((proc.cmdline() or [""])[0]).startswith("chromium")
            if proc.status() != psutil.STATUS_ZOMBIE and proc.pid not in helpers and not browser:
                alive.add(proc.pid)
        except psutil.NoSuchProcess:
            pass
    return alive - {p.pid for p in _resource_trackers()}


def _resource_trackers() -> list[psutil.Process]:
    """multiprocessing's resource tracker: a per-process helper that outlives runs."""
    found = []
    for proc in psutil.Process().children():
        try:
            if "resource_tracker" in " ".join(proc.cmdline()):
                found.append(proc)
        except psutil.NoSuchProcess:
            pass
    return found


def _run_dirs() -> set[str]:
    """This process's run directories (other processes may be running ranks too)."""
    pattern = f"{forkserver.RUN_DIR_PREFIX}{os.getpid()}-*"
    return set(glob.glob(os.path.join(tempfile.gettempdir(), pattern)))


SOONER = 0.4  # a test marked deadlocks: its runs' deadlines and gloo's timeout, scaled


@pytest.fixture(autouse=True)
def _deadlocks_end_sooner(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A test marked ``deadlocks`` asks what a check says of a deadlock, not when it says
    it. A deadlock ends on the run's deadline or on gloo's timeout, whichever comes first:
    there both are 0.4 times a notebook's (a 10 s deadline ends at 4 s, gloo's 10 s at 4 s),
    so the same one comes first, and the check tells it as a notebook would."""
    if not request.node.get_closest_marker("deadlocks"):
        return
    check = launcher._check_timeouts  # noqa: SLF001 - the one place a run's timeouts are set

    def sooner(timeout: float, pg_timeout: float | None) -> tuple[float, float]:
        return check(timeout * SOONER, pg_timeout and pg_timeout * SOONER)

    monkeypatch.setattr(launcher, "MAX_PG_TIMEOUT", launcher.MAX_PG_TIMEOUT * SOONER)
    monkeypatch.setattr(launcher, "_check_timeouts", sooner)


@pytest.fixture
def no_leftovers() -> Iterator[None]:
    """Fail the test if it leaves rank processes or run directories behind."""
    procs, dirs = _descendants(), _run_dirs()
    yield
    end = time.monotonic() + 2.0  # the test may have just killed a helper process
    while (_descendants() - procs) and time.monotonic() < end:
        time.sleep(0.05)
    left = [psutil.Process(p).cmdline() for p in _descendants() - procs if psutil.pid_exists(p)]
    assert not left, f"processes left running: {left}"
    assert _run_dirs() <= dirs, f"run directories left behind: {_run_dirs() - dirs}"


@pytest.fixture
def by_value(request: pytest.FixtureRequest) -> Iterator[None]:
    """Send the test module's functions, and those of the catalogues it imports from, to
    ranks by value, so ranks need not import them (as a notebook cell's would be)."""
    used = {getattr(v, "__module__", None) for v in vars(request.module).values()}
    modules = [request.module] + [
        sys.modules[name]
        for name in sorted(used - {None, request.module.__name__})
        if os.path.dirname(getattr(sys.modules.get(name), "__file__", "") or "") == CATALOGUES
    ]
    registered = set(cloudpickle.list_registry_pickle_by_value())
    mine = [m for m in modules if m.__name__ not in registered]
    for module in mine:
        cloudpickle.register_pickle_by_value(module)
    yield
    for module in mine:
        cloudpickle.unregister_pickle_by_value(module)


@pytest.fixture
def run_ranks(no_leftovers: None, by_value: None) -> Callable[..., list[Any]]:
    """``course.ranks.run`` with a 30 s deadline, checking that nothing is left behind."""

    def _run(fn: Callable[..., Any], world_size: int, *args: Any, **kwargs: Any) -> list[Any]:
        kwargs.setdefault("timeout", 30.0)
        return ranks.run(fn, world_size, *args, **kwargs)

    return _run
