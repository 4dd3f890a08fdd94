"""benchmarks/autograde.py without grading anything: its command line, its class, its configs."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path
from types import ModuleType

import nbformat
import pytest
from IPython.core.inputtransformer2 import TransformerManager
from traitlets.config.loader import PyFileConfigLoader

from course.instructor.selfstudy import grade_id
from course.instructor.submissions import assemble

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "bench_autograde", REPO / "benchmarks" / "autograde.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_bare_command_grades_ten_students_on_all_five_both_ways(bench):
    """Does `make benchmarks` (no arguments) get the default class, on both sides?"""
    args = bench.parse_args([])
    assert args.students == 10
    assert args.assignments == list(bench.ASSIGNMENTS)
    assert (args.only, args.keep) == (None, None)


def test_options_are_read_as_given(bench):
    """Do --students, --assignments, --only and --keep reach the run as typed?"""
    argv = ["--students", "3", "--assignments", "zero,buckets", "--only", "ours", "--keep", "kept"]
    args = bench.parse_args(argv)
    assert (args.students, args.assignments) == (3, ["zero", "buckets"])
    assert (args.only, args.keep) == ("ours", Path("kept"))


@pytest.mark.parametrize(
    "argv",
    [["--assignments", "ring"], ["--assignments", ","], ["--students", "0"], ["--only", "both"]],
)
def test_bad_arguments_stop_before_any_work(bench, argv):
    """Is an unknown assignment, an empty class or an unknown side refused at once?"""
    with pytest.raises(SystemExit):
        bench.parse_args(argv)


def test_students_rotate_over_the_five_kinds(bench):
    """Is student k of kind k % 5, handing in every assignment asked for?"""
    subs = bench.class_submissions(7, ["ring_allreduce", "zero"])
    kinds = ["right", "wrong", "deadlock", "crash", "hostile", "right", "wrong"]
    assert list(bench.KINDS) == kinds[:5]
    assert [bench.kind(s.student) for s in subs[::2]] == kinds
    assert [s.assignment for s in subs[:2]] == ["ring_allreduce", "zero"]
    assert len({s.student for s in subs}) == 7


def test_every_kind_assembles_into_code_that_parses(bench):
    """Does each kind's notebook of each assignment assemble onto the release, faults and
    attacks in place, with every code cell valid IPython?"""
    transform = TransformerManager().transform_cell
    for sub in bench.class_submissions(5, bench.ASSIGNMENTS):
        a, who = sub.assignment, bench.kind(sub.student)
        release = nbformat.read(REPO / "release" / a / f"{a}.ipynb", as_version=4)
        source = nbformat.read(REPO / "source" / a / f"{a}.ipynb", as_version=4)
        nb = assemble(sub, release, source)
        bench.add_attack(nb, sub)
        code = [c for c in nb.cells if c.cell_type == "code"]
        for cell in code:
            compile(transform(cell.source), f"{sub.student}/{a}/{grade_id(cell)}", "exec")
        text = "\n".join(c.source for c in code)
        if who in ("deadlock", "crash"):
            assert bench.CLASS[who]["fault"].strip().splitlines()[-1].strip() in text
        if who == "hostile":
            assert bench.CLASS[who][a]["code"].strip().splitlines()[-1] in text


def test_the_stock_config_keeps_only_the_courses_basics(bench, tmp_path):
    """Does the stock config hold the course's id, ignore list and code stub, a cell timeout,
    and nothing of the course's own grading (the judge)?"""
    shutil.copy2(REPO / "nbgrader_config.py", tmp_path / "nbgrader_config.py")
    course = PyFileConfigLoader("nbgrader_config.py", path=str(tmp_path)).load_config()
    bench.stock_config(tmp_path)
    stock = PyFileConfigLoader("nbgrader_config.py", path=str(tmp_path)).load_config()
    assert set(stock) == {"CourseDirectory", "ClearSolutions", "Execute"}
    assert set(stock.Execute) == {"timeout"}
    assert stock.Execute.timeout == bench.STOCK_CELL_TIMEOUT
    assert stock.ClearSolutions.code_stub == course.ClearSolutions.code_stub
    assert stock.CourseDirectory.ignore == course.CourseDirectory.ignore
    assert stock.CourseDirectory.course_id == course.CourseDirectory.course_id
    assert stock.CourseDirectory.root == str(tmp_path)
