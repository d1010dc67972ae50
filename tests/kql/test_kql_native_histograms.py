"""Native-histogram samples through kql: storage, selectors, ranges, subqueries, results (issue 14)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import orjson
import pytest

from kernel_insight.kql import (
    Engine,
    Matrix,
    MemoryStorage,
    Sample,
    Vector,
    prometheus_json_bytes,
    to_prometheus_json,
)
from kernel_insight.kql.histdense import DenseBlock, dense_quantiles
from kernel_insight.kql.histogram import FloatHistogram, histogram_quantile
from kernel_insight.kql.promqltest import histogram_values
from kernel_insight.kql.storage import STALE_NAN, Matcher
from kernel_insight.kql.values import hist_mask, histogram_json


@dataclass(slots=True)
class _H:
    """A stand-in histogram sample: the storage and the selectors only carry it (and read ``sum`` for staleness)."""

    count: float
    sum: float
    counter_reset_hint: int = 3  # a gauge: the store's counter-reset hints leave it alone

    def sample_weight(self) -> int:
        return 11  # an empty histogram's weight toward max_samples


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


# ------------------------------------------------------------------------- with real histograms


def _h(count: float, buckets: tuple[float, ...], hint: int = 0, schema: int = 0) -> FloatHistogram:
    """A histogram with positive buckets from index 0 (schema 0: (0.5,1], (1,2], (2,4], ...), sum = count."""
    return FloatHistogram(
        schema=schema,
        zero_threshold=0.0,
        zero_count=0.0,
        count=count,
        sum=count,
        positive_spans=((0, len(buckets)),) if buckets else (),
        positive_buckets=buckets,
        negative_spans=(),
        negative_buckets=(),
        counter_reset_hint=hint,
    )


def _counter_store() -> MemoryStorage:
    s = MemoryStorage()
    # A counter histogram growing by (2 observations in (0.5,1], 2 in (1,2]) every 15 s.
    stamps = list(range(0, 300_001, 15_000))
    s.add_histograms(
        {"__name__": "lat", "job": "a"}, stamps, [_h(4.0 * k, (2.0 * k, 2.0 * k)) for k in range(len(stamps))]
    )
    s.add_histograms(
        {"__name__": "lat", "job": "b"}, stamps, [_h(2.0 * k, (2.0 * k, 0.0)) for k in range(len(stamps))]
    )
    s.add({"__name__": "plain", "job": "a"}, stamps, [float(k) for k in range(len(stamps))])
    return s


def _one(result: Vector | Matrix | object) -> Sample:
    assert isinstance(result, Vector)
    assert len(result.samples) == 1
    return result.samples[0]


def test_rate_of_a_histogram_counter_is_a_histogram_per_second() -> None:
    engine = Engine(_counter_store())
    rate = _one(engine.instant_query('rate(lat{job="a"}[1m])', 300_000).value)
    assert rate.histogram is not None
    # 4 observations per 15 s, extrapolated over the full minute: 16 per minute.
    assert rate.histogram.count == pytest.approx(16 / 60)
    assert list(rate.histogram.positive_buckets) == pytest.approx([8 / 60, 8 / 60])
    assert rate.histogram.counter_reset_hint == 3  # a gauge histogram
    count = _one(engine.instant_query('histogram_count(rate(lat{job="a"}[1m]))', 300_000).value)
    assert count.value == pytest.approx(16 / 60)
    assert count.labels == (("job", "a"),)


def test_a_counter_reset_is_added_back_into_the_rate() -> None:
    s = MemoryStorage()
    hs = [_h(4, (2, 2)), _h(8, (4, 4)), _h(2, (1, 1)), _h(6, (3, 3))]
    s.add_histograms({"__name__": "c"}, [0, 15_000, 30_000, 45_000], hs)
    result = _one(Engine(s).instant_query("increase(c[45s])", 45_000).value)
    assert result.histogram is not None
    # The window (0 s, 45 s] holds 8, 2, 6: last - first + the value before the reset = 6 - 8 + 8 = 6
    # over 30 s, extrapolated 15 s towards the window's start: 6 * 45 / 30.
    assert result.histogram.count == pytest.approx(9.0)
    assert list(result.histogram.positive_buckets) == pytest.approx([4.5, 4.5])
    assert _one(Engine(s).instant_query("resets(c[45s])", 45_000).value).value == 1.0
    assert _one(Engine(s).instant_query("changes(c[45s])", 45_000).value).value == 2.0


def test_sum_and_avg_aggregate_histograms_and_refuse_mixed_groups() -> None:
    engine = Engine(_counter_store())
    total = _one(engine.instant_query("sum(lat)", 300_000).value)
    assert total.histogram is not None
    assert total.histogram.count == 80 + 40
    assert list(total.histogram.positive_buckets) == [80.0, 40.0]
    mean = _one(engine.instant_query("avg(lat)", 300_000).value)
    assert mean.histogram is not None
    assert mean.histogram.count == 60
    mixed = engine.instant_query('sum({job="a"})', 300_000)
    assert isinstance(mixed.value, Vector)
    assert len(mixed.value) == 0
    assert mixed.warnings == [
        "PromQL warning: encountered a mix of histograms and floats for aggregation (1:5)"
    ]
    counted = _one(engine.instant_query('count({job="a"})', 300_000).value)
    assert counted.value == 2.0
    ignored = engine.instant_query("max(lat)", 300_000)
    assert ignored.infos == ["PromQL info: ignored histogram in max aggregation (1:5)"]


def test_histogram_functions_read_histograms_and_skip_floats() -> None:
    engine = Engine(_counter_store())
    for query, expected in (
        ('histogram_count(lat{job="a"})', 80.0),
        ('histogram_sum(lat{job="a"})', 80.0),
        ('histogram_avg(lat{job="a"})', 1.0),
    ):
        sample = _one(engine.instant_query(query, 300_000).value)
        assert sample.value == expected, query
        assert sample.labels == (("job", "a"),)
    assert len(engine.instant_query("histogram_count(plain)", 300_000).value) == 0  # type: ignore[arg-type]
    # All observations of job b lie in (0.5, 1]: the median interpolates inside that bucket.
    median = _one(engine.instant_query('histogram_quantile(0.5, lat{job="b"})', 300_000).value)
    assert 0.5 < median.value <= 1.0
    below_one = _one(engine.instant_query('histogram_fraction(0, 1, lat{job="b"})', 300_000).value)
    assert below_one.value == pytest.approx(1.0)


def test_arithmetic_with_scalars_and_between_histograms() -> None:
    engine = Engine(_counter_store())
    doubled = _one(engine.instant_query('lat{job="a"} * 2', 300_000).value)
    assert doubled.histogram is not None
    assert doubled.histogram.count == 160
    assert dict(doubled.labels) == {"job": "a"}  # arithmetic drops the metric name
    halved = _one(engine.instant_query('lat{job="a"} / 2', 300_000).value)
    assert halved.histogram is not None
    assert halved.histogram.count == 40
    scaled = _one(engine.instant_query('0.5 * lat{job="a"}', 300_000).value)
    assert scaled.histogram is not None
    assert scaled.histogram.count == 40
    refused = engine.instant_query('lat{job="a"} + 1', 300_000)
    assert isinstance(refused.value, Vector)
    assert len(refused.value) == 0
    assert refused.infos == [
        'PromQL info: incompatible sample types encountered for binary operator "+": histogram + float (1:1)'
    ]
    diff = _one(engine.instant_query('lat{job="a"} - ignoring(job) lat{job="b"}', 300_000).value)
    assert diff.histogram is not None
    assert diff.histogram.count == 40
    assert diff.histogram.counter_reset_hint == 3
    same = engine.instant_query('lat{job="a"} == lat{job="a"}', 300_000).value
    assert isinstance(same, Vector)
    assert len(same) == 1
    negated = _one(engine.instant_query('-lat{job="a"}', 300_000).value)
    assert negated.histogram is not None
    assert negated.histogram.count == -80
    kept = engine.instant_query('lat{job="a"} and plain', 300_000).value
    assert isinstance(kept, Vector)
    assert kept.samples[0].histogram is not None


def test_mixed_float_and_histogram_windows() -> None:
    s = MemoryStorage()
    s.add({"__name__": "m"}, [0, 15_000], [1.0, 2.0])
    s.add_histograms({"__name__": "m"}, [30_000, 45_000], [_h(1, (1,)), _h(2, (2,))])
    engine = Engine(s)
    rate = engine.instant_query("rate(m[1m])", 45_000)
    assert isinstance(rate.value, Vector)
    assert len(rate.value) == 0
    assert rate.warnings == [
        'PromQL warning: encountered a mix of histograms and floats for metric name "m" (1:6)'
    ]
    maximum = engine.instant_query("max_over_time(m[1m])", 45_000)
    assert _one(maximum.value).value == 2.0
    assert maximum.infos == [
        'PromQL info: ignored histograms in a range containing both floats and histograms for metric name "m" (1:15)'
    ]
    assert _one(engine.instant_query("count_over_time(m[1m])", 45_000).value).value == 4.0
    last = _one(engine.instant_query("last_over_time(m[1m])", 45_000).value)
    assert last.histogram is not None
    assert last.histogram.count == 2
    assert _one(engine.instant_query("changes(m[1m])", 45_000).value).value == 3.0


def test_prometheus_json_of_histogram_samples() -> None:
    s = MemoryStorage()
    s.add_histograms({"__name__": "h"}, [0, 60_000], [_h(3, (1, 2)), _h(5, (2, 3))])
    engine = Engine(s)
    instant = engine.instant_query("h", 60_000)
    expected_hist = {"count": "5", "sum": "5", "buckets": [[0, "0.5", "1", "2"], [0, "1", "2", "3"]]}
    assert to_prometheus_json(instant.value) == {
        "resultType": "vector",
        "result": [{"metric": {"__name__": "h"}, "histogram": [60, expected_hist]}],
    }
    assert orjson.loads(prometheus_json_bytes(instant.value)) == to_prometheus_json(instant.value)
    ranged = engine.range_query("h", 0, 60_000, 60_000)
    data = orjson.loads(prometheus_json_bytes(ranged.value))
    assert data["result"][0]["metric"] == {"__name__": "h"}
    assert "values" not in data["result"][0]  # a series of histograms only has no float points
    assert data["result"][0]["histograms"][1] == [60, expected_hist]


def test_promqltest_histogram_notation_expands_series() -> None:
    values = histogram_values("{{schema:0 sum:1 count:2 buckets:[1 1]}}+{{sum:1 count:1 buckets:[1]}}x2")
    assert [v.hist.count for v in values if v.hist is not None] == [2.0, 3.0, 4.0]
    repeated = histogram_values("{{count:1 sum:1 buckets:[1]}}x3")
    assert len(repeated) == 4


def test_rule_evaluation_cache_keeps_histograms() -> None:
    """A rule over a histogram metric reads it through the rules' per-cycle cache (rules/prefetch.py)."""
    from kernel_insight.rules.prefetch import CycleStorage

    cycle = CycleStorage(_counter_store(), 300_000, {"lat": 120_000})
    engine = Engine(cycle)
    quantile = engine.instant_query('histogram_count(rate(lat{job="a"}[1m]))', 300_000)
    assert _one(quantile.value).value == pytest.approx(16 / 60)
    assert cycle.reads == 1


def test_histogram_json_writes_zero_and_negative_buckets_as_prometheus() -> None:
    """jsonutil.MarshalHistogram: [-zt, zt] is rule 3, negative buckets [l, u) rule 1, positive (l, u]
    rule 0, empty buckets left out, floats below 1e-6 in Go's 'e' form."""
    h = FloatHistogram(
        schema=0,
        zero_threshold=1e-9,
        zero_count=1.0,
        count=8.5,
        sum=-0.25,
        positive_spans=((-1, 2), (2, 1)),
        positive_buckets=(1.0, 0.0, 3.5),
        negative_spans=((1, 1),),
        negative_buckets=(3.0,),
    )
    assert histogram_json(h) == {
        "count": "8.5",
        "sum": "-0.25",
        "buckets": [
            [1, "-2", "-1", "3"],
            [3, "-1e-09", "1e-09", "1"],
            [0, "0.25", "0.5", "1"],
            [0, "4", "8", "3.5"],
        ],
    }
    assert histogram_json(FloatHistogram()) == {"count": "0", "sum": "0"}


def _random_histograms(rng: np.random.Generator, n: int, schema: int) -> list[FloatHistogram]:
    out = []
    for _ in range(n):
        pos_n, neg_n = int(rng.integers(0, 12)), int(rng.integers(0, 4))
        pos = tuple(float(x) for x in rng.integers(0, 50, pos_n) * rng.choice([1.0, 0.25], pos_n))
        neg = tuple(float(x) for x in rng.integers(0, 20, neg_n))
        zero = float(rng.choice([0.0, 0.0, 3.0]))
        pos_off = int(rng.integers(-8, 8))
        # Two positive spans now and then, with a gap between them.
        spans = ((pos_off, pos_n),) if pos_n < 4 else ((pos_off, 2), (int(rng.integers(0, 3)), pos_n - 2))
        out.append(
            FloatHistogram(
                schema=schema,
                zero_threshold=1e-3,
                zero_count=zero,
                count=sum(pos) + sum(neg) + zero,
                sum=float(rng.normal()),
                positive_spans=spans if pos_n else (),
                positive_buckets=pos,
                negative_spans=((int(rng.integers(-3, 3)), neg_n),) if neg_n else (),
                negative_buckets=neg,
            )
        )
    return out


@pytest.mark.parametrize("schema", [-2, 0, 3, 8])
def test_dense_quantiles_equal_nativehist_bit_for_bit(schema: int) -> None:
    """The numpy fast path of histogram_quantile gives kql.histogram's own answers, bit for bit."""
    rng = np.random.default_rng(schema + 10)
    hs = _random_histograms(rng, 400, schema)
    block = DenseBlock.of(hs)
    assert block is not None
    for q in (0.0, 0.01, 0.25, 0.5, 0.9, 0.99, 1.0):
        values, decided = dense_quantiles(np.full(len(hs), q), block)
        assert decided.sum() > 300  # empty histograms (count 0) are left to kql.histogram
        for h, value, ok in zip(hs, values.tolist(), decided.tolist(), strict=True):
            if ok:
                expected = histogram_quantile(q, h)[0]
                assert value == expected or (math.isnan(value) and math.isnan(expected)), (q, str(h))


def test_histogram_quantile_over_many_cells_takes_the_dense_path_and_agrees() -> None:
    rng = np.random.default_rng(7)
    s = MemoryStorage()
    hs = _random_histograms(rng, 200, 3)
    for k, h in enumerate(hs):
        s.add_histograms({"__name__": "lat", "k": str(k)}, [0], [h])
    result = Engine(s).instant_query("histogram_quantile(0.9, lat)", 0).value
    assert isinstance(result, Vector)
    got = {dict(x.labels)["k"]: x.value for x in result.samples}
    for k, h in enumerate(hs):
        expected = histogram_quantile(0.9, h)[0]
        assert got[str(k)] == expected or (math.isnan(got[str(k)]) and math.isnan(expected))


def test_hist_mask_counts_every_histogram_even_an_empty_one() -> None:
    cells = np.array([[FloatHistogram(), None], [None, _h(1, (1,))]], dtype=object)
    assert hist_mask(cells).tolist() == [[True, False], [False, True]]


def _counter_series(
    rng: np.random.Generator, series: int, samples: int, reset_rate: float = 0.03
) -> MemoryStorage:
    """Counter histograms (schema 2) growing by random observations, a reset now and then, and
    some series whose bucket layout widens over time."""
    s = MemoryStorage()
    for i in range(series):
        counts = np.zeros(12)
        hs = []
        for _ in range(samples):
            if rng.random() < reset_rate:
                counts = np.zeros(12)  # the process restarted
            counts = counts + rng.integers(0, 4, 12) * (rng.random(12) < (0.5 if i % 3 else 0.9))
            used = np.flatnonzero(counts)
            lo = int(used[0]) if len(used) else 0
            body = tuple(float(x) for x in counts[lo:]) if len(used) else ()
            hs.append(
                FloatHistogram(
                    schema=2,
                    zero_threshold=1e-4,
                    count=float(counts.sum()),
                    sum=float(counts.sum()) * 0.37,
                    positive_spans=((lo - 3, len(body)),) if body else (),
                    positive_buckets=body,
                )
            )
        labels = {"__name__": "c", "i": str(i), "g": str(i % 3)}
        s.add_histograms(labels, [k * 15_000 for k in range(samples)], hs)
    return s


@pytest.mark.parametrize(
    "query", ["rate(c[1m])", "increase(c[2m])", "sum(rate(c[1m]))", "avg by (i) (rate(c[1m]))"]
)
@pytest.mark.parametrize("chunk", [4_096, 100])
def test_dense_rate_and_sum_equal_the_per_histogram_path(
    query: str, chunk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The numpy paths for rate/increase and sum/avg give the per-histogram path's histograms, bit for bit
    (in one block, and in blocks of a few series each)."""
    from kernel_insight.kql import histdense

    monkeypatch.setattr(histdense, "DENSE_CHUNK", chunk)
    store = _counter_series(np.random.default_rng(3), 12, 60)
    fast = Engine(store).range_query(query, 120_000, 885_000, 15_000).value
    monkeypatch.setattr(histdense, "DENSE_MIN_CELLS", 10**9)
    slow = Engine(store).range_query(query, 120_000, 885_000, 15_000).value
    assert isinstance(fast, Matrix)
    assert isinstance(slow, Matrix)
    assert [x.labels for x in fast.series] == [x.labels for x in slow.series]
    points = 0
    for a, b in zip(fast.series, slow.series, strict=True):
        assert list(a.hist_timestamps) == list(b.hist_timestamps)
        for ha, hb in zip(a.histograms, b.histograms, strict=True):
            assert str(ha) == str(hb)
            assert (ha.count, ha.sum, ha.zero_count, ha.counter_reset_hint) == (
                hb.count,
                hb.sum,
                hb.zero_count,
                hb.counter_reset_hint,
            )
            assert (ha.positive_spans, ha.positive_buckets) == (hb.positive_spans, hb.positive_buckets)
            points += 1
    assert points >= 50  # every step of at least one series


@pytest.mark.parametrize(
    "query",
    [
        "histogram_quantile(0.9, rate(c[1m]))",
        "histogram_quantile(0.99, sum by (i) (rate(c[1m])))",
        "histogram_quantile(0.2, avg by (i) (increase(c[2m])))",
        "histogram_quantile(0.5, sum(rate(c[1m])))",
        "histogram_count(sum by (i) (rate(c[1m])))",
        "histogram_quantile(0.9, sum by (i) (rate(c[1m])) * 2)",
        "histogram_quantile(0.9, sum by (g) (rate(c[1m])))",
        "histogram_quantile(0.75, avg by (g) (increase(c[2m])))",
        "histogram_sum(sum by (g) (rate(c[1m])))",
    ],
)
@pytest.mark.parametrize("chunk", [4_096, 100])
@pytest.mark.parametrize("resets", [True, False])
def test_dense_cells_handed_to_sum_and_quantile_equal_the_object_path(
    query: str, chunk: int, resets: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """rate's dense cells go through sum/avg by series and histogram_quantile without becoming
    objects (DenseHists); the quantiles, the sample counts and the stats are the per-histogram
    path's, bit for bit."""
    from kernel_insight.kql import histdense

    monkeypatch.setattr(histdense, "DENSE_CHUNK", chunk)
    store = _counter_series(np.random.default_rng(5), 12, 60, 0.03 if resets else 0.0)
    made = [0]
    fill = histdense.DenseHists.fill

    def counting_fill(self: histdense.DenseHists, out: np.ndarray) -> None:
        made[0] += 1
        fill(self, out)

    monkeypatch.setattr(histdense.DenseHists, "fill", counting_fill)
    fast = Engine(store).range_query(query, 120_000, 885_000, 15_000)
    if (
        query.startswith("histogram_quantile")
        and "* 2" not in query
        and not (resets and "by (i)" not in query)
    ):
        # No FloatHistogram was made of rate's results: one series per group, or every window
        # decided dense (no reset inside) for sums of several.
        assert made[0] == 0
    monkeypatch.setattr(histdense, "DENSE_MIN_CELLS", 10**9)
    slow = Engine(store).range_query(query, 120_000, 885_000, 15_000)
    assert isinstance(fast.value, Matrix)
    assert isinstance(slow.value, Matrix)
    assert [x.labels for x in fast.value.series] == [x.labels for x in slow.value.series]
    points = 0
    for a, b in zip(fast.value.series, slow.value.series, strict=True):
        assert list(a.timestamps) == list(b.timestamps)
        assert a.values.tobytes() == b.values.tobytes()
        points += len(a.values)
    assert points >= 50
    assert (fast.stats.samples, fast.stats.peak_samples) == (slow.stats.samples, slow.stats.peak_samples)
    assert [str(x) for x in fast.annotations] == [str(x) for x in slow.annotations]


def test_a_recording_rule_records_histogram_samples_as_histograms() -> None:
    # Prometheus 3 records them; tests/rules/test_rules_histograms.py writes them to the store.
    from kernel_insight.kql import parse
    from kernel_insight.rules.config import RuleSpec
    from kernel_insight.rules.evaluation import RecordingRule

    expr = 'sum(rate(lat{job="a"}[1m]))'
    rule = RecordingRule(RuleSpec(kind="record", name="job:lat:rate1m", expr=expr, query=parse(expr)))
    ((labels, t, value),) = rule.eval(Engine(_counter_store()), 300_000, 0)
    (want,) = Engine(_counter_store()).instant_query(expr, 300_000).value.samples  # type: ignore[union-attr]
    assert (labels, t) == ((("__name__", "job:lat:rate1m"),), 300_000)
    assert isinstance(value, FloatHistogram)
    assert value.equals(want.histogram)
    assert rule.discarded == ""
    floats = "sum(rate(plain[1m]))"
    ok = RecordingRule(RuleSpec(kind="record", name="plain:rate1m", expr=floats, query=parse(floats)))
    assert len(ok.eval(Engine(_counter_store()), 300_000, 0)) == 1


@pytest.mark.parametrize("dense", [False, True])
def test_histogram_sums_are_kahan_compensated_as_prometheus(
    dense: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """sum and sum_over_time add histograms with Prometheus' KahanAdd: 1e100 + 1 - 1e100 is 1, not 0."""
    from kernel_insight.kql import histdense

    if dense:
        monkeypatch.setattr(histdense, "DENSE_MIN_CELLS", 1)
    s = MemoryStorage()
    for k, v in enumerate((1e100, 1.0, -1e100)):
        s.add_histograms({"__name__": "h", "k": str(k)}, [0], [_h(v, (v,), hint=3)])
        s.add_histograms({"__name__": "g"}, [k * 1000], [_h(v, (v,), hint=3)])
    total = _one(Engine(s).instant_query("sum(h)", 0).value)
    assert total.histogram is not None
    assert total.histogram.count == 1.0
    assert list(total.histogram.positive_buckets) == [1.0]
    over_time = _one(Engine(s).instant_query("sum_over_time(g[10s])", 2000).value)
    assert over_time.histogram is not None
    assert over_time.histogram.count == 1.0
