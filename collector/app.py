"""The collector's HTTP app: ``create_app(store)`` serves remote_write and health; the ingest router joins it.

Answers follow one rule (docs/storage.md): input the client must fix is a 4xx with a message
and is never retried, and so is a write the store refuses for good (422); a store that cannot
take writes now is a 503 with Retry-After; only a fault of the server itself is a 5xx otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect
from starlette.types import Receive, Send
from starlette.types import Scope as AsgiScope

from kernel_insight.collector.batcher import Batcher, FlushFailed
from kernel_insight.collector.clickhouse.ingest_groups import PreparedRows
from kernel_insight.collector.clickhouse.store import StorageError, StorageUnavailable, Store
from kernel_insight.collector.metrics import CollectorMetrics, RequestMetrics
from kernel_insight.collector.relabel import Relabeler
from kernel_insight.collector.remote_write import (
    DEFAULT_LIMITS,
    DEFAULT_MAX_DECOMPRESSED,
    RemoteWriteError,
    RemoteWriteTooLarge,
    SeriesCache,
    announced_size,
    parse_remote_write,
)
from kernel_insight.collector.rows import HistogramBatch, HistogramBuilder, SampleBatch

__all__ = [
    "DEFAULT_MAX_BODY",
    "INLINE_MAX_DECODED",
    "BodyTooLarge",
    "RemoteWriteEndpoint",
    "create_app",
    "read_body",
]

#: Largest request body accepted before decompression (Prometheus sends a few MB at most).
DEFAULT_MAX_BODY = 16 << 20

#: remote_write bodies that decompress to at most this many bytes (as their snappy header says) are
#: decoded on the event loop, larger ones in a worker thread. Prometheus' 2,000-sample requests
#: (bench-import's) decode in about what the hand-off to a thread and back costs (two wake-ups),
#: and the decode holds the GIL either way; the bound keeps the loop's share of the largest
#: request small whatever the compression (``make bench-import``, bench/results/import.md).
INLINE_MAX_DECODED = 1 << 20

log = logging.getLogger(__name__)

#: What a remote_write request without native histograms decodes to (never changed by anyone).
_NO_HISTOGRAMS = HistogramBatch.empty()

#: remote_write's token in the OpenAPI schema (``write_auth`` reads the header itself).
_WRITE_BEARER = Depends(HTTPBearer(auto_error=False))


class BodyTooLarge(Exception):
    def __init__(self, limit: int) -> None:
        super().__init__(f"request body larger than {limit} bytes")
        self.limit = limit


async def read_body(request: Request, limit: int) -> bytes:
    """The body, refused with BodyTooLarge as soon as it passes ``limit`` (never buffered whole first)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(limit)
    chunks = []
    size = 0
    async for chunk in request.stream():  # ClientDisconnect when the client goes or the body deadline passes
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(limit)
        chunks.append(chunk)
    return b"".join(chunks)


def _error(status: int, detail: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"status": "error", "detail": detail}, status_code=status, headers=headers)


class RemoteWriteEndpoint:
    """``POST /api/v1/write`` as a bare ASGI app: the token check, then the route's own handler.

    ``ki collector`` answers remote_write ahead of the app's middleware stack with it
    (``api.QueryFastPath``'s ``posts``, docs/api.md "remote_write: the request path"): the
    stack and FastAPI's dependency solving were a large share of a 2,000-sample request's Python
    time in the collector (``make bench-import``, bench/results/import.md). Everything else is the route's: ``write`` is the same handler, so the
    answers (204, 400, 413, 415, 422, 503) are the same. ``authorize`` gets the Authorization
    header and raises what the app's exception handlers render (401/403); None: open.
    Only made when every check of the route is ``authorize`` (``create_app``), so the fast
    path can never skip one.
    """

    path = "/api/v1/write"

    def __init__(
        self,
        write: Callable[[Request], Awaitable[Response]],
        authorize: Callable[[str | None], object] | None,
    ) -> None:
        self._write = write
        self._authorize = authorize

    async def __call__(self, scope: AsgiScope, receive: Receive, send: Send) -> None:
        scope["route"] = self
        if self._authorize is not None:
            authorization = next(
                (v.decode("latin-1") for k, v in scope["headers"] if k == b"authorization"), None
            )
            self._authorize(authorization)
        response = await self._write(Request(scope, receive))
        await response(scope, receive, send)


def create_app(
    store: Store,
    *,
    max_body_bytes: int = DEFAULT_MAX_BODY,
    max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED,
    routers: Sequence[APIRouter] = (),
    write_dependencies: Sequence[Any] = (),
    write_auth: Callable[[str | None], object] | None = None,
    metrics: CollectorMetrics | None = None,
    metrics_dependencies: Sequence[Any] = (),
) -> FastAPI:
    """The collector app over ``store`` (kept as ``app.state.store`` for other routers).

    ``metrics`` (a new :class:`CollectorMetrics` when None; ``app.state.metrics``) counts every
    request and every insert into ``store`` and is served at ``GET /metrics``, open unless
    ``metrics_dependencies`` guard it (docs/api.md says why open is the default).

    ``write_auth`` (called with the request's Authorization header, raising what the app's
    exception handlers render) and ``write_dependencies`` (FastAPI ``Depends(...)``) guard
    ``POST /api/v1/write``; the composition root passes the API's bearer-token check as
    ``write_auth``, so this module needs no import of the api package. Without either,
    remote_write is open: fit for tests and single-user tools only (``ki collector`` always
    passes the check, docs/api.md). With no ``write_dependencies``, ``app.state.remote_write_endpoint``
    is the route as a bare ASGI app (:class:`RemoteWriteEndpoint`) for a server to put ahead of the
    middleware stack; with some it is None (it would skip them).
    """
    metrics = metrics if metrics is not None else CollectorMetrics()
    store.insert_observer = metrics.observe_insert
    store_stats = metrics.store_stats if metrics.store_stats is not None else metrics.watch_store(store)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        store_stats.start()
        try:
            yield
        finally:
            await run_in_threadpool(store_stats.shutdown)

    app = FastAPI(title="Kernel Insight collector", docs_url=None, redoc_url=None, lifespan=lifespan)
    #: remote_write: validated labels by their raw bytes (parsed once per series, not per request).
    #: ``app.state.series_limits`` (rows.SeriesLimits) and ``app.state.remote_write_batcher`` (a
    #: started Batcher) are read per request, so the composition root can set them after this.
    series_cache = app.state.series_cache = SeriesCache()  # its max_series: --remote-write-series
    app.state.store = store
    app.state.metrics = metrics
    app.add_middleware(RequestMetrics, metrics=metrics)

    @app.exception_handler(StorageError)
    async def _storage_error(_: Request, exc: StorageError) -> JSONResponse:
        if exc.retry_after_s is not None:
            log.warning("storage unavailable: %s", exc)
            return _error(503, f"storage unavailable: {exc}", {"Retry-After": str(exc.retry_after_s)})
        # Writes answer permanent refusals themselves (4xx); one reaching here is a read's.
        log.error("storage refused a statement: %s", exc)
        return _error(500, f"storage refused the statement: {exc}")

    @app.exception_handler(BodyTooLarge)
    async def _too_large(_: Request, exc: BodyTooLarge) -> JSONResponse:
        return _error(413, str(exc))

    @app.exception_handler(ClientDisconnect)
    async def _gone(_: Request, exc: ClientDisconnect) -> JSONResponse:
        # Nobody is left to read this; answered quietly so a flood of cut-off uploads logs nothing.
        return _error(400, "the client disconnected before its request body arrived")

    @app.get("/healthz")
    async def healthz() -> JSONResponse:
        await run_in_threadpool(store.ping)  # StorageUnavailable -> 503
        return JSONResponse({"status": "ok"})

    @app.get("/metrics", dependencies=list(metrics_dependencies), include_in_schema=False)
    async def metrics_endpoint() -> Response:
        body, content_type = await run_in_threadpool(metrics.exposition)
        return Response(body, media_type=content_type)

    async def check_write_auth(
        request: Request, _: HTTPAuthorizationCredentials | None = _WRITE_BEARER
    ) -> None:
        # The HTTPBearer parameter only declares the scheme in the OpenAPI schema.
        if write_auth is not None:
            write_auth(request.headers.get("authorization"))

    async def remote_write(request: Request) -> Response:
        content_type = request.headers.get("content-type", "application/x-protobuf").lower()
        version = 2 if "proto=io.prometheus.write.v2.request" in content_type.replace(" ", "") else 1
        if version == 1 and "proto=" in content_type and "prometheus.writerequest" not in content_type:
            return _error(
                415,
                "remote_write accepts prometheus.WriteRequest (1.0) and io.prometheus.write.v2.Request (2.0), "
                f"got {content_type!r}",
            )
        encoding = request.headers.get("content-encoding", "snappy").lower()
        if encoding != "snappy":
            return _error(
                415, f"remote_write bodies must be snappy-compressed, got Content-Encoding {encoding!r}"
            )
        body = await read_body(request, max_body_bytes)
        limits = getattr(app.state, "series_limits", None) or DEFAULT_LIMITS
        batcher: Batcher | None = getattr(app.state, "remote_write_batcher", None)
        relabeler: Relabeler | None = getattr(app.state, "relabeler", None)

        written = [0, 0]  # samples, histograms: remote write 2.0 answers them in headers

        def decode() -> tuple[SampleBatch, HistogramBatch] | PreparedRows:
            """Decode (and, for the batcher, convert) in one step: on the loop or in one worker thread."""
            builder = HistogramBuilder()
            batch = parse_remote_write(body, max_decompressed_bytes, limits, series_cache, builder, version)
            hists = builder.build() if len(builder) else _NO_HISTOGRAMS  # an empty build: ~20 arrays
            if relabeler is not None:  # --relabel-config (collector/relabel.py)
                batch = relabeler.apply_batch(batch)
                hists = relabeler.apply_histograms(hists)
            written[:] = [len(batch), len(hists)]
            if batcher is None:
                return batch, hists
            # A fresh id nobody sends again: nothing for the batches table to deduplicate.
            return store.prepare(f"rw:{uuid.uuid4().hex}", samples=batch, histograms=hists, record=False)

        def insert(batch: SampleBatch, hists: HistogramBatch) -> None:
            store.insert_samples(batch)
            store.insert_histograms(hists)

        try:
            # Small bodies on the loop (INLINE_MAX_DECODED; one without a valid header is refused at
            # once); a direct insert (no batcher) waits for the engine, so it and large bodies go to
            # a worker thread.
            size = announced_size(body)
            decoded = (
                decode()
                if batcher is not None and (size is None or size <= INLINE_MAX_DECODED)
                else await run_in_threadpool(decode)
            )
            if isinstance(decoded, tuple):
                await run_in_threadpool(insert, *decoded)
            elif batcher is not None:
                # Group commit (collector/batcher.py): this request's rows go into ClickHouse with
                # every other request's and agent batch's, answered once they landed.
                try:
                    batcher.start()  # idempotent; refused once the app is shutting down
                except RuntimeError:
                    return _error(503, "the collector is shutting down", {"Retry-After": "5"})
                # eager: a remote_write sender (a Prometheus shard: one keep-alive connection)
                # waits for this answer before its next request, so the group is written once
                # every connection that sends waits on one (or its window passed).
                client = request.scope.get("client")
                sender = (client[0], client[1]) if client else None
                await asyncio.wrap_future(batcher.submit(decoded, eager=True, sender=sender).answer())
        except RemoteWriteTooLarge as exc:
            return _error(413, f"remote_write request too large: {exc}")
        except RemoteWriteError as exc:
            return _error(400, f"malformed remote_write request: {exc}")
        except ValueError as exc:  # rows the schema cannot hold
            return _error(400, f"remote_write request refused: {exc}")
        except StorageUnavailable:
            raise  # 503 with Retry-After (the handler above): Prometheus retries it
        except StorageError as exc:
            # Permanent: a 5xx would have Prometheus resend it forever and stall its queue
            # behind it. 422, like the agent ingest's answer to the same refusal.
            log.error("remote_write: storage refused the request: %s", exc)
            return _error(422, f"storage refused the write: {exc}")
        except FlushFailed:  # logged with its traceback by the batcher
            return _error(500, "internal error while storing the write")
        if version == 2:  # what was written, as the 2.0 spec asks of a receiver
            return Response(
                status_code=204,
                headers={
                    "X-Prometheus-Remote-Write-Samples-Written": str(written[0]),
                    "X-Prometheus-Remote-Write-Histograms-Written": str(written[1]),
                    "X-Prometheus-Remote-Write-Exemplars-Written": "0",
                },
            )
        return Response(status_code=204)

    app.post(
        "/api/v1/write",
        status_code=204,
        dependencies=[*([Depends(check_write_auth)] if write_auth is not None else []), *write_dependencies],
        name="remote_write",
    )(remote_write)
    app.state.remote_write_endpoint = (
        None if write_dependencies else RemoteWriteEndpoint(remote_write, write_auth)
    )

    for router in routers:
        app.include_router(router)
    return app
