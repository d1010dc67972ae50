"""The generated DDL: committed deploy files are current, and the layouts say what docs/storage.md says."""

from __future__ import annotations

from pathlib import Path

from kernel_insight.collector.clickhouse.schema import (
    SCHEMA,
    Retention,
    cluster_ddl,
    codec_matches,
    single_ddl,
    write_deploy_files,
)

ROOT = Path(__file__).resolve().parents[2]


def test_committed_deploy_files_equal_the_generator_output(tmp_path):
    for path in write_deploy_files(tmp_path):
        committed = ROOT / "deploy" / "clickhouse" / path.name
        assert committed.read_text() == path.read_text(), (
            f"{committed} is stale: run ki schema --write deploy/clickhouse"
        )


def test_cluster_layout_is_replicated_local_tables_behind_distributed():
    ddl = cluster_ddl(cluster="prod")
    for t in SCHEMA:
        local = next(s for s in ddl if f"ki.{t.name}_local ON CLUSTER" in s)
        assert "ENGINE = Replicated" in local
        assert f"'/clickhouse/tables/{{shard}}/ki/{t.name}_local', '{{replica}}'" in local
        dist = next(s for s in ddl if f"ki.{t.name} ON CLUSTER" in s)
        assert f"Distributed('prod', 'ki', '{t.name}_local', {t.sharding_key})" in dist


def test_samples_table_uses_codecs_day_partitions_and_ttl():
    samples = next(s for s in single_ddl(retention=Retention(samples_days=12)) if "ki.samples\n" in s)
    assert "ts DateTime64(3, 'UTC') CODEC(Delta, ZSTD(3))" in samples
    assert "value Float64 CODEC(Delta, ZSTD(3))" in samples
    assert "PARTITION BY toDate(ts)" in samples
    assert "TTL toDateTime(ts) + INTERVAL 12 DAY" in samples
    assert "ORDER BY (metric, fingerprint, ts)" in samples


def test_zero_retention_means_no_ttl():
    spans = next(s for s in single_ddl(retention=Retention(spans_days=0)) if "ki.kernel_spans\n" in s)
    assert "TTL" not in spans


def test_cluster_ddl_parses_in_the_real_engine(tmp_path):
    # No Keeper here, so the cluster DDL cannot run; ClickHouse's own parser still checks every statement.
    from kernel_insight.collector.clickhouse.store import EmbeddedStore, quote

    with EmbeddedStore(tmp_path / "d") as store:
        for statement in cluster_ddl(cluster="prod"):
            formatted = store.query(f"SELECT formatQuery({quote(statement)}) AS q").column("q")[0].as_py()
            assert "ON CLUSTER prod" in formatted


def test_codec_matches_reads_the_engines_spelling():
    assert codec_matches("Delta, ZSTD(3)", "CODEC(Delta(8), ZSTD(3))")
    assert codec_matches("DoubleDelta, ZSTD(1)", "CODEC(DoubleDelta, ZSTD(1))")
    assert not codec_matches("Delta, ZSTD(3)", "CODEC(DoubleDelta, ZSTD(3))")
    assert not codec_matches("Delta, ZSTD(3)", "CODEC(Delta(8), ZSTD(1))")
    assert not codec_matches("Delta, ZSTD(3)", "CODEC(Delta(8))")
    assert not codec_matches("Gorilla, ZSTD(3)", "")
