"""Ingest groups: batches prepared as Arrow tables (``PreparedRows``), the order a group's tables
are written in, and the group's write-ahead files (collector/ingest_wal.py): what a file holds,
what a backup keeps of a group in flight, and the replay at open."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa  # type: ignore[import-untyped]

from kernel_insight.collector.clickhouse.arrow_rows import concat
from kernel_insight.collector.clickhouse.errors import StorageUnavailable
from kernel_insight.collector.ingest_wal import IngestWal, WalCorrupt, WalGroup
from kernel_insight.collector.rows import SampleBatch
from kernel_insight.kql.errors import StorageError

__all__ = ["GROUP_ORDER", "TEST_KILL_AFTER_TABLE_ENV", "PreparedRows", "batches_rows"]

log = logging.getLogger(__name__)

#: The order a group's tables are written in (``Store.insert_prepared``); the ``batches`` rows
#: come after all of them, since they vouch that everything before them landed.
GROUP_ORDER = ("series", "samples", "histograms", "kernel_spans", "gpu_calls", "events", "instances")
#: A test hook, never set in production: a process started with this variable naming a table of
#: ``GROUP_ORDER`` SIGKILLs itself right after that table of a group of two or more recorded
#: batches landed, before the group's ``batches`` rows: the one place where an agent's retry
#: (a new group, a new token) would store rows twice without the write-ahead file
#: (tests/collector/test_ingest_wal.py kills ``ki collector`` exactly there). Read once, at import.
TEST_KILL_AFTER_TABLE_ENV = "KI_TEST_KILL_AFTER_GROUP_TABLE"
TEST_KILL_AFTER_TABLE = os.environ.get(TEST_KILL_AFTER_TABLE_ENV) or None


@dataclass(slots=True)
class PreparedRows:
    """One batch's rows as Arrow tables (``Store.prepare``), ready to be written with others.

    Converting is done in the caller's thread, batch by batch, so a value the schema cannot
    hold refuses its own batch and never a group; ``Store.insert_prepared`` then writes any
    number of them with one insert per table.
    """

    batch_id: str
    agent_id: str = ""
    tables: dict[str, pa.Table] = field(default_factory=dict)
    rows: int = 0
    metric_names: list[str] = field(default_factory=list)
    metric_codes: np.ndarray[Any, Any] | None = None
    ts_ms: np.ndarray[Any, Any] | None = None
    series_keys: list[tuple[int, int]] = field(default_factory=list)
    histogram_metrics: list[str] = field(default_factory=list)
    #: The batch's metrics when it carries start timestamps (``Store.start_timestamp_metrics``).
    start_timestamp_metrics: list[str] = field(default_factory=list)
    #: Whether the batch id is looked up in and written to the ``batches`` table. False for ids
    #: no sender can send again (remote_write's fresh ``rw:<uuid>``): nothing to deduplicate, so
    #: a group of them costs no ``batches_seen`` query and no ``batches`` insert.
    record: bool = True
    #: The batch's float samples for the head (``Store.head``), once they are written.
    samples: SampleBatch | None = None


def batches_rows(recorded: Sequence[PreparedRows]) -> pa.Table:
    """The ``batches`` rows of a group's recorded batches (written last, ``Store.insert_prepared``)."""
    now_ms = time.time_ns() // 1_000_000
    return pa.table(
        {
            "batch_id": pa.array([p.batch_id for p in recorded], pa.string()),
            "agent_id": pa.array([p.agent_id for p in recorded], pa.string()),
            "received": pa.array([now_ms] * len(recorded), pa.timestamp("ms", tz="UTC")),
            "rows": pa.array([p.rows for p in recorded], pa.uint64()),
        }
    )


def wal_tables(
    group: Sequence[PreparedRows], done: set[str], new_series: Callable[[list[pa.Table]], pa.Table | None]
) -> dict[str, pa.Table]:
    """What a group's write-ahead file holds: its tables not yet in ``done`` (``new_series``: the
    series rows not written before) and its ``batches`` rows."""
    tables: dict[str, pa.Table] = {}
    for name in GROUP_ORDER:
        parts = [p.tables[name] for p in group if name in p.tables]
        if not parts or name in done:
            continue
        # The rows insert_prepared is about to write, so a replay's insert is the same block
        # under the same token (series: the pairs not written before, as it chooses them).
        data = new_series(parts) if name == "series" else concat(parts)
        if data is not None:
            tables[name] = data
    tables["batches"] = batches_rows([p for p in group if p.record])
    return tables


def groups_left(logged: dict[Path, set[str]]) -> list[WalGroup]:
    """Each logged group (its file -> its done set) as what it has left to write."""
    groups: list[WalGroup] = []
    for path, done in list(logged.items()):
        try:
            group = IngestWal.read(path)
        except (OSError, WalCorrupt) as exc:
            raise StorageError(f"cannot read the ingest write-ahead file {path} for a backup: {exc}") from exc
        left = {name: table for name, table in group.tables.items() if name not in done}
        if left:
            groups.append(WalGroup(path, group.token, left))
    return groups


def replay(
    wal: IngestWal,
    batches_seen: Callable[[Sequence[str]], set[str]],
    insert_table: Callable[..., None],
) -> int:
    """Store each group left in ``wal`` (``Store.replay_ingest_wal``); the number replayed."""
    replayed = 0
    known = {*GROUP_ORDER, "batches"}
    for path in wal.pending():
        try:
            group = wal.read(path)
        except (WalCorrupt, OSError) as exc:
            wal.set_aside(path, str(exc))
            continue
        strange = sorted(set(group.tables) - known)
        batches = group.tables.get("batches")
        if strange or batches is None or list(group.tables)[-1] != "batches":
            wal.set_aside(path, f"not an ingest group (tables {list(group.tables)})")
            continue
        ids = {str(b) for b in batches.column("batch_id").to_pylist()}
        seen = batches_seen(sorted(ids))
        if seen == ids:
            wal.remove(path)  # the group had finished; its file's removal had not reached the disk
            continue
        if seen:
            wal.set_aside(path, f"{len(seen)} of its {len(ids)} batches are stored already, e.g. {min(seen)}")
            continue
        try:
            for name, table in group.tables.items():
                insert_table(name, table, dedup_token=f"{group.token}:{name}")
        except StorageUnavailable:
            raise
        except (StorageError, ValueError) as exc:
            wal.set_aside(path, f"storage refused it: {exc}")
            continue
        wal.remove(path)
        replayed += 1
        log.warning(
            "ingest WAL: replayed group %s (%d batches) that an earlier process had not finished",
            group.token,
            len(ids),
        )
    return replayed
