"""Bring a store's tables to the schema (collector/clickhouse/schema.py): create the missing ones,
add columns and codecs a newer version has, migrate older layouts, and set TTLs and merge settings.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING

from kernel_insight.collector.clickhouse.schema import (
    MERGE_SETTINGS,
    SCHEMA,
    cluster_ddl,
    codec_matches,
    single_ddl,
)
from kernel_insight.collector.clickhouse.sql import Params, ident, qualified
from kernel_insight.kql.errors import StorageError

if TYPE_CHECKING:
    from kernel_insight.collector.clickhouse.store import Store

__all__ = ["sync_schema"]

_TTL_DAYS_RE = re.compile(r"\bTTL\b.*?toIntervalDay\((\d+)\)", re.DOTALL)


def sync_schema(store: Store, table_settings: Mapping[str, Mapping[str, int]]) -> None:
    """Create missing tables and bring their TTLs to the configured retention.

    With ``cluster`` set, the replicated ``*_local`` tables and the Distributed tables over
    them are created ON CLUSTER (deploy/clickhouse/README.md); reads and writes are unchanged.
    """
    if store.cluster is None:
        statements = single_ddl(store.database, store.retention, table_settings)
        suffix, on_cluster = "", ""
    else:
        statements = cluster_ddl(store.database, store.cluster, store.retention)
        suffix, on_cluster = "_local", f" ON CLUSTER {ident(store.cluster)}"
    _migrate_samples_without_metric(store, table_settings, suffix)
    for statement in statements:
        store.command(statement)
    # ALTER only where the retention changed: MODIFY TTL re-evaluates every part of the table.
    p = Params()
    current = {
        row["name"]: row["q"]
        for row in store.query(
            f"SELECT name, create_table_query AS q FROM system.tables WHERE database = {p(store.database, 'String')}",
            p,
        ).to_pylist()
    }
    _migrate_samples_value(store, suffix, on_cluster)
    _add_missing_columns(store, suffix, on_cluster)
    _update_codecs(store, suffix, on_cluster)
    for t in SCHEMA:
        # Tables made before MERGE_SETTINGS (or this back end's own settings) existed, or with other
        # values, get them (docs/storage.md, "Merges").
        ddl = current.get(t.name + suffix)
        missing = {
            k: v
            for k, v in {**MERGE_SETTINGS, **table_settings.get(t.name, {})}.items()
            if ddl is not None and not re.search(rf"\b{k} = {v}(?![\w.])", ddl)
        }
        if missing:
            assignments = ", ".join(f"{k} = {v}" for k, v in missing.items())
            store.command(
                f"ALTER TABLE {qualified(store.database, t.name + suffix)}{on_cluster} MODIFY SETTING {assignments}"
            )
        if t.ttl_column is None:
            continue
        found = _TTL_DAYS_RE.search(current.get(t.name + suffix, ""))
        have = int(found.group(1)) if found else 0
        want = t.ttl(store.retention)
        if have == t.ttl_days(store.retention):
            continue
        name = f"{qualified(store.database, t.name + suffix)}{on_cluster}"
        store.command(f"ALTER TABLE {name} MODIFY TTL {want}" if want else f"ALTER TABLE {name} REMOVE TTL")


def _add_missing_columns(store: Store, suffix: str, on_cluster: str) -> None:
    """Columns a newer version added to a table (at its end) are added to a store made before
    them: ``ADD COLUMN`` only changes metadata, and old rows read the column's default."""
    have: dict[str, set[str]] = {}
    p = Params()
    for row in store.query(
        f"SELECT table, name FROM system.columns WHERE database = {p(store.database, 'String')}", p
    ).to_pylist():
        have.setdefault(row["table"], set()).add(row["name"])
    for t in SCHEMA:
        table = t.name + suffix
        if table not in have:
            continue
        for column in t.columns:
            if column.name in have[table]:
                continue
            targets = (
                [table] if store.cluster is None else [table, t.name]
            )  # the local and Distributed tables
            for target in targets:
                store.command(
                    f"ALTER TABLE {qualified(store.database, target)}{on_cluster} ADD COLUMN IF NOT EXISTS {column.sql()}"
                )


def _update_codecs(store: Store, suffix: str, on_cluster: str) -> None:
    """A column whose codec a newer version changed gets it: ``MODIFY COLUMN ... CODEC`` only
    changes metadata, so existing parts stay as written (and readable) and are re-encoded when
    merges rewrite them; new parts use the new codec at once (docs/storage.md, "Codecs")."""
    have: dict[tuple[str, str], str] = {}
    p = Params()
    for row in store.query(
        "SELECT table, name, compression_codec AS codec FROM system.columns "
        f"WHERE database = {p(store.database, 'String')}",
        p,
    ).to_pylist():
        have[(row["table"], row["name"])] = row["codec"]
    for t in SCHEMA:
        table_name = t.name + suffix
        for column in t.columns:
            current = have.get((table_name, column.name))
            if column.codec is None or current is None or codec_matches(column.codec, current):
                continue
            store.command(
                f"ALTER TABLE {qualified(store.database, table_name)}{on_cluster} "
                f"MODIFY COLUMN {ident(column.name)} CODEC({column.codec})"
            )


def _migrate_samples_value(store: Store, suffix: str, on_cluster: str) -> None:
    """Stores made before values were kept as decimals (``mantissa``, ``scale``): their stored
    ``value`` column becomes ``float_value`` (``RENAME COLUMN``: metadata and file names, no
    data rewritten), and ``_add_missing_columns`` then adds the decimal columns and ``value``
    as their ALIAS. Parts written before read ``scale`` as its default, -1, so their values
    come from ``float_value`` as they were; a merge writes them out with ``scale`` -1."""
    table = f"samples{suffix}"
    p = Params()
    kinds = {
        str(row["name"]): str(row["default_kind"])
        for row in store.query(
            "SELECT name, default_kind FROM system.columns "
            f"WHERE database = {p(store.database, 'String')} AND table = {p(table, 'String')}",
            p,
        ).to_pylist()
    }
    if kinds.get("value") != "" or "float_value" in kinds:
        return  # no table yet, or already migrated (value is the ALIAS)
    targets = [table] if store.cluster is None else [table, "samples"]  # local and Distributed
    for target in targets:
        store.command(
            f"ALTER TABLE {qualified(store.database, target)}{on_cluster} RENAME COLUMN value TO float_value"
        )


def _migrate_samples_without_metric(
    store: Store, table_settings: Mapping[str, Mapping[str, int]], suffix: str
) -> None:
    """Stores made before samples were ordered by metric: move the old table aside, so the
    new one is created, and copy its rows over with the metric from the series index."""
    table = f"samples{suffix}"
    p = Params()
    columns = (
        store.query(
            f"SELECT name FROM system.columns WHERE database = {p(store.database, 'String')} "
            f"AND table = {p(table, 'String')}",
            p,
        )
        .column("name")
        .to_pylist()
    )
    if not columns or "metric" in columns:
        return
    if store.cluster is not None:
        raise StorageError(
            f"{store.database}.{table} has the layout of an older version (no metric column); "
            "migrate it on the cluster first (docs/storage.md, 'Upgrading')"
        )
    old = qualified(store.database, "samples_before_metric")
    store.command(f"RENAME TABLE {qualified(store.database, 'samples')} TO {old}")
    for statement in single_ddl(store.database, store.retention, table_settings):
        store.command(statement)
    store.command(
        f"INSERT INTO {qualified(store.database, 'samples')} (metric, fingerprint, ts, float_value) "
        f"SELECT m.metric, o.fingerprint, o.ts, o.value FROM {old} AS o "
        f"INNER JOIN (SELECT DISTINCT fingerprint, metric FROM {qualified(store.database, 'series')}) AS m "
        "ON o.fingerprint = m.fingerprint"
    )
    store.command(f"DROP TABLE {old}")
