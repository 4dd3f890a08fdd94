"""course.grading.classrun: inert submissions, a uid per slot, machine faults retried, resume.

Two throwaway courses around the tamper fixture, each graded once by a module fixture (real
``nbgrader autograde`` processes with the course's judge):
one with honest, hanging and not-plain-files submissions, one whose ``nbgrader_config.py``
carries a fault the test controls (the grading process exits before grading, as a full disk
or a broken install would make it) and starts a process as the slot's uid.
"""

from __future__ import annotations

import importlib.util
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
from nbgrader.api import Gradebook, MissingEntry

from course.grading import slots, warm
from course.grading.classrun import Outcome, autograde_class, submission_digest
from course.instructor import pipeline

_spec = importlib.util.spec_from_file_location(
    "course_kit", Path(__file__).parents[1] / "fixtures" / "tamper" / "course_kit.py"
)
kit = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(kit)

NOTEBOOK = f"{kit.ASSIGNMENT}.ipynb"


def grading(test: Callable[..., None]) -> Callable[..., None]:
    """The marks of a test that runs real nbgrader autograde processes (and their ranks)."""
    for mark in (pytest.mark.nbgrader, pytest.mark.slow, pytest.mark.ranks):
        test = mark(test)
    return pytest.mark.timeout(600)(test)


def test_warming_up_starts_the_graders_forkserver() -> None:
    warm.warm_up()
    pid = warm._SERVER.pid()  # noqa: SLF001 - the process the graders fork from
    assert pid and psutil.pid_exists(pid)


def test_digest_changes_with_content(tmp_path: Path) -> None:
    """Does the submission hash change when a file's content changes, and only then?"""
    (tmp_path / "a.ipynb").write_text("one")
    first = submission_digest(tmp_path)
    assert submission_digest(tmp_path) == first
    (tmp_path / "a.ipynb").write_text("two")
    assert submission_digest(tmp_path) != first


# --- a class with honest, hanging and not-plain-files submissions -----------------------------


def _not_plain(root: Path, outside: Path) -> dict[str, str]:
    """Submissions that are not plain files, each next to a real notebook; name -> reason.

    ``outside`` becomes a right notebook (worth full marks, were it followed) that they
    point at.
    """

    def folder(student: str) -> Path:
        return root / "submitted" / student / kit.ASSIGNMENT

    kit.submit(root, "linked", kit.honest_right)  # the notebook itself points outside
    (folder("linked") / NOTEBOOK).rename(outside)
    (folder("linked") / NOTEBOOK).symlink_to(outside)
    kit.submit(root, "hardlinked")  # a second name for the file outside
    os.link(outside, folder("hardlinked") / "copy.ipynb")
    kit.submit(root, "fifo")
    os.mkfifo(folder("fifo") / "pipe")
    kit.submit(root, "oversize")
    with open(folder("oversize") / "data.bin", "wb") as f:
        f.truncate(21 * 2**20)
    kit.submit(root, "linked_folder")
    (folder("linked_folder") / "data").symlink_to(outside.parent)
    return {
        "linked": f"{NOTEBOOK} is a symbolic link (to {outside})",
        "hardlinked": "copy.ipynb is a hard link (2 names for one file)",
        "fifo": "pipe is a FIFO",
        "oversize": "data.bin is 21.0 MiB, over the 20 MiB cap",
        "linked_folder": f"data is a symbolic link (to {outside.parent})",
    }


@pytest.fixture(scope="module")
def class_run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A run over right, wrong and the not-plain ones, then hangs: outcomes, lines, the course."""
    work = tmp_path_factory.mktemp("class")
    root = kit.make_course(work / "course")
    kit.submit(root, "right", kit.honest_right)
    kit.submit(root, "wrong")
    outside = work / "elsewhere" / NOTEBOOK
    outside.parent.mkdir()
    reasons = _not_plain(root, outside)
    before = (outside.stat().st_mtime_ns, outside.read_bytes())
    lines: list[str] = []
    outcomes = autograde_class(kit.ASSIGNMENT, root, progress=lines.append)
    # A hang on its own, with a short cap: honest grading on a busy machine stays uncapped.
    kit.submit(root, "hangs", kit.cell_adds("import time\ntime.sleep(600)\n"))
    outcomes += autograde_class(
        kit.ASSIGNMENT, root, students=["hangs"], timeout=5, progress=lines.append
    )
    return {
        "root": root,
        "outcomes": {o.student: o for o in outcomes},
        "lines": lines,
        "reasons": reasons,
        "outside": (outside, before),
    }


def _score(root: Path, student: str) -> float:
    with Gradebook(f"sqlite:///{root / 'gradebook.db'}") as gb:
        return float(gb.find_submission(kit.ASSIGNMENT, student).score)


@grading
def test_grades_are_merged_and_a_hang_is_stopped(class_run: dict) -> None:
    """Are honest grades merged while a hanging submission is stopped and listed as failed?"""
    first, root = class_run["outcomes"], class_run["root"]
    assert first["right"].status == "graded" and first["right"].score == 3.0
    assert first["wrong"].status == "graded" and first["wrong"].score == 0.0
    assert first["hangs"].status == "failed" and "longer than 5 s" in first["hangs"].error
    assert first["hangs"].seconds >= 5  # its time is the cap it reached, not 0
    assert any("failed: ['hangs']" in line for line in class_run["lines"])
    assert _score(root, "right") == 3.0
    manifest = json.loads((root / "autograded" / ".classrun.json").read_text())["tamper"]
    assert manifest["hangs"]["status"] == "failed"


@grading
def test_not_plain_submissions_are_rejected_and_nothing_is_followed(class_run: dict) -> None:
    """Is each link, FIFO or oversize submission rejected with its reason, and never graded?"""
    first, root = class_run["outcomes"], class_run["root"]
    for student, reason in class_run["reasons"].items():
        outcome = first[student]
        assert outcome.status == "rejected", (student, outcome)
        assert outcome.error.startswith(f"submitted/{student}/{kit.ASSIGNMENT}: ")
        assert reason in outcome.error
        assert not (root / "autograded" / student).exists()
        with pytest.raises(MissingEntry):
            _score(root, student)
        assert any(f"{student}: REJECTED" in line for line in class_run["lines"])
    rejected = sorted(class_run["reasons"])
    assert any(f"rejected: {rejected}" in line for line in class_run["lines"])
    outside, before = class_run["outside"]
    assert (outside.stat().st_mtime_ns, outside.read_bytes()) == before


@grading
def test_a_rerun_grades_only_what_changed(class_run: dict) -> None:
    """Does a rerun skip unchanged graded work, regrade changed work and reject again?"""
    root, lines = class_run["root"], class_run["lines"]
    path = root / "submitted" / "wrong" / "tamper" / NOTEBOOK
    nb = json.loads(path.read_text())
    kit.honest_right(nb)
    path.write_text(json.dumps(nb))
    again = {
        o.student: o
        for o in autograde_class(
            kit.ASSIGNMENT, root, students=["right", "wrong", "linked"], progress=lines.append
        )
    }
    assert again["right"].status == "skipped"  # unchanged: not regraded
    assert again["wrong"].status == "graded" and again["wrong"].score == 3.0  # changed: regraded
    assert again["linked"].status == "rejected"  # inspected again: still not plain files


# --- machine-side faults, the uid of each slot, and `make autograde` ---------------------------

FAULT_HOOK = """
import os as _os, subprocess as _sp, sys as _sys


def _machine_fault(root):
    # A test's control over the grading process: faults/<student> holds "once" (the first
    # attempt exits before grading), "always" (every attempt does), "spawn" (start a process
    # as the slot's uid, left running). Every attempt appends "<uid> <pid or ->" to calls/.
    # nbgrader reads its config twice per process: act on the first reading only.
    if "--student" not in _sys.argv or getattr(_sys, "_machine_fault_seen", False):
        return
    _sys._machine_fault_seen = True
    student = _sys.argv[_sys.argv.index("--student") + 1]
    faults = _os.path.join(root, "faults", student)
    modes = open(faults).read().split() if _os.path.exists(faults) else []
    uid, pid = _os.environ.get("COURSE_SANDBOX_UID", "unset"), "-"
    if "spawn" in modes and _os.geteuid() == 0:
        pid = _sp.Popen(["sleep", "600"], user=int(uid), group=int(uid), start_new_session=True,
                        stdout=_sp.DEVNULL, stderr=_sp.DEVNULL).pid
    _os.makedirs(_os.path.join(root, "calls"), exist_ok=True)
    with open(_os.path.join(root, "calls", student), "a") as log:
        log.write(f"{uid} {pid}\\n")
    if "always" in modes or ("once" in modes and not _os.path.exists(faults + ".done")):
        open(faults + ".done", "w").close()
        print("the gradebook's disk is full (simulated machine fault)", flush=True)
        _os._exit(3)


_machine_fault(ROOT)
"""


def _gone(pid: int) -> bool:
    """Dead: no such process, or a zombie its parent has not reaped yet."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _calls(root: Path, student: str) -> list[tuple[str, str]]:
    text = (root / "calls" / student).read_text()
    return [tuple(line.split()) for line in text.splitlines()]


@pytest.fixture(scope="module")
def faulty(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """A course whose grading process fails for 'broken' always, for 'flaky' once; one run."""
    root = kit.make_course(tmp_path_factory.mktemp("faults") / "course")
    config = root / "nbgrader_config.py"
    config.write_text(config.read_text() + f"ROOT = {str(root)!r}\n" + FAULT_HOOK)
    (root / "faults").mkdir()
    (root / "faults" / "broken").write_text("always spawn")
    (root / "faults" / "flaky").write_text("once spawn")
    kit.submit(root, "broken", kit.honest_right)
    kit.submit(root, "flaky", kit.honest_right)
    lines: list[str] = []
    outcomes = autograde_class(kit.ASSIGNMENT, root, workers=2, progress=lines.append)
    yield {"root": root, "outcomes": {o.student: o for o in outcomes}, "lines": lines}
    for student in ("broken", "flaky"):  # nothing left behind even if a test failed
        for _, pid in _calls(root, student):
            if pid != "-" and psutil.pid_exists(int(pid)):
                psutil.Process(int(pid)).kill()


@grading
def test_a_machine_fault_is_retried_once(faulty: dict) -> None:
    """Is a grading process that failed once retried, and the submission graded in full?"""
    flaky: Outcome = faulty["outcomes"]["flaky"]
    assert flaky.status == "graded" and flaky.score == 3.0
    assert len(_calls(faulty["root"], "flaky")) == 2


@grading
def test_a_persistent_machine_fault_fails_with_its_reason(faulty: dict) -> None:
    """Does a grading process that fails twice end as failed, with the log, and no grade?"""
    broken: Outcome = faulty["outcomes"]["broken"]
    assert broken.status == "failed" and broken.score == 0.0
    assert broken.seconds > 0  # the time its two attempts took, as for a graded one
    assert "the grading machine failed, not the submission" in broken.error
    assert "attempt 1: nbgrader autograde exited with 3" in broken.error
    assert "attempt 2: nbgrader autograde exited with 3" in broken.error
    assert "disk is full (simulated machine fault)" in broken.error  # the log's tail
    assert len(_calls(faulty["root"], "broken")) == 2
    with pytest.raises(MissingEntry):
        _score(faulty["root"], "broken")
    assert any("failed: ['broken']" in line for line in faulty["lines"])


@grading
def test_each_slot_grades_as_its_own_uid(faulty: dict) -> None:
    """Does each submission run as one leased uid, distinct from the one graded beside it?"""
    root = faulty["root"]
    broken = {uid for uid, _ in _calls(root, "broken")}
    flaky = {uid for uid, _ in _calls(root, "flaky")}
    assert len(broken) == 1 and len(flaky) == 1  # a retry keeps its lease
    assert len(broken | flaky) == 2  # graded at the same time: two leases, two uids
    assert {int(uid) for uid in broken | flaky} <= set(slots.UIDS)


@grading
@pytest.mark.skipif(os.geteuid() != 0, reason="starting a process as a slot's uid needs root")
def test_nothing_a_submission_started_outlives_it(faulty: dict) -> None:
    """Are processes started as the slot's uid (with setsid: in no group) dead once it ends?"""
    root = faulty["root"]
    pids = [int(pid) for s in ("broken", "flaky") for _, pid in _calls(root, s) if pid != "-"]
    assert len(pids) == 4  # each attempt started one: graded, failed, and between attempts
    assert all(_gone(pid) for pid in pids), [p for p in pids if not _gone(p)]


@grading
def test_make_autograde_fails_lists_and_retries(faulty: dict, capsys) -> None:
    """Does `make autograde` exit 1 naming the failure, and do reruns retry what failed?"""
    root = faulty["root"]
    capsys.readouterr()
    assert pipeline._autograde_course(root, workers=2) == 1  # noqa: SLF001 - what `make autograde` runs
    out = capsys.readouterr().out
    assert "FAILED (no grade; `make autograde` again retries it): tamper/broken:" in out
    assert "the grading machine failed, not the submission" in out
    assert len(_calls(root, "broken")) == 4  # retried, without being asked
    assert len(_calls(root, "flaky")) == 2  # graded and unchanged: left alone
    (root / "faults" / "broken").unlink()  # the machine is mended: the next run grades it
    again = {o.student: o for o in autograde_class(kit.ASSIGNMENT, root, progress=print)}
    assert again["broken"].status == "graded" and _score(root, "broken") == 3.0
    assert again["flaky"].status == "skipped"
