"""Students' work copies: made from release/, never overwriting a student's answers."""

from __future__ import annotations

from pathlib import Path

from course.instructor.workcopies import main, make_work_copies

REPO = Path(__file__).resolve().parents[2]


def test_work_copies_are_made_once_and_keep_answers(tmp_path) -> None:
    """Are the release notebooks copied into work/, and a saved answer kept on the next run?"""
    work = tmp_path / "work"
    copied, kept = make_work_copies(work, REPO / "release")
    names = sorted(p.relative_to(work).as_posix() for p in copied)
    assert "ring_allreduce/ring_allreduce.ipynb" in names and not kept
    mine = work / "ring_allreduce" / "ring_allreduce.ipynb"
    mine.write_text(mine.read_text().replace('answer_ring_1 = \\"\\"', 'answer_ring_1 = \\"b\\"'))
    saved = mine.read_text()
    assert 'answer_ring_1 = \\"b\\"' in saved
    copied, kept = make_work_copies(work, REPO / "release")
    assert not copied and mine in kept and mine.read_text() == saved


def test_the_command_names_the_first_notebook(tmp_path, capsys) -> None:
    """Does `python -m course.instructor.workcopies` say to open the ring notebook first?"""
    assert main([str(tmp_path / "work"), "--from", str(REPO / "release")]) == 0
    assert "open ring_allreduce/ring_allreduce.ipynb" in capsys.readouterr().out


def test_make_lab_serves_the_course_and_opens_the_first_work_copy(tmp_path) -> None:
    """Does `make lab` make work copies from release/ and a stamped gradebook, then start
    jupyter lab on the course root (formgrader's links live there) with the first notebook
    open, the venv's bin on PATH, and --allow-root exactly when run as root?"""
    import os
    import shutil
    import sqlite3
    import subprocess
    import sys

    from course.instructor.lab import lab_command, prepare

    plan = subprocess.run(
        ["make", "-n", "lab"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    assert "course.instructor.lab work --from release" in plan
    root = tmp_path / "course"
    shutil.copytree(REPO / "release", root / "release")
    first = prepare(root)
    assert first.as_posix() == "work/ring_allreduce/ring_allreduce.ipynb"
    with sqlite3.connect(root / "gradebook.db") as db:
        assert db.execute("SELECT count(*) FROM alembic_version").fetchone() == (1,)
    cmd, env = lab_command(root, first)
    assert cmd[1] == "lab" and f"--ServerApp.root_dir={root}" in cmd
    assert "--LabApp.default_url=/lab/tree/work/ring_allreduce/ring_allreduce.ipynb" in cmd
    assert env["PATH"].split(os.pathsep)[0] == str(Path(sys.executable).parent)
    assert ("--allow-root" in cmd) == (os.geteuid() == 0)
    assert "/work/" in (REPO / ".gitignore").read_text().splitlines()


def test_make_lab_takes_a_port_opens_no_browser_without_a_display_and_asks_no_news(
    tmp_path, monkeypatch
) -> None:
    """Does `make lab PORT=8890` reach jupyter as its port; does a machine with no display
    get --no-browser (and one with a display a browser); are JupyterLab's news and update
    checks off in the environment's defaults, with what else was there kept?"""
    import json
    import subprocess

    from course.instructor.hubconfig import QUIET_LAB
    from course.instructor.lab import lab_command, quiet_lab

    plan = subprocess.run(
        ["make", "-n", "lab", "PORT=8890"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    assert "--port 8890" in plan
    first = Path("work/ring_allreduce/ring_allreduce.ipynb")
    for var in ("DISPLAY", "WAYLAND_DISPLAY"):
        monkeypatch.delenv(var, raising=False)
    cmd, _ = lab_command(tmp_path, first, port=8890)
    assert "--ServerApp.port=8890" in cmd and "--no-browser" in cmd
    monkeypatch.setenv("DISPLAY", ":0")
    assert "--no-browser" not in lab_command(tmp_path, first)[0]
    assert "--no-browser" in lab_command(tmp_path, first, open_browser=False)[0]
    overrides = tmp_path / "share" / "jupyter" / "lab" / "settings" / "overrides.json"
    overrides.parent.mkdir(parents=True)
    overrides.write_text(json.dumps({"@jupyterlab/apputils-extension:themes": {"theme": "x"}}))
    settings = json.loads(quiet_lab(tmp_path).read_text())
    assert settings["@jupyterlab/apputils-extension:themes"] == {"theme": "x"}
    for plugin, values in QUIET_LAB.items():
        assert settings[plugin] == values
