"""The head's new series, added a batch at a time (Head._add_series): ids, postings and reads agree
with an oracle when series repeat within a batch and across batches."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kernel_insight.collector.head import Head
from kernel_insight.collector.rows import series_fingerprint
from kernel_insight.kql.storage import Matcher

_POOL = [(("__name__", f"m{i % 3}"), ("i", str(i)), *((("odd", "1"),) if i % 2 else ())) for i in range(12)]


@settings(max_examples=60, deadline=None)
@given(
    batches=st.lists(
        st.lists(st.integers(0, len(_POOL) - 1), min_size=1, max_size=10), min_size=1, max_size=6
    )
)
def test_batches_with_repeated_series_read_back_exactly(batches: list[list[int]]) -> None:
    head = Head(window_ms=10**12)
    want: dict[int, list[tuple[int, float]]] = {}
    t = 1_000
    for picks in batches:
        # Each pick is one entry of the batch's series list: a series can come twice in a batch.
        series = [_POOL[p] for p in picks]
        fps = np.array([series_fingerprint(s) for s in series], dtype=np.uint64)
        ts = np.arange(t, t + len(picks), dtype=np.int64)
        vals = ts.astype(np.float64) / 7
        head.append(series, fps, np.arange(len(picks), dtype=np.int32), ts, vals)
        for p, tt, v in zip(picks, ts.tolist(), vals.tolist(), strict=True):
            want.setdefault(p, []).append((tt, v))
        t += len(picks)
    # One id per label set, postings ascending, every label set's samples found by its labels.
    assert len(head._labels) == len(want)
    assert len({series_fingerprint(s) for s in head._labels}) == len(head._labels)
    for values in head._postings.by_name.values():
        for ids in values.values():
            assert ids == sorted(set(ids))
    for p, samples in want.items():
        cols = head.select_columns([Matcher(k, "=", v) for k, v in _POOL[p]], 0, t)
        assert cols is not None
        got = [
            (int(tt), float(v))
            for s in cols.series()
            if tuple(s.labels) == _POOL[p]
            for tt, v in zip(s.timestamps.tolist(), s.values.tolist(), strict=True)
        ]
        assert got == samples
