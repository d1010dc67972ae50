"""Settled partitions merge (docs/storage.md, "Merges"): the merge selector alone left them as they were."""

from __future__ import annotations

import os
import time

import pytest

from kernel_insight.collector.clickhouse.embedded import EMBEDDED_TABLE_SETTINGS, EmbeddedStore
from kernel_insight.collector.clickhouse.schema import MERGE_SETTINGS
from kernel_insight.collector.rows import SampleBuilder

DAY_MS = 86_400_000


def _parts(store: EmbeddedStore) -> tuple[int, int]:
    q = (
        "SELECT count() AS parts, uniqExact(partition) AS partitions FROM system.parts "
        "WHERE active AND database = 'ki' AND table = 'samples'"
    )
    row = store.query(q).to_pylist()[0]
    return int(row["parts"]), int(row["partitions"])


def test_settled_day_partitions_end_as_one_part_each(tmp_path):
    with EmbeddedStore(tmp_path / "d", cache_bytes=0) as store:
        # The shipped age is 10 minutes; a second here, so the test sees the same rule act.
        store.command("ALTER TABLE ki.samples MODIFY SETTING min_age_to_force_merge_seconds = 1")
        start = (int(time.time() * 1000) // DAY_MS - 10) * DAY_MS
        for i in range(80):  # 8 inserts into each of 10 day partitions, in turn
            b = SampleBuilder()
            for s in range(500):
                b.add({"__name__": "m", "s": str(s)}, start + (i % 10) * DAY_MS + i * 1000, float(i))
            store.insert_samples(b.build())
        parts, partitions = _parts(store)
        assert partitions == 10
        assert parts > partitions  # several parts per day to begin with
        deadline = time.monotonic() + 60
        while _parts(store)[0] > partitions and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _parts(store) == (10, 10)
        assert store.query("SELECT count() AS n FROM ki.samples").to_pylist() == [{"n": 40000}]


def test_stores_made_before_the_merge_settings_get_them(tmp_path):
    with EmbeddedStore(tmp_path / "d", cache_bytes=0) as store:
        store.command(
            "ALTER TABLE ki.samples RESET SETTING min_age_to_force_merge_seconds, "
            "min_age_to_force_merge_on_partition_only, old_parts_lifetime, cleanup_delay_period, "
            "min_compressed_bytes_to_fsync_after_merge"
        )
        q = "SELECT create_table_query AS q FROM system.tables WHERE database = 'ki' AND name = 'samples'"
        assert "min_age_to_force_merge_seconds" not in store.query(q).to_pylist()[0]["q"]
    with EmbeddedStore(tmp_path / "d", cache_bytes=0) as store:
        ddl = store.query(q).to_pylist()[0]["q"]
        for name, value in MERGE_SETTINGS.items():
            assert f"{name} = {value}" in ddl


def test_stores_made_with_other_merge_values_get_the_current_ones(tmp_path):
    # A store from the previous release kept replaced parts 10 s (du ~9x the active parts).
    with EmbeddedStore(tmp_path / "d", cache_bytes=0) as store:
        store.command("ALTER TABLE ki.samples MODIFY SETTING old_parts_lifetime = 10")
        q = "SELECT create_table_query AS q FROM system.tables WHERE database = 'ki' AND name = 'samples'"
        assert "old_parts_lifetime = 10" in store.query(q).to_pylist()[0]["q"]
    with EmbeddedStore(tmp_path / "d", cache_bytes=0) as store:
        ddl = store.query(q).to_pylist()[0]["q"]
        assert f"old_parts_lifetime = {MERGE_SETTINGS['old_parts_lifetime']}" in ddl
        assert "old_parts_lifetime = 10" not in ddl


def _inactive_parts(store: EmbeddedStore) -> int:
    q = "SELECT count() AS n FROM system.parts WHERE NOT active AND database = 'ki' AND table = 'samples'"
    return int(store.query(q).to_pylist()[0]["n"])


def _active_parts(store: EmbeddedStore) -> int:
    q = "SELECT count() AS n FROM system.parts WHERE active AND database = 'ki' AND table = 'samples'"
    return int(store.query(q).to_pylist()[0]["n"])


def test_replaced_parts_are_deleted_without_further_writes(tmp_path):
    # A small partition: the selector merges each new part into it, replacing the whole part each
    # time. chDB alone left the replaced parts on disk 40 s and more after the last write.
    with EmbeddedStore(tmp_path / "d", cache_bytes=0) as store:
        store.command(
            "INSERT INTO ki.samples (metric, fingerprint, ts, float_value) SELECT 'm', number % 500, "
            "now64(3) - 3600 + number / 100, number FROM numbers(20000)"
        )
        seen = 0  # replaced parts seen at any moment (the cleanup may delete them between looks)
        for _ in range(20):  # paced as a trickle of heartbeats: a table that is not busy
            store.command(
                "INSERT INTO ki.samples (metric, fingerprint, ts, float_value) SELECT 'm', number, now64(3), 1 FROM numbers(28)"
            )
            seen = max(seen, _inactive_parts(store))
            time.sleep(0.4)
        deadline = time.monotonic() + 30
        while seen == 0 and _active_parts(store) >= 21 and time.monotonic() < deadline:
            seen = max(seen, _inactive_parts(store))
            time.sleep(0.05)  # wait for the merges to replace something
        # The merges did replace parts: seen on disk, or fewer active parts than the 21 inserts.
        assert seen > 0 or _active_parts(store) < 21
        deadline = time.monotonic() + 10
        while _inactive_parts(store) > 0 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _inactive_parts(store) == 0
        assert store.query("SELECT count() AS n FROM ki.samples").to_pylist() == [{"n": 20560}]


def test_stores_made_with_older_codecs_get_the_current_ones_and_keep_their_rows(tmp_path):
    # A store of an earlier release: ts DoubleDelta, value Gorilla (docs/storage.md, "Codecs"; the
    # stored float column is float_value since values are kept as decimals where they can be).
    q = "SELECT name, compression_codec AS c FROM system.columns WHERE database = 'ki' AND table = 'samples'"
    with EmbeddedStore(tmp_path / "d", cache_bytes=0) as store:
        store.command("ALTER TABLE ki.samples MODIFY COLUMN ts CODEC(DoubleDelta, ZSTD(3))")
        store.command("ALTER TABLE ki.samples MODIFY COLUMN float_value CODEC(Gorilla, ZSTD(3))")
        b = SampleBuilder()
        start = int(time.time() * 1000) - 60_000
        for i in range(300):
            b.add({"__name__": "m", "s": str(i % 3)}, start + i * 100, i * 0.1)
        store.insert_samples(b.build())
        codecs = {r["name"]: r["c"] for r in store.query(q).to_pylist()}
        assert "Gorilla" in codecs["float_value"]
        assert "DoubleDelta" in codecs["ts"]
    with EmbeddedStore(tmp_path / "d", cache_bytes=0) as store:
        codecs = {r["name"]: r["c"] for r in store.query(q).to_pylist()}
        assert codecs["float_value"] == "CODEC(Delta(8), ZSTD(3))"
        assert codecs["ts"] == "CODEC(Delta(8), ZSTD(3))"
        # Metadata only: no mutation rewrote the part written under the old codecs.
        assert store.query("SELECT count() AS n FROM system.mutations WHERE database = 'ki'").to_pylist() == [
            {"n": 0}
        ]
        read = "SELECT value FROM ki.samples ORDER BY ts"
        assert store.query(read).column("value").to_pylist() == [i * 0.1 for i in range(300)]
        store.optimize("samples")  # the merge writes the rows again under the new codecs
        assert store.query(read).column("value").to_pylist() == [i * 0.1 for i in range(300)]


def test_small_parts_are_one_packed_file_and_older_stores_get_the_setting(tmp_path):
    # Each file of a part takes at least a 4 KiB block: ~13 files made a 28-row part 52 KiB of du.
    q = "SELECT create_table_query AS q FROM system.tables WHERE database = 'ki' AND name = 'samples'"
    with EmbeddedStore(tmp_path / "d", cache_bytes=0) as store:
        store.command("ALTER TABLE ki.samples RESET SETTING min_bytes_for_full_part_storage")
        assert "min_bytes_for_full_part_storage" not in store.query(q).to_pylist()[0]["q"]
    with EmbeddedStore(tmp_path / "d", cache_bytes=0) as store:
        assert f"min_bytes_for_full_part_storage = {1 << 20}" in store.query(q).to_pylist()[0]["q"]
        b = SampleBuilder()
        for i in range(28):
            b.add({"__name__": "ki_agent_up", "agent": str(i)}, int(time.time() * 1000), 1.0)
        store.insert_samples(b.build())
        (path,) = (
            store.query(
                "SELECT path FROM system.parts WHERE active AND database = 'ki' AND table = 'samples'"
            )
            .column("path")
            .to_pylist()
        )
        assert sorted(os.listdir(path)) == ["data.packed"]
        assert store.query("SELECT count() AS n, sum(value) AS v FROM ki.samples").to_pylist() == [
            {"n": 28, "v": 28.0}
        ]


@pytest.mark.parametrize("table", sorted(EMBEDDED_TABLE_SETTINGS))
def test_the_embedded_busy_tables_merge_with_a_wider_base(tmp_path, table):
    """EMBEDDED_TABLE_SETTINGS (kernel_spans, samples): new stores get them, and so do stores made before them."""
    q = f"SELECT create_table_query AS q FROM system.tables WHERE database = 'ki' AND name = '{table}'"
    assert EMBEDDED_TABLE_SETTINGS[table]
    with EmbeddedStore(tmp_path / "d", cache_bytes=0) as store:
        for name, value in EMBEDDED_TABLE_SETTINGS[table].items():
            assert f"{name} = {value}" in store.query(q).to_pylist()[0]["q"]
        for name in EMBEDDED_TABLE_SETTINGS[table]:
            store.command(f"ALTER TABLE ki.{table} RESET SETTING {name}")
            assert name not in store.query(q).to_pylist()[0]["q"]
    with EmbeddedStore(tmp_path / "d", cache_bytes=0) as store:
        ddl = store.query(q).to_pylist()[0]["q"]
        for name, value in EMBEDDED_TABLE_SETTINGS[table].items():
            assert f"{name} = {value}" in ddl
