"""Does check_resharding pass every right sharded save and resharding load and fail each
wrong one, on gloo, with the hint that names its mistake?"""

from __future__ import annotations

import pytest
import resharding_impls
import torch
from student_code import as_student_code

from course.checks.teaching import CheckFailed
from course.lessons.fault_tolerance import Storage, check_resharding
from course.lessons.fault_tolerance.resharding import overlapping

pytestmark = pytest.mark.ranks


@pytest.mark.parametrize(("save", "load"), resharding_impls.RIGHT, ids=lambda f: f.__name__)
def test_right_saves_and_loads_pass(save, load):
    """Do the ranged load, the load of whole overlapping objects and a save that ends at a
    barrier all pass?"""
    assert "passed" in check_resharding(as_student_code(save), as_student_code(load))


@pytest.mark.parametrize(
    ("pair", "hint"), resharding_impls.WRONG.items(), ids=lambda x: getattr(x, "__name__", "")
)
def test_wrong_saves_and_loads_fail_with_their_hint(pair, hint):
    """Does each usual mistake fail, with a message that says which?"""
    save, load = pair
    with pytest.raises(CheckFailed) as failed:
        check_resharding(as_student_code(save), as_student_code(load))
    assert hint in str(failed.value)


@pytest.mark.deadlocks
def test_a_deadlocked_load_fails_and_names_it():
    with pytest.raises(CheckFailed) as failed:
        check_resharding(
            as_student_code(resharding_impls.save_sharded),
            as_student_code(resharding_impls.load_deadlock),
            loaded_on=(2,),
        )
    assert "load_resharded failed on 2 ranks" in str(failed.value)


def test_a_ranged_get_reads_only_its_elements(tmp_path):
    """On gloo the storage is files: does get(key, start, stop) return those elements and
    count only their bytes, and do a missing key and a bad range fail in words?"""
    storage = Storage(tmp_path)
    storage.put("exp_avg/0-10", torch.arange(10, dtype=torch.float32))
    assert storage.list() == ["exp_avg/0-10"]
    assert storage.get("exp_avg/0-10", 3, 6).tolist() == [3.0, 4.0, 5.0]
    assert storage.got == 12
    with pytest.raises(KeyError, match="holds no object"):
        storage.get("exp_avg/10-20")
    with pytest.raises(ValueError, match="0 <= start <= stop <= 10"):
        storage.get("exp_avg/0-10", 4, 11)
    with pytest.raises(ValueError, match="a key must be"):
        storage.put("exp avg", torch.zeros(1))


def test_the_overlaps_are_what_a_range_needs():
    """Rank 0 of 2 needs elements 0:15 of 29, which the first two of three saved shards
    hold; rank 3 of 4 (22:29) only the last."""
    assert overlapping(29, 3, 2, 0) == [(0, 10), (10, 20)]
    assert overlapping(29, 3, 4, 3) == [(20, 29)]


def test_a_gloo_rank_cannot_reach_the_relays_storage():
    """The relay's storage calls refuse, in words, on a rank of another backend."""
    from course.ranks import relay, run

    def job():
        try:
            relay.keys()
        except Exception as err:  # noqa: BLE001 - what it raised is the answer
            return str(err)
        return "reached"

    assert run(job, 2)[0] == "the relay's storage is reached only from a relay run's ranks"
