"""course.grading.results: a worker's result is plain data, checked before it is written."""

from __future__ import annotations

from pathlib import Path

import pytest

from course.grading.intake import Rejected
from course.grading.results import BadResultError, check, merge

GOOD = {
    "autograded": {"a.ipynb": b"{}"},
    "feedback": {"a.html": b"<p>"},
    "left_out": [],
    "grades": [["a", "cell", 1.0, False]],
    "comments": [["a", "cell", None]],
    "timestamp": None,
}


def test_a_plain_result_passes() -> None:
    """Is a result of plain data (bytes, numbers, strings) taken as it is?"""
    assert check(dict(GOOD)) == GOOD


@pytest.mark.parametrize(
    "change",
    [
        {"autograded": {"a.ipynb": "text, not bytes"}},
        {"feedback": {"a.html": object()}},
        {"grades": [["a", "cell", "10", False]]},
        {"grades": [["a", "cell", True, False]]},
        {"grades": [["a", "cell", 1e9, False]]},
        {"comments": [["a", "cell", 3]]},
        {"timestamp": 12},
        {"left_out": [b"bytes"]},
        {"grades": None},
    ],
    ids=[
        "file-str",
        "page-object",
        "score-str",
        "score-bool",
        "score-huge",
        "comment-int",
        "stamp-int",
        "left-out-bytes",
        "no-grades",
    ],
)
def test_anything_else_is_refused_with_why(change: dict) -> None:
    """Is a result with a field of the wrong kind refused before it is used?"""
    with pytest.raises(BadResultError):
        check({**GOOD, **change})


@pytest.mark.parametrize("name", ["../escape.ipynb", "/etc/x", "a/../../b", ""])
def test_a_file_name_that_leaves_its_folder_is_refused(tmp_path: Path, name: str) -> None:
    """Does merging refuse an autograded file whose name would leave its folder?"""
    with pytest.raises(Rejected):
        merge(tmp_path, "a", "ada", {**GOOD, "autograded": {name: b"x"}})
    assert not (tmp_path / "escape.ipynb").exists()


def test_nbgraders_warnings_stay_quiet_in_threads_at_once() -> None:
    """Do threads that merge and read gradebooks at once (each ignoring nbgrader's SAWarnings)
    let none of them out? ``catch_warnings`` alone sets the process's filters, so one
    thread's exit could put back the filters another had replaced."""
    import sys
    import threading
    import warnings

    from sqlalchemy.exc import SAWarning

    from course.grading.gradebook import nbgrader_quiet

    escaped: list[str] = []
    go = threading.Barrier(4)

    def quiet_warnings() -> None:
        go.wait()
        for _ in range(10_000):
            try:
                with nbgrader_quiet():
                    warnings.warn("not in session", SAWarning, stacklevel=1)
            except SAWarning as warning:
                escaped.append(str(warning))

    switching = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads take turns often: without the lock, 4 to 11 escape
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", SAWarning)  # one that escapes raises in its thread
            threads = [threading.Thread(target=quiet_warnings) for _ in range(4)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
    finally:
        sys.setswitchinterval(switching)
    assert escaped == []
