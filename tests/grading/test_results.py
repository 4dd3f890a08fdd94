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
