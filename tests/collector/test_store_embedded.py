"""The embedded store (chDB): schema, exactly-once batches, retention, typed failures."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from kernel_insight.collector.clickhouse.schema import Retention
from kernel_insight.collector.clickhouse.store import EmbeddedStore, StorageError, StorageUnavailable
from kernel_insight.collector.rows import Event, InstanceInfo, SampleBuilder, SpanBatch
from kernel_insight.kql.storage import STALE_NAN, Matcher, is_stale

NOW_MS = (int(time.time()) // 60) * 60_000


@pytest.fixture
def store(tmp_path):
    s = EmbeddedStore(tmp_path / "data")
    yield s
    s.close()


def _samples(n_series: int = 3, n: int = 10, base: int = NOW_MS):
    b = SampleBuilder()
    for i in range(n_series):
        b.add_series(
            {"__name__": "gpu_temp_celsius", "gpu": str(i)}, base + np.arange(n) * 1000, np.arange(n) + i
        )
    return b.build()


def _count(store, table: str) -> int:
    return int(store.query(f"SELECT count() AS c FROM ki.{table}").column("c")[0].as_py())


def test_schema_creates_every_table_with_codecs(store):
    tables = set(
        store.query("SELECT name FROM system.tables WHERE database = 'ki'").column("name").to_pylist()
    )
    assert tables == {
        "series",
        "samples",
        "kernel_spans",
        "gpu_calls",
        "events",
        "instances",
        "batches",
        "capture_requests",
        "histograms",
    }
    rows = store.query(
        "SELECT name, compression_codec FROM system.columns WHERE database='ki' AND table='samples'"
    ).to_pylist()
    codecs = {r["name"]: r["compression_codec"] for r in rows}
    assert codecs["ts"] == "CODEC(Delta(8), ZSTD(3))"
    assert codecs["float_value"] == "CODEC(Delta(8), ZSTD(3))"
    assert codecs["mantissa"] == "CODEC(Delta(8), ZSTD(5))"
    assert codecs["value"] == ""  # the ALIAS over them: nothing stored


def test_repeated_batch_id_stores_nothing_new(store):
    assert store.insert_batch("agent-a:1", samples=_samples()) is True
    assert store.insert_batch("agent-a:1", samples=_samples()) is False
    assert _count(store, "samples") == 30
    assert store.insert_batch("agent-a:2", samples=_samples(base=NOW_MS + 60_000)) is True
    assert _count(store, "samples") == 60


def test_dedup_token_alone_drops_a_retried_insert(store):
    # The batches row may never have been written (crash); the token still holds.
    store.insert_samples(_samples(), dedup_token="agent-a:7")
    store.insert_samples(_samples(), dedup_token="agent-a:7")
    assert _count(store, "samples") == 30


def test_exactly_once_survives_a_kill_between_insert_and_reply(tmp_path):
    # The child inserts the batch's rows, then dies before recording the batch or replying.
    path = tmp_path / "data"
    child = textwrap.dedent(
        f"""
        import os, signal, numpy as np
        from kernel_insight.collector.rows import SampleBuilder
        from kernel_insight.collector.clickhouse.store import EmbeddedStore
        s = EmbeddedStore({str(path)!r})
        b = SampleBuilder()
        for i in range(3):
            b.add_series({{"__name__": "gpu_temp_celsius", "gpu": str(i)}}, {NOW_MS} + np.arange(10) * 1000,
                         np.arange(10) + i)
        s.insert_samples(b.build(), dedup_token="agent-a:9")
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    proc = subprocess.run([sys.executable, "-c", child], capture_output=True, timeout=120, check=False)
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]
    with EmbeddedStore(path) as s:
        assert _count(s, "samples") == 30  # the insert landed before the kill
        assert s.insert_batch("agent-a:9", samples=_samples()) is True  # the retry...
        assert _count(s, "samples") == 30  # ...stores nothing twice
        assert s.insert_batch("agent-a:9", samples=_samples()) is False


def test_batch_ids_survive_a_restart(tmp_path):
    with EmbeddedStore(tmp_path / "d") as s:
        s.insert_batch("agent-b:1", samples=_samples())
    with EmbeddedStore(tmp_path / "d") as s:
        assert s.insert_batch("agent-b:1", samples=_samples()) is False
        assert _count(s, "samples") == 30


def test_stale_marker_keeps_its_bit_pattern(store):
    b = SampleBuilder()
    b.add_series({"__name__": "up"}, [NOW_MS, NOW_MS + 1000], [1.0, STALE_NAN])
    store.insert_samples(b.build())
    (series,) = store.storage().select([Matcher("__name__", "=", "up")], NOW_MS, NOW_MS + 1000)
    assert is_stale(series.values).tolist() == [False, True]


def test_spans_events_and_instances_round_trip(store):
    spans = SpanBatch(
        instance=["i-1", "i-1"],
        gpu=np.array([0, 1], np.uint16),
        stream=np.array([7, 7], np.uint64),
        kernel=["gemm", "flash_attn_fwd"],
        start_ns=np.array([NOW_MS * 1_000_000, NOW_MS * 1_000_000 + 5], np.int64),
        end_ns=np.array([NOW_MS * 1_000_000 + 1500, NOW_MS * 1_000_000 + 105], np.int64),
        correlation=np.array([1, 2], np.uint64),
        pid=np.array([42, 42], np.uint32),
    )
    events = [Event("i-1", 0, NOW_MS * 1_000_000, "xid", code=79, message="GPU fell off the bus")]
    store.insert_batch(
        "agent-c:1",
        spans=spans,
        events=events,
        instances=[InstanceInfo("i-1", NOW_MS, gpu_count=8, gpu_model="H100", labels={"rack": "r1"})],
    )
    store.upsert_instances(
        [InstanceInfo("i-1", NOW_MS + 1000, gpu_count=8, gpu_model="H100", labels={"rack": "r2"})]
    )
    rows = store.query("SELECT kernel, duration_ns FROM ki.kernel_spans ORDER BY start").to_pylist()
    assert rows == [{"kernel": "gemm", "duration_ns": 1500}, {"kernel": "flash_attn_fwd", "duration_ns": 100}]
    assert store.query("SELECT code, message FROM ki.events").to_pylist() == [
        {"code": 79, "message": "GPU fell off the bus"}
    ]
    latest = store.query("SELECT labels['rack'] AS rack FROM ki.instances FINAL").to_pylist()
    assert latest == [{"rack": "r2"}]
    # Counts as the store reads them for tests and tools: rows as written (the instances table's
    # two rows before a merge replaces one), distinct values of a column.
    store.insert_batch("agent-c:2", spans=spans)  # the same spans again, under another batch id
    assert store.row_count("kernel_spans") == 4
    assert store.distinct_count("kernel_spans", "correlation") == 2
    assert store.row_count("instances") == 2
    assert store.distinct_count("batches", "batch_id") == 2
    with pytest.raises(KeyError):
        store.row_count("system.users")
    with pytest.raises(KeyError):
        store.distinct_count("kernel_spans", "no_such_column")


def test_retention_is_configurable_and_reapplied(tmp_path):
    with EmbeddedStore(tmp_path / "d", retention=Retention(samples_days=3)) as s:
        ddl = s.query("SHOW CREATE TABLE ki.samples").column(0)[0].as_py()
        assert "toIntervalDay(3)" in ddl
    with EmbeddedStore(tmp_path / "d", retention=Retention(samples_days=5, spans_days=0)) as s:
        assert "toIntervalDay(5)" in s.query("SHOW CREATE TABLE ki.samples").column(0)[0].as_py()
        assert "TTL" not in s.query("SHOW CREATE TABLE ki.kernel_spans").column(0)[0].as_py()


def test_bad_retention_is_refused():
    with pytest.raises(ValueError, match="samples_days"):
        Retention(samples_days=-1)
    # The label index must outlive the samples it indexes.
    with pytest.raises(ValueError, match="must cover samples_days"):
        Retention(samples_days=30, series_days=7)
    with pytest.raises(ValueError, match="must cover samples_days"):
        Retention(samples_days=0, series_days=7)
    assert Retention(samples_days=90).series_ttl_days == 90
    assert Retention(samples_days=0, series_days=0).series_ttl_days == 0


def test_closed_store_is_unavailable_not_a_crash(tmp_path):
    s = EmbeddedStore(tmp_path / "d")
    s.close()
    s.close()  # safe twice
    with pytest.raises(StorageUnavailable, match="closed"):
        s.insert_samples(_samples())
    with pytest.raises(StorageUnavailable):
        s.ping()


def test_engine_rejection_is_a_typed_storage_error(store):
    with pytest.raises(StorageError, match=r"UNKNOWN_TABLE|Unknown table") as info:
        store.query("SELECT * FROM ki.no_such_table")
    assert not isinstance(info.value, StorageUnavailable)


def test_disk_bytes_counts_compressed_parts(store):
    store.insert_samples(_samples(n_series=2, n=1000))
    assert 0 < store.disk_bytes("samples") < 2000 * 16
    with pytest.raises(KeyError):
        store.disk_bytes("system.users")


def test_zero_retention_on_a_fresh_store_creates_no_ttl(tmp_path):
    with EmbeddedStore(tmp_path / "d", retention=Retention(spans_days=0)) as s:
        assert "TTL" not in s.query("SHOW CREATE TABLE ki.kernel_spans").column(0)[0].as_py()


def test_embedded_store_has_no_cluster_mode(tmp_path):
    from kernel_insight.collector.clickhouse.store import open_store

    with pytest.raises(ValueError, match="cluster needs a ClickHouse URL"):
        open_store(tmp_path / "d", cluster="ki")


def test_one_session_serves_several_threads(store):
    # FastAPI runs handlers on a thread pool: inserts and reads share the one chDB session.
    from concurrent.futures import ThreadPoolExecutor

    def work(i):
        store.insert_batch(f"agent-t:{i}", samples=_samples(n_series=2, n=50, base=NOW_MS + i * 60_000))
        return len(
            store.storage().select([Matcher("__name__", "=", "gpu_temp_celsius")], NOW_MS, NOW_MS + 10**7)
        )

    with ThreadPoolExecutor(4) as pool:
        seen = list(pool.map(work, range(12)))
    assert all(n == 2 for n in seen)
    assert _count(store, "samples") == 12 * 100


def test_out_of_range_timestamps_are_refused_before_storage():
    with pytest.raises(ValueError, match="outside the storable range"):
        _samples(base=-10_000)


def test_a_directory_in_use_by_another_process_is_a_clear_error(tmp_path):
    path = tmp_path / "d"
    with EmbeddedStore(path):
        child = f"from kernel_insight.collector.clickhouse.store import EmbeddedStore; EmbeddedStore({str(path)!r})"
        proc = subprocess.run(
            [sys.executable, "-c", child], capture_output=True, text=True, timeout=120, check=False
        )
    assert proc.returncode == 1
    assert "StorageUnavailable: cannot open the embedded store" in proc.stderr
    assert "another process" in proc.stderr


def test_reopening_with_the_same_retention_alters_nothing(tmp_path):
    with EmbeddedStore(tmp_path / "d", retention=Retention(samples_days=3)) as s:
        s.insert_samples(_samples())  # with data, a MODIFY TTL would leave a mutation behind
    with EmbeddedStore(tmp_path / "d", retention=Retention(samples_days=3)) as s:
        mutations = s.query("SELECT count() AS n FROM system.mutations WHERE database = 'ki'").column("n")[0]
        ddl = s.query("SHOW CREATE TABLE ki.series").column(0)[0].as_py()
    assert mutations.as_py() == 0
    assert "toIntervalDay(3)" in ddl  # the series index follows samples_days


def test_query_blob_returns_the_values_back_to_back(store):
    from kernel_insight.collector.clickhouse.sql import Params

    p = Params()
    sql = f"SELECT concat(toString(number), {p('x', 'String')}) FROM numbers(3)"
    assert store.query_blob(sql, p) == b"0x1x2x"
    assert store.query_blob("SELECT 'a' WHERE 0") == b""


def test_ping_asks_the_engine_at_most_once_a_second_and_a_closed_store_fails_at_once(tmp_path, monkeypatch):
    # /healthz is polled on kept-alive connections: each SELECT 1 queued behind the engine's work.
    from kernel_insight.collector.clickhouse import store as store_module

    s = EmbeddedStore(tmp_path / "d")
    asked: list[str] = []
    query = s.query
    monkeypatch.setattr(s, "query", lambda sql, params=None: asked.append(sql) or query(sql, params))
    now = [1000.0]
    monkeypatch.setattr(store_module.time, "monotonic", lambda: now[0])
    s.ping()
    s.ping()
    now[0] += store_module.PING_FRESH_S * 0.9
    s.ping()
    assert asked == ["SELECT 1"]
    now[0] += store_module.PING_FRESH_S * 0.2
    s.ping()
    assert asked == ["SELECT 1", "SELECT 1"]
    s.close()
    with pytest.raises(StorageUnavailable, match="closed"):
        s.ping()  # within the second, but closed
