"""A store made before samples were ordered by metric is migrated in place, data kept."""

from __future__ import annotations

import time

from kernel_insight.collector.rows import SampleBuilder
from kernel_insight.collector.store import EmbeddedStore
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
