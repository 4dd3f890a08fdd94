"""``make lab``: JupyterLab on the course, the first notebook open, nbgrader's formgrader working.

    python -m course.instructor.lab                                  # make lab: work/ from release/
    python -m course.instructor.lab selfstudy-work --from selfstudy  # the self-study build

Students' copies go to ``<work>/`` (``course.instructor.workcopies``: answers never
overwritten), and JupyterLab opens ``<work>/ring_allreduce/ring_allreduce.ipynb`` with the
file browser there. The server's root is the course root, not ``<work>/``: the formgrader
links an assignment's source and preview as paths under the served root (``source/<a>``,
``release/<a>``), which resolve only when the course is inside it. The venv's ``bin`` goes
first on PATH (nbgrader runs ``alembic`` by name when it makes a gradebook), and the
gradebook is made before the server starts, with its migration stamp; one an earlier start
left without it is stamped. ``--port`` picks the port (``make lab PORT=8890``); a machine with
no display (a server, a container) gets no browser opened, only the URL to open. JupyterLab's
defaults in the venv (its ``overrides.json``) ask for no news and no update checks, so no
toast covers the widgets. Kernels are forked from one warm process, as in the students' lab
(:mod:`course.instructor.forkedkernels`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from course.grading.gradebook import open_gradebook, venv_on_path
from course.instructor.forkedkernels import LAB_OPTION
from course.instructor.hubconfig import QUIET_LAB
from course.instructor.workcopies import course_order, make_work_copies

__all__ = ["has_display", "lab_command", "prepare", "quiet_lab"]


def prepare(root: Path, work: str = "work", origin: str = "release") -> Path:
    """Work copies and a stamped gradebook in course ``root``; return the first notebook
    (relative to ``root``)."""
    copied, kept = make_work_copies(root / work, root / origin)
    for path in copied:
        print(f"new work copy: {path.relative_to(root)}")
    if kept:
        print(f"kept {len(kept)} work copies with your answers in {work}/")
    if not copied and not kept:
        raise SystemExit(f"no notebooks in {root / origin}: run `make release` first")
    with open_gradebook(root / "gradebook.db"):
        pass
    return min(copied + kept, key=course_order).relative_to(root)


def quiet_lab(prefix: Path = Path(sys.prefix)) -> Path:
    """JupyterLab's defaults in the environment at ``prefix``: no news, no update checks (the
    toast that asks covers the widgets); what else is there is kept. Return the file."""
    path = prefix / "share" / "jupyter" / "lab" / "settings" / "overrides.json"
    settings = json.loads(path.read_text()) if path.is_file() and path.stat().st_size else {}
    for plugin, values in QUIET_LAB.items():
        settings.setdefault(plugin, {}).update(values)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(settings, indent=2) + "\n")
    return path


def has_display() -> bool:
    """Can a browser be opened here: a desktop session (X11, Wayland) or a Mac?"""
    return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")) or (
        sys.platform == "darwin"
    )


def lab_command(
    root: Path, first: Path, port: int | None = None, open_browser: bool | None = None
) -> tuple[list[str], dict[str, str]]:
    """The ``jupyter lab`` command line and environment that serve ``root`` and open ``first``
    (on ``port``, else jupyter's own choice; a browser only where one can open, by default)."""
    venv_on_path()
    jupyter = str(Path(sys.executable).parent / "jupyter")
    cmd = [
        jupyter,
        "lab",
        f"--ServerApp.root_dir={root.resolve()}",
        f"--LabApp.default_url=/lab/tree/{first.as_posix()}",
        f"--FileContentsManager.preferred_dir={first.parent.parent.as_posix()}",
        LAB_OPTION,
    ]
    if port is not None:
        cmd.append(f"--ServerApp.port={port}")
    if not (has_display() if open_browser is None else open_browser):
        cmd.append("--no-browser")
    if os.geteuid() == 0:  # a container or a fresh machine: jupyter refuses root without it
        cmd.append("--allow-root")
    return cmd, dict(os.environ)


def main(argv: Sequence[str] | None = None) -> int:
    """Make the work copies and the gradebook, then hand over to ``jupyter lab``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("work", nargs="?", default="work", help="where the students' copies go")
    parser.add_argument("--from", dest="origin", default="release", help="release or selfstudy")
    parser.add_argument("--port", type=int, help="the port to serve on (default: 8888 or next)")
    parser.add_argument(
        "--browser", action=argparse.BooleanOptionalAction, default=None,
        help="open a browser (default: only where there is a display)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    root = Path.cwd()
    first = prepare(root, args.work, args.origin)
    quiet_lab()
    cmd, env = lab_command(root, first, args.port, args.browser)
    print(f"opening {first} in JupyterLab (formgrader: Nbgrader > Formgrader)", flush=True)
    os.execve(cmd[0], cmd, env)  # noqa: S606 - make lab hands its terminal to jupyter lab
    return 1  # not reached: the process is jupyter lab now


if __name__ == "__main__":
    raise SystemExit(main())
