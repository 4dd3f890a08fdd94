"""The sampler's experiments (no ranks): its split and its picture."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from course.lessons.accumulation import sampler


@given(st.integers(1, 60), st.integers(1, 9), st.booleans())
def test_every_rank_gets_as_many_samples_and_every_sample_is_read(n, world_size, shuffle):
    """Without drop_last, do ranks get equal shares that together cover the whole data set?"""
    split = sampler.sampler_split(n, world_size, shuffle=shuffle)
    assert len({len(s) for s in split}) == 1
    assert {i for s in split for i in s} == set(range(n))
    assert sum(len(s) for s in split) - n < world_size  # padding is less than one round


def test_the_figure_marks_the_padded_samples():
    """10 samples on 4 ranks: one marker per read, and exactly the 2 padded reads marked x?"""
    fig = sampler.sampler_figure(sampler.sampler_split(10, 4), 10)
    symbols = [s for trace in fig.data for s in trace.marker.symbol]
    assert len(symbols) == 12 and symbols.count("x") == 2
    assert [list(t.x) for t in fig.data if "x" in t.marker.symbol] == [[2, 6, 0], [3, 7, 1]]
