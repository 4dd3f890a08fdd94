"""What the judge asks a submission's forkserver to import once, so its ranks do not."""

from __future__ import annotations

from types import SimpleNamespace

from course.grading.preload import rank_imports


def _submission(setup: list[str], grade_cells: dict[str, str]) -> SimpleNamespace:
    student = [("exercise", "import colorsys\nfrom json import tool")]  # never preloaded
    return SimpleNamespace(
        setup=setup, student=student, sources=grade_cells,
        grade_cells=[(gid, None) for gid in grade_cells],
    )  # fmt: skip


def test_the_setup_cells_modules_and_the_refused_built_ins_are_preloaded() -> None:
    sub = _submission(
        [
            (
                "import torch.distributed as dist\n"
                "from course.lessons.zero import check_answer, check_zero_memory, half_widget"
            )
        ],
        {"zero_check": "check_zero_memory(ZeroOptimizer)", "quiz": "check_answer('zero_1')"},
    )
    modules = rank_imports(sub)
    lesson = {"course.lessons.zero", "course.lessons.zero.check", "course.checks.answers"}
    assert {"torch.distributed", "course.pictures.widgets", *lesson} <= set(modules)
    assert "torch.distributed.optim" in modules  # what check_zero_memory's ranks refuse
    assert not {"colorsys", "json", "json.tool"} & set(modules)  # the student's imports


def test_a_submission_without_setup_or_refusals_preloads_nothing_more() -> None:
    assert rank_imports(_submission([], {"ring_check": "check_ring_sums(ring_allreduce)"})) == ()
