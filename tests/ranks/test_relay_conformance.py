"""torch's own backend tests, run on the relay: does it behave as gloo does on CPU?

Each case is a test of ``DistributedTest._DistTestBase`` from
``torch.testing._internal.distributed.distributed_test``, the suite that torch runs against
its own backends, with torch's harness (``TestDistBackend``: its file barrier, its per-rank
processes, its return-code checks). Three things differ from torch's run of it: the ranks are
forked, not spawned; the harness looks at its barrier and its ranks every 10 ms, not 100 ms;
and on the relay each rank joins a :class:`~course.ranks.router.Relay` made here
(``course.ranks.relay.join``) where torch would call ``init_process_group``. The
suite is imported with ``BACKEND=gloo``, so its skip decorators choose the cases gloo runs,
and each case runs on the world size torch's decorators ask of it: 3 ranks (torch's own
CPU runs), 4 (``require_exact_world_size(4)``) or 8 (the "group" cases, new_group([1, 2]),
which ``skip_if_small_worldsize`` skips below 8). ``CASES`` is the subset for
point-to-point, collectives and groups; each passes on gloo (``test_the_case_passes_on_gloo``,
the same harness with no relay), and a case torch skips fails here, except the
``all_to_all_single`` ones, which torch marks MPI's alone and gloo passes (``UNSKIPPED``).
A case that fails on the relay is marked ``xfail(strict=True)`` with the reason: once the
relay does what gloo does, it passes, fails as XPASS, and its mark is removed.

    .venv/bin/python -m pytest tests/ranks/test_relay_conformance.py       # both backends
    .venv/bin/python -m pytest -m conformance -k on_the_relay             # the relay only

torch's test helpers import ``expecttest`` (its ``TestCase``, which no case here uses); where
it is not installed, a stand-in with unittest's ``TestCase`` takes its place.
"""

from __future__ import annotations

import contextlib
import functools
import os
import random
import sys
import time
import types
import unittest
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch

from course.ranks.relay import join
from course.ranks.router import Relay

WORLD_SIZE = 3  # torch's CPU runs of this suite use 3 ranks
IMPORTED_AS = 4  # the world size its decorators see at import: ON_FOUR's need it, no case less
RELAY_TIMEOUT = 10.0  # seconds a receive or collective waits on the relay before it fails
DEADLINE = 60  # seconds torch's harness waits for a case's ranks before it kills them
HARNESS_POLL = 0.1  # seconds torch's harness sleeps between looks at its barrier and its ranks
POLL = 0.01  # ... here: those sleeps were two thirds of a case's 0.45 s

pytestmark = [pytest.mark.conformance, pytest.mark.ranks, pytest.mark.slow]

P2P = [
    "test_send_recv",
    "test_send_recv_any_source",
    "test_send_recv_with_tag",
    "test_isend",
    "test_irecv",
    "test_batch_isend_irecv_gloo",
    "test_batch_isend_irecv_gloo_tags",
]
COLLECTIVES = [
    "test_broadcast",
    "test_reduce_sum",
    "test_reduce_product",
    "test_reduce_min",
    "test_reduce_max",
    "test_reduce_sum_twice",
    "test_all_reduce_sum",
    "test_all_reduce_sum_async",
    "test_all_reduce_sum_complex",
    "test_all_reduce_complex_unsupported_ops",
    "test_all_reduce_product",
    "test_all_reduce_min",
    "test_all_reduce_max",
    "test_all_reduce_coalesced_sum",
    "test_all_reduce_coalesced_product",
    "test_all_reduce_coalesced_min",
    "test_all_reduce_coalesced_max",
    "test_all_reduce_coalesced_max_complex_unsupported",
    "test_scatter_checks",
    "test_scatter",
    "test_scatter_complex",
    "test_gather_checks",
    "test_gather",
    "test_all_gather",
    "test_all_gather_complex",
    "test_all_gather_coalesced_simple",
    "test_all_gather_coalesced_complex",
    "test_all_gather_coalesced_with_empty",
    "test_barrier",
    "test_all_gather_object_default_pg",
    "test_scatter_object_list",
    "test_get_future",
]
GROUPS = [  # rank and size, destroy, and the "full_group" cases: new_group() of every rank
    "test_get_rank",
    "test_get_rank_size_group",
    "test_get_rank_size_full_group",
    "test_destroy_group",
    "test_destroy_full_group",
    "test_broadcast_full_group",
    "test_reduce_full_group_sum",
    "test_reduce_full_group_product",
    "test_reduce_full_group_min",
    "test_reduce_full_group_max",
    "test_all_reduce_full_group_sum",
    "test_all_reduce_full_group_product",
    "test_all_reduce_full_group_min",
    "test_all_reduce_full_group_max",
    "test_all_reduce_coalesced_full_group_sum",
    "test_all_reduce_coalesced_full_group_product",
    "test_all_reduce_coalesced_full_group_min",
    "test_all_reduce_coalesced_full_group_max",
    "test_scatter_full_group",
    "test_gather_full_group",
    "test_all_gather_full_group",
    "test_all_gather_coalesced_full_group",
    "test_barrier_full_group",
    "test_all_gather_object_subgroup",
]
# torch runs these on exactly 4 ranks (require_exact_world_size); its other cases for
# new_subgroups want a GPU a rank (skip_if_lt_x_gpu), or are skipped on every backend
ON_FOUR = [
    "test_gather_object",
    "test_gather_object_subgroup",
    "test_new_subgroups_with_group_param",
]
# the "group" cases, new_group([1, 2]): torch skips them below 8 ranks (skip_if_small_worldsize)
ON_EIGHT = [
    "test_broadcast_group",
    "test_reduce_group_sum",
    "test_all_reduce_group_sum",
    "test_all_reduce_coalesced_group_sum",
    "test_scatter_group",
    "test_gather_group",
    "test_all_gather_group",
    "test_all_gather_coalesced_group",
    "test_barrier_group",
]
# torch marks its CPU all_to_all_single cases MPI's alone ("Only MPI supports CPU
# all_to_all_single"), yet gloo passes them, uneven splits too: they run here with that mark
# lifted, and no other (gloo fails the list all_to_all ones: its alltoall wants equal sizes)
UNSKIPPED = [
    "test_all_to_all_single_equal_split",
    "test_all_to_all_single_equal_split_complex",
    "test_all_to_all_single_equal_split_full_group",
    "test_all_to_all_single_unequal_split",
    "test_all_to_all_single_unequal_split_complex",
    "test_all_to_all_single_unequal_split_full_group",
]
ON_EIGHT_UNSKIPPED = [
    "test_all_to_all_single_equal_split_group",
    "test_all_to_all_single_unequal_split_group",
]
CASES = dict.fromkeys(P2P + COLLECTIVES + GROUPS + UNSKIPPED, WORLD_SIZE)
CASES |= dict.fromkeys(ON_FOUR, 4) | dict.fromkeys(ON_EIGHT + ON_EIGHT_UNSKIPPED, 8)
UNSKIPPED_ALL = {*UNSKIPPED, *ON_EIGHT_UNSKIPPED}

# Where the relay does not do what gloo does, case by case.
RELAY_FAILS: dict[str, str] = {}


def _relay_params() -> list[Any]:
    return [
        pytest.param(name, marks=pytest.mark.xfail(strict=True, reason=RELAY_FAILS[name]))
        if name in RELAY_FAILS
        else name
        for name in CASES
    ]


@contextlib.contextmanager
def _suite_env(world_size: int) -> Iterator[None]:
    """The environment torch's suite reads: at import (its skip decorators) and per case."""
    saved = {k: os.environ.get(k) for k in ("BACKEND", "WORLD_SIZE", "TEMP_DIR", "INIT_METHOD")}
    os.environ.update(BACKEND="gloo", WORLD_SIZE=str(world_size))
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _import_suite() -> tuple[type, type]:
    """torch's ``TestDistBackend`` and ``DistributedTest._DistTestBase``, imported for gloo."""
    try:
        import expecttest  # noqa: F401 - torch's test helpers import it
    except ImportError:
        stand_in = types.ModuleType("expecttest")
        stand_in.TestCase = unittest.TestCase  # type: ignore[attr-defined]
        stand_in.ACCEPT = False  # type: ignore[attr-defined]
        sys.modules["expecttest"] = stand_in
    with _suite_env(IMPORTED_AS):
        from torch.testing._internal import common_distributed
        from torch.testing._internal.distributed.distributed_test import (
            DistributedTest,
            TestDistBackend,
        )

    common_distributed.TIMEOUT_DEFAULT = DEADLINE  # what get_timeout gives every case here
    distributed_test = sys.modules[DistributedTest.__module__]
    common_distributed.time = distributed_test.time = _QuickPolls()  # its ranks fork with it
    return TestDistBackend, DistributedTest._DistTestBase  # noqa: SLF001 - torch's suite


class _QuickPolls(types.SimpleNamespace):
    """``time`` as torch's harness sees it, its polls (the file barrier every rank waits at,
    the parent's wait for its ranks' exits) every POLL seconds instead of HARNESS_POLL."""

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)

    @staticmethod
    def sleep(seconds: float) -> None:
        time.sleep(POLL if seconds == HARNESS_POLL else seconds)


def _join_relay(relay: Relay | None, rank: int) -> None:
    """In a forked rank: keep its own end of the relay's sockets, and join through it."""
    if relay is None:
        raise RuntimeError("a rank forked without a relay")
    torch.set_num_threads(1)  # up to 8 ranks share a few cores
    for r, end in enumerate(relay.ends):
        if r != rank:
            end.close()
    join(relay.ends[rank], rank, len(relay.ends), RELAY_TIMEOUT)


@functools.cache
def _harness() -> dict[str, type]:
    """torch's test classes, forked, on gloo and on the relay (imported once, on first use)."""
    TestDistBackend, DistTestBase = _import_suite()  # noqa: N806 - torch's class names

    class OnGloo(TestDistBackend, DistTestBase):
        """torch's harness as in its test_distributed_spawn.py, with forked ranks."""

        def setUp(self) -> None:
            super().setUp()
            self._start()

        def _start(self) -> None:
            self._start_processes(torch.multiprocessing.get_context("fork").Process)

        def tearDown(self) -> None:
            super().tearDown()
            with contextlib.suppress(FileNotFoundError):
                os.remove(self.file_name)  # torch's harness leaves its FileStore's file behind

    class OnRelay(OnGloo):
        """The same, each rank's default group the relay's instead of gloo's."""

        relay: Relay | None = None  # the parent's, inherited by each forked rank

        def _start(self) -> None:
            OnRelay.relay = Relay(int(self.world_size), RELAY_TIMEOUT)
            super()._start()
            OnRelay.relay.close_ends()  # the ranks hold them now
            OnRelay.relay.__enter__()

        def tearDown(self) -> None:
            super().tearDown()
            if OnRelay.relay is not None:
                OnRelay.relay.__exit__(None, None, None)
                OnRelay.relay = None

        @classmethod
        def _run(cls, rank: int, test_name: str, file_name: str, pipe: Any, **_: Any) -> None:
            """torch's ``TestDistBackend._run``, joining the relay for ``init_process_group``."""
            import torch.distributed as dist

            _join_relay(cls.relay, rank)
            self = cls(test_name)
            self.rank, self.file_name = rank, file_name
            self._barrier()
            self.run_test(test_name, pipe)
            self._barrier()
            dist.destroy_process_group()
            sys.exit(0)

    return {"gloo": OnGloo, "relay": OnRelay}


@contextlib.contextmanager
def _kept_rng() -> Iterator[None]:
    """torch's TestCase reseeds every generator in ``setUp``: this process's are put back."""
    state = random.getstate(), np.random.get_state(), torch.random.get_rng_state()  # noqa: NPY002
    try:
        yield
    finally:
        random.setstate(state[0])
        np.random.set_state(state[1])  # noqa: NPY002
        torch.random.set_rng_state(state[2])


def _run_case(backend: str, name: str) -> None:
    """Run torch's case ``name`` on ``backend`` with torch's harness; raise what it raised."""
    cls = _harness()[backend]
    if getattr(cls, name).__dict__.get("__unittest_skip__") and name not in UNSKIPPED_ALL:
        pytest.fail(f"torch skips {name} on gloo: {getattr(cls, name).__unittest_skip_why__}")
    case = cls(name)
    with _suite_env(CASES[name]), _kept_rng():
        case.setUp()
        try:
            getattr(case, name)()  # the harness's: start the ranks, wait, check their exit codes
        except unittest.SkipTest as skip:
            pytest.fail(f"torch skipped {name} on {backend}, which should run it: {skip}")
        finally:
            case.tearDown()
            case.doCleanups()


@pytest.mark.timeout(DEADLINE + 30)
@pytest.mark.parametrize("name", CASES)
def test_the_case_passes_on_gloo(name: str, no_leftovers: None) -> None:
    """Does torch's own case pass on gloo, forked ranks and all, so that it may judge the relay?
    (Once more if gloo's own TCP mesh could not form: on a machine busy with other test runs,
    a rank's connection was once closed before the case started, which says nothing of it.)"""
    try:
        _run_case("gloo", name)
    except RuntimeError as err:
        if "connectFullMesh failed" not in str(err):
            raise
        _run_case("gloo", name)


@pytest.mark.timeout(DEADLINE + 30)
@pytest.mark.parametrize("name", _relay_params())
def test_the_case_passes_on_the_relay(name: str, no_leftovers: None) -> None:
    """Does torch's own case, which passes on gloo, pass with the relay as every rank's group?"""
    _run_case("relay", name)
