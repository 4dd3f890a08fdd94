"""The gradebook and nbgrader's environment, for every process that grades or reports.

A new gradebook is stamped with the newest revision of nbgrader's schema. nbgrader reads it by
running ``alembic heads`` in a second interpreter found by name on PATH (2.5 CPU-s a gradebook);
:func:`read_schema_here` has it read from nbgrader's migrations in the process itself, and
``nbgrader_config.py`` calls it in every nbgrader command. nbgrader still runs ``alembic`` by
name to upgrade a gradebook: :func:`env` and :func:`open_gradebook` put this interpreter's
``bin`` on PATH first.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import sys
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = [
    "env",
    "nbgrader_quiet",
    "open_gradebook",
    "read_schema_here",
    "schema_head",
    "venv_on_path",
]

_FILTERS = threading.RLock()  # the process's warning filters: one thread changes them at a time


@contextlib.contextmanager
def nbgrader_quiet() -> Iterator[None]:
    """SQLAlchemy's warnings from nbgrader's own code, ignored. ``catch_warnings`` sets the
    whole process's filters, and restores them when it ends: two threads inside it at once
    (one merging a result, one reading a scratch gradebook) could each put back what the
    other had replaced, and a warning came out. One thread at a time holds them here."""
    from sqlalchemy.exc import SAWarning

    with _FILTERS, warnings.catch_warnings(action="ignore", category=SAWarning):
        yield


def schema_head() -> str:
    """The newest revision of nbgrader's gradebook schema, from its migrations, in this process
    (what ``alembic heads`` prints for nbgrader's ``alembic.ini``)."""
    import nbgrader.dbutil
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    config = Config()
    config.set_main_option("script_location", nbgrader.dbutil.ALEMBIC_DIR)
    return ScriptDirectory.from_config(config).get_current_head()


def read_schema_here() -> None:
    """Have nbgrader, in this process, stamp a new gradebook with :func:`schema_head`."""
    import nbgrader.api

    nbgrader.api.get_alembic_version = schema_head


def env() -> dict[str, str]:
    """This process's environment with the venv's bin on PATH, for nbgrader's subprocesses."""
    venv_on_path()
    return dict(os.environ)


def venv_on_path() -> None:
    """Put this interpreter's bin first on PATH: nbgrader runs ``alembic`` by name to upgrade
    a gradebook, and ``make autograde`` calls the venv's python without activating the venv."""
    here = str(Path(sys.executable).parent)
    path = os.environ.get("PATH", "")
    if here not in path.split(os.pathsep):
        os.environ["PATH"] = here + os.pathsep + path if path else here


def open_gradebook(db: Path) -> Any:
    """nbgrader's ``Gradebook`` on the SQLite file ``db``, made (or repaired) if need be.

    A gradebook.db with nbgrader's tables but no ``alembic_version`` was left by a creation
    that could not run ``alembic``; its tables are nbgrader's current schema (made by
    SQLAlchemy from nbgrader's models), so it is stamped with the current version rather
    than thrown away with whatever grades it holds.
    """
    from nbgrader.api import Gradebook

    venv_on_path()
    read_schema_here()
    if db.is_file():
        _stamp_if_unversioned(db)
    return Gradebook(f"sqlite:///{db.resolve()}")


def _stamp_if_unversioned(db: Path) -> None:
    """Give a gradebook made without ``alembic`` its ``alembic_version``, and say so."""
    with contextlib.closing(sqlite3.connect(db)) as con, con:
        query = "SELECT name FROM sqlite_master WHERE type='table'"
        tables = {row[0] for row in con.execute(query)}
        if tables and "alembic_version" not in tables:
            version = schema_head()
            cut = "its creation was cut short"
            print(f"{db} had no alembic_version ({cut}): stamped {version}", flush=True)
            con.execute("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL)")
            con.execute("INSERT INTO alembic_version (version_num) VALUES (?)", (version,))
