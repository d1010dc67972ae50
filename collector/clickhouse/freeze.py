"""The statements of a backup and its restore: freezing tables, reading their parts, attaching them.

collector/backup.py lays out the files; the statements it needs are here (docs/backup.md).
``frozen_*`` run on a store; ``restore_*`` on the chDB session a restore opens on an empty
data directory (``session.query(sql, fmt)``), before any store exists there.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from kernel_insight.collector.clickhouse.sql import Params, ident

if TYPE_CHECKING:
    from kernel_insight.collector.clickhouse.store import Store

__all__ = [
    "create_statement_prefix",
    "freeze_table",
    "mergetree_tables",
    "part_rows",
    "restore_attach_part",
    "restore_count",
    "restore_create_database",
    "restore_data_path",
]


def create_statement_prefix(database: str, table: str) -> str:
    """How the engine's ``create_table_query`` of ``database.table`` starts (a manifest's check)."""
    return f"CREATE TABLE {database}.{table} "


def mergetree_tables(store: Store) -> list[dict[str, Any]]:
    """The store's MergeTree tables by name: ``name``, its ``CREATE`` statement ``q``, ``paths``."""
    p = Params()
    return store.query_rows(
        "SELECT name, create_table_query AS q, data_paths AS paths FROM system.tables "
        f"WHERE database = {p(store.database, 'String')} AND engine LIKE '%MergeTree' ORDER BY name",
        p,
    )


def freeze_table(store: Store, table: str, name: str) -> None:
    """Hard-link the table's parts under ``shadow/<name>`` (``name``: a plain word)."""
    store.command(f"ALTER TABLE {ident(store.database)}.{ident(table)} FREEZE WITH NAME '{name}'")


def part_rows(store: Store, table: str) -> dict[str, int]:
    """Each part of the table and its rows, now (a part merged away stays listed a while)."""
    p = Params()
    return {
        r["name"]: int(r["rows"])
        for r in store.query_rows(
            "SELECT name, rows FROM system.parts "
            f"WHERE database = {p(store.database, 'String')} AND table = {p(table, 'String')}",
            p,
        )
    }


def restore_create_database(session: Any, database: str) -> None:
    session.query(f"CREATE DATABASE IF NOT EXISTS {ident(database)}")


def restore_data_path(session: Any, database: str, table: str) -> str:
    """The table's data directory (names checked plain by the manifest)."""
    paths = json.loads(
        str(
            session.query(
                f"SELECT data_paths FROM system.tables WHERE database = '{database}' AND name = '{table}'",
                "JSONCompactEachRow",
            )
        ).strip()
    )[0]
    return str(paths[0])


def restore_attach_part(session: Any, database: str, table: str, part: str) -> None:
    """Attach ``part`` from the table's ``detached/`` directory."""
    session.query(f"ALTER TABLE {ident(database)}.{ident(table)} ATTACH PART '{part}'")


def restore_count(session: Any, database: str, table: str) -> int:
    return int(str(session.query(f"SELECT count() FROM {ident(database)}.{ident(table)}", "CSV")).strip())
