"""``POST /v1/ingest``: where agent batches enter the collector (status codes in docs/wire.md).

The router only authenticates, decodes and deduplicates; what a batch becomes
in storage is the sink's business. A sink returns True when it stored the
batch and False when storage already had that batch id, and raises
``StorageUnavailable`` when the agent should come back later.

Example::

    app = create_app(store, routers=[ingest_router(KeyStore(path), sink=StoreSink(store))])
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Protocol

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect

from kernel_insight.collector.captures import CAPTURE_HEADER, CaptureDesk
from kernel_insight.collector.clickhouse.store import StorageError, StorageUnavailable
from kernel_insight.collector.keys import KeyStoreError, RevokedAgent, UnknownAgent
from kernel_insight.collector.metrics import CollectorMetrics
from kernel_insight.collector.wire import (
    BATCH_STATUS_HEADER,
    DEFAULT_LIMITS,
    FRAMES_CONTENT_TYPE,
    HEADER_SIZE,
    INGEST_PATH,
    SNAPSHOT_HEADER,
    STATUS_NAMES_UNKNOWN,
    AuthenticationFailed,
    BatchHeader,
    BatchId,
    Counter,
    DecodedBatch,
    Limits,
    MalformedBatch,
    NamesUnknown,
    OversizedBatch,
    decode_body,
    open_frame,
    parse_header,
    parse_sender,
    split_frames,
)

__all__ = ["IngestStats", "KeyLookup", "SeenBatches", "Sink", "counter_name", "ingest_router"]

log = logging.getLogger("kernel_insight.collector.ingest")

#: Stores one batch: True when stored, False when storage already had its id. A sink may
#: also offer ``submit(batch) -> Future[bool]`` (same verdict, same exceptions, raised by
#: ``result()``); the router then submits all frames of a request before waiting for any.
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


@dataclass(frozen=True, slots=True)
class _Outcome:
    """How one frame was settled: its status, words for the sender, and any headers."""

    status: int
    state: str
    detail: str
    headers: dict[str, str] | None = None
    batch_id: str | None = None
    records: int = 0
    header_records: int | None = None  # the record count its header claimed, once the header parsed
    agent_id: bytes | None = None  # the sender, once the frame authenticated


def _answer(outcome: _Outcome) -> JSONResponse:
    if outcome.status == 200:
        body: dict[str, object] = {
            "status": "stored",
            "batch_id": outcome.batch_id,
            "records": outcome.records,
        }
    else:
        body = {"status": outcome.state, "detail": outcome.detail}
    return JSONResponse(body, status_code=outcome.status, headers=outcome.headers)


def _retryable(status: int) -> bool:
    return status == 429 or status >= 500


def _answer_frames(outcomes: list[_Outcome]) -> JSONResponse:
    """One answer for a request of several frames: 200, with one status per frame in body order."""
    waits = [
        int(o.headers["Retry-After"])
        for o in outcomes
        if _retryable(o.status) and o.headers and "Retry-After" in o.headers
    ]
    headers = {BATCH_STATUS_HEADER: ", ".join(str(o.status) for o in outcomes)}
    if waits:
        headers["Retry-After"] = str(max(waits))
    results = [
        {
            "status": o.status,
            "state": o.state,
            "batch_id": o.batch_id,
            "records": o.records,
            "detail": o.detail,
        }
        for o in outcomes
    ]
    return JSONResponse({"status": "settled", "results": results}, headers=headers)


def _submit(sink: Sink, batch: DecodedBatch) -> Future[bool]:
    """Hand one batch to the sink without waiting for it, when the sink can (``submit``)."""
    submit = getattr(sink, "submit", None)
    done: Future[bool] = Future()
    try:
        if submit is not None:
            future: Future[bool] = submit(batch)
            return future
        done.set_result(sink(batch))
    except Exception as exc:  # settled with the frame's outcome in finish()
        done.set_exception(exc)
    return done


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
    424: "names_unknown",
    503: "unavailable",
}


def _outcome(outcome: _Outcome) -> str:
    if outcome.status == 503 and outcome.state == "busy":
        return "busy"
    return _OUTCOMES.get(outcome.status, "other")


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
    captures: CaptureDesk | None = None,
) -> APIRouter:
    """The ingest endpoint, bound to a key store and a sink.

    A request carries one frame (``application/x-ki-batch``, what every agent
    sends) or several (``application/x-ki-batches``, how an agent catches up on
    a backlog); each frame is authenticated, decoded and deduplicated on its
    own. The frames of one request are all handed to the sink before any is
    waited for, so a sink with ``submit`` (which returns a future that resolves
    once the batch is durable) lets them share one storage flush. With ``captures``,
    an answer that settles a frame offers the sender its pending capture requests
    (``KI-Capture`` headers) and stored batches report on their capture windows.
    """
    seen = seen if seen is not None else SeenBatches()
    stats = stats if stats is not None else IngestStats()
    metrics = metrics if metrics is not None else CollectorMetrics(process=False)
    snapshot_wanted: Callable[[bytes], bool] | None = getattr(sink, "histogram_snapshot_wanted", None)
    in_flight: set[BatchId] = set()
    in_flight_lock = threading.Lock()
    router = APIRouter()

    def lookup(agent_id: bytes, key_id: int) -> bytes | _Outcome:
        """The sender's key, or the outcome that refuses it (403 unknown/revoked, 503 store down)."""
        try:
            return keys.key_for(agent_id, key_id)
        except (UnknownAgent, RevokedAgent) as exc:
            log.warning("ingest: refused batch from agent %s: %s", agent_id.hex(), exc)
            return _Outcome(403, "forbidden", str(exc))
        except KeyStoreError as exc:
            log.error("ingest: key store unusable: %s", exc)
            return _Outcome(503, "unavailable", "key store unavailable", {"Retry-After": "5"})

    def refuse_sender(prefix: bytes) -> _Outcome | None:
        """The outcome for a request whose first HEADER_SIZE bytes (its first frame's header)
        already rule it out, else None."""
        try:
            agent_id, key_id = parse_sender(prefix)
        except MalformedBatch as exc:
            return _Outcome(400, "rejected", str(exc))
        key = lookup(agent_id, key_id)
        return key if isinstance(key, _Outcome) else None

    def prepare(frame: bytes | memoryview) -> _Outcome | DecodedBatch:
        """Everything before storage: an outcome when the frame is settled here, else the batch to store."""
        try:
            header = parse_header(frame, limits)
        except OversizedBatch as exc:
            return _Outcome(413, "rejected", str(exc))
        except MalformedBatch as exc:
            return _Outcome(400, "rejected", str(exc))
        outcome = check(frame, header)
        if isinstance(outcome, _Outcome):
            return dataclasses.replace(outcome, header_records=header.record_count)
        return outcome

    def check(frame: bytes | memoryview, header: BatchHeader) -> _Outcome | DecodedBatch:
        agent = header.agent_id.hex()
        key = lookup(header.agent_id, header.key_id)
        if isinstance(key, _Outcome):
            return key
        try:
            batch = decode_body(open_frame(frame, header, key, limits), header, limits)
        except AuthenticationFailed as exc:
            log.warning("ingest: batch from agent %s key %d failed authentication", agent, header.key_id)
            return _Outcome(401, "unauthenticated", str(exc))
        except OversizedBatch as exc:
            return _Outcome(413, "rejected", str(exc))
        except MalformedBatch as exc:
            log.warning("ingest: malformed batch from agent %s: %s", agent, exc)
            return _Outcome(400, "rejected", str(exc))
        bid = header.batch_id
        if bid in seen:
            return _Outcome(409, "duplicate", f"batch {bid} was stored before", agent_id=header.agent_id)
        with in_flight_lock:
            if bid in in_flight:
                return _Outcome(503, "busy", f"batch {bid} is being stored now", {"Retry-After": "1"})
            in_flight.add(bid)
        return batch

    def finish(batch: DecodedBatch, future: Future[bool]) -> _Outcome:
        """Wait for the sink's verdict on one batch and turn it into the frame's outcome."""
        outcome = wait(batch, future)
        return dataclasses.replace(outcome, header_records=batch.header.record_count)

    def wait(batch: DecodedBatch, future: Future[bool]) -> _Outcome:
        bid = batch.batch_id
        try:
            stored = future.result()
        except NamesUnknown as exc:
            # Not stored and not remembered: the agent sends its names, then this very batch again.
            log.info("ingest: batch %s of agent %s: %s", bid, batch.header.agent_id.hex(), exc)
            return _Outcome(STATUS_NAMES_UNKNOWN, "names_unknown", str(exc))
        except StorageUnavailable as exc:
            log.warning("ingest: storage unavailable: %s", exc)
            return _Outcome(
                503, "unavailable", "storage unavailable", {"Retry-After": str(exc.retry_after_s)}
            )
        except StorageError as exc:
            log.error("ingest: storage refused batch %s: %s", bid, exc)
            return _Outcome(422, "rejected", f"storage refused the batch: {exc}")
        except (ValueError, ArithmeticError) as exc:
            # A value this collector cannot turn into rows (derive validates what it knows of, so
            # this is a gap in that): retrying cannot help, so the agent must set the batch aside.
            log.error("ingest: batch %s cannot be stored: %s", bid, exc)
            return _Outcome(422, "rejected", f"batch cannot be stored: {exc}")
        except Exception:
            # A fault of ours, not of the batch: retryable, and the other frames still settle.
            log.exception("ingest: storing batch %s failed", bid)
            return _Outcome(500, "error", "internal error while storing the batch")
        finally:
            with in_flight_lock:
                in_flight.discard(bid)
        seen.add(bid)
        agent_id = batch.header.agent_id
        if not stored:
            return _Outcome(409, "duplicate", f"batch {bid} was stored before", agent_id=agent_id)
        if captures is not None and batch.captures:
            captures.heard(agent_id, batch.captures)
        stats.records += batch.record_count
        counters = {counter_name(k): float(v) for k, v in batch.counters.items()}
        metrics.agents.observe(batch.header.agent_id.hex(), batch.header.t_max_ns, counters, time.time())
        return _Outcome(200, "stored", "", batch_id=str(bid), records=batch.record_count, agent_id=agent_id)

    def settle(frames: list[memoryview] | list[bytes]) -> list[_Outcome]:
        """Prepare every frame, submit every batch in body order, then wait for each."""
        prepared = [prepare(f) for f in frames]
        pending: list[_Outcome | tuple[DecodedBatch, Future[bool]]] = []
        for p in prepared:
            pending.append(p if isinstance(p, _Outcome) else (p, _submit(sink, p)))
        return [p if isinstance(p, _Outcome) else finish(*p) for p in pending]

    def settle_many(body: bytes) -> tuple[JSONResponse, list[_Outcome]]:
        try:
            frames = split_frames(body, limits)
        except OversizedBatch as exc:
            outcome = _Outcome(413, "rejected", str(exc))
            return _answer(outcome), [outcome]
        except MalformedBatch as exc:
            outcome = _Outcome(400, "rejected", str(exc))
            return _answer(outcome), [outcome]
        outcomes = settle(frames)
        return _answer_frames(outcomes), outcomes

    def settle_one(body: bytes) -> tuple[JSONResponse, list[_Outcome]]:
        (outcome,) = settle([body])
        return _answer(outcome), [outcome]

    async def read_body(request: Request) -> bytes | _Outcome:
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
            return _Outcome(400, "rejected", "the client disconnected before the frame arrived")
        return bytes(body)

    @router.post(INGEST_PATH, summary="Receive sealed agent batches: one frame, or several (docs/wire.md)")
    async def ingest(request: Request) -> JSONResponse:
        declared = request.headers.get("content-length")
        many = request.headers.get("content-type", "").split(";")[0].strip().lower() == FRAMES_CONTENT_TYPE
        if declared is not None and not declared.isdigit():
            outcomes = [_Outcome(400, "rejected", "invalid Content-Length")]
            response = _answer(outcomes[0])
        elif declared is not None and int(declared) > limits.max_frame:
            outcomes = [_Outcome(413, "rejected", f"request bodies are limited to {limits.max_frame} bytes")]
            response = _answer(outcomes[0])
        else:
            body = await read_body(request)
            if isinstance(body, _Outcome):
                outcomes = [body]
                response = _answer(body)
            else:
                response, outcomes = await run_in_threadpool(settle_and_offer, body, many)
        for o in outcomes:  # per frame: what each batch became
            stats.count(o.status)
            metrics.ingest_batches.labels(outcome=_outcome(o)).inc()
            if o.header_records is not None:
                metrics.ingest_records.labels(outcome=_outcome(o)).inc(o.header_records)
        return response

    def settle_and_offer(body: bytes, many: bool) -> tuple[JSONResponse, list[_Outcome]]:
        """Settle the request's frames, then offer the sender its pending captures, on the same
        worker thread (one hand-off per request, not two)."""
        response, outcomes = (settle_many if many else settle_one)(body)
        sender = next((o.agent_id for o in outcomes if o.agent_id is not None), None)
        if captures is not None and sender is not None:  # only to a sender whose batch was settled
            for value in captures.offers(sender):
                response.headers.append(CAPTURE_HEADER, value)
        if sender is not None and snapshot_wanted is not None and snapshot_wanted(sender):
            response.headers[SNAPSHOT_HEADER] = "1"  # an increment lacked its base: snapshots next
        return response, outcomes

    return router
