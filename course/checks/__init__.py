"""Checks for hidden test cells: each grades one thing and fails with a message that teaches.

Every check runs the student's code on fresh ranks (``course.ranks``) and computes its
verdict in the caller, from what the ranks send back; none trusts the kernel's state. When
grading, the caller is the judge (``course.grading.judge``), which never runs student code.
"""

from __future__ import annotations

from course.checks.accumulation import check_accumulation_syncs, check_accumulation_values
from course.checks.answers import check_answer
from course.checks.backups import check_step_with_backups
from course.checks.buckets import check_bucketed_allreduce
from course.checks.calls import check_returns
from course.checks.compression import check_error_feedback_hook
from course.checks.ddp import check_reduce_hook, check_weighted_loss
from course.checks.fsdp import check_fsdp_traffic, check_fully_shard
from course.checks.fsdp_memory import check_fsdp_memory, check_fsdp_mixed_precision
from course.checks.halves import check_all_gather, check_halves_pattern, check_reduce_scatter
from course.checks.hierarchy import (
    check_hierarchical_allreduce,
    check_hierarchical_pattern,
    check_hierarchical_sums,
)
from course.checks.overlap import check_overlapping_ddp
from course.checks.ring import check_ring_allreduce, check_ring_pattern, check_ring_sums
from course.checks.sampler import check_sampler_indices
from course.checks.tree import check_tree_allreduce, check_tree_pattern, check_tree_sums
from course.checks.uneven import check_train_uneven
from course.checks.zero import check_zero_matches_ddp, check_zero_memory

__all__ = [
    "check_accumulation_syncs",
    "check_accumulation_values",
    "check_all_gather",
    "check_answer",
    "check_bucketed_allreduce",
    "check_error_feedback_hook",
    "check_fsdp_memory",
    "check_fsdp_mixed_precision",
    "check_fsdp_traffic",
    "check_fully_shard",
    "check_halves_pattern",
    "check_hierarchical_allreduce",
    "check_hierarchical_pattern",
    "check_hierarchical_sums",
    "check_overlapping_ddp",
    "check_reduce_hook",
    "check_reduce_scatter",
    "check_returns",
    "check_ring_allreduce",
    "check_ring_pattern",
    "check_ring_sums",
    "check_sampler_indices",
    "check_step_with_backups",
    "check_train_uneven",
    "check_tree_allreduce",
    "check_tree_pattern",
    "check_tree_sums",
    "check_weighted_loss",
    "check_zero_matches_ddp",
    "check_zero_memory",
]
