"""How long does a class-sized autograde take? 50 mixed submissions through
course.instructor.classrun.

    .venv/bin/python benchmarks/autograde.py [--students 50] [--workers 2] [--no-sandbox]

Builds a throwaway course around the tamper fixture (tests/fixtures/tamper), submits a class
of mixed quality (right, wrong answer, unimplemented, deadlocking, crashing, attacking the
grader), autogrades it with the sandboxed kernel and the out-of-kernel re-check, and prints
the wall time, submissions per minute and how each kind scored.
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from course.instructor import sandbox
from course.instructor.classrun import autograde_class

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location(
    "course_kit", HERE.parent / "tests" / "fixtures" / "tamper" / "course_kit.py"
)
kit = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(kit)


def _function(body: str):  # noqa: ANN202 - returns whatever the exec'd body defines
    def edit(nb: dict) -> None:
        kit.honest_right(nb)
        kit.cell(nb, "allreduce_sum")["source"] = f"def allreduce_sum(tensor):\n    {body}\n"

    return edit


KINDS = {  # kind -> edit, in the proportions of a (pessimistic) class
    "right": kit.honest_right,
    "right_too": kit.honest_right,
    "right_again": kit.honest_right,
    "right_also": kit.honest_right,
    "wrong_answer": lambda _nb: None,
    "wrong_answer_too": lambda _nb: None,
    "unimplemented": _function('"""Not done yet."""'),
    "deadlock": _function("dist.recv(tensor, src=(dist.get_rank() + 1) % dist.get_world_size())"),
    "crash": _function('raise RuntimeError("boom")'),
    "attack": kit.answer_cell_adds(kit.TRANSFORMER),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--students", type=int, default=50)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--no-sandbox", action="store_true")
    args = parser.parse_args()
    confined = sandbox.available() and not args.no_sandbox
    work = Path(tempfile.mkdtemp(prefix="bench-autograde-"))
    try:
        root = kit.make_course(work / "course", sandbox=confined)
        kinds = list(KINDS)
        student_kind = {}
        for i in range(args.students):
            kind = kinds[i % len(kinds)]
            student = f"s{i:03d}_{kind}"
            kit.submit(root, student, KINDS[kind])
            student_kind[student] = kind.split("_too")[0].split("_again")[0].split("_also")[0]
        started = time.monotonic()
        outcomes = autograde_class("tamper", root, workers=args.workers, timeout=300,
                                   progress=lambda line: print(line, flush=True))  # fmt: skip
        wall = time.monotonic() - started
        scores: dict[str, list] = defaultdict(list)
        for o in outcomes:
            scores[student_kind[o.student]].append(o.score if o.status == "graded" else o.status)
        print(f"\nsandbox={confined} workers={args.workers} students={args.students}")
        print(f"wall time {wall:.0f} s, {args.students / wall * 60:.1f} submissions per minute")
        print(f"mean per submission {sum(o.seconds for o in outcomes) / len(outcomes):.1f} s")
        for kind, got in scores.items():
            print(f"  {kind:14s} {got}")
        failed = [o.student for o in outcomes if o.status == "failed"]
        print(f"failed: {failed or 'none'}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
