"""``/v1/timeline/*``: one GPU's kernel spans for a window, paged; summary; correlation; export; captures.

Every answer is bounded (window length, page size, export size) and every bad parameter is a
400 with a message; the reads are in collector/spans.py and collector/trace.py.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any, Literal, TypeVar
from urllib.parse import urlencode

from fastapi import APIRouter, Depends, Query
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from kernel_insight.api.auth import Authenticator, Scope, TokenInfo
from kernel_insight.api.errors import ApiError
from kernel_insight.api.health import ERROR_RESPONSES
from kernel_insight.api.prometheus import ParamError, parse_time
from kernel_insight.collector.captures import (
    CAPTURE_STATES,
    MAX_CAPTURE_SECONDS,
    CaptureError,
    get_capture,
    list_captures,
    request_capture,
)
from kernel_insight.collector.clickhouse.store import StorageError
from kernel_insight.collector.perfetto_trace import perfetto_trace
from kernel_insight.collector.spans import (
    SpanCursor,
    SpanQueryError,
    SpanWindow,
    read_calls,
    read_counters,
    read_events,
    read_spans,
    summarize,
)
from kernel_insight.collector.trace import TraceTooLarge, chrome_trace_parts

__all__ = ["MAX_PAGE", "CaptureBody", "timeline_router"]

#: The largest page of spans one request returns.
MAX_PAGE = 10_000
#: Spans a correlation view lists (a bigger window: page through /v1/timeline/spans).
CORRELATION_SPANS = 5_000
#: NCCL operations, memory operations and syncs a correlation view lists, each.
CORRELATION_CALLS = 5_000
#: The correlation view's call lists: its key -> the gpu_calls track.
_CALL_LISTS = {"nccl": "nccl", "memory": "memory", "syncs": "sync"}

_T = TypeVar("_T")


def _object(**props: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": list(props)}


_INT, _STR, _BOOL = {"type": "integer"}, {"type": "string"}, {"type": "boolean"}
#: The correlation view's answer in /openapi.json (docs/api.md, "Kernel timelines").
_CALL_SCHEMAS: dict[str, dict[str, Any]] = {
    "nccl": _object(
        ts_ns=_INT, op=_STR, duration_ns=_INT, bytes=_INT, handle=_INT, rank=_INT, nranks=_INT, failed=_BOOL
    ),
    "memory": _object(
        ts_ns=_INT, op=_STR, bytes=_INT, handle=_INT, pid=_INT, tid=_INT, status=_INT, failed=_BOOL
    ),
    "syncs": _object(ts_ns=_INT, op=_STR, duration_ns=_INT, handle=_INT, pid=_INT, tid=_INT),
}
_CORRELATION_SCHEMA = _object(
    start_ns=_INT,
    end_ns=_INT,
    spans={"type": "array", "items": {"type": "object"}},
    spans_truncated=_BOOL,
    **{k: {"type": "array", "items": v} for k, v in _CALL_SCHEMAS.items()},
    **{f"{k}_truncated": _BOOL for k in _CALL_SCHEMAS},
    events={"type": "array", "items": {"type": "object"}},
    counters={
        "type": "object",
        "additionalProperties": {"type": "array", "items": {"type": "array", "items": {"type": "number"}}},
    },
)

audit = logging.getLogger("kernel_insight.audit")


class CaptureBody(BaseModel):
    """``POST /v1/timeline/captures``: every span of ``instance``'s GPU ``gpu`` for ``seconds``."""

    model_config = ConfigDict(extra="forbid")

    instance: str = Field(min_length=1, max_length=256)
    gpu: int = Field(ge=0, le=65535)
    seconds: int = Field(ge=1, le=MAX_CAPTURE_SECONDS)


_INSTANCE = Query(..., min_length=1, max_length=256, description="the instance (agent) id")
_GPU = Query(..., ge=0, le=65535, description="GPU index on the instance")
_FROM = Query(..., alias="from", description="window start: Unix seconds or RFC 3339 (inclusive)")
_TO = Query(
    ..., alias="to", description="window end: Unix seconds or RFC 3339 (exclusive); at most 24 h after from"
)
_STREAM = Query(None, ge=0, le=2**64 - 1, description="only this CUDA stream")
_KERNEL = Query(None, max_length=1024, description="RE2 regex on the kernel name, anchored as in PromQL")
_MIN_DUR = Query(0, ge=0, le=2**63 - 1, description="only spans at least this long (nanoseconds)")
_POD = Query(
    None, max_length=253, description='Kubernetes: only spans run while this pod held the GPU ("": no pod)'
)
_NAMESPACE = Query(None, max_length=253, description="Kubernetes: only spans of pods of this namespace")
_CONTAINER = Query(None, max_length=253, description="Kubernetes: only spans of this container of the pod")


def _window(
    instance: str,
    gpu: int,
    start: str,
    end: str,
    stream: int | None = None,
    kernel: str | None = None,
    min_dur: int = 0,
    holder: tuple[str | None, str | None, str | None] = (None, None, None),
) -> SpanWindow:
    try:
        start_ms, end_ms = parse_time(start, "from"), parse_time(end, "to")
        return SpanWindow(
            instance, gpu, start_ms * 1_000_000, end_ms * 1_000_000, stream, kernel, min_dur, *holder
        )
    except (ParamError, SpanQueryError) as exc:
        raise ApiError(400, "bad_data", str(exc)) from None


def _filtered_window(
    instance: str = _INSTANCE,
    gpu: int = _GPU,
    start: str = _FROM,
    end: str = _TO,
    stream: int | None = _STREAM,
    kernel: str | None = _KERNEL,
    min_duration_ns: int = _MIN_DUR,
    pod: str | None = _POD,
    namespace: str | None = _NAMESPACE,
    container: str | None = _CONTAINER,
) -> SpanWindow:
    """The window and span filters of the spans, summary and export routes (one parameter block)."""
    return _window(instance, gpu, start, end, stream, kernel, min_duration_ns, (pod, namespace, container))


def _whole_window(
    instance: str = _INSTANCE, gpu: int = _GPU, start: str = _FROM, end: str = _TO
) -> SpanWindow:
    """The window alone, every span in it (the correlation route)."""
    return _window(instance, gpu, start, end)


_FILTERED = Depends(_filtered_window)
_WHOLE = Depends(_whole_window)


async def _read(fn: Callable[..., _T], *args: Any) -> _T:
    try:
        return await run_in_threadpool(fn, *args)
    except TraceTooLarge as exc:
        raise ApiError(400, "bad_data", str(exc)) from None
    except StorageError as exc:  # the store is down or refused: retryable, never a 500
        raise ApiError(503, "unavailable", f"cannot read spans: {exc}", {"Retry-After": "5"}) from None


def timeline_router(store: Any, auth: Authenticator) -> APIRouter:
    """The timeline routes over ``store`` (read scope)."""
    router = APIRouter(tags=["timeline"])
    read = Depends(auth.require(Scope.READ))
    admin = Depends(auth.require(Scope.ADMIN))

    @router.get(
        "/v1/timeline/spans", responses=ERROR_RESPONSES, summary="Kernel spans of one GPU window, paged"
    )
    async def spans(
        window: SpanWindow = _FILTERED,
        limit: int = Query(1000, ge=1, le=MAX_PAGE, description="spans per page"),
        cursor: str | None = Query(None, max_length=200, description="next_cursor of the previous page"),
        _token: object = read,
    ) -> JSONResponse:
        try:
            after = None if cursor is None else SpanCursor.decode(cursor)
        except SpanQueryError as exc:
            raise ApiError(400, "bad_data", str(exc)) from None
        rows, nxt = await _read(read_spans, store, window, limit, after)
        return JSONResponse({"spans": rows, "next_cursor": None if nxt is None else nxt.encode()})

    @router.get(
        "/v1/timeline/summary", responses=ERROR_RESPONSES, summary="Per-kernel count, time, share, quantiles"
    )
    async def summary(
        window: SpanWindow = _FILTERED,
        kernels: int = Query(50, ge=1, le=1000, description="kernels listed, most total time first"),
        slowest: int = Query(5, ge=0, le=100, description="slowest spans listed per kernel"),
        _token: object = read,
    ) -> JSONResponse:
        body = await _read(summarize, store, window, kernels, slowest)
        for k in body["kernels"]:
            for s in k["slowest"]:
                s["timeline"] = _moment_link(window, s)
        return JSONResponse(body)

    @router.get(
        "/v1/timeline/correlation",
        responses={
            200: {"content": {"application/json": {"schema": _CORRELATION_SCHEMA}}},
            **ERROR_RESPONSES,
        },
        summary="One window's spans, NCCL operations, memory operations, syncs, events and NVML samples side by side",
    )
    async def correlation(window: SpanWindow = _WHOLE, _token: object = read) -> JSONResponse:
        rows, nxt = await _read(read_spans, store, window, CORRELATION_SPANS, None)
        events = await _read(read_events, store, window, CORRELATION_SPANS)
        counters = await _read(read_counters, store, window)
        body: dict[str, Any] = {
            "start_ns": window.start_ns,
            "end_ns": window.end_ns,
            "spans": rows,
            "spans_truncated": nxt is not None,
        }
        for key, track in _CALL_LISTS.items():
            body[key], body[f"{key}_truncated"] = await _read(
                read_calls, store, window, track, CORRELATION_CALLS
            )
        body["events"] = events
        body["counters"] = {k: [[t, v] for t, v in pts] for k, pts in counters.items()}
        return JSONResponse(body)

    @router.get(
        "/v1/timeline/export",
        responses={
            200: {"content": {"application/json": {}, "application/x-protobuf": {}}},
            **ERROR_RESPONSES,
        },
        summary="One GPU window as Chrome trace JSON (Perfetto, chrome://tracing) or a Perfetto protobuf trace",
    )
    async def export(
        window: SpanWindow = _FILTERED,
        format: Literal["json", "perfetto"] = Query(
            "json", description="json: Chrome trace event JSON; perfetto: a native Perfetto protobuf trace"
        ),
        _token: object = read,
    ) -> StreamingResponse:
        if format == "perfetto":
            parts: list[bytes | memoryview] = [await _read(perfetto_trace, store, window)]
            media, suffix = "application/x-protobuf", "perfetto-trace"
        else:
            parts = await _read(chrome_trace_parts, store, window)
            media, suffix = "application/json", "trace.json"
        name = f"{window.instance}-gpu{window.gpu}.{suffix}".replace('"', "")
        headers = {
            "Content-Disposition": f'attachment; filename="{name}"',
            "Content-Length": str(sum(len(part) for part in parts)),
        }
        # Sent as the pieces were made, a slice at a time: never joined into one more copy.
        return StreamingResponse(_slices(parts), media_type=media, headers=headers)

    @router.post(
        "/v1/timeline/captures",
        status_code=201,
        responses={404: {"description": "No such instance"}, **ERROR_RESPONSES},
        summary="Ask an agent to ship every span of one GPU for N seconds (scope admin; audited)",
    )
    async def capture(body: CaptureBody, token: TokenInfo | None = admin) -> JSONResponse:
        token_id, token_name = (token.id, token.name) if token is not None else ("local-dev", "local-dev")
        try:
            row = await _read(
                functools.partial(
                    request_capture,
                    store,
                    body.instance,
                    body.gpu,
                    body.seconds,
                    token_id=token_id,
                    token_name=token_name,
                )
            )
        except CaptureError as exc:
            raise ApiError(exc.status, "not_found" if exc.status == 404 else "bad_data", str(exc)) from None
        # One line per request, never rate-limited away (the message itself differs each time).
        audit.warning(
            f"audit: capture {row['id']} of {body.instance!r} GPU {body.gpu} for {body.seconds} s "
            f"requested by token {token_id} ({token_name!r})"
        )
        return JSONResponse(row, status_code=201)

    @router.get(
        "/v1/timeline/captures",
        responses=ERROR_RESPONSES,
        summary="An instance's capture requests: pending ones (what its agent will be told), or in any state",
    )
    async def captures(
        instance: str = _INSTANCE,
        state: str = Query(
            "pending", description=f"one of {', '.join(CAPTURE_STATES)}, or 'any' (the newest 100 requests)"
        ),
        _token: object = read,
    ) -> JSONResponse:
        try:
            rows = await _read(list_captures, store, instance, None if state == "any" else state)
        except CaptureError as exc:
            raise ApiError(400, "bad_data", str(exc)) from None
        return JSONResponse({"captures": rows})

    @router.get(
        "/v1/timeline/captures/{capture_id}",
        responses={404: {"description": "No such capture request"}, **ERROR_RESPONSES},
        summary="One capture request: its state and, once the agent reports, its window and span count",
    )
    async def capture_state(capture_id: str, _token: object = read) -> JSONResponse:
        try:
            row = await _read(get_capture, store, capture_id)
        except CaptureError as exc:
            raise ApiError(exc.status, "not_found" if exc.status == 404 else "bad_data", str(exc)) from None
        return JSONResponse(row)

    return router


#: Bytes per write of an export: large enough to stream fast, small enough for flow control.
_SLICE = 1 << 20


async def _slices(parts: list[bytes | memoryview]) -> AsyncIterator[bytes | memoryview]:
    for part in parts:
        view = memoryview(part)
        for i in range(0, len(view), _SLICE):
            yield view[i : i + _SLICE]


def _moment_link(window: SpanWindow, span: dict[str, Any]) -> str:
    """The spans URL of a 10 ms window around ``span``, for jumping to its moment on a timeline."""
    centre_ms = span["start_ns"] // 1_000_000
    query = urlencode(
        {
            "instance": window.instance,
            "gpu": window.gpu,
            "from": f"{(centre_ms - 5) / 1000:.3f}",
            "to": f"{(centre_ms + 5) / 1000:.3f}",
        }
    )
    return f"/v1/timeline/spans?{query}"
