"""When a rank fails: ``peers`` measures what a gloo collective does when a peer dies or hangs,
``elastic`` what torchrun's agent restarts, ``checkpoint`` what each rank writes and reads with
torch.distributed.checkpoint, ``quorum`` torchft's per-step quorum and live recovery,
``failures``, ``timeline`` and ``widget`` a job's failures over time and its checkpoint
interval, ``local_sgd`` what synchronising less often costs; ``outer`` grades the student's
DiLoCo outer step, ``resharding`` their sharded checkpoint's save and resharding load, on a
``storage`` that is read by range, ``survive`` their step that outlives a rank dying in it,
``heal`` their catching up of ranks that come back.
"""

from course.exports import Exports

EXPORTS = Exports(
    __name__,
    {
        "check_answer": "course.checks.answers",
        "check_diloco_outer_step": "course.lessons.fault_tolerance.outer",
        "check_fault_tolerant_step": "course.lessons.fault_tolerance.survive",
        "check_heal": "course.lessons.fault_tolerance.heal",
        "check_resharding": "course.lessons.fault_tolerance.resharding",
        "chunk_bounds": "course.ring.schedule",
        "checkpoint_run": "course.lessons.fault_tolerance.failures",
        "elastic": "course.lessons.fault_tolerance.elastic",
        "fail_and_recover": "course.lessons.fault_tolerance.quorum",
        "failure_free_fraction": "course.lessons.fault_tolerance.failures",
        "failures_widget": "course.lessons.fault_tolerance.widget",
        "first_failures": "course.lessons.fault_tolerance.failures",
        "Job": "course.lessons.fault_tolerance.failures",
        "not_implemented": "course.checks.teaching",
        "local_sgd": "course.lessons.fault_tolerance.local_sgd",
        "peers": "course.lessons.fault_tolerance.peers",
        "recovery_report": "course.lessons.fault_tolerance.quorum",
        "reshard": "course.lessons.fault_tolerance.checkpoint",
        "save_state": "course.lessons.fault_tolerance.checkpoint",
        "steps_table": "course.lessons.fault_tolerance.quorum",
        "try_heal": "course.lessons.fault_tolerance.heal",
        "try_steps": "course.lessons.fault_tolerance.survive",
        "Storage": "course.lessons.fault_tolerance.storage",
        "say_if_unimplemented": "course.checks.teaching",
    },
)
__all__ = [
    "Job",
    "Storage",
    "check_answer",
    "check_diloco_outer_step",
    "check_fault_tolerant_step",
    "check_heal",
    "check_resharding",
    "checkpoint_run",
    "chunk_bounds",
    "elastic",
    "fail_and_recover",
    "failure_free_fraction",
    "failures_widget",
    "first_failures",
    "local_sgd",
    "not_implemented",
    "peers",
    "recovery_report",
    "reshard",
    "save_state",
    "say_if_unimplemented",
    "steps_table",
    "try_heal",
    "try_steps",
]
__getattr__ = EXPORTS.getattr
__dir__ = EXPORTS.dir()
