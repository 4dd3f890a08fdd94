"""Known-wrong ``fully_shard`` implementations: the model solution with one mistake each.

Each is ``fsdp_impls``'s source with one of its ``KNOBS`` turned, so it can be pasted as a
student's cell (:func:`source`) or run as one (:func:`student_fn`). ``WRONG`` maps a name to
``(knobs, check, words)``: ``check`` is the check that must fail ("values", "traffic",
"memory", "mixed", "mixed on 3" or "any": every one) and ``words`` what its message must say.
``KEPT_FOR_BACKWARD``: the two that keep the forward's parameters for the backward, one with a
dummy all-gather in the backward: both must lose the same checks (traffic, memory, mixed).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

IMPLS = Path(__file__).with_name("fsdp_impls.py")

WRONG: dict[str, tuple[dict[str, bool], str, tuple[str, ...]]] = {
    "sums": ({"average": False}, "values", ("summed, not averaged", "rank 0 of 2")),
    "tied_one_name": (
        {"tie_all_names": False},
        "values",
        ("the head and the embedding differ", "both names"),
    ),
    "tied_twice": ({"count_tied_once": False}, "values", ("the root's shard", "counted twice")),
    "frozen_sharded": ({"skip_frozen": False}, "values", ("the root's shard", "frozen")),
    "unpadded": ({"pad": False}, "values", ("block 0's shard holds", "ceil(", "pad")),
    "keeps_params": (
        {"regather": False, "free_after_forward": False},
        "traffic",
        ("one all-gather per unit", "expected 2", "register_full_backward_pre_hook"),
    ),
    "keeps_params_dummy_gather": (  # the calls the traffic counts, the values never used
        {"regather": False, "free_after_forward": False, "dummy_gather": True},
        "traffic",
        ("the backward used parameters gathered in the forward", "gather again before the"),
    ),
    "no_free_after_forward": ({"free_after_forward": False}, "memory", ("held", "free each")),
    "no_free_after_backward": ({"free_after_backward": False}, "memory", ("held", "free each")),
    "bf16_reduce": (
        {"reduce_in_param_dtype": True},
        "mixed",
        ("reduce_scatter", "2-byte", "reduce_dtype"),
    ),
    "bf16_average": (
        {"divide_in_param_dtype": True},
        "mixed on 3",
        ("rank 0 of 3", "of the largest update", "before anything else", "not exact"),
    ),
    "bf16_master": (
        {"master_in_param_dtype": True},
        "mixed",
        ("block 0's flat_shard is torch.bfloat16", "stays float32", "cast a copy"),
    ),
    "sums_mixed": ({"average": False}, "mixed", ("param_dtype=bf16", "summed, not averaged")),
    "fp32_compute": (
        {"honour_param_dtype": False},
        "mixed",
        ("all_gather", "4-byte", "param_dtype"),
    ),
    "deadlock": ({"hang_on_last_rank": True}, "any", ("fully_shard failed on 2 ranks", "rank 1")),
}

KEPT_FOR_BACKWARD = ("keeps_params", "keeps_params_dummy_gather")
LOST_BY_KEEPING = {"values": False, "traffic": True, "memory": True, "mixed": True}


def source(name: str) -> str:
    """The cell text of wrong implementation ``name``."""
    knobs = WRONG[name][0]
    turned = "".join(f"\nKNOBS[{k!r}] = {v!r}" for k, v in knobs.items())
    return IMPLS.read_text() + turned + "\n"


def student_fn(name: str) -> Any:
    """Wrong implementation ``name``, run as a notebook cell runs it (none of it the course's)."""
    namespace: dict[str, Any] = {"__name__": "__main__"}
    exec(compile(source(name), "<cell>", "exec"), namespace)  # noqa: S102 - a student's cell
    return namespace["fully_shard"]
