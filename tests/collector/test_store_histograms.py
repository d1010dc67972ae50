"""Native histogram samples in the store: HistogramBatch -> chDB -> the same values back."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

from kernel_insight.collector.batcher import Batcher
from kernel_insight.collector.clickhouse.store import EmbeddedStore
from kernel_insight.collector.rows import HistogramBatch, HistogramBuilder, concat_histograms
from kernel_insight.kql.storage import STALE_NAN, is_stale_value

NOW_MS = (int(time.time()) // 60) * 60_000

COLUMNS = (
    "schema, zero_threshold, zero_count, count, sum, counter_reset_hint, positive_span_offsets, "
    "positive_span_lengths, positive_counts, positive_float_counts, negative_span_offsets, "
    "negative_span_lengths, negative_counts, negative_float_counts, custom_values"
)


@pytest.fixture
def store(tmp_path):
    s = EmbeddedStore(tmp_path / "data")
    yield s
    s.close()


def _rows(store):
    return store.query(
        f"SELECT metric, fingerprint, toUnixTimestamp64Milli(ts) AS t, {COLUMNS} FROM ki.histograms "
        "ORDER BY fingerprint, t"
    ).to_pylist()


def _example() -> HistogramBatch:
    b = HistogramBuilder()
    # The Prometheus docs' integer example, buckets as deltas: absolute counts 2, 1, 1, 2, 3.
    b.add_deltas(
        {"__name__": "kernel_duration_seconds", "kernel": "gemm", "gpu": "0"},
        NOW_MS,
        schema=3,
        count=12,
        sum=0.0425,
        zero_threshold=2.938735877055719e-39,
        zero_count=2,
        positive_spans=[(-3, 2), (1, 3)],
        positive_deltas=[2, -1, 0, 1, 1],
        negative_spans=[(0, 1)],
        negative_deltas=[1],
        counter_reset_hint=2,
    )
    b.add(
        {"__name__": "kernel_duration_seconds", "kernel": "gemm", "gpu": "0"},
        NOW_MS + 15_000,
        schema=3,
        count=13.5,
        sum=STALE_NAN,
        positive_spans=[(0, 1)],
        positive_buckets=[13.5],
        counter_reset_hint=3,
    )
    b.add(
        {"__name__": "nhcb_seconds", "le_set": "a"},
        NOW_MS,
        schema=-53,
        count=5,
        sum=1.5,
        positive_spans=[(0, 3)],
        positive_buckets=[1.0, 3.0, 1.0],
        custom_values=[0.1, 0.5, 1.0],
    )
    return b.build()


def test_histograms_round_trip_through_chdb(store):
    batch = _example()
    assert store.insert_histograms(batch) == 3
    rows = _rows(store)
    assert len(rows) == 3
    by_metric = {}
    for r in rows:
        by_metric.setdefault(r["metric"], []).append(r)
    first, second = by_metric["kernel_duration_seconds"]
    assert first["t"] == NOW_MS
    assert second["t"] == NOW_MS + 15_000
    assert first["schema"] == 3
    assert first["zero_count"] == 2.0
    assert first["count"] == 12.0
    assert first["zero_threshold"] == 2.938735877055719e-39
    assert first["positive_span_offsets"] == [-3, 1]
    assert first["positive_span_lengths"] == [2, 3]
    # An integer histogram's counts go to the Int64 column, a float one's to the Float64 column.
    assert first["positive_counts"] == [2, 1, 1, 2, 3]
    assert first["positive_float_counts"] == []
    assert first["negative_span_offsets"] == [0]
    assert first["negative_counts"] == [1]
    assert first["counter_reset_hint"] == 2
    # A stale histogram keeps the StaleNaN bit pattern in sum (Prometheus marks it there).
    assert is_stale_value(second["sum"])
    assert second["counter_reset_hint"] == 3
    assert second["positive_float_counts"] == [13.5]
    assert second["positive_counts"] == []
    assert second["negative_float_counts"] == []
    assert second["custom_values"] == []
    (nhcb,) = by_metric["nhcb_seconds"]
    assert nhcb["schema"] == -53
    assert nhcb["custom_values"] == [0.1, 0.5, 1.0]
    # The series index holds the histogram series, like float ones: selectors and label APIs see them.
    series = store.query("SELECT metric, labels FROM ki.series ORDER BY metric").to_pylist()
    assert [(s["metric"], dict(s["labels"])) for s in series] == [
        ("kernel_duration_seconds", {"gpu": "0", "kernel": "gemm"}),
        ("nhcb_seconds", {"le_set": "a"}),
    ]
    assert store.histogram_metrics() == {"kernel_duration_seconds", "nhcb_seconds"}


def test_batch_row_gives_back_what_was_added():
    batch = _example()
    row = batch.row(0)
    assert row["positive_spans"] == ((-3, 2), (1, 3))
    assert row["positive_buckets"] == (2.0, 1.0, 1.0, 2.0, 3.0)
    assert row["negative_spans"] == ((0, 1),)
    joined = concat_histograms([batch, _example()])
    assert len(joined) == 6
    assert len(joined.series) == 2
    assert joined.row(5)["custom_values"] == (0.1, 0.5, 1.0)
    assert joined.row(3)["positive_buckets"] == (2.0, 1.0, 1.0, 2.0, 3.0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"positive_spans": [(0, 2)], "positive_buckets": [1.0]}, "cover 2 buckets"),
        ({"positive_spans": [(0, 1), (-1, 1)], "positive_buckets": [1.0, 1.0]}, "negative offset"),
        ({"counter_reset_hint": 4}, "counter_reset_hint"),
        ({"schema": 300}, "schema"),
    ],
)
def test_builder_refuses_inconsistent_histograms(kwargs, message):
    args = {"schema": 0, "count": 1.0, "sum": 1.0, **kwargs}
    with pytest.raises(ValueError, match=message):
        HistogramBuilder().add({"__name__": "h"}, NOW_MS, **args)


def test_histograms_go_through_the_group_commit_exactly_once(store):
    batcher = Batcher(store, max_delay_s=0.05)
    batcher.start()
    try:
        first = store.prepare("agent-1:1", histograms=_example())
        assert batcher.submit(first).answer().result(timeout=30) is True
        again = store.prepare("agent-1:1", histograms=_example())
        assert batcher.submit(again).answer().result(timeout=30) is False
    finally:
        batcher.shutdown()
    assert len(_rows(store)) == 3


def test_float_and_histogram_samples_of_one_series_share_its_fingerprint(store):
    from kernel_insight.collector.rows import SampleBuilder

    s = SampleBuilder()
    # 30 s into NOW_MS's minute, the same UTC day as the histogram at NOW_MS: a series has one
    # row per day it has samples on, so NOW_MS - 15 s failed the count below when the module was
    # imported in the first minute after midnight UTC (the CI run of stop 25).
    s.add({"__name__": "mixed", "gpu": "1"}, NOW_MS + 30_000, 4.0)
    h = HistogramBuilder()
    h.add(
        {"__name__": "mixed", "gpu": "1"},
        NOW_MS,
        schema=0,
        count=1,
        sum=2.0,
        positive_spans=[(1, 1)],
        positive_buckets=[1.0],
    )
    assert store.insert_batch("b:1", samples=s.build(), histograms=h.build()) is True
    fps = store.query(
        "SELECT (SELECT any(fingerprint) FROM ki.samples) AS a, (SELECT any(fingerprint) FROM ki.histograms) AS b, "
        "(SELECT count() FROM ki.series) AS n"
    ).to_pylist()[0]
    assert fps["a"] == fps["b"]
    assert fps["n"] == 1


def test_a_timestamp_outside_the_schema_is_refused_before_any_write():
    b = HistogramBuilder()
    b.add({"__name__": "h"}, -1, schema=0, count=1, sum=math.inf)
    with pytest.raises(ValueError, match="outside the storable range"):
        b.build()
    assert np.isinf(HistogramBuilder().build().sum).size == 0
