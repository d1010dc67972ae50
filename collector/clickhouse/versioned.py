"""Small versioned tables beside the data: the key and token stores' records, rule-group leases.

Each row carries a ``version``; the newest wins (ReplacingMergeTree folds old rows away). The
statements are here; collector/private_json.py and rules/lease.py call them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kernel_insight.collector.clickhouse.sql import Params, ident, literal, qualified

if TYPE_CHECKING:
    from kernel_insight.collector.clickhouse.store import Store

__all__ = ["latest_docs", "latest_lease_term", "replacing_table_ddl", "versioned_table_ddl"]


def replacing_table_ddl(
    store: Store, table: str, columns: str, order_by: str, comment: str, *, dedup_window: int | None = None
) -> str:
    """``CREATE TABLE IF NOT EXISTS`` for a small table whose rows carry a ``version``; the newest wins.

    On a cluster the table is replicated to every node and not sharded (the same ZooKeeper
    path for all shards): every collector reads it whole from whichever node it talks to.
    ``dedup_window`` keeps that many insert tokens (so a repeated insert is dropped).
    """
    if store.cluster is None:
        engine, on_cluster, window = "ReplacingMergeTree(version)", "", "non_replicated_deduplication_window"
    else:
        path = literal(f"/clickhouse/tables/all/{store.database}/{table}")
        engine = f"ReplicatedReplacingMergeTree({path}, '{{replica}}', version)"
        on_cluster, window = f" ON CLUSTER {ident(store.cluster)}", "replicated_deduplication_window"
    settings = f" SETTINGS {window} = {int(dedup_window)}" if dedup_window is not None else ""
    return (
        f"CREATE TABLE IF NOT EXISTS {qualified(store.database, table)}{on_cluster} ({columns}) ENGINE = {engine} "
        f"ORDER BY {order_by}{settings} COMMENT {literal(comment)}"
    )


def versioned_table_ddl(store: Store, table: str, key: str, comment: str) -> str:
    """The DDL of a small (key, version, doc) table where the newest version of a key wins."""
    return replacing_table_ddl(
        store, table, f"{ident(key)} String, version UInt64, doc String", ident(key), comment
    )


def latest_docs(store: Store, table: str, key: str) -> list[dict[str, Any]]:
    """Each key's newest row of a (key, version, doc) table: ``key``, ``v`` (its version), ``doc``."""
    k = ident(key)
    return store.query_rows(
        f"SELECT {k}, max(version) AS v, argMax(doc, version) AS doc FROM {qualified(store.database, table)}"
        f" GROUP BY {k}"
    )


def latest_lease_term(store: Store, table: str, group_key: str) -> dict[str, Any] | None:
    """The newest term of ``group_key``'s lease (``term``, ``holder``, ``expires``), or None."""
    p = Params()
    rows = store.query_rows(
        f"SELECT term, argMax(holder, version) AS holder, argMax(expires_ms, version) AS expires "
        f"FROM {qualified(store.database, table)} WHERE group_key = {p(group_key, 'String')} "
        f"GROUP BY term ORDER BY term DESC LIMIT 1",
        p,
    )
    return rows[0] if rows else None
