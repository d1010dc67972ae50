"""Reads of ``capture_requests`` (the newest version of each request, ``FINAL``) and of an instance's
GPU count, for collector/captures.py. Rows come back with ``requested``/``updated`` as
``*_ms`` and the window as ``window_*_ns`` (docs/wire.md, "Capture windows in the ingest response")."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kernel_insight.collector.clickhouse.sql import Params, qualified

if TYPE_CHECKING:
    from kernel_insight.collector.clickhouse.store import Store

__all__ = [
    "capture_row",
    "instance_gpu_count",
    "newest_capture_rows",
    "open_capture_rows",
    "pending_capture_rows",
]

_COLUMNS = (
    "id, instance, gpu, seconds, state, toUnixTimestamp64Milli(requested) AS requested_ms,"
    " toUnixTimestamp64Milli(updated) AS updated_ms, token_id, token_name,"
    " toUnixTimestamp64Nano(window_start) AS window_start_ns, toUnixTimestamp64Nano(window_end) AS window_end_ns,"
    " spans"
)


def _rows(store: Store, where: str, p: Params, limit: int = 1000) -> list[dict[str, Any]]:
    """Requests matching ``where``, oldest first."""
    return list(
        store.query_rows(
            f"SELECT {_COLUMNS} FROM {qualified(store.database, 'capture_requests')} FINAL WHERE {where}"
            f" ORDER BY requested_ms, id LIMIT {int(limit)}",
            p,
        )
    )


def pending_capture_rows(store: Store, instance: str) -> list[dict[str, Any]]:
    """The instance's pending requests, oldest first."""
    p = Params()
    return _rows(store, f"instance = {p(instance, 'String')} AND state = 'pending'", p)


def open_capture_rows(store: Store, limit: int) -> list[dict[str, Any]]:
    """Every request not finished (pending, delivered, capturing), oldest first."""
    return _rows(store, "state IN ('pending', 'delivered', 'capturing')", Params(), limit)


def capture_row(store: Store, capture_id: str) -> dict[str, Any] | None:
    p = Params()
    rows = _rows(store, f"id = {p(capture_id, 'String')}", p, 1)
    return rows[0] if rows else None


def newest_capture_rows(store: Store, instance: str, state: str | None, limit: int) -> list[dict[str, Any]]:
    """The instance's newest ``limit`` requests in ``state`` (None: any), oldest first."""
    p = Params()
    where = f"instance = {p(instance, 'String')}" + (
        "" if state is None else f" AND state = {p(state, 'String')}"
    )
    return list(
        store.query_rows(
            f"SELECT * FROM (SELECT {_COLUMNS} FROM {qualified(store.database, 'capture_requests')} FINAL"
            f" WHERE {where} ORDER BY requested_ms DESC, id DESC LIMIT {int(limit)}) ORDER BY requested_ms, id",
            p,
        )
    )


def instance_gpu_count(store: Store, instance: str) -> int | None:
    """The instance's GPU count as it last reported it; None when it never reported."""
    p = Params()
    known = store.query_rows(
        f"SELECT gpu_count FROM {qualified(store.database, 'instances')} FINAL WHERE id = {p(instance, 'String')}",
        p,
    )
    return int(known[0]["gpu_count"]) if known else None
