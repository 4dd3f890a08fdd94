"""The backup-workers check: the model step passes, each misconception fails, saying why."""

from __future__ import annotations

import pytest
import synchrony_impls
import wrong_backups

from course.lessons.synchrony import check_step_with_backups

pytestmark = [pytest.mark.ranks, pytest.mark.slow]


def test_the_model_step_passes() -> None:
    """Does the model step pass on 3 and 4 ranks, stragglers drawn, 0 to 2 backups?"""
    report = check_step_with_backups(synchrony_impls.step_with_backups)
    assert "4 steps on world sizes 3 and 4" in str(report)


@pytest.mark.parametrize(
    ("impl", "words"),
    [
        ("waits_for_everyone", "waited for"),  # kept the straggler, or waited in a send
        ("all_reduce_of_everyone", "waited for"),
        ("blocks_on_the_straggler", "waited for the straggler"),
        ("divides_by_everyone", "divided by N, not by the number kept"),
        ("each_keeps_its_own", "the ranks disagree on whom they kept"),
    ],
)
def test_each_misconception_fails_saying_why(impl: str, words: str) -> None:
    """Does each wrong step fail on 3 ranks with the reason that fits it?"""
    with pytest.raises(AssertionError, match=words):
        check_step_with_backups(getattr(wrong_backups, impl), world_sizes=(3,))


@pytest.mark.parametrize("sizes", [(), (1,), (3.0,), ("4",)])
def test_world_sizes_that_cannot_hold_a_straggler_are_refused(sizes: tuple) -> None:
    """Is a world size below 2, or not an integer, refused at once, saying what is expected?"""
    with pytest.raises(ValueError, match="integers of at least 2"):
        check_step_with_backups(synchrony_impls.step_with_backups, world_sizes=sizes)
