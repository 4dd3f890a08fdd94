"""The instructor's pipeline: sample submissions, real nbgrader autograde, grades as expected."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from course.grading.gradebook import open_gradebook
from course.instructor import commands, grades, pipeline
from course.instructor.grades import GradeRow, check_expectations
from course.instructor.selfstudy import grade_id
from course.instructor.submissions import Submission, assemble, load_specs

REPO = Path(__file__).resolve().parents[2]
TOY = REPO / "tests" / "fixtures" / "toy_course"
RING = "ring_allreduce"


def _toy_notebooks() -> tuple[nbformat.NotebookNode, nbformat.NotebookNode]:
    """The toy fixture's source and a release made from it the way nbgrader makes it."""
    from nbgrader.preprocessors import ClearHiddenTests, ClearSolutions

    source = nbformat.read(TOY / "source" / "toy" / "toy.ipynb", as_version=4)
    release, _ = ClearSolutions(code_stub={"python": "# YOUR CODE HERE"}).preprocess(
        nbformat.from_dict(source), {}
    )
    release, _ = ClearHiddenTests().preprocess(release, {})
    return source, release


def _cell(nb: nbformat.NotebookNode, gid: str) -> str:
    return next(c.source for c in nb.cells if grade_id(c) == gid)


# --- assembling submissions from specs (no kernel) -------------------------------------------


def test_key_and_solution_fill_the_release():
    """Does a "key"/"solution" spec fill the answer line and the solution, markers removed?"""
    source, release = _toy_notebooks()
    nb = assemble(Submission("ada", "toy"), release, source)
    assert _cell(nb, "toy_1_answer").splitlines()[-1] == 'answer_toy_1 = "b"'
    assert "return x + 1" in _cell(nb, "add_one")
    assert "SOLUTION" not in _cell(nb, "add_one")


def test_wrong_picks_another_letter_and_text_replaces_the_cell():
    """Does "wrong" answer a letter other than the key, and cell text replace the stub?"""
    source, release = _toy_notebooks()
    sub = Submission(
        "ben", "toy", answers={"*": "wrong"}, cells={"add_one": "def add_one(x):\n    return 0\n"}
    )
    nb = assemble(sub, release, source)
    assert _cell(nb, "toy_1_answer").splitlines()[-1] == 'answer_toy_1 = "a"'
    assert _cell(nb, "add_one") == "def add_one(x):\n    return 0"


def test_only_solution_cells_change():
    """Are all locked cells of the submission exactly the release's?"""
    source, release = _toy_notebooks()
    nb = assemble(
        Submission("ben", "toy", answers={"*": "c"}, cells={"*": "stub"}), release, source
    )
    changed = [
        grade_id(a) for a, b in zip(nb.cells, release.cells, strict=True) if a.source != b.source
    ]
    assert changed == ["toy_1_answer"]


def test_blank_and_stub_submit_the_release_as_is():
    """Does an all-blank spec hand in the release notebook unchanged?"""
    source, release = _toy_notebooks()
    nb = assemble(Submission("cy", "toy", answers={"*": ""}, cells={"*": "stub"}), release, source)
    assert [c.source for c in nb.cells] == [c.source for c in release.cells]


def test_a_spec_naming_a_missing_cell_is_rejected():
    """Does a spec that names no real cell fail with a message naming the spec and the cell?"""
    source, release = _toy_notebooks()
    with pytest.raises(ValueError, match=r"ben.toml, \[toy\].*'add_two'"):
        assemble(Submission("ben", "toy", cells={"add_two": "pass"}), release, source)


def test_every_sample_spec_fits_its_release_notebook():
    """Does each spec in autograde/submissions name an assignment and cells that exist?"""
    subs = load_specs()
    assert {s.assignment for s in subs} <= set(commands.assignments(REPO))
    assert RING in {s.assignment for s in subs}
    for sub in subs:
        a = sub.assignment
        release = nbformat.read(REPO / "release" / a / f"{a}.ipynb", as_version=4)
        source = nbformat.read(REPO / "source" / a / f"{a}.ipynb", as_version=4)
        nbformat.validate(assemble(sub, release, source))


def test_the_ring_samples_cover_the_failure_kinds():
    """Do the ring samples include right, wrong, deadlocking and crashing students?"""
    ring = {s.student: s for s in load_specs() if s.assignment == RING}
    assert len(ring) >= 4
    assert any(s.answers == {"*": "wrong"} for s in ring.values())
    texts = [s.cells.get(RING, "") for s in ring.values()]
    assert any("dist.recv(incoming, left)  # every rank waits" in t for t in texts)
    assert any("rank + 1 - t," in t for t in texts)


def test_expectations_compare_scores_to_patterns():
    """Does check_expectations apply the first matching pattern and report mismatches?"""
    subs = [Submission("ben", "a", expect={"q*_check": 0, "*": "full"})]
    rows = [GradeRow("ben", "a", "q1_check", 0, 2), GradeRow("ben", "a", "f_sums", 3, 6)]
    assert check_expectations(rows, subs) == ["ben/a/f_sums: 3 points, expected 6"]
    missing = [Submission("cy", "a")]
    assert check_expectations([], missing) == ["cy/a: no grades in the gradebook"]


def test_grade_table_has_a_row_per_cell_and_a_total():
    """Does the grade table show each cell's score per student and the totals?"""
    rows = [
        GradeRow("ada", "a", "q1_check", 2, 2),
        GradeRow("ben", "a", "q1_check", 0, 2),
        GradeRow("ada", "a", "f_sums", 6, 6),
        GradeRow("ben", "a", "f_sums", 3, 6),
    ]
    lines = grades.format_grades(rows).splitlines()
    assert lines[0].split() == ["a", "ada", "ben"]
    assert lines[1].split() == ["q1_check", "(2)", "2", "0"]
    assert lines[-1].split() == ["total", "(8)", "8", "3"]


# --- the real nbgrader pipeline ---------------------------------------------------------------


@pytest.mark.nbgrader
@pytest.mark.slow
def test_demo_on_the_toy_course(tmp_path, capsys):
    """Does the demo release, run, submit, autograde, feed back and export, as specs expect?"""
    root = tmp_path / "demo"
    status = pipeline.demo(root, source=TOY / "source", specs=TOY / "submissions", jobs=2)
    out = capsys.readouterr().out
    assert status == 0, out
    assert "every grade as its spec expects" in out
    specs = load_specs(TOY / "submissions")
    rows = grades.grade_rows(root)
    assert len(rows) == 3 * len(specs) and check_expectations(rows, specs) == []
    executed = nbformat.read(root / "build" / "executed" / "toy.ipynb", as_version=4)
    assert all(c.execution_count for c in executed.cells if c.cell_type == "code")
    assert "toy.ipynb ran top to bottom" in out and "UNEXPECTED" not in out
    pages = sorted(p.relative_to(root).as_posix() for p in (root / "feedback").rglob("*.html"))
    assert pages == [f"feedback/{s.student}/toy/toy.html" for s in specs]
    assert "is not right" in (root / "feedback" / "ben" / "toy" / "toy.html").read_text()
    csv = (root / "build" / "grades.csv").read_text().splitlines()
    assert csv[0].startswith("assignment,duedate,timestamp,student_id")
    assert len(csv) == 1 + len(specs)


def test_the_zero_samples_cover_the_failure_kinds():
    """Do the zero samples include right, wrong answers, a wrong reduce_scatter, full state?"""
    subs = {s.student: s for s in load_specs() if s.assignment == "zero"}
    assert len(subs) >= 3
    assert any(s.answers == {"*": "wrong"} for s in subs.values())
    texts = [" ".join(s.cells.values()) for s in subs.values() if isinstance(s.cells, dict)]
    assert any("chunks[(rank + 1) % n].clone()" in t for t in texts)  # the unshifted ring
    assert any("optimizer_class(self.params" in t for t in texts)  # Adam state for everything


def test_the_synchrony_samples_cover_the_failure_kinds():
    """Do the synchrony samples include right work, wrong answers, a ring passed off as a
    tree, a deadlock, and the two attacks (gloo's backend object, a stopped clock)?"""
    subs = {s.student: s for s in load_specs() if s.assignment == "synchrony"}
    assert {"ada", "ben", "cy", "eve"} <= set(subs)
    assert subs["ben"].answers == {"*": "wrong"}
    texts = {k: " ".join(s.cells.values()) for k, s in subs.items() if isinstance(s.cells, dict)}
    assert "torch.tensor_split(tensor.view(-1), n)" in texts["ben"]  # his ring, as the tree
    assert "waits for a partner that waits too" in texts["cy"]
    assert "_get_backend" in texts["eve"] and "time.monotonic = " in texts["eve"]


def test_the_fault_tolerance_samples_cover_the_failure_kinds():
    """Do the fault_tolerance samples include right work, wrong answers, an outer step that
    deadlocks and one with heavy-ball momentum for Nesterov's, a load that reads the whole
    checkpoint and a save that names its shards by rank?"""
    subs = {s.student: s for s in load_specs() if s.assignment == "fault_tolerance"}
    assert {"ada", "ben", "cy", "eve"} <= set(subs)
    assert subs["ben"].answers == {"*": "wrong"}
    texts = {k: " ".join(s.cells.values()) for k, s in subs.items() if isinstance(s.cells, dict)}
    assert "if dist.get_rank() != 0:" in texts["cy"]
    assert "g.sub_(outer_lr * m)" in texts["eve"]
    assert "torch.cat([storage.get(k) for k in keys])[lo:hi]" in texts["cy"]
    assert 'storage.put(f"{name}/{dist.get_rank()}", shard)' in texts["eve"]


def test_the_fsdp_samples_cover_the_failure_kinds():
    """Do the fsdp samples include right work, wrong answers with weights that train but
    gather once, a deadlock, and an all-reduce its own record calls a reduce-scatter?"""
    subs = {s.student: s for s in load_specs() if s.assignment == "fsdp"}
    assert {"ada", "ben", "cy", "eve"} <= set(subs)
    assert subs["ben"].answers == {"*": "wrong"}
    texts = {k: " ".join(s.cells.values()) for k, s in subs.items() if isinstance(s.cells, dict)}
    assert "register_full_backward_pre_hook" not in texts["ben"]
    assert "rank 0 never sends" in texts["cy"]
    assert "dist.all_reduce(grad)" in texts["eve"] and "recorder._active" in texts["eve"]


@pytest.mark.nbgrader
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_make_autograde_on_a_fresh_clone(tmp_path):
    """With no gradebook yet and the venv's bin off PATH, does `make autograde` make one?"""
    root = pipeline.prepare_course(tmp_path / "course")
    assignment = commands.assignments(root)[0]
    folder = root / "submitted" / "eve" / assignment
    folder.mkdir(parents=True)
    (folder / f"{assignment}.ipynb").symlink_to(
        root / "source" / assignment / f"{assignment}.ipynb"
    )
    path = os.pathsep.join(p for p in ("/usr/local/bin", "/usr/bin", "/bin") if Path(p).is_dir())
    env = {**os.environ, "PATH": path}
    cmd = [sys.executable, "-m", "course.instructor.pipeline", "autograde", "--root", str(root)]
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, check=False)
    out = done.stdout + done.stderr
    assert "FileNotFoundError" not in out, out
    assert "not in the gradebook yet: generating the release first" in out, out
    assert f"REJECTED (no grade; only plain files are graded): {assignment}/eve:" in out, out
    assert "is a symbolic link" in out
    assert done.returncode == 1  # a submission has no grade
    with sqlite3.connect(root / "gradebook.db") as con:
        assert con.execute("SELECT version_num FROM alembic_version").fetchall()
    assert not (root / "autograded" / "eve").exists()


def test_a_gradebook_left_without_alembic_version_is_stamped(tmp_path, capsys):
    """Is a gradebook whose creation could not run alembic repaired, with a message, and usable?"""
    from nbgrader.api import Base
    from sqlalchemy import create_engine

    db = tmp_path / "gradebook.db"
    Base.metadata.create_all(bind=create_engine(f"sqlite:///{db}"))  # what the old failure left
    with open_gradebook(db) as gb:
        gb.add_student("ada")
    assert "had no alembic_version" in capsys.readouterr().out
    with sqlite3.connect(db) as con:
        assert con.execute("SELECT version_num FROM alembic_version").fetchall()
    with open_gradebook(db) as gb:
        assert [s.id for s in gb.students] == ["ada"]
    assert "alembic_version" not in capsys.readouterr().out  # said once, when repaired


def test_a_new_gradebook_is_stamped_with_the_head_alembic_prints(tmp_path, monkeypatch):
    """Is a gradebook made here stamped, with no ``alembic`` process started, with the
    revision ``alembic heads`` prints for nbgrader's migrations?"""
    import nbgrader.api
    from nbgrader.dbutil import write_alembic_ini

    ini = tmp_path / "alembic.ini"
    write_alembic_ini(str(ini), f"sqlite:///{tmp_path / 'other.db'}")
    alembic = [str(Path(sys.executable).parent / "alembic"), "-c", str(ini), "heads"]
    printed = subprocess.run(alembic, capture_output=True, text=True, check=True).stdout.split()[0]

    def no_process(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"a process was started: {args}")

    monkeypatch.setattr(nbgrader.api.sp, "check_output", no_process)
    with open_gradebook(tmp_path / "gradebook.db") as gb:
        gb.add_student("ada")
    with sqlite3.connect(tmp_path / "gradebook.db") as con:
        assert con.execute("SELECT version_num FROM alembic_version").fetchall() == [(printed,)]


def test_a_notebook_run_by_the_pipeline_keeps_no_widget_state(tmp_path: Path) -> None:
    """Does a notebook the pipeline runs carry its widget's view but not the widget's state
    (megabytes for the ring's), as JupyterLab saves none by default?"""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("import ipywidgets\nipywidgets.IntSlider(value=3)")]
    nb.cells[0].metadata["nbgrader"] = {"grade_id": "slider"}
    path, out = tmp_path / "w.ipynb", tmp_path / "out" / "w.ipynb"
    nbformat.write(nb, path)
    assert commands.execute(path, out=out) == []
    ran = nbformat.read(out, as_version=4)
    shown = ran.cells[0].outputs[0]["data"]
    assert "application/vnd.jupyter.widget-view+json" in shown
    assert "widgets" not in ran.metadata
