"""kql reads native histograms through the ClickHouse back end: selects, mixed series, label APIs, pushdowns."""

from __future__ import annotations

import time

import numpy as np
import pytest

from kernel_insight.collector.clickhouse.query import ClickHouseStorage
from kernel_insight.collector.clickhouse.store import EmbeddedStore, ServerStore
from kernel_insight.collector.rows import HistogramBuilder, SampleBuilder
from kernel_insight.kql.histogram import FloatHistogram
from kernel_insight.kql.storage import STALE_NAN, Matcher, MemoryStorage, SelectHints, is_stale_value

NOW = (int(time.time() * 1000) // 3_600_000) * 3_600_000 - 2 * 3_600_000  # two settled hours back
NAME = Matcher("__name__", "=", "kernel_duration_seconds")


def _hist(i: int, *, hint: int = 0) -> FloatHistogram:
    return FloatHistogram(
        schema=3,
        zero_threshold=1e-128,
        zero_count=1.0,
        count=1.0 + 3 * i + 0.5 * (i % 2),
        sum=0.25 * i,
        positive_spans=((-2, 1), (3, 1)),
        positive_buckets=(float(i), float(2 * i) + 0.5 * (i % 2)),
        counter_reset_hint=hint,
    )


def _fill(store, memory: MemoryStorage) -> None:
    h = HistogramBuilder()
    s = SampleBuilder()
    for gpu in ("0", "1"):
        labels = {"__name__": "kernel_duration_seconds", "gpu": gpu, "kernel": "gemm"}
        for i in range(1, 11):
            fh = _hist(i + int(gpu), hint=2 if i > 1 else 0)
            h.add_histogram(labels, NOW + i * 15_000, fh)
            memory.add_histograms(labels, [NOW + i * 15_000], [fh])
    # A series whose type changed: floats first, then histograms, one timestamp both (the histogram wins).
    mixed = {"__name__": "kernel_duration_seconds", "gpu": "2", "kernel": "gemm"}
    s.add_series(mixed, [NOW + 15_000, NOW + 30_000], [1.0, 2.0])
    memory.add(mixed, [NOW + 15_000, NOW + 30_000], [1.0, 2.0])
    for i in (2, 3):
        h.add_histogram(mixed, NOW + i * 15_000, _hist(i))
        memory.add_histograms(mixed, [NOW + i * 15_000], [_hist(i)])
    stale = FloatHistogram(sum=STALE_NAN)
    h.add_histogram(mixed, NOW + 4 * 15_000, stale)
    memory.add_histograms(mixed, [NOW + 4 * 15_000], [stale])
    # A float-only metric beside them.
    s.add_series({"__name__": "gpu_temp", "gpu": "0"}, [NOW + 15_000], [61.0])
    memory.add({"__name__": "gpu_temp", "gpu": "0"}, [NOW + 15_000], [61.0])
    store.insert_batch("b:1", samples=s.build(), histograms=h.build())


def _plain(series):
    out = []
    for d in series:
        out.append(
            (
                d.labels,
                d.timestamps.tolist(),
                [v if not is_stale_value(v) else "stale" for v in d.values.tolist()],
                d.hist_timestamps.tolist(),
                [("stale" if is_stale_value(h.sum) else str(h), h.counter_reset_hint) for h in d.histograms],
            )
        )
    return out


def _first_hint_unknown(plain):
    return [(*w[:4], [(w[4][0][0], None), *w[4][1:]] if w[4] else []) for w in plain]


@pytest.fixture
def stores(tmp_path):
    memory = MemoryStorage()
    store = EmbeddedStore(tmp_path / "data")
    _fill(store, memory)
    yield store, memory
    store.close()


@pytest.mark.parametrize(
    "matchers",
    [
        [NAME],
        [NAME, Matcher("gpu", "=~", "[12]")],
        [Matcher("kernel", "=", "gemm")],
        [Matcher("__name__", "=~", "kernel_.*|gpu_temp")],
    ],
)
@pytest.mark.parametrize(
    ("lo", "hi"), [(0, 10**13), (NOW + 30_000, NOW + 60_000), (NOW + 61_000, NOW + 62_000)]
)
def test_clickhouse_select_equals_memory_storage(stores, matchers, lo, hi):
    store, memory = stores
    want = _plain(memory.select(matchers, lo, hi))
    if lo > 0:  # a window's first histogram keeps its stored hint (MemoryStorage knows the one before)
        want = _first_hint_unknown(want)
    for use_cache in (True, False):
        got = _plain(store.storage(use_cache=use_cache).select(matchers, lo, hi))
        assert (_first_hint_unknown(got) if lo > 0 else got) == want


def test_histograms_come_back_with_every_field(stores):
    store, _ = stores
    (series,) = store.storage().select([NAME, Matcher("gpu", "=", "0")], NOW, NOW + 20_000)
    (h,) = series.histograms
    assert h == _hist(1)
    assert series.timestamps.size == 0
    assert store.histogram_metrics() == {"kernel_duration_seconds"}


def test_label_apis_see_histogram_only_series_in_a_partial_day(stores):
    store, _ = stores
    storage = store.storage()
    lo, hi = NOW + 100_000, NOW + 160_000  # only histogram samples of gpu 0 and 1 here
    assert storage.label_values("gpu", [NAME], lo, hi) == ["0", "1"]
    assert "kernel" in storage.label_names([NAME], lo, hi)


def test_grid_pushdowns_leave_histogram_metrics_to_the_engine(stores):
    store, _ = stores
    storage = store.storage(use_cache=False)
    assert (
        storage.select_last_on_grid([NAME], NOW + 60_000, NOW + 120_000, SelectHints(step_ms=15_000), 60_000)
        is None
    )
    assert (
        storage.select_range_on_grid(
            [NAME], NOW + 60_000, NOW + 120_000, SelectHints(step_ms=15_000, func="rate", range_ms=60_000)
        )
        is None
    )
    temp = [Matcher("__name__", "=", "gpu_temp")]
    assert (
        storage.select_last_on_grid(temp, NOW + 15_000, NOW + 30_000, SelectHints(step_ms=15_000), 60_000)
        is not None
    )


def test_a_store_that_cannot_know_its_histogram_metrics_looks_every_time(stores, tmp_path):
    store, memory = stores
    store.close()
    import clickhouse_connect

    client = clickhouse_connect.get_client(dsn=f"chdb://{tmp_path / 'data'}")
    server = ServerStore(client)
    try:
        assert server.histogram_metrics() is None
        got = _plain(ClickHouseStorage(server).select([NAME], 0, 10**13))
        assert got == _plain(memory.select([NAME], 0, 10**13))
        assert (
            ClickHouseStorage(server).select_last_on_grid(
                [NAME], NOW + 60_000, NOW + 120_000, SelectHints(step_ms=15_000), 60_000
            )
            is None
        )
    finally:
        server.close()


def test_float_only_reads_never_touch_the_histograms_table(stores):
    store, _ = stores
    store.histogram_metrics()  # the table's metrics are read once per store (and after raw statements)
    seen: list[str] = []
    query = store.query

    def spy(sql, params=None):
        seen.append(sql)
        return query(sql, params)

    store.query = spy  # type: ignore[method-assign]
    cols = store.storage(use_cache=False).select_columns([Matcher("__name__", "=", "gpu_temp")], 0, 10**13)
    assert cols.hist is None
    assert np.array_equal(cols.vs, [61.0])
    assert not any("histograms" in sql for sql in seen)


@pytest.mark.parametrize("backend", ["embedded", "clickhouse-connect-chdb", "clickhouse-connect-http"])
def test_every_back_end_writes_and_reads_histograms_alike(backend, tmp_path):
    """Arrow list and dictionary columns through clickhouse-connect's insert (chDB and HTTP) as through chDB's."""
    import contextlib

    from chdb_http import running_shim

    memory = MemoryStorage()
    with contextlib.ExitStack() as stack:
        if backend == "embedded":
            store = stack.enter_context(EmbeddedStore(tmp_path))
        elif backend == "clickhouse-connect-chdb":
            store = stack.enter_context(ServerStore.connect(f"chdb://{tmp_path}"))
        else:
            _, url = stack.enter_context(running_shim(tmp_path))
            store = stack.enter_context(ServerStore.connect(url))
        _fill(store, memory)
        for lo, hi in ((0, 10**13), (NOW + 30_000, NOW + 60_000)):
            got = _plain(store.storage(use_cache=False).select([NAME], lo, hi))
            want = _plain(memory.select([NAME], lo, hi))
            if lo > 0:
                got, want = _first_hint_unknown(got), _first_hint_unknown(want)
            assert got == want
        assert store.storage().label_values("gpu", [NAME], NOW + 100_000, NOW + 160_000) == ["0", "1"]


def test_a_store_without_histograms_reads_labels_as_before(tmp_path):
    with EmbeddedStore(tmp_path) as store:
        s = SampleBuilder()
        s.add({"__name__": "gpu_temp", "gpu": "0"}, NOW + 15_000, 61.0)
        store.insert_batch("f:1", samples=s.build())
        assert store.histogram_metrics() == frozenset()
        seen: list[str] = []
        query = store.query

        def spy(sql, params=None):
            seen.append(sql)
            return query(sql, params)

        store.query = spy  # type: ignore[method-assign]
        storage = store.storage(use_cache=False)
        assert storage.label_values("gpu", [], NOW + 1, NOW + 20_000) == ["0"]  # a partial day
        assert storage.select([Matcher("__name__", "=", "gpu_temp")], NOW, NOW + 20_000)[
            0
        ].values.tolist() == [61.0]
        assert seen
        assert not any("histograms" in sql for sql in seen)


def test_histogram_reads_count_each_histogram_by_its_size(stores):
    """A ClickHouse read of histogram rows is bounded as the engine counts them: 13 samples each
    here (two spans, two buckets: Prometheus' HPoint size), not one."""
    import traceback

    from kernel_insight.kql import Engine, EngineLimits, TooManySamplesError

    store, _ = stores
    q = 'kernel_duration_seconds{gpu="0"}[10m]'
    at = NOW + 10 * 15_000
    assert _hist(1).sample_weight() == 13  # (168 + 4 x 8 + 8) / 16
    weights = 10 * 13  # ten histograms of gpu 0 in the window
    whole = Engine(store.storage(use_cache=False), EngineLimits(max_samples=weights)).instant_query(q, at)
    assert whole.stats.peak_samples == weights
    with pytest.raises(TooManySamplesError):
        Engine(store.storage(use_cache=False), EngineLimits(max_samples=weights - 1)).instant_query(q, at)
    # The read itself stops: 109 samples leave room for 9 rows of at least 11 each, not 109 rows.
    with pytest.raises(TooManySamplesError) as info:
        Engine(store.storage(use_cache=False), EngineLimits(max_samples=109)).instant_query(q, at)
    assert traceback.extract_tb(info.tb)[-1].name == "_read"
