"""The students' JupyterLab: nbgrader's instructor views turned off in this environment.

    python -m course.instructor.studentlab        # the student view's postBuild runs it

nbgrader installs its formgrader, course list and "Create Assignment" sidebar for everyone;
a student needs none of them (and Binder's memory is better spent on kernels). This turns
them off at the ``sys-prefix`` level of the environment it runs in, with jupyter's own
commands, so the student's own Jupyter settings are left alone. On the class's JupyterHub the
same settings sit in a folder on the user servers' ``JUPYTER_CONFIG_PATH``
(``course.instructor.hub``): the instructor grades in the course's service, which keeps them.
The assignment list and the Validate button stay: students fetch and submit with them.

It forks each kernel from one process that imported what the lessons' kernels import
(:mod:`course.instructor.forkedkernels`): the eight lessons open and run hold 1,158 MB, not
1,958 (``benchmarks/binder.py``), within Binder's 2 GB. And it shuts down a kernel idle for
:data:`CULL_IDLE` seconds, its notebook's tab open or not (``MappingKernelManager.cull_*``):
a lesson's kernel still keeps about 100 MB of its own once its cells have run. A culled
notebook keeps its outputs; running it again brings its kernel back.

These are the views, not a boundary: a student who turns formgrader back on in their own
``~/.jupyter`` gets one over their own files, with their own uid; what keeps the course's
sources, the gradebook and other students' work from them is the file system's permissions.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from course.instructor.forkedkernels import PROVISIONER

__all__ = [
    "CULL_IDLE", "INSTRUCTOR_LAB_PLUGINS", "INSTRUCTOR_SERVER_EXTENSIONS", "student_config",
    "student_lab",
]  # fmt: skip

INSTRUCTOR_SERVER_EXTENSIONS = (
    "nbgrader.server_extensions.formgrader",
    "nbgrader.server_extensions.course_list",
)
CULL_IDLE = 20 * 60  # seconds a kernel may sit idle before the server shuts it down
INSTRUCTOR_LAB_PLUGINS = (
    "@jupyter/nbgrader:formgrader",
    "@jupyter/nbgrader:create-assignment",
    "@jupyter/nbgrader:course-list",
)


def student_lab(prefix: str = sys.prefix) -> Path:
    """Disable the instructor's server extensions and lab plugins for the environment at
    ``prefix`` (this interpreter's); return its jupyter config folder.

    What ``jupyter server extension disable --sys-prefix`` and ``jupyter labextension
    disable --level=sys_prefix`` write, written here: those commands act on whichever
    environment their own script belongs to, this on the one that runs it.
    """
    return student_config(Path(prefix) / "etc" / "jupyter")


def student_config(config: Path) -> Path:
    """Write into the jupyter config folder ``config`` (a level of the environment, or a
    folder on a server's ``JUPYTER_CONFIG_PATH``: a hub's user servers) what turns the
    instructor's views off, idle kernels culled and kernels forked from the zygote, keeping
    what is there; return
    ``config``."""
    server = _merge(config / "jupyter_server_config.json")  # it overrides the .d/ files
    enabled = server.setdefault("ServerApp", {}).setdefault("jpserver_extensions", {})
    enabled |= dict.fromkeys(INSTRUCTOR_SERVER_EXTENSIONS, False)
    kernels = server.setdefault("MappingKernelManager", {})
    kernels |= {"cull_idle_timeout": CULL_IDLE, "cull_interval": 60, "cull_connected": True}
    server.setdefault("KernelProvisionerFactory", {})["default_provisioner_name"] = PROVISIONER
    _write(config / "jupyter_server_config.json", server)
    page = _merge(config / "labconfig" / "page_config.json")
    page.setdefault("disabledExtensions", {}).update(dict.fromkeys(INSTRUCTOR_LAB_PLUGINS, True))
    _write(config / "labconfig" / "page_config.json", page)
    return config


def _merge(path: Path) -> dict:
    """A JSON config file's content, or an empty one."""
    return json.loads(path.read_text()) if path.is_file() and path.stat().st_size else {}


def _write(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + os.linesep)


if __name__ == "__main__":
    where = student_lab()
    print(
        f"nbgrader's instructor views (formgrader, course list, Create Assignment) off, and "
        f"kernels forked from one zygote and shut down when idle for {CULL_IDLE // 60} "
        f"minutes, in {where}"
    )
