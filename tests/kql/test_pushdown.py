"""The columnar read path (ClickHouseStorage.select_columns) answers exactly as the reference MemoryStorage."""

from __future__ import annotations

import math
import random
import re
import time

import numpy as np
import pytest

from kernel_insight.collector.clickhouse.query import RANGE_GRID_AGGREGATES
from kernel_insight.collector.clickhouse.store import EmbeddedStore, ServerStore
from kernel_insight.collector.rows import SampleBuilder
from kernel_insight.collector.sample_cache import SampleCache
from kernel_insight.kql.engine import Engine
from kernel_insight.kql.functions import FUNCTIONS
from kernel_insight.kql.pushdown import (
    SeriesColumns,
    columns_of,
    gather_ranges,
)
from kernel_insight.kql.storage import STALE_NAN, Capability, Matcher, MemoryStorage, SeriesData, is_stale
from kernel_insight.kql.values import Matrix

BASE = (int(time.time()) // 3600) * 3_600_000 - 2 * 3_600_000
STEP = 15_000
POINTS = 240  # one hour


def _data(seed: int) -> list[tuple[dict[str, str], list[int], list[float]]]:
    """Gauges and counters with gaps, jitter, stale markers and counter resets."""
    rng = random.Random(seed)
    out = []
    for inst in ("n0", "n1", "n2"):
        for gpu in range(4):
            base = {"instance": inst, "gpu": str(gpu), "model": rng.choice(["a", "b"])}
            ts = [
                BASE + i * STEP + rng.randint(-2000, 2000)
                for i in range(POINTS)
                if rng.random() > 0.05  # scrape gaps
            ]
            gauge = [
                rng.gauss(60, 10) if r > 0.04 else STALE_NAN if r > 0.01 else math.nan
                for r in (rng.random() for _ in ts)
            ]
            counter, total = [], 0.0
            for _ in ts:
                total = 0.0 if rng.random() < 0.01 else total + rng.randint(0, 500)  # resets
                counter.append(total if rng.random() > 0.02 else STALE_NAN)
            out.append(({**base, "__name__": "gpu_temp"}, ts, gauge))
            out.append(({**base, "__name__": "launches_total", "kernel": "gemm"}, ts, counter))
    return out


@pytest.fixture(scope="module", params=["embedded", "embedded-cached", "clickhouse-connect-chdb"])
def stores(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    # clickhouse-connect's own chDB backend runs the ServerStore code path (its Arrow conversion) in process.
    # "embedded" has its sample cache off, so the ClickHouse push-down answers; with the cache on
    # (the default) every read of these settled hours comes from decoded blocks in memory.
    if request.param == "embedded":
        store = EmbeddedStore(path, cache_bytes=0)
    elif request.param == "embedded-cached":
        store = EmbeddedStore(path)
        # Every hour of the data settled, whatever the minute the suite runs at.
        store.sample_cache = SampleCache(64 << 20, clock=lambda: (BASE + 10 * 3_600_000) / 1000)
    else:
        store = ServerStore.connect(f"chdb://{path}")
    mem = MemoryStorage()
    b = SampleBuilder()
    for labels, ts, vs in _data(11):
        mem.add(labels, ts, vs)
        b.add_series(labels, ts, vs)
    batch = b.build()
    store.insert_samples(batch)
    store.insert_samples(batch)  # a re-import: every sample stored twice, read once
    yield store.storage(), mem
    store.close()


def _same_series(a: list[SeriesData], b: list[SeriesData]) -> None:
    assert [s.labels for s in a] == [s.labels for s in b]
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x.timestamps, y.timestamps)
        # Bit for bit: stale markers must survive as stale markers, not as any NaN.
        np.testing.assert_array_equal(x.values.view(np.uint64), y.values.view(np.uint64))


def _same_matrix(a: Matrix, b: Matrix) -> None:
    assert [s.labels for s in a.series] == [s.labels for s in b.series]
    for x, y in zip(a.series, b.series, strict=True):
        np.testing.assert_array_equal(x.timestamps, y.timestamps)
        np.testing.assert_array_equal(x.values, y.values)


def _close_matrix(a: Matrix, b: Matrix) -> None:
    """Equal up to summation order (ClickHouse and numpy add in different orders)."""
    assert [s.labels for s in a.series] == [s.labels for s in b.series]
    for x, y in zip(a.series, b.series, strict=True):
        np.testing.assert_array_equal(x.timestamps, y.timestamps)
        np.testing.assert_allclose(x.values, y.values, rtol=1e-12, atol=1e-12)


def test_gather_ranges_concatenates_ranges_in_the_given_order():
    idx = gather_ranges(np.array([5, 0, 9]), np.array([2, 3, 0]))
    assert idx.tolist() == [5, 6, 0, 1, 2]
    assert gather_ranges(np.array([], dtype=np.int64), np.array([], dtype=np.int64)).tolist() == []


def test_without_stale_keeps_a_series_whose_samples_were_all_stale():
    cols = columns_of(
        [
            SeriesData((("__name__", "a"),), np.array([1, 2]), np.array([STALE_NAN, STALE_NAN])),
            SeriesData((("__name__", "b"),), np.array([1, 2]), np.array([1.0, STALE_NAN])),
        ]
    ).without_stale()
    assert cols.offsets.tolist() == [0, 0, 1]
    assert cols.ts.tolist() == [1]
    assert not is_stale(cols.vs).any()


def test_clickhouse_storage_is_columnar(stores):
    ch, mem = stores
    assert Capability.COLUMNS in ch.capabilities
    assert Capability.COLUMNS not in mem.capabilities


@pytest.mark.parametrize(
    "matchers",
    [
        [Matcher("__name__", "=", "gpu_temp")],
        [Matcher("__name__", "=~", "gpu_temp|launches_total"), Matcher("gpu", "!=", "1")],
        [Matcher("instance", "=~", "n[02]"), Matcher("kernel", "=", "")],
        [Matcher("__name__", "=", "missing")],
    ],
)
def test_select_columns_equals_memory_select_on_random_windows(stores, matchers):
    ch, mem = stores
    rng = random.Random(3)
    for _ in range(4):
        start = BASE + rng.randint(-600_000, POINTS * STEP)
        end = start + rng.randint(0, 1_800_000)
        cols = ch.select_columns(matchers, start, end)
        assert isinstance(cols, SeriesColumns)
        assert cols.offsets[0] == 0
        assert cols.offsets[-1] == len(cols.ts)
        assert (np.diff(cols.offsets) > 0).all()  # no empty series, as select returns them
        _same_series(cols.series(), mem.select(matchers, start, end))
        _same_series(ch.select(matchers, start, end), mem.select(matchers, start, end))


QUERIES = [
    "gpu_temp",
    'gpu_temp{instance=~"n[01]"} offset 2m',
    "rate(launches_total[5m])",
    "increase(launches_total[10m])",
    "irate(launches_total[1m])",
    "resets(launches_total[15m])",
    "avg_over_time(gpu_temp[5m])",
    "max_over_time(gpu_temp[3m])",
    "quantile_over_time(0.9, gpu_temp[10m])",
    "last_over_time(gpu_temp[2m])",
    "count_over_time(launches_total[5m])",
    "sum by (instance) (rate(launches_total[5m]))",
    "topk(2, gpu_temp)",
    "gpu_temp > 65 and on (instance, gpu) rate(launches_total[5m]) > 10",
    "max_over_time(rate(launches_total[5m])[20m:1m])",
]


@pytest.mark.parametrize("query", QUERIES)
def test_engine_over_clickhouse_equals_the_reference_evaluator(stores, query):
    ch, mem = stores
    start, end = BASE + 300_000 + 500, BASE + POINTS * STEP + 120_000
    got = Engine(ch).range_query(query, start, end, 30_000).value
    want = Engine(mem).range_query(query, start, end, 30_000).value
    assert isinstance(got, Matrix)
    assert isinstance(want, Matrix)
    assert len(want) > 0
    _close_matrix(got, want)


def test_engine_reads_a_columnar_store_without_per_series_select(stores, monkeypatch):
    ch, mem = stores

    def refuse(*args, **kwargs):
        raise AssertionError("the engine should use select_columns")

    monkeypatch.setattr(ch, "select", refuse)
    query = "quantile_over_time(0.9, launches_total[5m])"  # not pushed down: raw samples
    got = Engine(ch).range_query(query, BASE + 600_000, BASE + 1_800_000, 60_000)
    want = Engine(mem).range_query(query, BASE + 600_000, BASE + 1_800_000, 60_000)
    _same_matrix(got.value, want.value)


GRID_QUERIES = [
    "gpu_temp",
    "launches_total",
    'gpu_temp{instance="n1"} offset 1m',
    "timestamp(gpu_temp)",
    "gpu_temp @ end()",
    "avg by (model) (gpu_temp)",
    "topk(3, gpu_temp)",
    "gpu_temp > 60 or launches_total",
]


#: Selectors at one fixed time: nothing to compute on a grid, so the engine reads samples.
NOT_PUSHED = {"gpu_temp @ end()"}


@pytest.fixture
def pushed(stores, monkeypatch) -> dict[str, int]:
    """Answers the storage's push-down entry points gave (a None is a refusal: the engine reads
    samples instead), so a test of the pushed path fails when nothing was pushed down. With the
    sample cache on, settled hours are read from memory instead (its hits count those)."""
    ch, _ = stores
    answered = {"select_last_on_grid": 0, "select_range_on_grid": 0}
    answered["cache_lookups_before"] = _cache_lookups(ch)
    for name in ("select_last_on_grid", "select_range_on_grid"):
        real = getattr(ch, name)

        def spy(*args, _real=real, _name=name, **kwargs):
            result = _real(*args, **kwargs)
            answered[_name] += result is not None
            return result

        monkeypatch.setattr(ch, name, spy)
    return answered


def _cache_lookups(ch) -> int:
    if ch.sample_cache is None:
        return 0
    stats = ch.sample_cache.stats()
    return stats.hits + stats.misses


def _assert_pushed(ch, pushed: dict[str, int], entry: str, what: str) -> None:
    if ch.sample_cache is not None and pushed[entry] == 0:
        lookups = _cache_lookups(ch) - pushed["cache_lookups_before"]
        assert lookups > 0, f"{what}: neither pushed down nor read through the cache"
    else:
        assert pushed[entry] > 0, f"{what} was not pushed down"


@pytest.mark.parametrize("query", GRID_QUERIES)
@pytest.mark.parametrize("step_ms", [30_000, 60_000, 97_000])
def test_selectors_pushed_to_clickhouse_grid_equal_the_reference(stores, pushed, query, step_ms):
    ch, mem = stores
    rng = random.Random(step_ms)
    for _ in range(3):
        start = BASE + rng.randint(-300_000, POINTS * STEP)
        end = start + rng.randint(0, 3_600_000)
        got = Engine(ch).range_query(query, start, end, step_ms)
        want = Engine(mem).range_query(query, start, end, step_ms)
        _same_matrix(got.value, want.value)
        assert got.stats.samples == want.stats.samples
    if query not in NOT_PUSHED:
        _assert_pushed(ch, pushed, "select_last_on_grid", query)


def test_instant_selectors_on_clickhouse_grid_equal_the_reference(stores, pushed):
    ch, mem = stores
    rng = random.Random(5)
    seen = 0
    for _ in range(30):
        t = BASE + rng.randint(-120_000, POINTS * STEP + 400_000)
        got = Engine(ch).instant_query("gpu_temp", t).value
        want = Engine(mem).instant_query("gpu_temp", t).value
        assert [s.labels for s in got.samples] == [s.labels for s in want.samples]
        np.testing.assert_array_equal([s.value for s in got.samples], [s.value for s in want.samples])
        seen += len(want)
    assert seen > 0
    _assert_pushed(ch, pushed, "select_last_on_grid", "an instant selector")


def _refuse_the_slower_path(ch, monkeypatch, what: str) -> None:
    """Pushed down, a grid query must not read raw samples; with the sample cache on, it must
    read them (from memory) and never ask ClickHouse for a grid."""

    def refuse(*args, **kwargs):
        raise AssertionError(what)

    if ch.sample_cache is None:
        monkeypatch.setattr(ch, "select_columns", refuse)
    else:
        assert ch.sample_cache.wait_idle()  # the first read queued the fill of its hours
        monkeypatch.setattr(ch._store, "query", refuse)  # every hour is cached now


def test_selector_grid_is_computed_in_clickhouse(stores, monkeypatch):
    ch, mem = stores
    start, end = BASE + 600_500, BASE + 3_000_500
    Engine(ch).range_query("gpu_temp", start, end, 60_000)  # fills the cache, where there is one
    _refuse_the_slower_path(ch, monkeypatch, "a selector on a grid read raw samples (or, cached, ClickHouse)")
    got = Engine(ch).range_query("gpu_temp", start, end, 60_000).value
    _same_matrix(got, Engine(mem).range_query("gpu_temp", start, end, 60_000).value)
    assert len(got) == 12


def test_fine_steps_read_raw_samples_instead_of_a_grid(stores, monkeypatch):
    ch, _ = stores

    def refuse(*args, **kwargs):
        raise AssertionError("a 15 s step should not be pushed down")

    monkeypatch.setattr(ch, "select_last_on_grid", refuse)
    got = Engine(ch).range_query("gpu_temp", BASE + 600_500, BASE + 900_500, 15_000).value
    assert len(got) == 12


@pytest.mark.parametrize("stores", ["embedded-cached"], indirect=True)
@pytest.mark.parametrize(
    ("query", "step_ms"),
    [('absent(gpu_temp{instance="n9"})', 60_000), ("gpu_temp", 60_000), ("deriv(gpu_temp[5m])", 0)],
)
def test_a_grid_read_declined_for_the_cache_hands_its_plan_to_the_read(stores, monkeypatch, query, step_ms):
    """Hours the cache holds: the grid read declines the window, and the read of that same window
    that follows takes over the cache plan it made, asked once per query instead of twice."""
    ch, mem = stores
    start, end = BASE + 600_500, BASE + 3_000_500
    if step_ms == 0:
        start = end
    Engine(ch).range_query(query, start, end, step_ms or 60_000)  # queues the fill of its hours
    assert ch.sample_cache.wait_idle()
    plans = []
    real = ch._cache_plan

    def counted(*args):
        plan = real(*args)
        plans.append(plan)
        return plan

    monkeypatch.setattr(ch, "_cache_plan", counted)
    got = Engine(ch).range_query(query, start, end, step_ms or 60_000).value
    assert len(plans) == 1
    assert plans[0] is not None
    _same_matrix(got, Engine(mem).range_query(query, start, end, step_ms or 60_000).value)
    # Handed over once: the next query plans afresh.
    Engine(ch).range_query(query, start, end, step_ms or 60_000)
    assert len(plans) == 2


def test_the_push_down_table_is_the_stores_keyed_by_kql_function_names():
    """kql says which functions a store may compute on a grid (FunctionSpec.pushdown); the
    ClickHouse adapter says how, for exactly those."""
    assert set(RANGE_GRID_AGGREGATES) == {f for f, spec in FUNCTIONS.items() if spec.pushdown is not None}
    for func, agg in RANGE_GRID_AGGREGATES.items():
        assert re.fullmatch(r"timeSeries[A-Za-z]+ToGrid", agg.aggregate), func


@pytest.mark.parametrize("func", sorted(f for f, spec in FUNCTIONS.items() if spec.pushdown is not None))
@pytest.mark.parametrize("metric", ["gpu_temp", "launches_total"])
def test_range_functions_pushed_to_clickhouse_equal_the_reference(stores, pushed, func, metric):
    ch, mem = stores
    rng = random.Random(f"{func}{metric}")
    for rng_s, step_ms in ((60, 60_000), (300, 30_000), (45, 120_000)):
        start = BASE + rng.randint(-300_000, POINTS * STEP)
        end = start + rng.randint(0, 3_600_000)
        query = f"{func}({metric}[{rng_s}s])"
        got = Engine(ch).range_query(query, start, end, step_ms)
        want = Engine(mem).range_query(query, start, end, step_ms)
        _close_matrix(got.value, want.value)
        # Pushed down, only computed values are counted: never more than the engine reads itself.
        assert got.stats.samples <= want.stats.samples
    _assert_pushed(ch, pushed, "select_range_on_grid", func)


def test_range_function_grid_is_computed_in_clickhouse(stores, monkeypatch):
    ch, mem = stores
    query = "sum by (instance) (rate(launches_total[5m] offset 1m))"
    start, end = BASE + 600_500, BASE + 3_000_500
    Engine(ch).range_query(query, start, end, 60_000)  # fills the cache, where there is one
    _refuse_the_slower_path(ch, monkeypatch, "rate on a grid read raw samples (or, cached, ClickHouse)")
    got = Engine(ch).range_query(query, start, end, 60_000).value
    _close_matrix(got, Engine(mem).range_query(query, start, end, 60_000).value)
    assert len(got) == 3


def test_anchored_ranges_and_at_are_not_pushed_down(stores, monkeypatch):
    ch, mem = stores

    def refuse(*args, **kwargs):
        raise AssertionError("not a grid the store can compute")

    monkeypatch.setattr(ch, "select_range_on_grid", refuse)
    start, end = BASE + 600_500, BASE + 3_000_500
    for query in ("rate(launches_total[5m] @ end())", "quantile_over_time(0.5, gpu_temp[5m])"):
        got = Engine(ch).range_query(query, start, end, 60_000).value
        _close_matrix(got, Engine(mem).range_query(query, start, end, 60_000).value)


def test_grid_reads_ask_for_sample_times_only_under_timestamp(stores, monkeypatch):
    ch, mem = stores
    asked = []
    real = ch.select_last_on_grid

    def spy(*args, **kwargs):
        asked.append(args[-1] if len(args) == 6 else kwargs.get("sample_times", True))
        return real(*args, **kwargs)

    monkeypatch.setattr(ch, "select_last_on_grid", spy)
    start, end = BASE + 600_500, BASE + 3_000_500
    for query in ("gpu_temp", "timestamp(gpu_temp)", "timestamp((gpu_temp))"):
        got = Engine(ch).range_query(query, start, end, 60_000).value
        _same_matrix(got, Engine(mem).range_query(query, start, end, 60_000).value)
    assert asked == [False, True, True]


@pytest.mark.parametrize("list_max", [0, 10_000])
def test_many_series_filter_samples_by_the_series_query_itself(stores, monkeypatch, list_max):
    from kernel_insight.collector.clickhouse import query

    ch, mem = stores
    monkeypatch.setattr(query, "FINGERPRINT_LIST_MAX", list_max)
    start, end = BASE + 600_500, BASE + 3_000_500
    for q in ("gpu_temp", "rate(launches_total[5m])", "quantile_over_time(0.5, gpu_temp[5m])"):
        got = Engine(ch).range_query(q, start, end, 60_000).value
        want = Engine(mem).range_query(q, start, end, 60_000).value
        assert len(want) > 0
        _close_matrix(got, want)


def test_label_sort_keys_order_like_the_label_tuples():
    from kernel_insight.collector.clickhouse.query import _sort_key

    rng = random.Random(9)
    alphabet = ["", "a", "ab", "a_b", "b", "é", "Z", "a b", "\t"]
    sets = []
    for _ in range(2000):
        n = rng.randint(1, 4)
        sets.append(tuple(sorted({(rng.choice(alphabet[1:]), rng.choice(alphabet)) for _ in range(n)})))
    keys = [_sort_key(s) for s in sets]
    assert None not in keys
    assert sorted(sets) == [s for _, s in sorted(zip(keys, sets, strict=True))]
    assert _sort_key((("__name__", "x\x00y"),)) is None


def test_series_whose_labels_have_no_sort_key_are_sorted_by_their_tuples():
    from kernel_insight.collector.clickhouse.query import _sort_key, _sorted_rows

    labels = [(("__name__", "b"),), (("__name__", "a\x01"),), (("__name__", "a"),)]
    known = {fp: (lab, _sort_key(lab)) for fp, lab in enumerate(labels)}
    assert known[1][1] is None
    got, rows = _sorted_rows([0, 1, 2, 99], known)
    assert got == sorted(labels)
    assert rows.tolist() == [2, 1, 0]


def test_select_columns_come_back_sorted_by_labels(stores):
    ch, _ = stores
    cols = ch.select_columns([Matcher("__name__", "=~", ".+")], BASE, BASE + POINTS * STEP)
    assert cols.labels == sorted(cols.labels)
    assert len(cols) == 24
