"""The students' JupyterLab: are nbgrader's instructor views off, and the student's left?"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import time
import urllib.error
from pathlib import Path

import psutil
import pytest

from course.instructor.studentlab import student_lab

pytestmark = pytest.mark.browser

REPO = Path(__file__).resolve().parents[2]


def test_students_see_no_formgrader_course_list_or_create_assignment(
    browser, tmp_path, artifact, helpers
) -> None:
    """With the student view's settings (course.instructor.studentlab), is the Nbgrader menu
    down to the assignment list, the Create Assignment sidebar gone and formgrader not served?"""
    config = student_lab(str(tmp_path / "env"))
    root = tmp_path / "root"
    shutil.copytree(REPO / "release" / "ring_allreduce", root / "ring_allreduce")
    jupyter = str(Path(sys.executable).parent / "jupyter")
    cmd = [jupyter, "lab", f"--ServerApp.root_dir={root}"]
    cmd += ["--allow-root"] if os.geteuid() == 0 else []
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(config)}  # where student_lab wrote
    with helpers.running_lab(root, tmp_path / "home", root, (cmd, env)) as lab:
        context = browser.new_context(viewport={"width": 1280, "height": 1000})
        page = context.new_page()
        page.goto(lab.url("lab/tree/ring_allreduce/ring_allreduce.ipynb"))
        page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)
        page.get_by_role("menuitem", name="Nbgrader", exact=True).click()
        items = page.locator(".lm-Menu-content .lm-Menu-itemLabel").all_text_contents()
        assert [i for i in items if i] == ["Assignment List"]
        assert page.get_by_text("Create Assignment").count() == 0
        page.screenshot(path=artifact("student-lab-menu.png"))
        with pytest.raises(urllib.error.HTTPError) as refused:
            lab.api("formgrader/api/assignments")
        assert refused.value.code == 404
        context.close()


def test_an_idle_kernel_is_shut_down_with_its_notebook_open(browser, tmp_path, helpers) -> None:
    """With the student view's settings and only the idle limit cut (to 6 s from
    studentlab.CULL_IDLE), is a kernel whose notebook stays open in the browser shut down
    once idle, so that the eight lessons' kernels need not all sit in Binder's 2 GB? And was
    it forked from the lab's zygote (course.instructor.forkedkernels), and is it gone?"""
    config = student_lab(str(tmp_path / "env"))
    root = tmp_path / "root"
    shutil.copytree(REPO / "release" / "ring_allreduce", root / "ring_allreduce")
    jupyter = str(Path(sys.executable).parent / "jupyter")
    cmd = [jupyter, "lab", f"--ServerApp.root_dir={root}"]
    cmd += ["--MappingKernelManager.cull_idle_timeout=6", "--MappingKernelManager.cull_interval=1"]
    cmd += ["--allow-root"] if os.geteuid() == 0 else []
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(config)}
    with helpers.running_lab(root, tmp_path / "home", root, (cmd, env)) as lab:
        context = browser.new_context(viewport={"width": 1280, "height": 1000})
        page = context.new_page()
        page.goto(lab.url("lab/tree/ring_allreduce/ring_allreduce.ipynb"))
        seen, forked, deadline = [], [], time.monotonic() + 90
        while time.monotonic() < deadline:  # the tab's kernel comes, connected, then goes
            try:
                kernels = lab.api("api/kernels")
            except urllib.error.HTTPError as error:
                # jupyter_server 2.21 lists a kernel that is starting before it has set its
                # last_activity, and answers that one request with a 500; JupyterLab polls again
                if error.code != 500:
                    raise
                time.sleep(0.25)
                continue
            seen += [k["id"] for k in kernels if k["connections"] >= 1 and k["id"] not in seen]
            forked = forked or [c.pid for z in _zygotes(root) for c in z.children()]
            if seen and not kernels:
                break
            time.sleep(0.25)
        assert seen, "the notebook's kernel never started with the tab connected to it"
        assert lab.api("api/kernels") == [], "the idle kernel was not shut down"
        assert forked, "the kernel was not forked from the lab's zygote"
        assert not [p for p in forked if psutil.pid_exists(p)], "the culled kernel still runs"
        context.close()


def _zygotes(root: Path) -> list[psutil.Process]:
    """The kernels' zygotes of the JupyterLab serving ``root``."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            parent = proc.parent()
            if "course.instructor.zygote" in " ".join(proc.info["cmdline"] or []) and (
                parent and f"--ServerApp.root_dir={root}" in parent.cmdline()
            ):
                found.append(proc)
    return found
