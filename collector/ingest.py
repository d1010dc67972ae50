"""``POST /v1/ingest``: where agent batches enter the collector (status codes in docs/wire.md).

The router only authenticates, decodes and deduplicates; what a batch becomes
in storage is the sink's business. A sink returns True when it stored the
batch and False when storage already had that batch id, and raises
``StorageUnavailable`` when the agent should come back later.

Example::

    app = create_app(store, routers=[ingest_router(KeyStore(path), sink=StoreSink(store))])
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect

from kernel_insight.collector.keys import KeyStoreError, RevokedAgent, UnknownAgent
from kernel_insight.collector.metrics import CollectorMetrics
from kernel_insight.collector.store import StorageError, StorageUnavailable
from kernel_insight.collector.wire import (
    DEFAULT_LIMITS,
    HEADER_SIZE,
    INGEST_PATH,
    AuthenticationFailed,
    BatchId,
    Counter,
    DecodedBatch,
    Limits,
    MalformedBatch,
    OversizedBatch,
    decode_body,
    open_frame,
    parse_header,
    parse_sender,
)

__all__ = ["IngestStats", "KeyLookup", "SeenBatches", "Sink", "counter_name", "ingest_router"]

log = logging.getLogger("kernel_insight.collector.ingest")

#: Stores one batch: True when stored, False when storage already had its id.
Sink = Callable[[DecodedBatch], bool]


class KeyLookup(Protocol):
    """What the router needs from a key store (``KeyStore`` is one)."""

    def key_for(self, agent_id: bytes, key_id: int) -> bytes: ...


class SeenBatches:
    """Batch ids already stored, per (agent, epoch): a watermark plus the ids above it.

    Agents send in sequence order, so the set above the watermark stays small;
    this is the fast path in front of the sink's own (durable) deduplication.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runs: dict[tuple[bytes, int], tuple[int, set[int]]] = {}

    def __contains__(self, bid: BatchId) -> bool:
        with self._lock:
            low, above = self._runs.get((bid.agent_id, bid.epoch), (0, set()))
            return bid.seq < low or bid.seq in above

    def add(self, bid: BatchId) -> None:
        with self._lock:
            low, above = self._runs.get((bid.agent_id, bid.epoch), (0, set()))
            above.add(bid.seq)
            while low in above:
                above.discard(low)
                low += 1
            self._runs[(bid.agent_id, bid.epoch)] = (low, above)


@dataclass
class IngestStats:
    """Outcomes by status, for the collector's own metrics."""

    by_status: dict[int, int] = field(default_factory=dict)
    records: int = 0

    def count(self, status: int) -> None:
        self.by_status[status] = self.by_status.get(status, 0) + 1


def _answer(status: int, state: str, detail: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"status": state, "detail": detail}, status_code=status, headers=headers)


#: The ``outcome`` label of ``ki_collector_ingest_batches_total`` per status code (docs/metrics.md).
_OUTCOMES = {
    200: "stored",
    400: "rejected",
    401: "unauthenticated",
    403: "forbidden",
    408: "rejected",
    409: "duplicate",
    413: "rejected",
    422: "failed",
    503: "unavailable",
}


def _outcome(response: JSONResponse) -> str:
    if response.status_code == 503 and b'"busy"' in bytes(response.body):
        return "busy"
    return _OUTCOMES.get(response.status_code, "other")


def counter_name(counter_id: int) -> str:
    """The name of a COUNTERS id (docs/wire.md), lower-case; ``counter_<id>`` for ids newer than this collector."""
    try:
        return Counter(counter_id).name.lower()
    except ValueError:
        return f"counter_{counter_id}"


def ingest_router(
    keys: KeyLookup,
    sink: Sink,
    *,
    limits: Limits = DEFAULT_LIMITS,
    seen: SeenBatches | None = None,
    stats: IngestStats | None = None,
    metrics: CollectorMetrics | None = None,
) -> APIRouter:
    """The ingest endpoint, bound to a key store and a sink."""
    seen = seen if seen is not None else SeenBatches()
    stats = stats if stats is not None else IngestStats()
    metrics = metrics if metrics is not None else CollectorMetrics(process=False)
    in_flight: set[BatchId] = set()
    in_flight_lock = threading.Lock()
    router = APIRouter()

    def lookup(agent_id: bytes, key_id: int) -> bytes | JSONResponse:
        """The sender's key, or the answer that refuses it (403 unknown/revoked, 503 store down)."""
        try:
            return keys.key_for(agent_id, key_id)
        except (UnknownAgent, RevokedAgent) as exc:
            log.warning("ingest: refused batch from agent %s: %s", agent_id.hex(), exc)
            return _answer(403, "forbidden", str(exc))
        except KeyStoreError as exc:
            log.error("ingest: key store unusable: %s", exc)
            return _answer(503, "unavailable", "key store unavailable", {"Retry-After": "5"})

    def refuse_sender(prefix: bytes) -> JSONResponse | None:
        """The answer for a frame whose first HEADER_SIZE bytes already rule it out, else None."""
        try:
            agent_id, key_id = parse_sender(prefix)
        except MalformedBatch as exc:
            return _answer(400, "rejected", str(exc))
        key = lookup(agent_id, key_id)
        return key if isinstance(key, JSONResponse) else None

    def settle(frame: bytes) -> JSONResponse:
        response = store_frame(frame)
        with contextlib.suppress(MalformedBatch):  # no header: no record count to report
            records = parse_header(frame, limits).record_count
            metrics.ingest_records.labels(outcome=_outcome(response)).inc(records)
        return response

    def store_frame(frame: bytes) -> JSONResponse:
        try:
            header = parse_header(frame, limits)
        except OversizedBatch as exc:
            return _answer(413, "rejected", str(exc))
        except MalformedBatch as exc:
            return _answer(400, "rejected", str(exc))
        agent = header.agent_id.hex()
        key = lookup(header.agent_id, header.key_id)
        if isinstance(key, JSONResponse):
            return key
        try:
            batch = decode_body(open_frame(frame, header, key, limits), header, limits)
        except AuthenticationFailed as exc:
            log.warning("ingest: batch from agent %s key %d failed authentication", agent, header.key_id)
            return _answer(401, "unauthenticated", str(exc))
        except OversizedBatch as exc:
            return _answer(413, "rejected", str(exc))
        except MalformedBatch as exc:
            log.warning("ingest: malformed batch from agent %s: %s", agent, exc)
            return _answer(400, "rejected", str(exc))
        bid = header.batch_id
        if bid in seen:
            return _answer(409, "duplicate", f"batch {bid} was stored before")
        with in_flight_lock:
            if bid in in_flight:
                return _answer(503, "busy", f"batch {bid} is being stored now", {"Retry-After": "1"})
            in_flight.add(bid)
        try:
            stored = sink(batch)
        except StorageUnavailable as exc:
            log.warning("ingest: storage unavailable: %s", exc)
            return _answer(503, "unavailable", "storage unavailable", {"Retry-After": str(exc.retry_after_s)})
        except StorageError as exc:
            log.error("ingest: storage refused batch %s: %s", bid, exc)
            return _answer(422, "rejected", f"storage refused the batch: {exc}")
        except (ValueError, ArithmeticError) as exc:
            # A value this collector cannot turn into rows (derive validates what it knows of, so
            # this is a gap in that): retrying cannot help, so the agent must set the batch aside.
            log.error("ingest: batch %s cannot be stored: %s", bid, exc)
            return _answer(422, "rejected", f"batch cannot be stored: {exc}")
        finally:
            with in_flight_lock:
                in_flight.discard(bid)
        seen.add(bid)
        if not stored:
            return _answer(409, "duplicate", f"batch {bid} was stored before")
        stats.records += batch.record_count
        counters = {counter_name(k): float(v) for k, v in batch.counters.items()}
        metrics.agents.observe(agent, header.t_max_ns, counters, time.time())
        return JSONResponse({"status": "stored", "batch_id": str(bid), "records": batch.record_count})

    async def read_frame(request: Request) -> JSONResponse:
        """Read the body, but refuse an unknown or revoked sender (or not-a-batch) after its
        first HEADER_SIZE bytes: strangers never make the collector buffer a frame."""
        body = bytearray()
        try:
            async for chunk in request.stream():
                first = len(body) < HEADER_SIZE
                body += chunk
                if first and len(body) >= HEADER_SIZE:
                    refused = await run_in_threadpool(refuse_sender, bytes(body[:HEADER_SIZE]))
                    if refused is not None:
                        return refused  # the rest is discarded unread (docs/security.md)
                if len(body) > limits.max_frame:
                    break
        except ClientDisconnect:  # the client went, or the body deadline cut it off
            return _answer(400, "rejected", "the client disconnected before the frame arrived")
        return await run_in_threadpool(settle, bytes(body))

    @router.post(INGEST_PATH, summary="Receive one sealed agent batch (docs/wire.md)")
    async def ingest(request: Request) -> JSONResponse:
        declared = request.headers.get("content-length")
        if declared is not None and not declared.isdigit():
            response = _answer(400, "rejected", "invalid Content-Length")
        elif declared is not None and int(declared) > limits.max_frame:
            response = _answer(413, "rejected", f"frames are limited to {limits.max_frame} bytes")
        else:
            response = await read_frame(request)
        stats.count(response.status_code)
        metrics.ingest_batches.labels(outcome=_outcome(response)).inc()
        return response

    return router
