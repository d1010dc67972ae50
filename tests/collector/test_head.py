"""The head (collector/head.py) answers exactly as ClickHouse would: with it on, off, evicting,
reloaded after a restart or a raw statement, and over windows that straddle its coverage."""

from __future__ import annotations

import random
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernel_insight.collector import head as head_module
from kernel_insight.collector.clickhouse.store import EmbeddedStore
from kernel_insight.collector.head import DEFAULT_HEAD_BYTES as HEAD
from kernel_insight.collector.head import Head, concat_columns
from kernel_insight.collector.rows import SampleBuilder
from kernel_insight.kql.engine import Engine
from kernel_insight.kql.pushdown import columns_of
from kernel_insight.kql.storage import STALE_NAN, Matcher, MemoryStorage, labels_match

BASE = (int(time.time()) // 60) * 60_000 - 20 * 60_000  # 20 minutes ago, on a minute

LABEL_VALUES = {
    "job": ["node", "gpu", ""],
    "instance": ["h1", "h2", "h10", "h2x"],
    "mode": ["idle", "user", ""],
}
METRICS = ["cpu_seconds_total", "mem_free_bytes", "up"]
LABELS_ASKED = ["__name__", "job", "instance", "mode", "nosuch"]


def _labels(rng: random.Random) -> dict[str, str]:
    out = {"__name__": rng.choice(METRICS)}
    for name, values in LABEL_VALUES.items():
        v = rng.choice(values)
        if v:
            out[name] = v
    return out


MATCHERS = [
    [Matcher("__name__", "=", "up")],
    [Matcher("__name__", "=~", "cpu.*|up")],
    [Matcher("instance", "=~", "h1.*")],
    [Matcher("instance", "!~", "h1.*"), Matcher("__name__", "!=", "up")],
    [Matcher("job", "=", ""), Matcher("__name__", "=", "mem_free_bytes")],
    [Matcher("mode", "!=", "idle")],
    [Matcher("job", "=~", "node|gpu"), Matcher("mode", "=~", ".*")],
    [Matcher("nosuch", "=", "")],
    [Matcher("instance", "=", "h2"), Matcher("job", "!=", "")],
    [Matcher("__name__", "=", "up"), Matcher("instance", "!=", "")],
    [Matcher("__name__", "=", "up"), Matcher("nosuch", "=", "")],
    [Matcher("__name__", "=", "up"), Matcher("nosuch", "!=", "")],
    [
        Matcher("__name__", "=", "cpu_seconds_total"),
        Matcher("mode", "=~", "i.*"),
        Matcher("job", "!~", "gpu"),
    ],
    [Matcher("__name__", "=", "absent_metric"), Matcher("instance", "!=", "")],
]


def _same(got, want) -> None:
    assert [d.labels for d in got] == [d.labels for d in want]
    for g, w in zip(got, want, strict=True):
        assert g.timestamps.tolist() == w.timestamps.tolist(), g.labels
        assert g.values.view(np.uint64).tolist() == w.values.view(np.uint64).tolist(), g.labels


def _same_latest(got, want) -> None:
    assert got.labels == want.labels
    assert got.present.tolist() == want.present.tolist(), got.labels
    p = want.present
    assert got.values[p].view(np.uint64).tolist() == want.values[p].view(np.uint64).tolist(), got.labels
    assert got.sample_ts[p].tolist() == want.sample_ts[p].tolist(), got.labels


def _wait_ready(store: EmbeddedStore) -> None:
    deadline = time.monotonic() + 60
    while not store.head.ready:  # type: ignore[union-attr]
        assert time.monotonic() < deadline, "the head did not load"
        time.sleep(0.02)


def _write(
    store: EmbeddedStore, mem: MemoryStorage, rng: random.Random, batch: int, t_lo: int, t_hi: int
) -> None:
    b = SampleBuilder()
    for _ in range(rng.randint(1, 8)):
        labels = _labels(rng)
        ts = sorted(rng.sample(range(t_lo, t_hi), rng.randint(1, 6)))
        # Values are a function of (series, time): a repeated sample (a retried batch) has the same value.
        key = hash(tuple(sorted(labels.items()))) % 1000
        vs = [STALE_NAN if (t // 1000) % 17 == 0 else float(key * 1e6 + t % 1_000_003) for t in ts]
        b.add_series(labels, [BASE + t for t in ts], vs)
        mem.add(labels, [BASE + t for t in ts], vs)
    store.insert_batch(f"b{batch}", samples=b.build())


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1))
def test_head_answers_as_memory_storage_through_writes_restarts_and_evictions(tmp_path_factory, seed):
    """Writes (late ones, repeated ones), restarts and raw statements interleaved with reads of
    recent, old and straddling windows: the store with its head answers as kql's MemoryStorage,
    and as the same store with the head off."""
    rng = random.Random(seed)
    path = tmp_path_factory.mktemp("head")
    mem = MemoryStorage()
    # A 3-minute head over 20 minutes of data: the head evicts, and windows straddle its coverage.
    store = EmbeddedStore(path, head_bytes=HEAD, head_window_ms=180_000)
    try:
        for step in range(rng.randint(6, 14)):
            store.head.open_block_samples = rng.choice([5, 20, 1000])  # type: ignore[union-attr]
            late = rng.random() < 0.2
            t_hi = min(1_200_000, 90_000 * (step + 1))
            t_lo = max(0, t_hi - (900_000 if late else 90_000))
            _write(store, mem, rng, step, t_lo, t_hi)
            if rng.random() < 0.25:  # a restart: the head is rebuilt from ClickHouse
                store.close()
                store = EmbeddedStore(path, head_bytes=HEAD, head_window_ms=180_000)
            if rng.random() < 0.5:
                _wait_ready(store)
            for _ in range(3):
                matchers = rng.choice(MATCHERS)
                end = BASE + rng.randint(0, 1_300_000)
                start = end - rng.choice([0, 5_000, 60_000, 300_000, 1_500_000])
                _same(store.storage().select(matchers, start, end), mem.select(matchers, start, end))
                # An instant selector: the head's newest samples (Head.select_last) when it covers
                # the lookback window, the engine's lookup over the samples otherwise.
                _same_latest(Engine(store.storage()).latest(matchers, end), Engine(mem).latest(matchers, end))
        _wait_ready(store)
        head = store.head  # the same data through ClickHouse alone, then through the head
        try:
            for matchers in MATCHERS:
                for start, end in [(BASE, BASE + 1_300_000), (BASE + 1_100_000, BASE + 1_250_000)]:
                    store.head = None
                    without = store.storage().select(matchers, start, end)
                    store.head = head
                    _same(store.storage().select(matchers, start, end), without)
            # Label names and values from the head's postings (windows it covers) as ClickHouse lists them.
            first = max(head.coverage_start_ms, BASE)  # type: ignore[union-attr]
            for matchers in [*MATCHERS, []]:
                for start, end in [(first, BASE + 1_300_000), (first + 20_000, first + 80_000)]:
                    assert head.covers(start)  # type: ignore[union-attr]
                    store.head = None
                    names = store.storage().label_names(matchers, start, end)
                    values = {n: store.storage().label_values(n, matchers, start, end) for n in LABELS_ASKED}
                    store.head = head
                    assert store.storage().label_names(matchers, start, end) == names, (matchers, start, end)
                    for n in LABELS_ASKED:
                        assert store.storage().label_values(n, matchers, start, end) == values[n], (
                            n,
                            matchers,
                        )
        finally:
            store.head = head
    finally:
        store.close()


def test_a_restart_mid_stream_answers_what_was_acknowledged_before(tmp_path):
    """Queries right after the collector's store reopens (head loading, then loaded) answer every
    sample acknowledged before the restart."""
    now = int(time.time() * 1000)
    store = EmbeddedStore(tmp_path, head_bytes=HEAD)
    b = SampleBuilder()
    for i in range(50):
        b.add_series({"__name__": "up", "instance": f"h{i}"}, [now - 60_000, now - 30_000], [1.0, float(i)])
    store.insert_batch("before", samples=b.build())
    store.close()
    store = EmbeddedStore(tmp_path, head_bytes=HEAD)
    try:
        m = [Matcher("__name__", "=", "up")]
        first = store.storage().select(m, now - 120_000, now)  # whether or not the head has loaded
        _wait_ready(store)
        assert store.head is not None
        assert store.head.stats().series == 50
        second = store.storage().select(m, now - 120_000, now)
        _same(first, second)
        assert len(second) == 50
        assert all(
            d.values.tolist()[-1] == float(i)
            for i, d in enumerate(sorted(second, key=lambda d: int(dict(d.labels)["instance"][1:])))
        )
    finally:
        store.close()


def test_a_flood_of_series_past_the_budget_evicts_and_still_answers_exactly(tmp_path, caplog):
    """New series past the memory budget: the oldest blocks leave memory (said in the stats and
    the log), reads of them go to ClickHouse, nothing crashes and every answer stays exact."""
    now = int(time.time() * 1000)
    store = EmbeddedStore(tmp_path, head_bytes=400_000)
    mem = MemoryStorage()
    try:
        _wait_ready(store)
        store.head.open_block_samples = 500  # type: ignore[union-attr]
        for k in range(30):
            b = SampleBuilder()
            for i in range(100):
                labels = {"__name__": "flood", "series": f"s{k}-{i}", "wave": str(k)}
                ts = [now - 300_000 + k * 1_000 + j for j in range(3)]
                b.add_series(labels, ts, [float(i + j) for j in range(3)])
                mem.add(labels, ts, [float(i + j) for j in range(3)])
            store.insert_batch(f"flood{k}", samples=b.build())
        stats = store.head.stats()  # type: ignore[union-attr]
        assert stats.evicted_for_budget > 0
        assert stats.bytes <= 400_000 + 100 * 3 * 20 * 30  # the open block is bounded by the sealing size
        assert stats.coverage_start_ms is not None
        assert stats.coverage_start_ms > now - 300_000
        assert "over its memory budget" in caplog.text
        for matchers in ([Matcher("__name__", "=", "flood")], [Matcher("wave", "=~", "1|29")]):
            _same(
                store.storage().select(matchers, now - 400_000, now), mem.select(matchers, now - 400_000, now)
            )
    finally:
        store.close()


@pytest.mark.parametrize("filter_max", [0, 10**9], ids=["postings", "labels"])
def test_head_matching_is_labels_match(monkeypatch, filter_max):
    """Postings intersection, and the check of the few series the equality matchers leave on their
    labels, give exactly the series kql's own matcher semantics select."""
    monkeypatch.setattr(head_module, "FILTER_BY_LABELS_MAX", filter_max)
    monkeypatch.setattr(head_module, "FILTER_BY_LABELS_SHARE", 0.0)
    rng = random.Random(3)
    head = Head()
    seen: dict[tuple[tuple[str, str], ...], int] = {}
    for _ in range(300):
        labels = tuple(sorted(_labels(rng).items()))
        fp = seen.setdefault(labels, len(seen) + 1)
        head.append(
            [labels], np.array([fp], np.uint64), np.array([0], np.int32), np.array([BASE]), np.array([1.0])
        )
    by_sid = head._labels
    for matchers in MATCHERS:
        got = {by_sid[i] for i in head.matching(matchers).tolist()}
        want = {labels for labels in seen if labels_match(labels, matchers)}
        assert got == want, matchers


def test_concat_columns_joins_each_series_in_time_order():
    mem_a, mem_b = MemoryStorage(), MemoryStorage()
    mem_a.add({"__name__": "m", "i": "1"}, [1, 2], [1.0, 2.0])
    mem_a.add({"__name__": "m", "i": "3"}, [1], [5.0])
    mem_b.add({"__name__": "m", "i": "1"}, [5], [3.0])
    mem_b.add({"__name__": "m", "i": "2"}, [6, 7], [4.0, 4.5])
    m = [Matcher("__name__", "=", "m")]
    joined = concat_columns(columns_of(mem_a.select(m, 0, 10)), columns_of(mem_b.select(m, 0, 10))).series()
    assert [(dict(d.labels)["i"], d.timestamps.tolist(), d.values.tolist()) for d in joined] == [
        ("1", [1, 2, 5], [1.0, 2.0, 3.0]),
        ("2", [6, 7], [4.0, 4.5]),
        ("3", [1], [5.0]),
    ]


@pytest.mark.parametrize("statement", ["ALTER TABLE {t} DELETE WHERE value > 5", "TRUNCATE TABLE {t}"])
def test_a_raw_statement_on_the_samples_table_rebuilds_the_head(tmp_path, statement):
    now = int(time.time() * 1000)
    store = EmbeddedStore(tmp_path, head_bytes=HEAD)
    try:
        _wait_ready(store)
        b = SampleBuilder()
        for i in range(10):
            b.add_series({"__name__": "x", "i": str(i)}, [now - 1_000], [float(i)])
        store.insert_batch("x", samples=b.build())
        store.command(
            statement.format(t="ki.samples")
            + (" SETTINGS mutations_sync = 2" if "DELETE" in statement else "")
        )
        _wait_ready(store)
        got = store.storage().select([Matcher("__name__", "=", "x")], now - 10_000, now)
        want = 6 if "DELETE" in statement else 0
        assert len(got) == want
    finally:
        store.close()


def test_a_query_over_too_many_samples_in_the_head_fails_with_prometheus_text(tmp_path):
    """The sample limit holds on the head's reads: refused with Prometheus' error, before the
    samples are gathered where a block lies inside the window, never an out-of-memory kill."""
    from kernel_insight.kql.engine import Engine, EngineLimits
    from kernel_insight.kql.errors import TooManySamplesError

    now = int(time.time() * 1000)
    store = EmbeddedStore(tmp_path, head_bytes=HEAD)
    try:
        _wait_ready(store)
        store.head.open_block_samples = 1_000  # type: ignore[union-attr]
        b = SampleBuilder()
        for i in range(200):
            b.add_series(
                {"__name__": "big", "i": str(i)}, [now - 60_000 + k * 1_000 for k in range(50)], [1.0] * 50
            )
        store.insert_batch("big", samples=b.build())
        assert store.head.stats().blocks > 0  # type: ignore[union-attr]
        engine = Engine(store.storage(), EngineLimits(max_samples=5_000))
        with pytest.raises(TooManySamplesError, match="query processing would load too many samples"):
            engine.instant_query("count_over_time(big[2m])", now)
        small = Engine(store.storage(), EngineLimits(max_samples=50_000))
        (sample,) = small.instant_query("count(count_over_time(big[2m]))", now).value.samples  # type: ignore[union-attr]
        assert sample.value == 200
    finally:
        store.close()


def test_a_restart_loads_only_what_fits_the_budget_and_still_answers_exactly(tmp_path):
    """More recent samples in ClickHouse than the head's budget holds: the load starts later (the
    coverage says where), and reads before it go to ClickHouse; answers are the same."""
    now = int(time.time() * 1000)
    mem = MemoryStorage()
    store = EmbeddedStore(tmp_path)
    b = SampleBuilder()
    for i in range(20):
        labels = {"__name__": "up", "i": str(i)}
        ts = [now - 600_000 + k * 6_000 for k in range(100)]
        b.add_series(labels, ts, [float(k) for k in range(100)])
        mem.add(labels, ts, [float(k) for k in range(100)])
    store.insert_batch("before", samples=b.build())
    store.close()
    store = EmbeddedStore(tmp_path, head_bytes=12_000 + 20 * 400)  # ~900 of the 2,000 samples
    try:
        _wait_ready(store)
        stats = store.head.stats()  # type: ignore[union-attr]
        assert stats.coverage_start_ms is not None
        assert now - 600_000 < stats.coverage_start_ms < now
        assert 0 < stats.samples < 2_000
        m = [Matcher("__name__", "=", "up")]
        for start in (now - 700_000, stats.coverage_start_ms - 1, stats.coverage_start_ms + 10_000):
            _same(store.storage().select(m, start, now), mem.select(m, start, now))
    finally:
        store.close()


def test_a_histogram_only_series_is_found_though_the_head_holds_floats_only(tmp_path):
    """Selectors that may match a native-histogram metric go to ClickHouse: the head knows nothing
    of series without float samples (a histogram-only series was listed as absent)."""
    from kernel_insight.collector.rows import HistogramBuilder

    now = int(time.time() * 1000)
    store = EmbeddedStore(tmp_path, head_bytes=HEAD)
    try:
        _wait_ready(store)
        floats = SampleBuilder()
        floats.add_series({"__name__": "up", "job": "nh"}, [now - 1_000], [1.0])
        hb = HistogramBuilder()
        hb.add(
            {"__name__": "latency_seconds", "job": "nh"},
            now - 1_000,
            schema=0,
            count=3.0,
            sum=1.5,
            positive_spans=((0, 1),),
            positive_buckets=(3.0,),
        )
        store.insert_batch("mixed", samples=floats.build(), histograms=hb.build())
        for matchers in ([Matcher("job", "=", "nh")], [Matcher("__name__", "=~", "lat.*")]):
            got = store.storage().select(matchers, now - 60_000, now)
            assert "latency_seconds" in {dict(d.labels)["__name__"] for d in got}, matchers
        (up,) = store.storage().select([Matcher("__name__", "=", "up")], now - 60_000, now)
        assert up.values.tolist() == [1.0]
    finally:
        store.close()


def test_latest_over_no_series_still_gives_sample_times(tmp_path):
    """``Engine.latest`` asked for sample times gives them with no row too, as a grid store did:
    the health snapshot of a fresh store read through the head was a 503 (it needs the array)."""
    from kernel_insight.kql.engine import Engine

    store = EmbeddedStore(tmp_path, head_bytes=HEAD)
    try:
        _wait_ready(store)
        found = Engine(store.storage()).latest([Matcher("__name__", "=", "nothing")], int(time.time() * 1000))
        assert len(found) == 0
        assert found.sample_ts is not None
        assert found.sample_ts.shape == (0, 1)
    finally:
        store.close()


def test_the_head_loads_a_fleet_of_series_with_statements_that_do_not_grow_with_it(tmp_path, monkeypatch):
    """A restart over 20,000 series: the load reads their labels by day, not by naming every
    fingerprint in the statement (a 500,000-series head made that a ~10 MB parameter the engine
    parsed for minutes, holding the session that ingest and every query wait for)."""
    now = int(time.time() * 1000)
    store = EmbeddedStore(tmp_path)
    b = SampleBuilder()
    for i in range(20_000):
        b.add_series(
            {"__name__": "gpu_power_watts", "instance": f"node-{i // 8}", "gpu": str(i % 8)},
            [now - 5_000],
            [float(i)],
        )
    store.insert_batch("fleet", samples=b.build())
    store.close()
    sizes: list[int] = []
    run = EmbeddedStore._run

    def recorded(self, sql, fmt, params=None):  # type: ignore[no-untyped-def]
        sizes.append(len(sql) + sum(len(v) for v in (params.texts() if params else {}).values()))
        return run(self, sql, fmt, params)

    monkeypatch.setattr(EmbeddedStore, "_run", recorded)
    store = EmbeddedStore(tmp_path, head_bytes=HEAD)
    try:
        _wait_ready(store)
        assert store.head is not None
        assert store.head.stats().series == 20_000
        assert max(sizes) < 10_000, max(sizes)
        m = [Matcher("__name__", "=", "gpu_power_watts"), Matcher("instance", "=", "node-7")]
        got = store.storage().select(m, now - 60_000, now)
        assert sorted(d.values.tolist()[-1] for d in got) == [float(56 + g) for g in range(8)]
    finally:
        store.close()


def test_merged_blocks_keep_the_head_near_its_window_at_a_low_rate():
    """Blocks merge only within an eighth of the window in time: eviction drops a block once its
    newest sample leaves the window, so a block merged over a longer span kept that much more in
    memory (at the soak's ~2,000 samples/s a head of a 5-minute window grew past 20 minutes' worth)."""
    from kernel_insight.collector.head import MAX_BLOCK_SPAN_OF_WINDOW

    window_ms, per_s = 60_000, 50
    h = Head(window_ms=window_ms, open_block_samples=100)  # a block every 2 s of sample time
    series = [(("__name__", "m"), ("i", str(i))) for i in range(per_s)]
    fps = np.arange(1, per_s + 1, dtype=np.uint64)
    idx = np.arange(per_s, dtype=np.int32)
    most = 0
    for second in range(20 * 60):
        h.append(series, fps, idx, np.full(per_s, second * 1000, np.int64), np.full(per_s, float(second)))
        deadline = time.monotonic() + 30
        while h._merging:  # a merge runs on its own thread: let it land before the next write
            assert time.monotonic() < deadline, "a head merge did not finish"
            time.sleep(0.001)
        most = max(most, h.stats().samples)
    # The window, one merged block's span and the open block, in samples (one a second per series).
    bound = per_s * (window_ms * (1 + MAX_BLOCK_SPAN_OF_WINDOW) / 1000 + 2 + 1)
    assert most <= bound, (most, bound)
    assert h.stats().blocks < 20 * 60 / 2 / 2  # and blocks did merge
