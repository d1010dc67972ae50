"""The decoded-hours sample cache: reads through it equal reads without it, and writes are never hidden."""

from __future__ import annotations

import random
import threading
import time

import numpy as np
import pytest

from kernel_insight.collector.clickhouse.store import EmbeddedStore, ServerStore, open_store
from kernel_insight.collector.rows import SampleBuilder
from kernel_insight.collector.sample_cache import BLOCK_MS, SampleBlock, SampleCache
from kernel_insight.kql.pushdown import SeriesColumns
from kernel_insight.kql.storage import STALE_NAN, Matcher, SelectHints

# A whole UTC hour, recent enough for the default retention (samples older than it are dropped).
HOUR0 = int(time.time() * 1000) // BLOCK_MS * BLOCK_MS - 6 * BLOCK_MS
HOURS = 3
STEP = 15_000


def _batch(seed: int, hours: int = HOURS) -> SampleBuilder:
    rng = random.Random(seed)
    b = SampleBuilder()
    for metric in ("gpu_temp", "gpu_power", "launches_total"):
        for inst in ("n0", "n1", "n2"):
            for gpu in range(3):
                if rng.random() < 0.15:
                    continue  # not every GPU has every metric
                first = rng.randrange(0, hours * BLOCK_MS // 2)  # series appear at different times
                ts = [
                    t + rng.randint(-2000, 2000) for t in range(HOUR0 + first, HOUR0 + hours * BLOCK_MS, STEP)
                ]
                vs = [rng.gauss(60, 10) if rng.random() > 0.02 else STALE_NAN for _ in ts]
                labels = {"__name__": metric, "instance": inst, "gpu": str(gpu)}
                if metric == "launches_total":
                    labels["kernel"] = rng.choice(["gemm", "attn"])
                b.add_series(labels, ts, vs)
    return b


def _clock_at(ms: int) -> SampleCache:
    return SampleCache(64 << 20, clock=lambda: ms / 1000)


@pytest.fixture
def store(tmp_path):
    s = EmbeddedStore(tmp_path / "d")
    batch = _batch(3).build()
    s.insert_samples(batch)
    s.insert_samples(batch)  # stored twice, read once
    yield s
    s.close()


def _same(a: SeriesColumns, b: SeriesColumns) -> None:
    assert a.labels == b.labels
    np.testing.assert_array_equal(a.ts, b.ts)
    np.testing.assert_array_equal(a.vs.view(np.uint64), b.vs.view(np.uint64))


MATCHERS = [
    [Matcher("__name__", "=", "gpu_temp")],
    [Matcher("__name__", "=", "gpu_power"), Matcher("instance", "=~", "n[01]")],
    [Matcher("__name__", "=", "launches_total"), Matcher("kernel", "!=", "gemm"), Matcher("gpu", "!~", "2")],
    [Matcher("__name__", "=", "gpu_temp"), Matcher("missing", "=", "")],
    [Matcher("__name__", "=", "gpu_temp"), Matcher("instance", "=", "nowhere")],
    [Matcher("__name__", "=~", "gpu_.*")],  # two metrics: not through the cache
    [Matcher("instance", "=", "n2")],  # no metric named at all: not through the cache
]


@pytest.mark.parametrize("settled_hours", [0, 1, 2, 3])
def test_reads_through_the_cache_equal_reads_without_it(store, settled_hours):
    """Random windows over 3 h, with 0-3 of the hours settled (cached) and the rest read from ClickHouse."""
    # Hours before this clock's settle line are cacheable: exactly ``settled_hours`` of them.
    now = HOUR0 + settled_hours * BLOCK_MS + 3 * 60_000
    store.sample_cache = _clock_at(now)
    cached, plain = store.storage(), store.storage(use_cache=False)
    rng = random.Random(settled_hours)
    windows = []
    for _ in range(25):
        start = HOUR0 + rng.randrange(-BLOCK_MS // 2, HOURS * BLOCK_MS)
        windows.append((start, start + rng.randrange(0, 2 * BLOCK_MS)))
    found = 0
    for _ in range(2):  # the first pass queues fills of the hours it misses, the second reads them
        for start, end in windows:
            for matchers in MATCHERS:
                got = cached.select_columns(matchers, start, end)
                _same(got, plain.select_columns(matchers, start, end))
                found += len(got) > 0
        assert store.sample_cache.wait_idle()
    assert found > 200  # most of the 350 reads found series
    stats = store.sample_cache.stats()
    if settled_hours >= 2:
        assert stats.hits > 0
        assert stats.entries > 0
    if settled_hours == 0:
        assert stats.entries == 0  # nothing settled: nothing cached


def test_a_late_write_to_a_cached_hour_and_a_new_series_are_seen(store):
    store.sample_cache = _clock_at(HOUR0 + 10 * BLOCK_MS)
    storage = store.storage()
    m = [Matcher("__name__", "=", "gpu_temp")]
    window = (HOUR0, HOUR0 + HOURS * BLOCK_MS - 1)
    storage.select_columns(m, *window)  # queues the fill
    assert store.sample_cache.wait_idle()
    before = storage.select_columns(m, *window)
    assert store.sample_cache.stats().entries == HOURS
    late = SampleBuilder()
    late.add({"__name__": "gpu_temp", "instance": "n9", "gpu": "0"}, HOUR0 + 1_234, 99.0)  # a new series
    late.add({"__name__": "gpu_temp", "instance": "n0", "gpu": "0"}, HOUR0 + BLOCK_MS + 7, -1.0)
    store.insert_samples(late.build())
    after = storage.select_columns(m, *window)
    assert len(after) == len(before) + 1
    assert len(after.ts) == len(before.ts) + 2
    _same(after, store.storage(use_cache=False).select_columns(m, *window))
    assert store.sample_cache.wait_idle()  # the read after the write queued a refill
    hits = store.sample_cache.stats().hits
    _same(storage.select_columns(m, *window), after)
    assert store.sample_cache.stats().hits == hits + HOURS  # that answer came from the cache


def test_an_instant_selector_over_cached_hours_reads_the_last_samples_from_them(store, monkeypatch):
    """select_last_on_grid at one time over cached hours (ClickHouseStorage._cached_last) answers
    what the store answers without the cache: the same series, values (stale markers not
    present), sample times; windows inside an hour, across an hour's start, before a series
    began and after the data ended. A window reaching into hours not settled is not answered
    there (None: the engine reads select_columns, the cache plus ClickHouse)."""
    store.sample_cache = _clock_at(HOUR0 + HOURS * BLOCK_MS + 3 * 60_000)
    rng = random.Random(5)
    lookback = 300_000
    times = [HOUR0 + k * BLOCK_MS + d for k in range(HOURS + 1) for d in (-1, 0, 1, 60_000, lookback - 1)]
    times += [HOUR0 + rng.randrange(0, HOURS * BLOCK_MS) for _ in range(12)]
    import kernel_insight.collector.clickhouse.query as query

    from_cache = []
    real = query.ClickHouseStorage._cached_last
    monkeypatch.setattr(
        query.ClickHouseStorage, "_cached_last", lambda *a: from_cache.append(real(*a)) or from_cache[-1]
    )
    answered = 0
    for t in times:
        for m in MATCHERS:
            for sample_times in (True, False):
                cached = store.storage()
                cached.select_columns(m, t - lookback + 1, t)  # queues the fill of its hours
                assert store.sample_cache.wait_idle()
                got = cached.select_last_on_grid(m, t, t, SelectHints(step_ms=1), lookback, sample_times)
                if got is None:
                    continue  # left to the engine over select_columns (a window reaching past the cache)
                want = store.storage(use_cache=False).select_last_on_grid(
                    m, t, t, SelectHints(step_ms=1), lookback, sample_times
                )
                assert want is not None
                assert got.labels == want.labels, (t, m)
                np.testing.assert_array_equal(got.present, want.present)
                np.testing.assert_array_equal(got.values[got.present], want.values[want.present])
                if sample_times:
                    assert got.sample_ts is not None
                    assert want.sample_ts is not None
                    np.testing.assert_array_equal(got.sample_ts, want.sample_ts)
                answered += len(got)
    assert answered > 0
    assert sum(1 for grid in from_cache if grid is not None and len(grid)) > 100  # the cached path answered


def test_writes_that_cannot_be_mapped_to_hours_clear_the_cache(store):
    store.sample_cache = _clock_at(HOUR0 + 10 * BLOCK_MS)
    m = [Matcher("__name__", "=", "gpu_temp")]
    store.storage().select_columns(m, HOUR0, HOUR0 + BLOCK_MS)
    assert store.sample_cache.wait_idle()
    assert store.sample_cache.stats().entries > 0
    store.command("ALTER TABLE ki.samples DELETE WHERE value > 60 SETTINGS mutations_sync = 1")
    assert store.sample_cache.stats().entries == 0
    got = store.storage().select_columns(m, HOUR0, HOUR0 + BLOCK_MS)
    assert len(got.vs) > 0
    assert not (got.vs > 60).any()


def test_concurrent_late_writes_are_never_hidden(store):
    """Readers fill hours while a writer keeps adding late samples to them; afterwards the
    cached answer equals ClickHouse's."""
    store.sample_cache = _clock_at(HOUR0 + 10 * BLOCK_MS)
    m = [Matcher("__name__", "=", "gpu_power")]
    window = (HOUR0, HOUR0 + HOURS * BLOCK_MS - 1)
    errors: list[BaseException] = []

    def writer() -> None:
        try:
            for i in range(40):
                b = SampleBuilder()
                b.add(
                    {"__name__": "gpu_power", "instance": "late", "gpu": str(i % 3)},
                    HOUR0 + i * 61_001,
                    float(i),
                )
                store.insert_samples(b.build())
        except BaseException as exc:
            errors.append(exc)

    def reader() -> None:
        try:
            storage = store.storage()
            for _ in range(40):
                storage.select_columns(m, *window)
        except BaseException as exc:
            errors.append(exc)

    threads = [
        threading.Thread(target=writer),
        threading.Thread(target=reader),
        threading.Thread(target=reader),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors
    assert store.sample_cache.wait_idle()
    store.storage().select_columns(m, *window)  # queues the refill of hours the last writes touched
    assert store.sample_cache.wait_idle()
    hits = store.sample_cache.stats().hits
    _same(
        store.storage().select_columns(m, *window), store.storage(use_cache=False).select_columns(m, *window)
    )
    assert store.sample_cache.stats().hits == hits + HOURS  # that answer came from the cache
    assert len(store.storage().select_columns([*m, Matcher("instance", "=", "late")], *window).ts) == 40


def test_long_windows_and_windows_past_retention_bypass_the_cache(store):
    store.sample_cache = _clock_at(HOUR0 + 100 * BLOCK_MS)
    storage = store.storage()
    m = [Matcher("__name__", "=", "gpu_temp")]
    storage.select_columns(m, HOUR0 - 60 * BLOCK_MS, HOUR0 + 3 * BLOCK_MS)  # 63 hours
    store.retention = type(store.retention)(samples_days=2)
    storage.select_columns(m, HOUR0, HOUR0 + BLOCK_MS)  # ~4 days before the clock
    assert store.sample_cache.wait_idle()
    assert store.sample_cache.stats().entries == 0  # neither read queued a fill


def test_hours_too_large_for_the_budget_are_not_read_into_it(store):
    store.sample_cache = SampleCache(64 << 10, clock=lambda: (HOUR0 + 10 * BLOCK_MS) / 1000)  # 64 KiB
    m = [Matcher("__name__", "=", "gpu_temp")]
    window = (HOUR0, HOUR0 + HOURS * BLOCK_MS)
    want = store.storage(use_cache=False).select_columns(m, *window)
    _same(store.storage().select_columns(m, *window), want)
    assert store.sample_cache.wait_idle()
    assert store.sample_cache.stats().entries == 0
    assert store.sample_cache.oversized("gpu_temp", HOUR0)
    _same(store.storage().select_columns(m, *window), want)  # and answered all the same


def test_every_storage_of_a_store_shares_the_cached_hours_and_labels(store, monkeypatch):
    """The HTTP API makes a storage per request: the second request must not need ClickHouse."""
    store.sample_cache = _clock_at(HOUR0 + 10 * BLOCK_MS)
    m = [Matcher("__name__", "=", "launches_total"), Matcher("kernel", "=", "gemm")]
    window = (HOUR0 + 600_000, HOUR0 + HOURS * BLOCK_MS - 1)
    want = store.storage().select_columns(m, *window)  # queues the fill
    assert len(want) > 0
    assert store.sample_cache.wait_idle()
    _same(store.storage().select_columns(m, *window), want)  # learns the labels of the metric's series

    def refuse(sql: str) -> None:
        raise AssertionError(f"asked ClickHouse: {sql[:80]}")

    monkeypatch.setattr(store, "query", refuse)
    _same(store.storage().select_columns(m, *window), want)


def _block(n: int) -> SampleBlock:
    fps = np.repeat(np.arange(4, dtype=np.uint64), n // 4)
    return SampleBlock.from_sorted(fps, np.arange(n, dtype=np.int64), np.zeros(n))


def test_a_fill_that_raced_a_write_to_its_hour_is_refused():
    cache = SampleCache(1 << 20)
    gen = cache.generation()
    cache.invalidate([("m", 0)])  # a write committed while the fill was reading
    assert not cache.put("m", 0, _block(8), gen)
    assert cache.get("m", 0) is None
    assert cache.put("m", BLOCK_MS, _block(8), gen)  # another hour was not written
    assert cache.put("m", 0, _block(8), cache.generation())
    assert cache.stats().fills_discarded == 1
    gen = cache.generation()
    cache.clear()
    assert not cache.put("m", 0, _block(8), gen)


def test_the_cache_keeps_to_its_byte_budget_least_recently_used_first():
    one = _block(64).nbytes
    cache = SampleCache(3 * one)
    for hour in range(3):
        assert cache.put("m", hour * BLOCK_MS, _block(64), cache.generation())
    cache.get("m", 0)  # hour 0 used most recently now
    cache.put("m", 3 * BLOCK_MS, _block(64), cache.generation())
    assert cache.get("m", BLOCK_MS) is None
    assert cache.get("m", 0) is not None
    assert cache.stats().bytes <= 3 * one
    assert cache.stats().entries == 3
    assert not cache.put("m", 9 * BLOCK_MS, _block(1024), cache.generation())  # larger than the budget
    with pytest.raises(ValueError, match="cache size"):
        SampleCache(-1)


def test_background_fills_are_deduplicated_and_their_failures_counted(caplog):
    cache = SampleCache(1 << 20)
    gate = threading.Event()
    ran: list[str] = []

    def slow() -> None:
        gate.wait(10)
        ran.append("slow")

    def broken() -> None:
        raise RuntimeError("store went away")

    assert cache.fill_later("a", slow)
    assert not cache.fill_later("a", slow)  # already queued
    assert cache.fill_later("b", broken)
    gate.set()
    assert cache.wait_idle(10)
    assert ran == ["slow"]
    assert cache.stats().fills_failed == 1
    assert "sample cache fill failed" in caplog.text
    cache.close()
    assert not cache.fill_later("c", slow)


def test_the_cache_is_on_for_a_data_directory_and_off_for_a_server_by_default(tmp_path):
    with open_store(tmp_path / "a") as s:
        assert isinstance(s, EmbeddedStore)
        assert s.sample_cache is not None
    with open_store(tmp_path / "b", cache_bytes=0) as s:
        assert s.sample_cache is None
    with ServerStore.connect(f"chdb://{tmp_path / 'c'}") as s:
        assert s.sample_cache is None


def test_a_selector_asked_again_skips_label_matching_until_its_series_change(store, monkeypatch):
    """store.selection_cache: the matching series of a selector are remembered while the same series are present."""
    import kernel_insight.collector.clickhouse.query as query

    store.sample_cache = _clock_at(HOUR0 + 10 * BLOCK_MS)
    m = [Matcher("__name__", "=", "launches_total"), Matcher("kernel", "=", "gemm")]
    window = (HOUR0 + 600_000, HOUR0 + HOURS * BLOCK_MS - 1)
    store.storage().select_columns(m, *window)  # queues the fill
    assert store.sample_cache.wait_idle()
    matched = []
    real = query.labels_match
    monkeypatch.setattr(query, "labels_match", lambda *a: matched.append(a) or real(*a))
    first = store.storage().select_columns(m, *window)
    assert matched, "the first read through the cache matches labels"
    matched.clear()
    _same(store.storage().select_columns(m, *window), first)  # the very same blocks (their serials)
    assert matched == []
    again = store.storage().select_columns(m, (window[0] + window[1]) // 2, window[1])
    assert matched == []  # remembered: other blocks, the same series
    _same(again, store.storage(use_cache=False).select_columns(m, (window[0] + window[1]) // 2, window[1]))
    late = SampleBuilder()  # a new matching series in a cached hour
    late.add(
        {"__name__": "launches_total", "instance": "n9", "gpu": "0", "kernel": "gemm"}, HOUR0 + BLOCK_MS, 1.0
    )
    store.insert_samples(late.build())
    store.storage().select_columns(m, *window)  # the read after the write queues a refill
    assert store.sample_cache.wait_idle()
    after = store.storage().select_columns(m, *window)
    assert matched, "other series present: matched again"
    assert len(after) == len(first) + 1
    _same(after, store.storage(use_cache=False).select_columns(m, *window))


def test_each_wanted_series_samples_inside_a_window_are_found_in_a_block_regular_or_not():
    # _windows.series_ranges (gather_series' search, in C): regular scrapes, jittered ones,
    # duplicate times, gaps, empty series, wanted series missing from the block and windows
    # before, across and after the samples all agree with a plain search per series.
    from kernel_insight.kql import _windows

    rng = np.random.default_rng(7)
    for _ in range(2000):
        lens = rng.integers(0, 40, int(rng.integers(1, 8)))
        parts = []
        for n in lens.tolist():
            kind = int(rng.integers(0, 3))
            if kind == 0:  # regular, as scrapes are
                x = 3_600_000 + 15_000 * np.arange(n) + 250
            elif kind == 1:  # jittered and with gaps
                x = 3_600_000 + np.cumsum(rng.integers(0, 40_000, n))
            else:  # few distinct times
                x = np.sort(rng.integers(0, 5, n)) * 1000
            parts.append(np.asarray(x, dtype=np.int64))
        ts = np.concatenate(parts)
        offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
        fps = np.sort(rng.choice(1000, len(lens), replace=False)).astype(np.uint64)
        want = np.concatenate([fps, rng.integers(0, 1000, 3).astype(np.uint64)])
        rng.shuffle(want)
        for _ in range(4):
            start = int(rng.integers(-1000, 4_800_000))
            end = start + int(rng.integers(0, 1_000_000))
            starts, lengths = np.empty(len(want), np.int64), np.empty(len(want), np.int64)
            _windows.series_ranges(fps, offsets, ts, want, start, end, starts, lengths)
            for fp, got_start, got_length in zip(
                want.tolist(), starts.tolist(), lengths.tolist(), strict=True
            ):
                at = np.flatnonzero(fps == fp)
                if len(at) == 0:
                    assert (got_start, got_length) == (0, 0)
                    continue
                a, b = int(offsets[at[0]]), int(offsets[at[0] + 1])
                first = a + int(np.searchsorted(ts[a:b], start, "left"))
                last = a + int(np.searchsorted(ts[a:b], end, "right"))
                assert got_length == last - first
                if got_length:
                    assert got_start == first
