"""Imported first by a grading forkserver: it and every rank it forks are not dumpable.

``prctl(PR_SET_DUMPABLE, 0)`` makes a process's memory (``/proc/<pid>/mem``), file
descriptors and ptrace closed to other processes of the same uid. A rank runs a student's
code as the same uid as the forkserver and the other ranks: without this, that code could
read its siblings' inputs, or rewrite the forkserver that forks the next check's ranks.
Forked children inherit the flag; a rank may undo it for itself only.
"""

from __future__ import annotations

import ctypes
import sys

PR_SET_DUMPABLE = 4

if sys.platform == "linux":
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
