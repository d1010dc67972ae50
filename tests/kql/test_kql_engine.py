"""Engine: results, staleness, extensions, limits, cancellation, typed errors, annotations, JSON."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Sequence

import numpy as np
import pytest

from kernel_insight.kql import (
    STALE_NAN,
    CancelToken,
    Engine,
    EngineLimits,
    KqlEvaluationError,
    KqlTypeError,
    Matcher,
    Matrix,
    MemoryStorage,
    QueryCancelledError,
    QueryTimeoutError,
    Scalar,
    SelectHints,
    SeriesData,
    StorageError,
    String,
    TooManySamplesError,
    TooManySeriesError,
    Vector,
    parse,
    to_prometheus_json,
)
from kernel_insight.kql.storage import NO_HINTS

MIN = 60_000


@pytest.fixture
def store() -> MemoryStorage:
    s = MemoryStorage()
    for gpu, step in (("0", 10.0), ("1", 20.0)):
        s.add(
            {"__name__": "kernel_launches_total", "gpu": gpu, "model": "llama-70b"},
            [i * MIN for i in range(11)],
            [i * step for i in range(11)],
        )
    s.add(
        {"__name__": "kernel_execution_time_seconds", "model": "llama-70b", "kernel": "gemm"},
        [i * 15_000 for i in range(241)],
        [0.25] * 241,
    )
    s.add({"__name__": "gpu_memory_used_bytes", "gpu": "0"}, [0], [45 * 2**30])
    s.add({"__name__": "gpu_memory_used_bytes", "gpu": "1"}, [0], [30 * 2**30])
    return s


def values(result_value: Vector) -> dict[tuple[tuple[str, str], ...], float]:
    return {s.labels: s.value for s in result_value.samples}


def test_instant_query_returns_a_vector_with_labels(store: MemoryStorage) -> None:
    result = Engine(store).instant_query('kernel_launches_total{gpu="1"}', 10 * MIN)
    assert isinstance(result.value, Vector)
    assert values(result.value) == {
        (("__name__", "kernel_launches_total"), ("gpu", "1"), ("model", "llama-70b")): 200.0
    }


def test_functions_drop_the_metric_name(store: MemoryStorage) -> None:
    result = Engine(store).instant_query("rate(kernel_launches_total[5m])", 10 * MIN)
    assert values(result.value) == {
        (("gpu", "0"), ("model", "llama-70b")): pytest.approx(10 / 60),
        (("gpu", "1"), ("model", "llama-70b")): pytest.approx(20 / 60),
    }


def test_range_query_returns_series_sorted_by_labels_with_a_point_per_step(store: MemoryStorage) -> None:
    result = Engine(store).range_query("kernel_launches_total", 0, 2 * MIN, MIN)
    assert isinstance(result.value, Matrix)
    assert [dict(s.labels)["gpu"] for s in result.value.series] == ["0", "1"]
    assert list(result.value.series[1].timestamps) == [0, MIN, 2 * MIN]
    assert list(result.value.series[1].values) == [0.0, 20.0, 40.0]


def test_scalar_and_string_results() -> None:
    engine = Engine(MemoryStorage())
    assert engine.instant_query("2 ^ 10", 0).value == Scalar(0, 1024.0)
    assert engine.instant_query('"gpu"', 5).value == String(5, "gpu")
    matrix = engine.range_query("time()", 0, 2000, 1000).value
    assert isinstance(matrix, Matrix)
    assert list(matrix.series[0].values) == [0.0, 1.0, 2.0]


def test_the_alert_from_the_issue_evaluates(store: MemoryStorage) -> None:
    query = (
        'count_over_time(kernel_execution_time_seconds{model="llama-70b"}[1h]) > 100 '
        'and avg_over_time(kernel_execution_time_seconds{model="llama-70b"}[1h]) > 200ms'
    )
    result = Engine(store).instant_query(query, 60 * MIN)
    assert values(result.value) == {(("kernel", "gemm"), ("model", "llama-70b")): 240.0}


def test_duration_literal_is_a_number_of_seconds(store: MemoryStorage) -> None:
    engine = Engine(store)
    assert engine.instant_query("200ms", 0).value == Scalar(0, 0.2)
    assert engine.instant_query("1h30m", 0).value == Scalar(0, 5400.0)
    assert len(engine.instant_query("kernel_execution_time_seconds > 300ms", 60 * MIN).value) == 0


def test_byte_literal_is_a_number_of_bytes(store: MemoryStorage) -> None:
    engine = Engine(store)
    assert engine.instant_query("40GiB", 0).value == Scalar(0, 40 * 2**30)
    assert engine.instant_query("1.5KB", 0).value == Scalar(0, 1500.0)
    high = engine.instant_query("gpu_memory_used_bytes > 40GiB", 0).value
    assert [dict(s.labels)["gpu"] for s in high.samples] == ["0"]


def test_stale_marker_ends_a_series_at_once() -> None:
    s = MemoryStorage()
    s.add({"__name__": "util"}, [0, 10_000, 20_000], [1.0, 2.0, STALE_NAN])
    engine = Engine(s)
    assert len(engine.instant_query("util", 15_000).value) == 1
    assert len(engine.instant_query("util", 20_000).value) == 0
    assert engine.instant_query("count_over_time(util[1m])", 30_000).value.samples[0].value == 2


def test_lookback_is_five_minutes_and_left_open() -> None:
    s = MemoryStorage()
    s.add({"__name__": "util"}, [0], [1.0])
    engine = Engine(s)
    assert len(engine.instant_query("util", 299_999).value) == 1
    assert len(engine.instant_query("util", 300_000).value) == 0
    assert len(Engine(s, EngineLimits(lookback_ms=60_000)).instant_query("util", 60_000).value) == 0


def test_offset_and_at_modifiers(store: MemoryStorage) -> None:
    engine = Engine(store)
    q = 'kernel_launches_total{gpu="0"}'
    assert engine.instant_query(f"{q} offset 5m", 10 * MIN).value.samples[0].value == 50
    assert engine.instant_query(f"{q} @ 120", 10 * MIN).value.samples[0].value == 20
    series = engine.range_query(f"{q} @ end()", 0, 2 * MIN, MIN).value.series[0]
    assert list(series.values) == [20.0, 20.0, 20.0]


def test_subquery_evaluates_the_inner_query_on_its_own_grid(store: MemoryStorage) -> None:
    result = Engine(store).instant_query(
        'max_over_time(rate(kernel_launches_total{gpu="1"}[2m])[5m:1m])', 10 * MIN
    )
    assert result.value.samples[0].value == pytest.approx(20 / 60)


def test_accepts_a_parsed_expression(store: MemoryStorage) -> None:
    result = Engine(store).instant_query(parse("sum(kernel_launches_total)"), 10 * MIN)
    assert values(result.value) == {(): 300.0}


def test_range_query_of_a_range_vector_is_a_type_error(store: MemoryStorage) -> None:
    with pytest.raises(KqlTypeError, match='invalid expression type "range vector" for range query'):
        Engine(store).range_query("kernel_launches_total[5m]", 0, MIN, MIN)


def test_instant_query_of_a_range_vector_returns_its_samples(store: MemoryStorage) -> None:
    matrix = Engine(store).instant_query('kernel_launches_total{gpu="0"}[2m]', 10 * MIN).value
    assert isinstance(matrix, Matrix)
    assert list(matrix.series[0].timestamps) == [9 * MIN, 10 * MIN]


def test_duplicate_output_label_sets_are_an_evaluation_error(store: MemoryStorage) -> None:
    with pytest.raises(KqlEvaluationError, match="vector cannot contain metrics with the same labelset"):
        Engine(store).instant_query('label_replace(kernel_launches_total, "gpu", "x", "", "")', 10 * MIN)


@pytest.mark.parametrize(
    "op", ["+", "-", "*", "/", "%", "^", "atan2", "==", "!=", ">", "<", ">=", "<=", "and", "or", "unless"]
)
@pytest.mark.parametrize(
    "sides",
    [("nothing", "kernel_launches_total"), ("kernel_launches_total", "nothing"), ("nothing", "nothing")],
)
def test_binary_operators_accept_empty_operands(
    store: MemoryStorage, op: str, sides: tuple[str, str]
) -> None:
    lhs, rhs = sides
    engine = Engine(store)
    for query in (f"{lhs} {op} {rhs}", f"{lhs} {op} on(gpu) {rhs}"):
        result = engine.range_query(query, 0, 2 * MIN, MIN)
        assert isinstance(result.value, Matrix)
        keeps_lhs = op == "unless" and lhs != "nothing"
        expected = 2 if (op == "or" and "kernel_launches_total" in sides) or keeps_lhs else 0
        assert len(result.value) == expected


# ----------------------------------------------------------------------------------- limits


def test_too_many_samples_is_refused(store: MemoryStorage) -> None:
    engine = Engine(store, EngineLimits(max_samples=100))
    with pytest.raises(TooManySamplesError, match="too many samples"):
        engine.instant_query("count_over_time(kernel_execution_time_seconds[1h])", 60 * MIN)
    assert len(engine.instant_query("kernel_execution_time_seconds", 60 * MIN).value) == 1


def test_too_many_series_is_refused(store: MemoryStorage) -> None:
    engine = Engine(store, EngineLimits(max_series=1))
    with pytest.raises(TooManySeriesError, match="more than the limit of 1"):
        engine.instant_query("kernel_launches_total", 10 * MIN)


def test_limits_can_be_set_per_query(store: MemoryStorage) -> None:
    with pytest.raises(TooManySeriesError):
        Engine(store).instant_query("kernel_launches_total", 10 * MIN, limits=EngineLimits(max_series=1))


class SlowStorage(MemoryStorage):
    """Sleeps in every select, long enough for timeouts and cancellation to land."""

    def __init__(self, delay: float) -> None:
        super().__init__()
        self.delay = delay
        self.add({"__name__": "up"}, [0], [1.0])

    def select(
        self, matchers: Sequence[Matcher], start_ms: int, end_ms: int, hints: SelectHints = NO_HINTS
    ) -> list[SeriesData]:
        time.sleep(self.delay)
        return super().select(matchers, start_ms, end_ms, hints)


def test_query_times_out() -> None:
    engine = Engine(SlowStorage(0.05), EngineLimits(timeout_s=0.02))
    with pytest.raises(QueryTimeoutError, match="timed out"):
        engine.instant_query("up + up + up", 0)


def test_query_can_be_cancelled_from_another_thread() -> None:
    token = CancelToken()
    started, release = threading.Event(), threading.Event()

    class BlockingStorage(MemoryStorage):
        def select(
            self, matchers: Sequence[Matcher], start_ms: int, end_ms: int, hints: SelectHints = NO_HINTS
        ) -> list[SeriesData]:
            started.set()
            release.wait(5)
            return super().select(matchers, start_ms, end_ms, hints)

    def cancel_once_running() -> None:
        started.wait(5)
        token.cancel()
        release.set()

    canceller = threading.Thread(target=cancel_once_running)
    canceller.start()
    with pytest.raises(QueryCancelledError, match="canceled"):
        Engine(BlockingStorage()).instant_query("up + up", 0, cancel=token)
    canceller.join()


def test_storage_failures_are_typed() -> None:
    class Broken(MemoryStorage):
        def select(
            self, matchers: Sequence[Matcher], start_ms: int, end_ms: int, hints: SelectHints = NO_HINTS
        ) -> list[SeriesData]:
            raise ConnectionError("clickhouse is down")

    with pytest.raises(StorageError, match="clickhouse is down") as info:
        Engine(Broken()).instant_query("up", 0)
    assert isinstance(info.value.__cause__, ConnectionError)


# ----------------------------------------------------------------------------------- annotations


def test_annotations_come_back_with_positions() -> None:
    s = MemoryStorage()
    s.add({"__name__": "up", "job": "a"}, [0], [1.0])
    result = Engine(s).range_query("sum(sort(up))", 0, MIN, MIN)
    assert result.warnings == [
        "PromQL warning: sort is ineffective for range queries since results are always ordered by labels (1:5)"
    ]
    assert result.annotations[0].level == "warning"
    q = Engine(s).instant_query("quantile(2, up)", 0)
    assert q.warnings == ["PromQL warning: quantile value should be between 0 and 1, got 2 (1:10)"]


def test_histogram_quantile_over_classic_buckets() -> None:
    s = MemoryStorage()
    for le, count in (("0.1", 10.0), ("0.5", 30.0), ("1", 40.0), ("+Inf", 40.0)):
        s.add({"__name__": "kernel_duration_seconds_bucket", "le": le, "kernel": "gemm"}, [0], [count])
    result = Engine(s).instant_query("histogram_quantile(0.5, kernel_duration_seconds_bucket)", 0)
    assert values(result.value) == {(("kernel", "gemm"),): pytest.approx(0.3)}


# ----------------------------------------------------------------------------------- JSON


def test_vector_as_prometheus_json(store: MemoryStorage) -> None:
    result = Engine(store).instant_query('sum by (gpu) (kernel_launches_total{gpu="0"}) / 4', 90_500)
    assert result.to_prometheus_json() == {
        "resultType": "vector",
        "result": [{"metric": {"gpu": "0"}, "value": [90.5, "2.5"]}],
    }


def test_matrix_scalar_and_string_as_prometheus_json(store: MemoryStorage) -> None:
    engine = Engine(store)
    matrix = engine.range_query('kernel_launches_total{gpu="1"}', 0, MIN, MIN).value
    assert to_prometheus_json(matrix) == {
        "resultType": "matrix",
        "result": [
            {
                "metric": {"__name__": "kernel_launches_total", "gpu": "1", "model": "llama-70b"},
                "values": [[0, "0"], [60, "20"]],
            }
        ],
    }
    assert to_prometheus_json(Scalar(1000, math.inf)) == {"resultType": "scalar", "result": [1, "+Inf"]}
    assert to_prometheus_json(Scalar(1000, math.nan))["result"] == [1, "NaN"]
    # jsonutil.MarshalFloat: Go's 'e' format from 1e21 on.
    assert to_prometheus_json(Scalar(1000, 1e100))["result"][1] == "1e+100"
    assert to_prometheus_json(Scalar(1000, 1e20))["result"][1] == "1" + "0" * 20
    assert to_prometheus_json(String(1500, "gpu")) == {"resultType": "string", "result": [1.5, "gpu"]}


def test_stats_count_samples_and_series(store: MemoryStorage) -> None:
    result = Engine(store).instant_query("kernel_launches_total[5m]", 10 * MIN)
    assert result.stats.samples == 10
    assert result.stats.series == 2
    assert np.isfinite(result.stats.seconds)


def test_large_groups_keep_compensated_sums() -> None:
    s = MemoryStorage()
    values = [2.0, 8.0, 1e100, -1e100] * 300 + [52.0] * 300
    for i, v in enumerate(values):
        s.add({"__name__": "x", "i": f"{i:04d}", "part": "cancel" if i < 1200 else "flat"}, [0], [v])
    engine = Engine(s)
    sums = values_by_part(engine.instant_query("sum by (part) (x)", 0).value)
    assert sums == {"cancel": 3000.0, "flat": 52.0 * 300}
    means = values_by_part(engine.instant_query("avg by (part) (x)", 0).value)
    assert means == {"cancel": 2.5, "flat": 52.0}
    s.add({"__name__": "x", "i": "inf", "part": "flat"}, [0], [math.inf])
    assert values_by_part(engine.instant_query("avg by (part) (x)", 0).value)["flat"] == math.inf


def values_by_part(vec: Vector) -> dict[str, float]:
    return {dict(s.labels)["part"]: s.value for s in vec.samples}


LONG_WINDOW_QUERIES = [
    "sum_over_time(x[10m])",
    "avg_over_time(x[10m])",
    "avg_over_time(huge[10m])",
    "stddev_over_time(x[10m])",
    "stdvar_over_time(x[10m])",
    "deriv(x[10m])",
    "predict_linear(x[10m], 60)",
    "ts_of_max_over_time(x[10m])",
    "ts_of_min_over_time(steps[10m])",
    "double_exponential_smoothing(x[10m], 0.3, 0.6)",
]


@pytest.mark.parametrize("query", LONG_WINDOW_QUERIES)
def test_long_windows_agree_with_lock_step(query: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from kernel_insight.kql.functions import range as range_functions

    s = MemoryStorage()
    rng = np.random.default_rng(7)
    stamps = np.arange(600) * 1000
    s.add({"__name__": "x", "gpu": "0"}, stamps, rng.normal(100, 15, 600))
    s.add({"__name__": "x", "gpu": "1"}, stamps[::7], rng.normal(5, 1, len(stamps[::7])))
    s.add({"__name__": "huge"}, stamps, np.full(600, 9e307))
    s.add({"__name__": "steps"}, stamps, np.repeat([3.0, 1.0, 2.0, 1.0], 150))
    engine = Engine(s)
    monkeypatch.setattr(range_functions, "LOCKSTEP_LIMIT", 10_000)  # every window in lock step
    with_lock_step = engine.range_query(query, 300_000, 600_000, 30_000).value
    monkeypatch.setattr(range_functions, "LOCKSTEP_LIMIT", 8)  # nearly every window on its own
    per_window = engine.range_query(query, 300_000, 600_000, 30_000).value
    assert isinstance(with_lock_step, Matrix)
    assert isinstance(per_window, Matrix)
    assert [x.labels for x in per_window.series] == [x.labels for x in with_lock_step.series]
    for a, b in zip(with_lock_step.series, per_window.series, strict=True):
        np.testing.assert_allclose(a.values, b.values, rtol=1e-9)


def test_topk_and_bottomk_put_nan_after_infinities() -> None:
    s = MemoryStorage()
    for i, v in enumerate([1.0, -math.inf, math.nan, 5.0, math.inf]):
        s.add({"__name__": "x", "i": str(i)}, [0], [v])
    engine = Engine(s)
    top = [x.value for x in engine.instant_query("topk(5, x)", 0).value.samples]
    bottom = [x.value for x in engine.instant_query("bottomk(5, x)", 0).value.samples]
    assert top[:4] == [math.inf, 5.0, 1.0, -math.inf]
    assert bottom[:4] == [-math.inf, 1.0, 5.0, math.inf]
    assert math.isnan(top[4])
    assert math.isnan(bottom[4])
    assert [dict(x.labels)["i"] for x in engine.instant_query("limitk(2, x)", 0).value.samples] == ["0", "1"]
