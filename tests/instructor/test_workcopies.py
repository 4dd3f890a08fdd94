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


def test_make_lab_opens_work_copies_as_root_or_not() -> None:
    """Does `make lab` make work copies and open work/ (not release/), with --allow-root
    exactly when run as root?"""
    import os
    import subprocess

    plan = subprocess.run(
        ["make", "-n", "lab"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    assert "course.instructor.workcopies work --from release" in plan
    assert "jupyter lab --notebook-dir=work" in plan
    assert ("--allow-root" in plan) == (os.geteuid() == 0)
    assert "/work/" in (REPO / ".gitignore").read_text().splitlines()
