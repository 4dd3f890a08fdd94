"""A class on JupyterHub: accounts, the course, nbgrader's exchange and the hub's configuration.

    sudo .venv/bin/python -m course.instructor.hub --root /srv/sync-data-parallel --port 8000

sets up, as nbgrader's JupyterHub guide describes ("One Class, Multiple Graders"), and then
runs JupyterHub (with configurable-http-proxy from npm) on 127.0.0.1:

* local Unix accounts: an instructor, students, and ``grader-<course>``, the account that
  runs formgrader as a hub service; a Unix group (graders) holds the instructor and that
  account, and alone may enter the course root (``source/`` with the keys, the gradebook);
  every home is 0700;
* the course root ``ROOT/course`` (the course's sources, released with generate_assignment),
  and the exchange ``ROOT/exchange``, world-writable as nbgrader's docs ask: nbgrader gives
  its inbound folder no read bit for others and names feedback by a hash, so a student can
  neither list another's submission nor find their feedback;
* the students' environment in a world-readable place (``--env``, default
  ``/opt/sync-data-parallel/env``: a clone of the course's checkout may live in a root-only
  home such as ``/root``, where a student's kernel could not start): a venv of the system's
  Python with the course installed (not editable) and the instructor's modules readable by
  the graders group only (the same list the student view leaves out);
* hub groups and roles: ``formgrade-<course>`` (the instructor) may use the course service;
  ``nbgrader-<course>`` (the students) may see it listed;
* the users' own servers read ``ROOT/jupyter-users`` first: nbgrader's instructor views
  (formgrader, the course list, Create Assignment) are off there, so a student's lab shows
  the assignment list only; the instructor grades in the course service, which keeps them.

Grade with ``make autograde ROOT=ROOT/course`` (as root): results are handed back to the
course root's owner so formgrader can open them.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import secrets
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from course.instructor.hubconfig import COURSE_ID, QUIET_LAB, hub_config, server_config
from course.instructor.studentlab import student_config

__all__ = ["COURSE_ID", "Class", "build_env", "hub_config", "main", "make_accounts", "make_course"]

REPO = Path(__file__).resolve().parents[2]
PROXY = REPO / "node_modules" / ".bin" / "configurable-http-proxy"


@dataclass(frozen=True)
class Class:
    """Where a class lives, who is in it, and the ports it answers on (all on 127.0.0.1)."""

    root: Path = Path("/srv/sync-data-parallel")
    env: Path = Path("/opt/sync-data-parallel/env")
    instructor: str = "instructor"
    students: tuple[str, ...] = ("student1", "student2", "student3")
    prefix: str = ""  # put before every account and group name (a test's own class)
    port: int = 8000
    ports: tuple[int, ...] = (8081, 8001, 9999)  # hub, proxy API, course service
    passwords: dict[str, str] = field(default_factory=dict)

    @property
    def grader(self) -> str:
        return f"{self.prefix}grader-{COURSE_ID}"

    @property
    def group(self) -> str:
        return f"{self.prefix}graders-{COURSE_ID}"[:32]

    @property
    def users(self) -> tuple[str, ...]:
        return (self.instructor, *self.students)

    @property
    def course(self) -> Path:
        return self.root / "course"

    @property
    def exchange(self) -> Path:
        return self.root / "exchange"

    @property
    def config(self) -> Path:
        """Jupyter config every user's server reads (JUPYTER_CONFIG_PATH): course, exchange."""
        return self.root / "jupyter"

    @property
    def user_config(self) -> Path:
        """Jupyter config the users' own servers read before :attr:`config`: nbgrader's
        instructor views off (the course's service, where grading happens, keeps them)."""
        return self.root / "jupyter-users"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"


def _run(*cmd: str, stdin: str | None = None) -> None:
    subprocess.run(cmd, input=stdin, text=True, check=True, capture_output=True)


def _exists(kind: str, name: str) -> bool:
    return subprocess.run(["getent", kind, name], capture_output=True, check=False).returncode == 0


def make_accounts(cls: Class) -> dict[str, str]:
    """Create the Unix group and accounts (kept if there); set passwords; {user: password}."""
    if not _exists("group", cls.group):
        _run("groupadd", cls.group)
    passwords = {u: cls.passwords.get(u) or secrets.token_urlsafe(12) for u in cls.users}
    for user in (*cls.users, cls.grader):
        if not _exists("passwd", user):
            _run("useradd", "--create-home", "--shell", "/bin/bash", user)
        os.chmod(Path("~" + user).expanduser(), 0o700)
    for user in (cls.instructor, cls.grader):
        _run("usermod", "--append", "--groups", cls.group, user)
    _run("chpasswd", stdin="".join(f"{u}:{p}\n" for u, p in passwords.items()))
    return passwords


def remove_accounts(cls: Class) -> None:
    """Delete the class's accounts (and homes) and its group: a test's cleanup."""
    for user in (*cls.users, cls.grader):
        subprocess.run(["userdel", "--remove", "--force", user], capture_output=True, check=False)
    subprocess.run(["groupdel", cls.group], capture_output=True, check=False)


def _base_python() -> str:
    """A Python 3.11 every user may run (the system's), not a root-only one (pyenv in /root)."""
    for candidate in ("/usr/bin/python3.11", "/usr/local/bin/python3.11"):
        if os.access(candidate, os.X_OK):
            return candidate
    return sys.executable


def build_env(cls: Class, repo: Path = REPO) -> Path:
    """The students' venv at ``cls.env``: the course and its pins, instructor modules closed."""
    from course.instructor.studentview import LEFT_OUT

    python = cls.env / "bin" / "python"
    if not python.exists():
        _run(_base_python(), "-m", "venv", "--without-pip", str(cls.env))
    _run(sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet",
         "--disable-pip-version-check", f"{repo}[hub]")  # fmt: skip
    site = Path(
        subprocess.run(
            [str(python), "-I", "-c", "import course, os; print(os.path.dirname(course.__file__))"],
            capture_output=True, text=True, check=True, cwd="/",
        ).stdout.strip()
    )  # fmt: skip
    if not site.is_relative_to(cls.env):  # never a checkout's own files
        raise RuntimeError(f"the students' environment imports course from {site}")
    _close_instructor_modules(site.parent, LEFT_OUT, cls.group)
    settings = cls.env / "share" / "jupyter" / "lab" / "settings" / "overrides.json"
    settings.parent.mkdir(parents=True, exist_ok=True)
    settings.write_text(json.dumps(QUIET_LAB))
    return python


def _close_instructor_modules(site: Path, left_out: tuple[str, ...], group: str) -> None:
    """The instructor's modules (and their bytecode): readable by ``group`` only."""
    for rel in left_out:
        module = site / rel
        cache = module.parent / "__pycache__"
        for path in [module, *cache.glob(f"{module.stem}.*.pyc")]:
            if path.exists():
                shutil.chown(path, "root", group)
                path.chmod(0o640)


def make_course(cls: Class, repo: Path = REPO) -> Path:
    """The course root (released), the exchange, and the config every user's server reads."""
    from course.instructor.commands import release
    from course.instructor.pipeline import prepare_course

    if not (cls.course / "gradebook.db").exists():
        prepare_course(cls.course, repo / "source")
        release(cls.course)
    for path in [cls.course, *cls.course.rglob("*")]:
        shutil.chown(path, cls.grader, cls.group)
        if path.is_dir():
            path.chmod(0o2770)  # setgid: what graders make stays the group's
    cls.root.chmod(0o755)
    cls.exchange.mkdir(exist_ok=True)
    cls.exchange.chmod(0o777)  # nbgrader's docs: every user writes the exchange
    cls.config.mkdir(exist_ok=True)
    (cls.config / "nbgrader_config.py").write_text(
        "c = get_config()  # noqa: F821\n"
        f"c.CourseDirectory.course_id = {COURSE_ID!r}\n"
        f"c.Exchange.root = {str(cls.exchange)!r}\n"
    )
    (cls.config / "jupyter_server_config.py").write_text(server_config())
    cls.user_config.mkdir(exist_ok=True)
    student_config(cls.user_config)
    return cls.course


def write_hub(cls: Class) -> Path:
    """Write the hub's folder (root only: its database and cookie secret) and config file."""
    folder = cls.root / "hub"
    folder.mkdir(mode=0o700, exist_ok=True)
    path = folder / "jupyterhub_config.py"
    path.write_text(hub_config(cls, PROXY))
    return path


def hub_command(cls: Class) -> list[str]:
    """The command that runs the class's hub (the course's venv's jupyterhub, as root)."""
    jupyterhub = str(Path(sys.executable).parent / "jupyterhub")
    return [jupyterhub, "-f", str(cls.root / "hub" / "jupyterhub_config.py")]


def set_up(cls: Class) -> dict[str, str]:
    """Accounts, the students' environment, the course and the hub's config; the passwords."""
    if os.geteuid() != 0:
        raise SystemExit("a hub with real accounts needs root: run it with sudo")
    if not PROXY.exists():
        raise SystemExit(f"no configurable-http-proxy at {PROXY}: run `make setup` (npm ci)")
    cls.root.mkdir(parents=True, exist_ok=True)
    passwords = make_accounts(cls)
    build_env(cls)
    make_course(cls)
    write_hub(cls)
    return passwords


def free_ports(n: int) -> tuple[int, ...]:
    """``n`` ports free on 127.0.0.1 now, below the kernel's ephemeral range: two classes'
    hubs on one machine do not collide, and no process that asks for any port (a rank's
    store, a client's own end of a connection) is handed one of them before it is bound."""
    low = _ephemeral_low()
    found: list[int] = []
    for port in random.sample(range(max(low - 12000, 1024), low), 200):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        found.append(port)
        if len(found) == n:
            return tuple(found)
    raise RuntimeError(f"no {n} free ports below {low} on 127.0.0.1")


def _ephemeral_low() -> int:
    """Where the kernel's ephemeral ports start (Linux: 32768 unless set otherwise)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _ports(text: str) -> tuple[int, int, int]:
    try:
        hub, api, service = (int(p) for p in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"three ports, HUB,API,SERVICE: got {text!r}") from None
    return hub, api, service


def main(argv: list[str] | None = None) -> int:
    """``python -m course.instructor.hub [--root DIR] [--env DIR] [--port N]``: set up, serve."""
    parser = argparse.ArgumentParser(
        prog="python -m course.instructor.hub", description=main.__doc__
    )
    parser.add_argument("--root", type=Path, default=Class.root)
    parser.add_argument("--env", type=Path, default=Class.env)
    parser.add_argument("--port", type=int, default=Class.port)
    parser.add_argument("--password", help="every account's password (default: random, printed)")
    parser.add_argument(
        "--inner-ports", type=_ports, default=None, metavar="HUB,API,SERVICE",
        help="the hub's own, the proxy's API and the course service's (default: free ones)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    ports = args.inner_ports or free_ports(3)
    passwords = dict.fromkeys(Class().users, args.password) if args.password else {}
    cls = Class(root=args.root.resolve(), env=args.env.resolve(), port=args.port,
                ports=ports, passwords=passwords)  # fmt: skip
    passwords = set_up(cls)
    print(f"JupyterHub for {COURSE_ID} at {cls.url} (loopback only); accounts:")
    for user, password in passwords.items():
        print(f"    {user:12s} {password}")
    print(f"formgrader: {cls.url}services/{COURSE_ID}/formgrader (as {cls.instructor})")
    print(f"grade with: sudo make autograde ROOT={cls.course}")
    print("stop with:  sudo make hub-down (REMOVE=1 also removes the accounts and the course)")
    os.execv(hub_command(cls)[0], hub_command(cls))  # noqa: S606 - becomes the hub
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
