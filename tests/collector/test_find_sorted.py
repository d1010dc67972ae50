"""head.find_sorted (fingerprint -> position in a sorted array, searched in ascending order) against a dict."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kernel_insight.collector.head import find_sorted

_FPS = st.integers(0, 2**64 - 1)


@settings(max_examples=300, deadline=None)
@given(
    haystack=st.lists(_FPS, unique=True, max_size=60), needles=st.lists(_FPS, max_size=40), picks=st.data()
)
def test_positions_match_a_dict(haystack: list[int], needles: list[int], picks: st.DataObject) -> None:
    hay = np.array(sorted(haystack), dtype=np.uint64)
    if haystack:  # some needles that are there, some twice, in any order
        needles = needles + picks.draw(st.lists(st.sampled_from(haystack), max_size=40))
    pos = {int(v): i for i, v in enumerate(hay.tolist())}
    got = find_sorted(hay, np.array(needles, dtype=np.uint64))
    assert got.tolist() == [pos.get(n, -1) for n in needles]
