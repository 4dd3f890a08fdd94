"""The class's Jupyter configuration, as text: the hub's (nbgrader's guide) and every server's.

``hub_config`` follows nbgrader's "One Class, Multiple Graders" for JupyterHub >= 2: a course
service run by the grader account, a ``formgrade-<course>`` group whose role may use it, a
``nbgrader-<course>`` group of students who may see it listed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["COURSE_ID", "FRAME_SELF", "QUIET_LAB", "hub_config", "server_config"]

COURSE_ID = "sync-data-parallel"
# JupyterLab's defaults for the course's labs: no news toast over the widgets, and no widget
# state saved into notebooks (a ring widget's is about 5 MB; the intake caps a file at 20 MiB).
QUIET_LAB = {
    "@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": False},
    "@jupyter-widgets/jupyterlab-manager:plugin": {"saveState": False},
}
# JupyterHub >= 4.1 keeps single-user pages out of frames; formgrader's page in JupyterLab
# is one (nbgrader #1870): let a server frame its own pages, and nothing else.
FRAME_SELF = "frame-ancestors 'self'"


def server_config() -> str:
    """jupyter_server_config.py for every user's server: it may frame its own pages."""
    csp = {"headers": {"Content-Security-Policy": FRAME_SELF}}
    return f"c = get_config()  # noqa: F821\nc.ServerApp.tornado_settings = {csp!r}\n"


def _roles() -> list[dict]:
    """The course's roles: graders use its service; students and servers see it listed."""
    return [
        {
            "name": f"formgrade-{COURSE_ID}",
            "groups": [f"formgrade-{COURSE_ID}"],
            "scopes": [
                f"access:services!service={COURSE_ID}",
                "list:services",
                f"read:services!service={COURSE_ID}",
            ],
        },
        {
            "name": f"nbgrader-{COURSE_ID}",
            "groups": [f"nbgrader-{COURSE_ID}"],
            "scopes": ["list:services", f"read:services!service={COURSE_ID}"],
        },
        {"name": "server", "scopes": ["inherit"]},
    ]


def hub_config(cls: Any, proxy: Path) -> str:
    """The text of jupyterhub_config.py for the class (nbgrader's guide, JupyterHub >= 2)."""
    hub, api, service = cls.ports
    singleuser = str(cls.env / "bin" / "jupyterhub-singleuser")
    user_env = {"JUPYTER_CONFIG_PATH": f"{cls.user_config}:{cls.config}"}
    service_env = {"JUPYTER_CONFIG_PATH": str(cls.config), "COURSE_EXCHANGE": str(cls.exchange),
                   "JUPYTERHUB_DEFAULT_URL": "/formgrader"}  # fmt: skip
    settings = {
        "JupyterHub.ip": "127.0.0.1",
        "JupyterHub.port": cls.port,
        "JupyterHub.hub_ip": "127.0.0.1",
        "JupyterHub.hub_port": hub,
        "ConfigurableHTTPProxy.api_url": f"http://127.0.0.1:{api}",
        "ConfigurableHTTPProxy.command": [str(proxy)],
        # where the hub finds a proxy left by a run that died, and stops it before its own
        "ConfigurableHTTPProxy.pid_file": str(cls.root / "hub" / "jupyterhub-proxy.pid"),
        "JupyterHub.db_url": f"sqlite:///{cls.root / 'hub' / 'jupyterhub.sqlite'}",
        "JupyterHub.cookie_secret_file": str(cls.root / "hub" / "cookie_secret"),
        "JupyterHub.pid_file": str(cls.root / "hub" / "jupyterhub.pid"),
        # No periodic health check of the course's service: it only logs, and JupyterHub 6.1's
        # races the hub's own shutdown (it reads the stopped service's server, now None, and
        # logs an AttributeError's traceback on SIGTERM about one time in ten).
        "JupyterHub.service_check_interval": 0,
        "JupyterHub.authenticator_class": "pam",
        "PAMAuthenticator.open_sessions": False,
        "Authenticator.allowed_users": sorted(cls.users),
        "Spawner.cmd": [singleuser],
        "Spawner.default_url": "/lab",
        "Spawner.environment": user_env,
        "Spawner.start_timeout": 120,
        "Spawner.http_timeout": 120,
        "JupyterHub.load_groups": {
            f"formgrade-{COURSE_ID}": {"users": [cls.instructor]},
            f"nbgrader-{COURSE_ID}": {"users": list(cls.students)},
        },
        "JupyterHub.load_roles": _roles(),
        "JupyterHub.services": [
            {
                "name": COURSE_ID,
                "url": f"http://127.0.0.1:{service}",
                "command": [singleuser],
                "user": cls.grader,
                "cwd": str(cls.course),
                "environment": service_env,
                "oauth_no_confirm": True,
                "timeout": 120,  # seconds to come up: a loaded machine needs more than 30
            }
        ],
    }  # fmt: skip
    lines = [
        "# Written by course.instructor.hub: the class's JupyterHub.",
        "c = get_config()  # noqa: F821",
    ]
    lines += [f"c.{key} = {value!r}" for key, value in settings.items()]
    return "\n".join(lines) + "\n"
