"""The health snapshot's reads that are not kql's: instances, latency quantiles, events, series labels.

api/health/source.py calls these; each returns the rows as dicts (docs/api.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from kernel_insight.collector.clickhouse.sql import Params, ms_time, qualified

if TYPE_CHECKING:
    from kernel_insight.collector.clickhouse.store import Store

__all__ = [
    "event_counts",
    "instance_rows",
    "instance_series_labels",
    "quantiles_by_instance",
    "recent_events",
]


def instance_rows(store: Store) -> list[dict[str, Any]]:
    """Every enrolled instance's newest row, ``last_seen`` as ``last_seen_ms``."""
    return store.query_rows(
        "SELECT id, hardware_fingerprint, gpu_count, gpu_model, memory_total_bytes, labels, attributes,"
        f" toUnixTimestamp64Milli(last_seen) AS last_seen_ms FROM {qualified(store.database, 'instances')} FINAL"
    )


def _series(store: Store, p: Params, metrics: Sequence[str], start_ms: int, now_ms: int) -> str:
    return (
        "SELECT DISTINCT fingerprint, metric, labels['instance'] AS instance"
        f" FROM {qualified(store.database, 'series')}"
        f" WHERE metric IN {p(list(metrics), 'Array(String)')}"
        f" AND date >= toDate({ms_time(start_ms)}) AND date <= toDate({ms_time(now_ms)})"
    )


def _has_series(store: Store, metric: str, start_ms: int, now_ms: int) -> bool:
    """Whether ``metric`` has a series row on a day between ``start_ms`` and ``now_ms`` (the days
    the join of :func:`quantiles_by_instance` reads)."""
    p = Params()
    return bool(
        store.query_rows(
            f"SELECT 1 AS found FROM {qualified(store.database, 'series')}"
            f" WHERE metric = {p(metric, 'String')}"
            f" AND date >= toDate({ms_time(start_ms)}) AND date <= toDate({ms_time(now_ms)}) LIMIT 1",
            p,
        )
    )


def quantiles_by_instance(store: Store, metric: str, start_ms: int, now_ms: int) -> list[dict[str, Any]]:
    """Per ``instance`` label: p50, p90, p99 (``q``) and the count (``n``) of ``metric``'s finite
    samples in ``[start_ms, now_ms]``. The samples key leads with metric, so the ``s.metric``
    filter skips every other metric's granules.

    The join is asked only once a series of ``metric`` has a row in the window's days: the engine
    sets a join up even over no rows, and a fleet whose senders have no such series (remote_write
    of host metrics alone) would pay that setup at every snapshot rebuild (bench/results/fleet.md).
    An inner join whose right side is empty answers no rows, so skipping it changes no answer."""
    if not _has_series(store, metric, start_ms, now_ms):
        return []
    p = Params()
    return store.query_rows(
        "SELECT f.instance AS instance, quantilesExactInclusive(0.5, 0.9, 0.99)(s.value) AS q, count() AS n"
        f" FROM {qualified(store.database, 'samples')} AS s"
        f" INNER JOIN ({_series(store, p, [metric], start_ms, now_ms)}) AS f ON s.fingerprint = f.fingerprint"
        f" WHERE s.ts >= {ms_time(start_ms)} AND s.ts <= {ms_time(now_ms)}"
        f" AND s.metric IN {p([metric], 'Array(String)')} AND isFinite(s.value) GROUP BY instance",
        p,
    )


def event_counts(store: Store, since_ms: int) -> list[dict[str, Any]]:
    """Events since ``since_ms`` counted by ``instance`` and ``kind`` (``n``)."""
    return store.query_rows(
        f"SELECT instance, kind, count() AS n FROM {qualified(store.database, 'events')}"
        f" WHERE ts >= {ms_time(since_ms)} GROUP BY instance, kind"
    )


def instance_series_labels(store: Store, metric: str, start_ms: int, now_ms: int) -> list[dict[str, Any]]:
    """Per ``instance`` label, the labels (``l``) of its lowest-fingerprint ``metric`` series with
    samples between the days of ``start_ms`` and ``now_ms``."""
    p = Params()
    return store.query_rows(
        "SELECT labels['instance'] AS instance, argMin(labels, fingerprint) AS l"
        f" FROM {qualified(store.database, 'series')} WHERE metric = {p(metric, 'String')}"
        f" AND date >= toDate({ms_time(start_ms)}) AND date <= toDate({ms_time(now_ms)})"
        " AND labels['instance'] != '' GROUP BY instance",
        p,
    )


def recent_events(store: Store, instance: str, limit: int) -> list[dict[str, Any]]:
    """The instance's newest ``limit`` events, newest first (``ts`` as ``ts_ms``)."""
    p = Params()
    return store.query_rows(
        "SELECT toUnixTimestamp64Milli(ts) AS ts_ms, gpu, kind, code, message"
        f" FROM {qualified(store.database, 'events')} WHERE instance = {p(instance, 'String')}"
        f" ORDER BY ts DESC LIMIT {int(limit)}",
        p,
    )
