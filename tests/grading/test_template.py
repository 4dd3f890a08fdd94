"""A box's forkserver forked from the template is confined as one started cold."""

from __future__ import annotations

import os
import sys

import cloudpickle
import psutil
import pytest
from marks import CONFINED

from course.grading import rankbox, sandbox, template
from course.grading.rankbox import RankBox
from course.ranks import launch

pytestmark = [pytest.mark.ranks, CONFINED]

cloudpickle.register_pickle_by_value(sys.modules[__name__])
# What the grader holds and a rank must not: the instructor's modules, nbgrader, the judge.
GRADERS = ("course.instructor", "nbgrader", "course.grading.judge", "sqlalchemy")


def _confinement() -> dict:
    """What a rank sees of its confinement: who it is, what it may do, what is around it."""
    import ctypes
    import resource
    import socket
    import sys
    from pathlib import Path

    def status(pid: int | str) -> dict[str, str]:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
        return dict(line.split(":\t", 1) for line in lines if ":\t" in line)

    me = status("self")
    others = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) not in (1, os.getpid()):
            try:
                others[entry.name] = status(entry.name)["Uid"].split()[0]
            except (OSError, KeyError):
                continue
    ctypes.CDLL(None).prctl(4, 1, 0, 0, 0)  # dumpable again, as a rank may make itself
    environ = Path("/proc/self/environ").read_bytes().split(b"\0")
    kinds = (resource.RLIMIT_AS, resource.RLIMIT_NPROC, resource.RLIMIT_NOFILE)
    # What Python listed of the folders it looked in (the one it started in, for one).
    caches = [getattr(finder, "_path_cache", ()) for finder in sys.path_importer_cache.values()]
    listed = {name for cache in caches for name in cache}
    return {
        "ids": (os.getuid(), os.geteuid(), os.getgid(), os.getgroups()),
        "caps": me["CapEff"], "no_new_privs": me["NoNewPrivs"],
        "others": sorted(set(others.values())),  # whose processes it can see
        "interfaces": sorted(name for _, name in socket.if_nameindex()),
        "limits": [resource.getrlimit(kind) for kind in kinds],
        # The environment the process started with, less the folder a cold one started in.
        "first_environ": sorted({e.split(b"=", 1)[0].decode() for e in environ if e} - {"PWD"}),
        "environ": sorted(os.environ),
        "hostname": socket.gethostname(),
        "graders_modules": sorted(m for m in sys.modules if m.startswith(GRADERS)),
        "cwd": Path.cwd().name,
        "started_in": Path(sys.modules["multiprocessing.process"].ORIGINAL_DIR).name,
        "session_leader": os.getsid(0) == os.getpid(),
        "listed": sorted(listed),
    }  # fmt: skip


def _confined(monkeypatch: pytest.MonkeyPatch, warm: bool) -> tuple[list[dict], int | None]:
    if not warm:
        monkeypatch.setattr(template, "template", lambda: None)
    with RankBox(uid=sandbox.SANDBOX_UID, ddp=True) as box:  # both import the same
        result = launch(_confinement, 2, timeout=60)
        stub = box.server.stub_pid()
    assert result.ok, result.failures
    return result.results, stub


def test_a_warm_forkserver_is_confined_as_a_cold_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """Do ranks forked warm (from the template) and cold (a forkserver started in the
    sandbox) see the same uid, capabilities, limits, network, processes and environment?"""
    warm, stub = _confined(monkeypatch, warm=True)
    assert stub is not None  # it was forked from the template
    cold, no_stub = _confined(monkeypatch, warm=False)
    assert no_stub is None
    for rank, (w, c) in enumerate(zip(warm, cold, strict=True)):
        assert w == c, {key: (w[key], c[key]) for key in w if w[key] != c[key]} | {"rank": rank}
    seen = warm[0]
    uid = sandbox.SANDBOX_UID
    assert seen["ids"] == (uid, uid, uid, [])
    assert seen["caps"] == "0000000000000000" and seen["no_new_privs"] == "1"
    assert set(seen["others"]) <= {str(uid)}
    assert seen["interfaces"] == ["lo"]
    limits = rankbox.LIMITS
    assert seen["limits"][:2] == [(limits.address_space,) * 2, (limits.processes,) * 2]
    assert set(seen["first_environ"]) <= set(sandbox.sandbox_env(None))
    assert seen["graders_modules"] == []


def test_the_template_starts_with_none_of_the_graders_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    """A process's first environment stays in its memory, and Python lists the folder it
    starts in: does a template started by a grader with a secret in its environment, in a
    folder with a secret in a file's name, hand its ranks none of either?"""
    monkeypatch.setenv("COURSE_TEST_SECRET", "secret-of-the-grader")
    monkeypatch.chdir(tmp_path)  # the grader's folder (a course root, say), out of the view
    (tmp_path / "SECRET_NAME_OF_A_FILE").touch()
    monkeypatch.delenv(template.ENV, raising=False)
    monkeypatch.setattr(template, "_TEMPLATE", None)
    fresh = template.template()
    assert fresh is not None
    try:
        results, stub = _confined(monkeypatch, warm=True)
        assert stub is not None
        inherited = psutil.Process(fresh.pid()).environ()
    finally:
        fresh.stop()
    assert "COURSE_TEST_SECRET" not in inherited
    for seen in results:
        assert "COURSE_TEST_SECRET" not in seen["first_environ"] + seen["environ"]
        assert "SECRET_NAME_OF_A_FILE" not in seen["listed"]


def test_a_box_whose_template_is_gone_starts_cold(monkeypatch: pytest.MonkeyPatch) -> None:
    """A grader handed a template that has since died: does its box start cold, and work?"""
    monkeypatch.setattr(template, "_TEMPLATE", None)
    monkeypatch.setenv(template.ENV, f"/nonexistent/socket {os.getpid()}")
    results, stub = _confined(monkeypatch, warm=True)
    assert stub is None
    assert results[0]["ids"][0] == sandbox.SANDBOX_UID


def test_an_entry_never_joins_the_namespaces_it_is_in_already() -> None:
    """Handed its own namespaces (a stub whose pid a host process took): does the entry
    refuse, before it joins any, rather than run the forkserver unconfined?"""
    mine = [os.open(f"/proc/self/ns/{ns}", os.O_RDONLY) for ns in template.NAMESPACES]
    root = os.open("/", os.O_RDONLY)
    try:
        with pytest.raises(OSError, match="namespace is this process's own"):
            template._enter({"procs": [], "cwd": "/"}, [*mine, root])  # noqa: SLF001 - the module's own step
    finally:
        for fd in (*mine, root):
            os.close(fd)


def test_a_forkserver_ready_before_its_parent_names_it_is_taken() -> None:
    """Forked, the box's forkserver may run before its parent (the entry) writes its pid: is
    its "ready", read first, still taken, not a failed start that sends the box cold?"""
    read, write = os.pipe()
    try:
        os.write(write, b" ready ")
        os.write(write, f" {os.getpid()} ".encode())
        assert template._report(read, None).pid == os.getpid()  # noqa: SLF001 - the module's own step
    finally:
        os.close(read)
        os.close(write)
