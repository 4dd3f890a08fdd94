"""course.grading.intake: a submission is plain files, inspected and copied following nothing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from course.grading.intake import SUBMISSION, Rejected, copy_inert, inspect


@pytest.fixture
def submitted(tmp_path: Path) -> Path:
    """submitted/eve/a/ with a notebook and a data folder, and a secret outside submitted/."""
    folder = tmp_path / "submitted" / "eve" / "a"
    (folder / "data").mkdir(parents=True)
    (folder / "a.ipynb").write_text("{}")
    (folder / "data" / "x.txt").write_text("x")
    (tmp_path / "secret.txt").write_text("the key is b")
    return tmp_path / "submitted"


def _rejected(submitted: Path, *names: str) -> str:
    with pytest.raises(Rejected) as caught:
        inspect(submitted, *names)
    return str(caught.value)


def test_plain_files_are_accepted_and_copied(submitted: Path, tmp_path: Path) -> None:
    """Is a folder of plain files hashed, and copied file for file into a new folder?"""
    digest = inspect(submitted, "eve", "a")
    assert digest == inspect(submitted, "eve", "a")
    copy_inert(submitted, ("eve", "a"), tmp_path / "copy")
    copied = sorted(str(p.relative_to(tmp_path / "copy")) for p in (tmp_path / "copy").rglob("*"))
    assert copied == ["a.ipynb", "data", "data/x.txt"]
    assert (tmp_path / "copy" / "data" / "x.txt").read_text() == "x"
    assert not any(p.is_symlink() for p in (tmp_path / "copy").rglob("*"))


@pytest.mark.parametrize("where", ["a.ipynb", "data/x.txt", "data"])
def test_a_symlink_anywhere_is_rejected(submitted: Path, tmp_path: Path, where: str) -> None:
    """Is a symlink refused wherever it is (the notebook, any file, a folder), naming it?"""
    path = submitted / "eve" / "a" / where
    if path.is_dir():
        for child in path.iterdir():
            child.unlink()
        path.rmdir()
    else:
        path.unlink()
    path.symlink_to(tmp_path / "secret.txt" if where != "data" else tmp_path)
    why = _rejected(submitted, "eve", "a")
    assert f"{where} is a symbolic link (to {tmp_path}" in why


def test_a_symlinked_student_or_assignment_folder_is_rejected(
    submitted: Path, tmp_path: Path
) -> None:
    """Is a student folder, or an assignment folder, that is a symlink refused by name?"""
    (submitted / "mallory").symlink_to(submitted / "eve")
    assert "mallory is a symbolic link" in _rejected(submitted, "mallory", "a")
    (submitted / "trent").mkdir()
    (submitted / "trent" / "a").symlink_to(submitted / "eve" / "a")
    assert "trent/a is a symbolic link" in _rejected(submitted, "trent", "a")


def test_a_hard_link_is_rejected(submitted: Path, tmp_path: Path) -> None:
    """Is a file with a second name (a hard link to a file elsewhere) refused?"""
    (submitted / "eve" / "a" / "a.ipynb").unlink()
    os.link(tmp_path / "secret.txt", submitted / "eve" / "a" / "a.ipynb")
    assert "a.ipynb is a hard link (2 names" in _rejected(submitted, "eve", "a")


def test_a_fifo_is_rejected_without_blocking(submitted: Path) -> None:
    """Is a FIFO refused (and never opened: opening one would block the grader)?"""
    os.mkfifo(submitted / "eve" / "a" / "data" / "pipe")
    assert "data/pipe is a FIFO" in _rejected(submitted, "eve", "a")


def test_size_and_count_caps(submitted: Path) -> None:
    """Are a file over the size cap, a folder over the total cap and too many files refused?"""
    big = submitted / "eve" / "a" / "big.bin"
    with open(big, "wb") as f:
        f.truncate(SUBMISSION.file_bytes + 1)  # sparse: the size is what counts
    assert "big.bin is 20.0 MiB, over the 20 MiB cap" in _rejected(submitted, "eve", "a")
    big.unlink()
    notebook = submitted / "eve" / "a" / "a.ipynb"
    with open(notebook, "r+b") as f:
        f.truncate(SUBMISSION.file_bytes + 1)
    said = _rejected(submitted, "eve", "a")
    assert "a.ipynb is 20.0 MiB, over the 20 MiB cap: clear its outputs" in said
    notebook.write_text("{}")
    for i in range(6):
        with open(submitted / "eve" / "a" / f"part{i}.bin", "wb") as f:
            f.truncate(SUBMISSION.file_bytes - 1)
    assert "more than 100 MiB in all" in _rejected(submitted, "eve", "a")
    for i in range(6):
        (submitted / "eve" / "a" / f"part{i}.bin").unlink()
    for i in range(SUBMISSION.entries):
        (submitted / "eve" / "a" / "data" / f"f{i}").write_text("")
    assert f"more than {SUBMISSION.entries} files and folders" in _rejected(submitted, "eve", "a")


def test_copying_results_back_leaves_links_out(submitted: Path, tmp_path: Path) -> None:
    """Does the lenient copy (results back from grading) skip a symlink, copy the rest, say so?"""
    (submitted / "eve" / "a" / "data" / "x.txt").unlink()
    (submitted / "eve" / "a" / "data" / "x.txt").symlink_to(tmp_path / "secret.txt")
    left_out = copy_inert(submitted, ("eve", "a"), tmp_path / "back", strict=False)
    assert left_out == [
        f"data/x.txt is a symbolic link (to {tmp_path / 'secret.txt'}), not a regular file"
    ]
    assert (tmp_path / "back" / "a.ipynb").is_file()
    assert not (tmp_path / "back" / "data" / "x.txt").exists()
    with pytest.raises(Rejected):
        copy_inert(submitted, ("eve", "a"), tmp_path / "strict")
