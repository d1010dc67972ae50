"""Capture windows: an admin asks one agent to ship every kernel span of one GPU for N seconds.

Server side only: the request is stored as a pending row of ``capture_requests`` (also the
audit record: who asked, when); how it will reach the agent is in docs/wire.md.
"""

from __future__ import annotations

import secrets
import time
from typing import TYPE_CHECKING, Any

import pyarrow as pa  # type: ignore[import-untyped]

from kernel_insight.collector.store import quote

if TYPE_CHECKING:
    from kernel_insight.collector.store import Store

__all__ = ["MAX_CAPTURE_SECONDS", "CaptureError", "pending_captures", "request_capture"]

#: The longest capture window: at 100k kernels/s, 60 s is 6M spans (about 70 MB on disk).
MAX_CAPTURE_SECONDS = 60
#: Pending requests one instance may hold; more are refused until the agent takes some.
MAX_PENDING = 16


class CaptureError(ValueError):
    """A request the caller must fix (the API answers 400, or 404 for an unknown instance)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def pending_captures(store: Store, instance: str) -> list[dict[str, Any]]:
    """The instance's pending capture requests, oldest first."""
    rows = store.query(
        "SELECT id, instance, gpu, seconds, state, toUnixTimestamp64Milli(requested) AS requested_ms, token_name"
        f" FROM {store.database}.capture_requests FINAL"
        f" WHERE instance = {quote(instance)} AND state = 'pending' ORDER BY requested_ms, id"
    ).to_pylist()
    return [
        {
            "id": r["id"],
            "instance": r["instance"],
            "gpu": int(r["gpu"]),
            "seconds": int(r["seconds"]),
            "state": r["state"],
            "requested_ms": int(r["requested_ms"]),
            "requested_by": r["token_name"],
        }
        for r in rows
    ]


def request_capture(
    store: Store, instance: str, gpu: int, seconds: int, *, token_id: str, token_name: str
) -> dict[str, Any]:
    """Store a pending capture request for ``instance``'s GPU and return it (raises CaptureError)."""
    if not 1 <= seconds <= MAX_CAPTURE_SECONDS:
        raise CaptureError(f"seconds must be 1..{MAX_CAPTURE_SECONDS}, got {seconds}")
    if not 0 <= gpu <= 65535:
        raise CaptureError(f"gpu must be 0..65535, got {gpu}")
    known = store.query(
        f"SELECT gpu_count FROM {store.database}.instances FINAL WHERE id = {quote(instance)}"
    ).to_pylist()
    if not known:
        raise CaptureError(f"no instance {instance!r}: it has never reported", 404)
    gpus = int(known[0]["gpu_count"])
    if gpus and gpu >= gpus:
        raise CaptureError(f"instance {instance!r} has {gpus} GPUs (0..{gpus - 1}); no GPU {gpu}")
    if len(pending_captures(store, instance)) >= MAX_PENDING:
        raise CaptureError(f"instance {instance!r} already has {MAX_PENDING} pending captures; wait for them")
    now_ms = int(time.time() * 1000)
    row = {
        "id": secrets.token_hex(8),
        "instance": instance,
        "gpu": gpu,
        "seconds": seconds,
        "state": "pending",
        "requested": now_ms,
        "updated": now_ms,
        "token_id": token_id,
        "token_name": token_name,
    }
    store.insert_table(
        "capture_requests",
        pa.table(
            {
                "id": pa.array([row["id"]], pa.string()),
                "instance": pa.array([instance], pa.string()),
                "gpu": pa.array([gpu], pa.uint16()),
                "seconds": pa.array([seconds], pa.uint32()),
                "state": pa.array(["pending"], pa.string()),
                "requested": pa.array([now_ms], pa.timestamp("ms", tz="UTC")),
                "updated": pa.array([now_ms], pa.timestamp("ms", tz="UTC")),
                "token_id": pa.array([token_id], pa.string()),
                "token_name": pa.array([token_name], pa.string()),
            }
        ),
    )
    return {
        "id": row["id"],
        "instance": instance,
        "gpu": gpu,
        "seconds": seconds,
        "state": "pending",
        "requested_ms": now_ms,
        "requested_by": token_name,
    }
