"""Can a submission gain points, read what it must not, or do harm by attacking the grader?

One class of the real ring_allreduce assignment (16 points) is autograded the one way the
course grades (``classrun``: one ``nbgrader autograde`` per submission with the course's
``nbgrader_config.py``, so ``course.grading.judge``): an honest right and an honest wrong
submission, and one hostile submission per attack in ``attacks.py``, each the honest wrong one
plus its attack. The honest right one is graded at the same time as the fork bomb.

Beside it, on the same machine, a second course (another checkout's, as a second instructor
would run it) grades the course's samples (``BESIDE``) with ``make autograde``'s command: their
honest grades must be those their specs expect, as on a quiet machine, none FAILED, and each
sample's failure must say what happened, while the fork bomb starves the machine and the
daemon hunts for forkservers to kill. (The suite grades samples here only; ``make demo``
grades every one.)
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import attacks
import nbformat
import pytest
from autograded import autograded_errors
from marks import CONFINED

from course.grading import classrun
from course.instructor.commands import nbgrader
from course.instructor.grades import check_expectations, format_grades, grade_rows, near_copies
from course.instructor.pipeline import prepare_course
from course.instructor.submissions import Submission, load_specs, submit

REPO = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.nbgrader,
    pytest.mark.slow,
    pytest.mark.ranks,
    pytest.mark.timeout(1200),
    CONFINED,
]

A = "ring_allreduce"
WRONG = {"*": "wrong"}
STUB = {"*": "stub"}  # every exercise cell as released
ATTACKS = {
    "forged_pickle": attacks.FORGED_PICKLE,
    "evil_tensor": attacks.EVIL_TENSOR,
    "other_inputs": attacks.OTHER_INPUTS,
    "reference": attacks.REFERENCE,
    "collective": attacks.COLLECTIVE,
    "collective_renamed": attacks.COLLECTIVE_RENAMED,
    "store": attacks.STORE,
    "read_around": attacks.READ_AROUND,
    "write_around": attacks.WRITE_AROUND,
}
# Edits of the notebook's structure, applied to the grade cells in GRADES.
GRADES = ("ring_1_check", "ring_allreduce_sums")


def _unlock(cell: dict) -> None:
    """An emptied check, unlocked and worth 100 points."""
    cell.metadata["nbgrader"].update(locked=False, points=100)
    cell.source = "pass"


def _delete(cell: dict) -> None:
    cell.metadata["deleted"] = True  # _restructure leaves the cell out


def _rename(cell: dict) -> None:
    cell.metadata["nbgrader"]["grade_id"] += "_mine"


STRUCTURE = {"edit_locked": _unlock, "delete_grades": _delete, "rename_grades": _rename}
# First in the queue: the honest one is graded beside one of these and after the other, in
# the same worker slot.
DAEMON, FORK_BOMB, HONEST = "aa_daemon", "ab_fork_bomb", "ac_honest_right"
# The samples graded beside the attacks, by assignment: the ring's; those of the assignments
# whose right work once lost points beside another grading run (a backup step, FSDP's and
# ZeRO's memory); and the failures of note of two more. `make demo` grades every sample.
BESIDE = {
    A: ("ada", "ben", "cy", "dee"),
    "accumulation": ("cy",),
    "zero": ("ada", "cy"),
    "synchrony": ("ada", "cy", "eve"),
    "fault_tolerance": ("ada", "cy", "eve"),
    "fsdp": ("ada", "ben", "cy", "eve"),
}
LOOP = "\nwhile True:\n    pass\n"
OTHER_RING = attacks.HONEST_RING.replace(attacks.TOKEN, "another student's ring")


def _submissions() -> list[Submission]:
    subs = [
        Submission(DAEMON, A, WRONG, {"ring_allreduce": attacks.DAEMON}),
        Submission(FORK_BOMB, A, WRONG, {"ring_allreduce": attacks.FORK_BOMB}),
        Submission("no_comm", A, WRONG, {"ring_allreduce": attacks.NO_COMM}),
        Submission("no_setup", A, {"*": "key"}, {"ring_allreduce": OTHER_RING}),
        Submission(HONEST, A, {"*": "key"}, {"ring_allreduce": attacks.HONEST_RING}),
        Submission("honest_wrong", A, WRONG, STUB),
        Submission("quiz_forms", A, {"*": "key"}, {"ring_allreduce": OTHER_RING}),
        Submission("runaway", A, {"*": "key"}, {"ring_allreduce": OTHER_RING + LOOP}),
        Submission("near_copy", A, {"*": "key"}, {"ring_allreduce": attacks.near_copy()}),
    ]
    subs += [Submission(name, A, WRONG, STUB) for name in STRUCTURE]
    return subs + [Submission(name, A, WRONG, {"ring_allreduce": s}) for name, s in ATTACKS.items()]


def _edit(root: Path, student: str, edit: dict[str, str]) -> None:
    """Replace (or, with a leading "+", extend) the text of answer cells after assembly."""
    path = root / "submitted" / student / A / f"{A}.ipynb"
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        text = edit.get(cell.metadata.get("nbgrader", {}).get("grade_id"))
        if text is not None:
            cell.source = cell.source + text[1:] if text.startswith("+") else text
    nbformat.write(nb, path)


def _restructure(root: Path, student: str, change: object, grades: tuple = GRADES) -> None:
    """Apply ``change`` to the cells ``grades`` names in a submitted notebook."""
    path = root / "submitted" / student / A / f"{A}.ipynb"
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") in grades:
            change(cell)
    nb.cells = [c for c in nb.cells if not c.metadata.get("deleted")]
    nbformat.write(nb, path)


def _fingerprint(root: Path) -> dict[str, str]:
    """Every file of the course outside what grading writes, by content."""
    skip = ("autograded", "feedback", "gradebook.db", "build", "exchange")
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not str(p.relative_to(root)).startswith(skip)
    }


@pytest.fixture(scope="module")
def graded(tmp_path_factory: pytest.TempPathFactory) -> dict:
    Path(attacks.MARKER).unlink(missing_ok=True)
    root = prepare_course(tmp_path_factory.mktemp("tamper") / "course")
    nbgrader(root, "generate_assignment", A, "--force")
    submit(root, _submissions())
    _edit(root, "quiz_forms", {
        "ring_1_answer": 'answer_ring_1 = "B".lower()\n',  # a call, not a literal
        "ring_2_answer": 'answer_ring_2 = f"c"\n',  # an f-string
        "ring_allreduce": '+\nanswer_ring_3 = "b"\n',  # set again, in another cell
    })  # fmt: skip
    _edit(root, "runaway", {"ring_1_answer": "+" + LOOP})
    for name, change in STRUCTURE.items():
        _restructure(root, name, change)
    _restructure(root, "no_setup", _delete, grades=("setup",))
    before = _fingerprint(root)
    beside_root = tmp_path_factory.mktemp("beside") / "course"
    beside = _sample_class(beside_root)
    lines: list[str] = []
    outcomes = classrun.autograde_class(A, root, workers=2, progress=lines.append)
    beside_out = beside.communicate(timeout=900)[0]
    scores: dict[str, dict[str, float]] = {}
    for row in grade_rows(root):
        scores.setdefault(row.student, {})[row.grade_id] = row.score
    table = format_grades(grade_rows(root), near_copies(root))
    return {"root": root, "outcomes": {o.student: o for o in outcomes}, "scores": scores,
            "before": before, "table": table,
            "beside": (beside_root, beside.returncode, beside_out)}  # fmt: skip


def _beside() -> list[Submission]:
    return [s for s in load_specs() if s.student in BESIDE.get(s.assignment, ())]


def _sample_class(root: Path) -> subprocess.Popen:
    """The samples of ``BESIDE`` in a course of their own, graded by ``make autograde``'s
    command in a process of its own; started, not waited for."""
    prepare_course(root)
    nbgrader(root, "generate_assignment", "*", "--force")  # every assignment, in one run
    submit(root, _beside())
    cmd = [sys.executable, "-m", "course.instructor.pipeline", "autograde", "--root", str(root)]
    return subprocess.Popen(
        cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def _outputs(root: Path, student: str, grade_id: str) -> str:
    path = root / "autograded" / student / A / f"{A}.ipynb"
    nb = nbformat.read(path, as_version=4)
    cell = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)
    return "\n".join(o.get("text") or o.get("evalue") or "" for o in cell.get("outputs", []))


def test_every_submission_is_graded_and_the_honest_ones_score_as_they_should(graded: dict) -> None:
    """No attack makes the grader fail (FAILED would not be a grade); 16 and 0 as earned. A
    renamed check is nbgrader's to refuse: rejected, with the reason."""
    statuses = {s: o.status for s, o in graded["outcomes"].items() if o.status != "graded"}
    assert statuses == {"rename_grades": "rejected"}
    assert "nbgrader cannot grade this notebook" in graded["outcomes"]["rename_grades"].error
    assert sum(graded["scores"][HONEST].values()) == 16
    assert sum(graded["scores"]["honest_wrong"].values()) == 0


def test_a_class_graded_beside_the_attacks_gets_its_quiet_grades(graded: dict) -> None:
    """Graded beside the fork bomb and the forkserver-killing daemon, in another course on the
    same machine, does every sample get the grade its spec expects, none FAILED?"""
    root, returncode, out = graded["beside"]
    assert returncode == 0, out
    assert "FAILED" not in out, out
    specs = _beside()
    assert {(s.assignment, s.student) for s in specs} == {
        (a, student) for a, students in BESIDE.items() for student in students
    }
    assert check_expectations(grade_rows(root), specs) == [], out
    # The deadlocking and crashing samples are stopped by the checks' own deadlines, never by
    # nbgrader's cell timeout, and no rank was lost with its forkserver; their failures teach:
    # the ring's deadlock is named as one, its crash shows the student's own error.
    lost = ("CellTimeoutError", "forkserver", "exited with code 255")
    for sub in specs:
        errors = autograded_errors(root, sub.student, sub.assignment)
        assert not [e for e in errors.values() if any(w in e for w in lost)], (sub, errors)
    assert "deadlock" in autograded_errors(root, "cy", A)["ring_allreduce_sums"].lower()
    assert "IndexError" in autograded_errors(root, "dee", A)["ring_allreduce_sums"]


@pytest.mark.parametrize("attack", [*ATTACKS, *STRUCTURE, DAEMON, FORK_BOMB])
def test_an_attack_gains_nothing(graded: dict, attack: str) -> None:
    """Each attack scores what the honest wrong answer scores (the rendezvous store included:
    on the relay each rank's store is its own)."""
    mine = graded["scores"].get(attack, {})  # none at all: rejected
    assert sum(mine.values()) == 0, mine


def test_a_collective_earns_nothing_and_says_why(graded: dict) -> None:
    text = _outputs(graded["root"], "collective", "ring_allreduce_sums")
    assert "dist.all_reduce, a collective" in text and "point-to-point calls only" in text


def test_nothing_a_rank_sends_is_unpickled(graded: dict) -> None:
    """The forged pickles and the tensor subclass never ran in the grader (no marker file)."""
    assert not Path(attacks.MARKER).exists()
    assert "malformed report" in _outputs(graded["root"], "forged_pickle", "ring_allreduce_sums")


def test_the_course_reference_is_out_of_reach(graded: dict) -> None:
    text = _outputs(graded["root"], "reference", "ring_allreduce_sums")
    assert "reference" in text and "ring_allreduce failed" in text


def test_nothing_secret_reaches_a_submission(graded: dict) -> None:
    """What the reading attack found (and shows in its feedback) holds no solution, no hidden
    test, no gradebook and nothing of another student's; no autograded notebook but the
    honest right one holds that student's token."""
    shown = _outputs(graded["root"], "read_around", "ring_allreduce_sums")
    assert "RuntimeError" in shown
    for secret in (attacks.TOKEN, "BEGIN SOLUTION", "BEGIN HIDDEN TESTS", "SQLite format", "key="):
        assert secret not in shown
    autograded = graded["root"] / "autograded"
    holders = {p.parts[-3] for p in autograded.rglob("*.ipynb") if attacks.TOKEN in p.read_text()}
    assert holders == {HONEST}


def test_no_file_outside_the_grading_output_changes(graded: dict) -> None:
    assert _fingerprint(graded["root"]) == graded["before"]
    planted = [*graded["root"].rglob("planted.txt"), *Path("/tmp").glob("planted.txt")]
    assert planted == []


def test_quiz_answers_are_read_from_the_text(graded: dict) -> None:
    """A call, an f-string, or the name set again elsewhere: 0, with the form expected."""
    scores = graded["scores"]["quiz_forms"]
    assert (scores["ring_1_check"], scores["ring_2_check"], scores["ring_3_check"]) == (0, 0, 0)
    for item in ("ring_1", "ring_2", "ring_3"):
        text = _outputs(graded["root"], "quiz_forms", f"{item}_check")
        assert f'write it as answer_{item} = "a"' in text


def test_a_runaway_cell_costs_only_itself(graded: dict) -> None:
    """Endless loops in an answer cell and after the ring: quiz points kept, the ring's lost."""
    scores = graded["scores"]["runaway"]
    assert scores["ring_1_check"] + scores["ring_2_check"] + scores["ring_3_check"] == 6
    assert scores["ring_allreduce_sums"] == scores["ring_allreduce_pattern"] == 0


def test_a_near_copy_of_the_course_solution_is_flagged_not_scored(graded: dict) -> None:
    """It earns what it computes (16), and the grade table points the instructor at it."""
    assert sum(graded["scores"]["near_copy"].values()) == 16
    flagged = [line for line in graded["table"].splitlines() if "flagged" in line]
    assert flagged == [
        "  flagged: near_copy's ring_allreduce: a near copy of the course's solution"
    ]


def test_predicted_inputs_earn_no_sums(graded: dict) -> None:
    """Inputs come from fresh random seeds: a function that recomputes them without any
    message gets no sums. (Its forged trace is the gap docs/grading.md names.)"""
    assert graded["scores"]["no_comm"]["ring_allreduce_sums"] == 0


def test_deleting_the_setup_cell_changes_nothing(graded: dict) -> None:
    """The grader's imports come from the gradebook, not from the submitted notebook."""
    assert sum(graded["scores"]["no_setup"].values()) == 16


# What the samples' failures say, graded beside the attacks (their grades are their specs':
# test_a_class_graded_beside_the_attacks_gets_its_quiet_grades).


def test_a_hanging_uneven_loop_costs_one_gloo_timeout(graded: dict) -> None:
    """Does Cy's plain loop (it hangs on uneven data) lose only its own points, stopped by its
    check's gloo timeout, with a message that names the fix?"""
    errors = autograded_errors(graded["beside"][0], "cy", "accumulation")
    assert list(errors) == ["train_uneven_finishes"], errors
    assert "did not finish" in errors["train_uneven_finishes"]
    assert "Agree each step" in errors["train_uneven_finishes"]


def test_the_zero_samples_failures(graded: dict) -> None:
    """Do Cy's unshifted ring and full Adam state say so?"""
    errors = autograded_errors(graded["beside"][0], "cy", "zero")
    assert "chunk_bounds" in errors["reduce_scatter_sums"]
    assert "only this rank's shard" in errors["zero_optimizer_memory"]


def test_the_synchrony_samples_failures(graded: dict) -> None:
    """Are Cy's deadlocking tree and Eve's stopped clock named for what they are?"""
    cy, eve = (autograded_errors(graded["beside"][0], s, "synchrony") for s in ("cy", "eve"))
    assert "deadlock" in cy["tree_allreduce_sums"].lower()
    assert "waited for the straggler" in eve["step_with_backups_check"]


def test_the_fault_tolerance_samples_failures(graded: dict) -> None:
    """Do Cy's deadlocking outer step, whole-reading load, uncaught failed all-reduce and heal
    the ranks ahead skip, and Eve's heavy-ball step, rank-named shards, re-reduced partial
    buffer and averaged heal, each say what happened?"""
    root = graded["beside"][0]
    cy, eve = (autograded_errors(root, s, "fault_tolerance") for s in ("cy", "eve"))
    assert "failed on 2 ranks" in cy["diloco_outer_step_check"]
    assert "plain momentum" in eve["diloco_outer_step_check"]
    assert "Read only the objects that overlap" in cy["resharding_check"]
    assert "a save on 3 ranks leaves 9 objects" in eve["resharding_check"]
    assert "catch that error (a RuntimeError)" in cy["survive_check"]
    assert "partly summed" in eve["survive_check"]
    assert "blocked in dist.broadcast" in cy["heal_check"]
    assert "the ranks ahead take part in the copy too" in cy["heal_check"]
    assert "the mean of every rank's parameters" in eve["heal_check"]


def test_the_fsdp_samples_failures(graded: dict) -> None:
    """Do Ben's gather-once, Cy's deadlock and Eve's forged record each say what happened?"""
    root = graded["beside"][0]
    ben, cy, eve = (autograded_errors(root, s, "fsdp") for s in ("ben", "cy", "eve"))
    assert "backward" in ben["fully_shard_traffic"]
    assert "deadlock" in cy["fully_shard_matches"].lower()
    assert "all_reduce" in eve["fully_shard_traffic"]
