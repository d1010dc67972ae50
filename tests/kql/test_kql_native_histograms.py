"""Native-histogram samples through kql: storage, selectors, ranges, subqueries, results (issue 14)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kernel_insight.kql import Engine, Matrix, MemoryStorage, Vector
from kernel_insight.kql.storage import STALE_NAN, Matcher


@dataclass(slots=True)
class _H:
    """A stand-in histogram sample: the storage and the selectors only carry it (and read ``sum`` for staleness)."""

    count: float
    sum: float


def _store() -> MemoryStorage:
    s = MemoryStorage()
    s.add_histograms({"__name__": "lat", "job": "a"}, [0, 60_000, 120_000], [_H(1, 1), _H(2, 2), _H(3, 3)])
    s.add({"__name__": "lat", "job": "b"}, [0, 60_000], [1.0, 2.0])
    # Mixed: floats first, histograms from 120 s on.
    s.add({"__name__": "lat", "job": "c"}, [0, 60_000], [5.0, 6.0])
    s.add_histograms({"__name__": "lat", "job": "c"}, [120_000], [_H(7, 7)])
    return s


def test_memory_storage_returns_floats_and_histograms_apart() -> None:
    s = _store()
    (a, b, c) = s.select([Matcher("__name__", "=", "lat")], 0, 120_000)
    assert len(a.timestamps) == 0
    assert list(a.hist_timestamps) == [0, 60_000, 120_000]
    assert [h.count for h in a.histograms] == [1, 2, 3]
    assert list(b.timestamps) == [0, 60_000]
    assert a.histograms
    assert not b.histograms
    assert list(c.timestamps) == [0, 60_000]
    assert list(c.hist_timestamps) == [120_000]
    # A window that holds only histograms still returns the series.
    (only,) = s.select([Matcher("job", "=", "a")], 100_000, 130_000)
    assert list(only.hist_timestamps) == [120_000]


def test_instant_selector_takes_the_latest_sample_of_either_kind() -> None:
    engine = Engine(_store())
    at_60 = engine.instant_query("lat", 60_000).value
    assert isinstance(at_60, Vector)
    by_job = {dict(x.labels)["job"]: x for x in at_60.samples}
    assert by_job["a"].histogram == _H(2, 2)
    assert math.isnan(by_job["a"].value)
    assert by_job["b"].histogram is None
    assert by_job["b"].value == 2.0
    assert by_job["c"].value == 6.0
    at_120 = engine.instant_query("lat", 120_000).value
    assert isinstance(at_120, Vector)
    by_job = {dict(x.labels)["job"]: x for x in at_120.samples}
    assert by_job["c"].histogram == _H(7, 7)


def test_a_stale_marker_of_either_kind_ends_the_series() -> None:
    s = MemoryStorage()
    s.add_histograms({"__name__": "x", "k": "float_marker"}, [0], [_H(1, 1)])
    s.add({"__name__": "x", "k": "float_marker"}, [10_000], [STALE_NAN])
    s.add_histograms({"__name__": "x", "k": "hist_marker"}, [0, 10_000], [_H(1, 1), _H(0, STALE_NAN)])
    s.add_histograms({"__name__": "x", "k": "live"}, [0], [_H(1, 1)])
    result = Engine(s).instant_query("x", 20_000).value
    assert isinstance(result, Vector)
    assert [dict(x.labels)["k"] for x in result.samples] == ["live"]


def test_range_query_returns_histogram_points_beside_float_points() -> None:
    result = Engine(_store()).range_query("lat", 0, 120_000, 60_000).value
    assert isinstance(result, Matrix)
    by_job = {dict(x.labels)["job"]: x for x in result.series}
    assert list(by_job["a"].hist_timestamps) == [0, 60_000, 120_000]
    assert len(by_job["a"].timestamps) == 0
    assert [h.count for h in by_job["a"].histograms] == [1, 2, 3]
    assert list(by_job["c"].timestamps) == [0, 60_000]
    assert list(by_job["c"].hist_timestamps) == [120_000]
    assert not by_job["b"].histograms


def test_range_vector_and_subquery_carry_histograms() -> None:
    engine = Engine(_store())
    matrix = engine.instant_query("lat[2m]", 120_000).value
    assert isinstance(matrix, Matrix)
    by_job = {dict(x.labels)["job"]: x for x in matrix.series}
    assert list(by_job["a"].hist_timestamps) == [60_000, 120_000]
    assert list(by_job["c"].timestamps) == [60_000]
    assert list(by_job["c"].hist_timestamps) == [120_000]
    sub = engine.instant_query("lat[2m:1m]", 120_000).value
    assert isinstance(sub, Matrix)
    by_job = {dict(x.labels)["job"]: x for x in sub.series}
    assert list(by_job["a"].hist_timestamps) == [60_000, 120_000]
    assert np.array_equal(by_job["c"].timestamps, [60_000])


def test_float_functions_ignore_histogram_samples() -> None:
    result = Engine(_store()).instant_query("abs(lat)", 60_000).value
    assert isinstance(result, Vector)
    assert sorted(dict(x.labels)["job"] for x in result.samples) == ["b", "c"]
