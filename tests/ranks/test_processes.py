"""A process's children as the kernel lists them: the same as psutil finds by scanning."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil
import pytest

from course.ranks.processes import child_pids

# A parent with two children, one started from a second thread, the other with two of its
# own: every process sleeps until killed.
TREE = """
import os, subprocess, sys, threading, time
sleep = [sys.executable, "-c", "import time; time.sleep(600)"]
subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; s = sys.argv[1:]; "
                  "[subprocess.Popen(s) for _ in range(2)]; time.sleep(600)", *sleep])
threading.Thread(target=lambda: subprocess.Popen(sleep).wait(), daemon=True).start()
time.sleep(600)
"""


def test_children_are_those_psutil_finds() -> None:
    """In a tree of four processes, one started from a second thread (the kernel lists each
    thread's children apart), are a process's children, and all its descendants, those
    psutil finds by reading every process on the machine?"""
    root = subprocess.Popen([sys.executable, "-c", TREE])
    try:
        parent = psutil.Process(root.pid)
        deadline = time.monotonic() + 30
        while len(parent.children(recursive=True)) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        below = sorted(p.pid for p in parent.children(recursive=True))
        assert len(below) == 4
        assert sorted(child_pids(root.pid)) == sorted(p.pid for p in parent.children())
        assert len(child_pids(root.pid)) == 2
        assert sorted(child_pids(root.pid, recursive=True)) == below
    finally:
        for proc in [*psutil.Process(root.pid).children(recursive=True), root]:
            proc.kill()
        root.wait()
    with pytest.raises(ProcessLookupError):
        child_pids(root.pid)  # gone, and reaped
