"""Capture windows: an admin asks one agent to ship every kernel span of one GPU for N seconds.

The request is a ``pending`` row of ``capture_requests`` (also the audit record: who asked,
when). :class:`CaptureDesk` is the ingest path's side (docs/wire.md, "Capture windows"): it
offers each pending request to its agent in a ``KI-Capture`` answer header (the row becomes
``delivered``), hears back from the CAPTURES section of that agent's batches (``capturing``,
then ``done`` with the span count once the window's last batch is stored), and lets requests
nobody took expire (``expired``). Every change of state is a new row version.
"""

from __future__ import annotations

import logging
import re
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa  # type: ignore[import-untyped]

from kernel_insight.collector.clickhouse.capture_rows import (
    capture_row,
    instance_gpu_count,
    newest_capture_rows,
    open_capture_rows,
    pending_capture_rows,
)
from kernel_insight.collector.wire import CaptureReport

if TYPE_CHECKING:
    from kernel_insight.collector.clickhouse.store import Store

__all__ = [
    "CAPTURE_HEADER",
    "CAPTURE_STATES",
    "MAX_CAPTURE_SECONDS",
    "CaptureDesk",
    "CaptureError",
    "CaptureReport",
    "capture_header_value",
    "get_capture",
    "list_captures",
    "parse_capture_header",
    "pending_captures",
    "request_capture",
]

log = logging.getLogger("kernel_insight.collector.captures")

#: The answer header that hands a capture request to an agent (docs/wire.md).
CAPTURE_HEADER = "KI-Capture"
#: A request's states, in the order it goes through them (``expired`` ends any unfinished one).
CAPTURE_STATES = ("pending", "delivered", "capturing", "done", "expired")
#: The longest capture window: at 100k kernels/s, 60 s is 6M spans (about 70 MB on disk).
MAX_CAPTURE_SECONDS = 60
#: Pending requests one instance may hold; more are refused until the agent takes some.
MAX_PENDING = 16
#: Requests one ingest answer offers (oldest first); the rest go with the next answers.
OFFERS_PER_ANSWER = 4
#: A request no agent took within this long expires; one taken but never finished expires this
#: long after its window should have ended (an agent too old to report, or one that died).
EXPIRE_S = 600.0

_ID_RE = re.compile(r"^[0-9a-f]{16}$")
_HEADER_RE = re.compile(r"^([0-9a-f]{16});gpu=(\d{1,5});seconds=(\d{1,5})$")


class CaptureError(ValueError):
    """A request the caller must fix (the API answers 400, or 404 for an unknown instance)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def capture_header_value(capture_id: str, gpu: int, seconds: int) -> str:
    """``<id>;gpu=<n>;seconds=<s>``: one ``KI-Capture`` header value."""
    return f"{capture_id};gpu={gpu};seconds={seconds}"


def parse_capture_header(value: str) -> tuple[str, int, int]:
    """(id, gpu, seconds) from a ``KI-Capture`` value; ValueError when it is not one."""
    m = _HEADER_RE.match(value.strip())
    if m is None:
        raise ValueError(f"not a KI-Capture value: {value[:80]!r}")
    return m.group(1), int(m.group(2)), int(m.group(3))


def _public(r: dict[str, Any]) -> dict[str, Any]:
    """A row as the API shows it (the token's name, never its id)."""
    return {
        "id": r["id"],
        "instance": r["instance"],
        "gpu": int(r["gpu"]),
        "seconds": int(r["seconds"]),
        "state": r["state"],
        "requested_ms": int(r["requested_ms"]),
        "updated_ms": int(r["updated_ms"]),
        "requested_by": r["token_name"],
        "window_start_ns": int(r["window_start_ns"] or 0),
        "window_end_ns": int(r["window_end_ns"] or 0),
        "spans": int(r["spans"] or 0),
    }


def pending_captures(store: Store, instance: str) -> list[dict[str, Any]]:
    """The instance's pending capture requests, oldest first."""
    return [_public(r) for r in pending_capture_rows(store, instance)]


def list_captures(
    store: Store, instance: str, state: str | None = None, limit: int = 100
) -> list[dict[str, Any]]:
    """The instance's capture requests in ``state`` (None: any), newest ``limit`` of them, oldest first."""
    if state is not None and state not in CAPTURE_STATES:
        raise CaptureError(f"state must be one of {', '.join(CAPTURE_STATES)}, got {state!r}")
    return [_public(r) for r in newest_capture_rows(store, instance, state, limit)]


def get_capture(store: Store, capture_id: str) -> dict[str, Any]:
    """One request by id (raises CaptureError 404 when there is none)."""
    if not _ID_RE.match(capture_id):
        raise CaptureError(f"a capture id is 16 hex digits, got {capture_id[:40]!r}")
    row = capture_row(store, capture_id)
    if row is None:
        raise CaptureError(f"no capture {capture_id}", 404)
    return _public(row)


def _write(store: Store, rows: Sequence[dict[str, Any]]) -> None:
    """New versions of capture rows (every column; ``updated`` orders the versions)."""

    def col(name: str, kind: Any) -> Any:
        return pa.array([r[name] for r in rows], kind)

    ms, ns = pa.timestamp("ms", tz="UTC"), pa.timestamp("ns", tz="UTC")
    store.insert_table(
        "capture_requests",
        pa.table(
            {
                "id": col("id", pa.string()),
                "instance": col("instance", pa.string()),
                "gpu": col("gpu", pa.uint16()),
                "seconds": col("seconds", pa.uint32()),
                "state": col("state", pa.string()),
                "requested": col("requested_ms", ms),
                "updated": col("updated_ms", ms),
                "token_id": col("token_id", pa.string()),
                "token_name": col("token_name", pa.string()),
                "window_start": col("window_start_ns", ns),
                "window_end": col("window_end_ns", ns),
                "spans": col("spans", pa.uint64()),
            }
        ),
    )


def request_capture(
    store: Store, instance: str, gpu: int, seconds: int, *, token_id: str, token_name: str
) -> dict[str, Any]:
    """Store a pending capture request for ``instance``'s GPU and return it (raises CaptureError)."""
    if not 1 <= seconds <= MAX_CAPTURE_SECONDS:
        raise CaptureError(f"seconds must be 1..{MAX_CAPTURE_SECONDS}, got {seconds}")
    if not 0 <= gpu <= 65535:
        raise CaptureError(f"gpu must be 0..65535, got {gpu}")
    gpus = instance_gpu_count(store, instance)
    if gpus is None:
        raise CaptureError(f"no instance {instance!r}: it has never reported", 404)
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
        "requested_ms": now_ms,
        "updated_ms": now_ms,
        "token_id": token_id,
        "token_name": token_name,
        "window_start_ns": 0,
        "window_end_ns": 0,
        "spans": 0,
    }
    _write(store, [row])
    return _public(row)


class CaptureDesk:
    """The ingest path's side of capture windows: offer pending requests, hear back, expire.

    It keeps the unfinished requests of every instance in memory, re-read from the table at
    most every ``refresh_s`` (a request made through any collector of a cluster reaches the
    agent within that), so an ingest answer costs no query. Several collectors may offer
    the same request to one agent: the agent runs one window per id (docs/wire.md).

    Example::

        desk = CaptureDesk(store)
        ingest_router(keys, sink, captures=desk)
    """

    def __init__(
        self,
        store: Store,
        *,
        instance_of: Callable[[bytes], str] | None = None,
        refresh_s: float = 1.0,
        expire_s: float = EXPIRE_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self._instance_of = instance_of or (lambda agent_id: agent_id.hex())
        self._refresh_s = refresh_s
        self._expire_s = expire_s
        self._clock = clock
        self._lock = threading.Lock()
        self._open: dict[str, dict[str, Any]] = {}  # id -> row (every column), unfinished requests
        self._read_at = float("-inf")

    def _now_ms(self, row: dict[str, Any] | None = None) -> int:
        now = int(self._clock() * 1000)
        return max(now, int(row["updated_ms"]) + 1) if row is not None else now

    def _refresh(self) -> None:
        """Re-read the unfinished requests when the copy is older than refresh_s (lock held)."""
        now = self._clock()
        if now - self._read_at < self._refresh_s:
            return
        rows = open_capture_rows(self.store, 100_000)
        self._read_at = now
        self._open = {r["id"]: r for r in rows}
        expired = []
        for r in rows:
            limit_ms = self._expire_s * 1000 + (0 if r["state"] == "pending" else int(r["seconds"]) * 1000)
            if now * 1000 - int(r["requested_ms"]) > limit_ms:
                expired.append({**r, "state": "expired", "updated_ms": self._now_ms(r)})
                log.warning(
                    "capture %s of %s GPU %s expired while %s", r["id"], r["instance"], r["gpu"], r["state"]
                )
        if expired:
            _write(self.store, expired)
            for r in expired:
                self._open.pop(r["id"], None)

    def offers(self, agent_id: bytes) -> list[str]:
        """``KI-Capture`` values for an answer to ``agent_id`` (oldest first, at most 4); the offered
        requests become ``delivered``. Empty when the store cannot be read or written (the next
        answer offers them again)."""
        instance = self._instance_of(agent_id)
        with self._lock:
            try:
                self._refresh()
                mine = sorted(
                    (r for r in self._open.values() if r["instance"] == instance and r["state"] == "pending"),
                    key=lambda r: (int(r["requested_ms"]), r["id"]),
                )[:OFFERS_PER_ANSWER]
                if not mine:
                    return []
                delivered = [{**r, "state": "delivered", "updated_ms": self._now_ms(r)} for r in mine]
                _write(self.store, delivered)
            except Exception as exc:  # never fail an ingest answer over this
                log.warning("capture requests for %s not offered now: %s", instance, exc)
                return []
            for r in delivered:
                self._open[r["id"]] = r
        return [capture_header_value(r["id"], int(r["gpu"]), int(r["seconds"])) for r in delivered]

    def heard(self, agent_id: bytes, reports: Sequence[CaptureReport]) -> None:
        """A stored batch of ``agent_id`` reported on capture windows: record the state changes
        (``capturing`` once, ``done`` with the span count at the final batch)."""
        if not reports:
            return
        instance = self._instance_of(agent_id)
        with self._lock:
            try:
                self._refresh()
                changed = []
                for rep in reports:
                    r = self._open.get(rep.id)
                    if r is None or r["instance"] != instance or int(r["gpu"]) != rep.gpu:
                        continue  # finished, expired, or not this agent's: nothing to record
                    state = "done" if rep.final else "capturing"
                    if state == r["state"] and not rep.final:
                        continue
                    changed.append(
                        {
                            **r,
                            "state": state,
                            "updated_ms": self._now_ms(r),
                            "window_start_ns": rep.start_ns,
                            "window_end_ns": rep.end_ns,
                            "spans": rep.spans,
                        }
                    )
                if changed:
                    _write(self.store, changed)
            except Exception as exc:  # the batch is stored; the state catches up with a later report
                log.warning("capture reports of %s not recorded: %s", instance, exc)
                return
            for r in changed:
                if r["state"] == "done":
                    self._open.pop(r["id"], None)
                    log.info(
                        "capture %s of %s GPU %d done: %d spans", r["id"], instance, int(r["gpu"]), r["spans"]
                    )
                else:
                    self._open[r["id"]] = r
