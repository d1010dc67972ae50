"""Stores made by older versions (samples not ordered by metric, no start timestamps) are migrated in place, data kept."""

from __future__ import annotations

import time

import numpy as np

from kernel_insight.collector.clickhouse.store import EmbeddedStore
from kernel_insight.collector.rows import HistogramBuilder, SampleBuilder
from kernel_insight.kql.storage import Matcher


def test_samples_without_a_metric_column_are_migrated_on_open(tmp_path) -> None:
    now = int(time.time() * 1000)
    store = EmbeddedStore(tmp_path)
    b = SampleBuilder()
    for i in range(3):
        b.add({"__name__": "gpu_temperature_celsius", "gpu": str(i)}, now - 1000, 50.0 + i)
        b.add({"__name__": "gpu_power_watts", "gpu": str(i)}, now - 1000, 300.0 + i)
    store.insert_samples(b.build())
    # Rebuild samples in the old layout (no metric column, ordered by fingerprint), same rows.
    store.command(
        "CREATE TABLE ki.samples_old (fingerprint UInt64, ts DateTime64(3, 'UTC'), value Float64) "
        "ENGINE = MergeTree ORDER BY (fingerprint, ts)"
    )
    store.command("INSERT INTO ki.samples_old SELECT fingerprint, ts, value FROM ki.samples")
    store.command("DROP TABLE ki.samples")
    store.command("RENAME TABLE ki.samples_old TO ki.samples")
    store.close()

    reopened = EmbeddedStore(tmp_path)
    try:
        cols = reopened.query("SELECT name FROM system.columns WHERE database = 'ki' AND table = 'samples'")
        assert "metric" in cols.column("name").to_pylist()
        got = reopened.storage().select(
            [Matcher("__name__", "=", "gpu_temperature_celsius")], now - 60_000, now
        )
        assert sorted(float(s.values[0]) for s in got) == [50.0, 51.0, 52.0]
        total = reopened.query("SELECT count() AS n FROM ki.samples").column("n").to_pylist()
        assert total == [6]
        tables = (
            reopened.query("SELECT name FROM system.tables WHERE database = 'ki'").column("name").to_pylist()
        )
        assert "samples_before_metric" not in tables
    finally:
        reopened.close()


def test_a_store_without_start_timestamps_gains_the_st_columns_by_metadata_only(tmp_path) -> None:
    """Stores made before start timestamps (remote_write 2.0) were kept: ``st`` is added to samples
    and histograms on open, no mutation runs, old parts read 0 (unset), before and after a merge."""
    now = int(time.time() * 1000)
    with EmbeddedStore(tmp_path) as store:
        # The layout before: both tables exactly as that version made them (no st column), with parts.
        for table in ("samples", "histograms"):
            store.command(f"ALTER TABLE ki.{table} DROP COLUMN st")
        b = SampleBuilder()
        for i in range(3):
            b.add({"__name__": "requests_total", "job": "a"}, now - 3000 + i * 1000, float(i))
        store.insert_samples(b.build())
        h = HistogramBuilder()
        h.add(
            {"__name__": "lat"},
            now - 2000,
            schema=0,
            count=1.0,
            sum=0.5,
            positive_spans=[(0, 1)],
            positive_buckets=[1.0],
        )
        store.insert_histograms(h.build())
    with EmbeddedStore(tmp_path) as store:
        for table in ("samples", "histograms"):
            cols = {
                r["name"]: (r["type"], r["compression_codec"])
                for r in store.query(
                    f"SELECT name, type, compression_codec FROM system.columns WHERE database = 'ki' AND table = '{table}'"
                ).to_pylist()
            }
            assert cols["st"] == ("Int64", "CODEC(Delta(8), ZSTD(1))")
        assert store.query(
            "SELECT count() AS n FROM system.mutations WHERE database = 'ki' AND NOT is_done"
        ).to_pylist() == [{"n": 0}]
        b = SampleBuilder()
        b.add_series_canonical(
            (("__name__", "requests_total"), ("job", "a")),
            np.array([now - 500], np.int64),
            np.array([1.0]),
            np.array([now - 700], np.int64),
        )
        store.insert_samples(b.build())
        for _ in range(2):  # as written, then merged into one part
            rows = store.query(
                "SELECT toUnixTimestamp64Milli(ts) - {now:Int64} AS t, value, st FROM ki.samples ORDER BY ts".replace(
                    "{now:Int64}", str(now)
                )
            ).to_pylist()
            assert [(r["t"], r["value"], r["st"]) for r in rows] == [
                (-3000, 0.0, 0),
                (-2000, 1.0, 0),
                (-1000, 2.0, 0),
                (-500, 1.0, now - 700),
            ]
            assert store.query("SELECT st FROM ki.histograms").column("st").to_pylist() == [0]
            got = store.storage().select([Matcher("__name__", "=", "requests_total")], now - 60_000, now)
            assert [float(v) for v in got[0].values] == [0.0, 1.0, 2.0, 1.0]
            store.optimize("samples")
            store.optimize("histograms")
