"""Take a class's JupyterHub down: stop the hub, and on request remove what its set-up made.

    sudo .venv/bin/python -m course.instructor.hubdown --root /srv/sync-data-parallel
    sudo .venv/bin/python -m course.instructor.hubdown --root /srv/sync-data-parallel --remove

``make hub-down`` (``REMOVE=1`` to remove). Stopping sends the hub SIGTERM (it stops the users'
servers and the course service itself) and waits for it, then stops a proxy a hub that died
left behind; every process is found by the pid files the hub's configuration names. Removing
also ends what the class's accounts still run, deletes the accounts, their homes and the
group, the class's root (the course, its gradebook and the exchange: the grades with it) and
the students' environment. Nothing is removed without ``--remove``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import psutil

from course.instructor.hub import Class, remove_accounts

__all__ = ["main", "remove_class", "stop_hub"]

STOP_WAIT = 60.0  # seconds the hub gets to stop its servers before it is killed


def _pid(path: Path) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        return int(path.read_text().strip())
    return None


def _stop(pid: int | None, wait: float) -> str:
    """SIGTERM to ``pid``, SIGKILL after ``wait`` s: "stopped", "killed" or "not running"."""
    if pid is None or not psutil.pid_exists(pid):
        return "not running"
    try:
        proc = psutil.Process(pid)
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(wait)
        except psutil.TimeoutExpired:
            proc.kill()
            proc.wait(5)
            return "killed"
    except psutil.NoSuchProcess:
        pass
    return "stopped"


def stop_hub(cls: Class, wait: float = STOP_WAIT) -> tuple[str, float]:
    """Stop the class's hub, then any proxy left behind: how the hub ended ("stopped" by
    itself, "killed" after ``wait`` s, or "not running") and the seconds it took."""
    folder = cls.root / "hub"
    start = time.monotonic()
    how = _stop(_pid(folder / "jupyterhub.pid"), wait)
    took = time.monotonic() - start
    _stop(_pid(folder / "jupyterhub-proxy.pid"), 5.0)
    return how, took


def remove_class(cls: Class) -> None:
    """End what the class's accounts run, delete them and their group, its root and its env."""
    for user in (*cls.users, cls.grader):
        subprocess.run(["pkill", "-KILL", "-u", user], capture_output=True, check=False)
    remove_accounts(cls)
    shutil.rmtree(cls.root, ignore_errors=True)
    shutil.rmtree(cls.env, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    """``python -m course.instructor.hubdown [--root DIR] [--env DIR] [--remove]``."""
    parser = argparse.ArgumentParser(
        prog="python -m course.instructor.hubdown", description=main.__doc__
    )
    parser.add_argument("--root", type=Path, default=Class.root)
    parser.add_argument("--env", type=Path, default=Class.env)
    parser.add_argument(
        "--remove", action="store_true",
        help="also delete the accounts, the course root (grades included) and the environment",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("a class's hub and accounts are root's: run it with sudo")
    cls = Class(root=args.root.resolve(), env=args.env.resolve())
    how, took = stop_hub(cls)
    print("no hub was running" if how == "not running" else f"the hub {how} in {took:.1f} s")
    if args.remove:
        remove_class(cls)
        print(
            f"removed the accounts {', '.join((*cls.users, cls.grader))}, {cls.root} and {cls.env}"
        )
    else:
        print(f"kept the accounts, {cls.root} and {cls.env}: `make hub-down REMOVE=1` removes them")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
