"""The Prometheus HTTP API (``/api/v1/query`` and friends) evaluated by kql, so Grafana and promtool work unchanged.

Parameters, response shapes, error types and status codes follow Prometheus'
``web/api/v1/api.go``: parse problems are ``bad_data`` (400), a query that fails
while running is ``execution`` (422), a timeout is ``timeout`` (503), a cancelled
query ``canceled`` (499), a storage failure ``internal`` (500, the store's fault,
never the client's input) or ``unavailable`` (503 + Retry-After, when the store is down).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import datetime as dt
import functools
import logging
import math
import re
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol
from urllib.parse import parse_qsl, unquote

import orjson
from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from starlette.concurrency import run_in_threadpool
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Message, Receive, Send
from starlette.types import Scope as AsgiScope

from kernel_insight.api.auth import Authenticator, CheckMemo, Scope
from kernel_insight.api.connections import QuickAnswer, ResponseWriter
from kernel_insight.api.errors import ApiError, error_response
from kernel_insight.kql.ast import VectorSelector
from kernel_insight.kql.engine import Engine
from kernel_insight.kql.errors import (
    KqlError,
    KqlParseError,
    QueryCancelledError,
    QueryTimeoutError,
    StorageError,
    TooManySamplesError,
)
from kernel_insight.kql.lexical import parse_duration
from kernel_insight.kql.limits import EngineLimits
from kernel_insight.kql.parser import parse
from kernel_insight.kql.storage import Matcher, SelectHints, Storage, read_within
from kernel_insight.kql.values import QueryResult, prometheus_json_bytes

__all__ = [
    "MAX_FORM_BYTES",
    "MAX_POINTS",
    "MetricMetadata",
    "ParamError",
    "QueryFastPath",
    "parse_duration_param",
    "parse_time",
    "prometheus_router",
    "query_routes",
]

#: Threads that evaluate queries (anyio's default thread limit, which served them before).
QUERY_THREADS = 40
#: A query request whose last runs took less than this runs inline on the event loop (_QueryRunner).
INLINE_MAX_S = 0.005
#: How many query requests' last run times are kept (then forgotten all at once).
_REMEMBERED_REQUESTS = 4096
#: Prometheus refuses range queries with more points per series than this.
MAX_POINTS = 11_000
#: The largest form body read (Go's ``ParseForm`` limit, which Prometheus inherits): 10 MiB.
MAX_FORM_BYTES = 10 << 20
#: Prometheus' minTime/maxTime, as the Go client sends them for "no bound".
_MIN_TIME_MS = -9223372036854775808 // 1_000_000 // 1000 * 1000
_MAX_TIME_MS = 9223372036854775807 // 1_000_000 // 1000 * 1000
#: Where "all time" starts and ends for our storage (DateTime64(3) holds 1900..2299).
_STORE_MIN_MS = 0
_STORE_MAX_MS = 4_102_444_800_000  # 2100-01-01

MetricMetadata = dict[str, list[dict[str, str]]]

log = logging.getLogger("kernel_insight.api.prometheus")


class ParamError(ValueError):
    """A request parameter the client must fix (bad_data, 400)."""

    status = 400


class BodyTooLarge(ParamError):
    """A form body over the cap (bad_data, 413 as every capped body in the collector; Go's text)."""

    status = 413


def parse_time(text: str, name: str) -> int:
    """Unix seconds (float) or RFC 3339, as Prometheus' ``parseTime``; milliseconds out."""
    try:
        value = float(text)
    except ValueError:
        pass
    else:
        if not math.isfinite(value):
            raise ParamError(f'invalid parameter "{name}": cannot parse "{text}" to a valid timestamp')
        return _clamp(round(value * 1000))
    try:
        parsed = dt.datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise ParamError(f'invalid parameter "{name}": cannot parse "{text}" to a valid timestamp') from None
    if parsed.tzinfo is None:
        raise ParamError(f'invalid parameter "{name}": cannot parse "{text}" to a valid timestamp')
    return _clamp(round(parsed.timestamp() * 1000))


def _clamp(ms: int) -> int:
    # Go clients send minTime/maxTime for open bounds; the store holds 1970..2100.
    return max(_STORE_MIN_MS, min(_STORE_MAX_MS, ms))


def parse_duration_param(text: str, name: str) -> int:
    """Seconds (float) or a Prometheus duration (``5m``); milliseconds out."""
    try:
        value = float(text)
    except ValueError:
        pass
    else:
        if not math.isfinite(value) or abs(value) > 9.2e15:
            raise ParamError(
                f'invalid parameter "{name}": cannot parse "{text}" to a valid duration. It overflows int64'
            )
        return round(value * 1000)
    try:
        return parse_duration(text)
    except ValueError:
        raise ParamError(f'invalid parameter "{name}": cannot parse "{text}" to a valid duration') from None


_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


@dataclasses.dataclass(frozen=True, slots=True)
class _Param:
    """One parameter of a Prometheus API endpoint, as its OpenAPI schema describes it."""

    name: str
    description: str
    repeated: bool = False
    path: bool = False

    def openapi(self) -> dict[str, Any]:
        schema: dict[str, Any] = {"type": "string"}
        if self.repeated:
            schema = {"type": "array", "items": schema}
        where = "path" if self.path else "query"
        return {
            "name": self.name,
            "in": where,
            "required": self.path,
            "description": self.description,
            "schema": schema,
        }


class _Params:
    """The request's parameters, form body first (Go's ``FormValue`` order), then the URL query."""

    def __init__(self, pairs: list[tuple[str, str]], path_params: dict[str, str] | None = None) -> None:
        self.pairs = pairs
        self.path_params = path_params or {}

    @classmethod
    async def read(cls, request: Request, max_bytes: int = MAX_FORM_BYTES) -> _Params:
        pairs: list[tuple[str, str]] = []
        if request.method == "POST":
            ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
            if ctype == "application/x-www-form-urlencoded":
                body = await _read_capped(request, max_bytes)
                try:
                    pairs = parse_qsl(body.decode("utf-8"), keep_blank_values=True, strict_parsing=False)
                except (UnicodeDecodeError, ValueError) as exc:
                    raise ParamError(f"error parsing form values: {exc}") from None
        pairs += _query_pairs(request.scope["query_string"])
        return cls(pairs, request.scope.get("path_params") or {})

    def get(self, name: str) -> str | None:
        for k, v in self.pairs:
            if k == name:
                return v
        return None

    def get_all(self, name: str) -> list[str]:
        return [v for k, v in self.pairs if k == name]


#: %-encoded query-string parts -> decoded, for :func:`_query_pairs` (cleared when full).
_DECODED: dict[str, str] = {}
_DECODED_MAX = 4096


def _query_pairs(raw: bytes) -> list[tuple[str, str]]:
    """A URL query's parameters as Starlette's ``QueryParams`` reads them (latin-1, then
    ``parse_qsl`` keeping blank values; the same pairs, hypothesis-checked), each distinct
    %-encoded part decoded once: a dashboard sends the same query text again and again, and
    ``QueryParams`` was a visible share of a small request (``make bench-kql``)."""
    pairs = []
    for part in raw.decode("latin-1").split("&"):
        if part:
            name, _, value = part.partition("=")
            pairs.append((_decoded(name), _decoded(value)))
    return pairs


def _decoded(part: str) -> str:
    part = part.replace("+", " ")
    if "%" not in part:
        return part  # nothing to decode (times, steps, most names)
    out = _DECODED.get(part)
    if out is None:
        if len(_DECODED) >= _DECODED_MAX:
            _DECODED.clear()
        out = _DECODED[part] = unquote(part)
    return out


async def _read_capped(request: Request, max_bytes: int) -> bytes:
    """The request body, refused (Go's ``ParseForm`` text, 413) once it passes ``max_bytes``, unbuffered."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise BodyTooLarge("error parsing form values: http: POST too large")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise BodyTooLarge("error parsing form values: http: POST too large")
        chunks.append(chunk)
    return b"".join(chunks)


def _success(data: Any, warnings: Sequence[str] = (), infos: Sequence[str] = ()) -> JSONResponse:
    body: dict[str, Any] = {"status": "success", "data": data}
    if warnings:
        body["warnings"] = list(warnings)
    if infos:
        body["infos"] = list(infos)
    return JSONResponse(body)


class _EncodedJSON(JSONResponse):
    """A JSON response (status 200) whose body is already encoded: the headers JSONResponse
    would make (``content-length``, ``content-type``) without its generic header building."""

    def __init__(self, body: bytes) -> None:
        self.status_code = 200
        self.background = None
        self.body = body
        self.raw_headers = [
            (b"content-length", str(len(body)).encode()),
            (b"content-type", b"application/json"),
        ]


def _result_response(result: QueryResult) -> JSONResponse:
    """A query's result as ``_success`` would write it, encoded without a Python object per sample
    (``prometheus_json_bytes``: a large range result through JSONResponse spent most of its time on
    those objects; ``make bench-kql``)."""
    body = b'{"status":"success","data":' + prometheus_json_bytes(result.value)
    if warnings := result.warnings:
        body += b',"warnings":' + orjson.dumps(warnings)
    if infos := result.infos:
        body += b',"infos":' + orjson.dumps(infos)
    return _EncodedJSON(body + b"}")


@contextlib.contextmanager
def _query_param() -> Iterator[None]:
    """A query that does not parse is Prometheus 3's ``invalid parameter "query": 1:16: parse
    error: ...`` (``invalidParamError``) on query, query_range and format_query."""
    try:
        yield
    except KqlParseError as exc:
        raise ParamError(f'invalid parameter "query": {exc.brief}') from None


def _refusal(exc: ParamError | KqlError) -> JSONResponse:
    """The answer to a request parameter the client must fix or to a query that failed."""
    if isinstance(exc, ParamError):
        return error_response(exc.status, "bad_data", str(exc))
    return _kql_error(exc)


def _kql_error(exc: KqlError) -> JSONResponse:
    if isinstance(exc, KqlParseError):
        return error_response(400, "bad_data", exc.brief)
    if isinstance(exc, QueryTimeoutError):
        return error_response(503, "timeout", exc.message)
    if isinstance(exc, QueryCancelledError):
        return error_response(499, "canceled", exc.message)
    if isinstance(exc, StorageError):
        if exc.retry_after_s is not None:
            # The store's own words (the innermost storage error), not the layers that wrapped them.
            cause: BaseException = exc
            while isinstance(cause.__cause__, StorageError):
                cause = cause.__cause__
            retry = {"Retry-After": str(exc.retry_after_s)}
            return error_response(503, "unavailable", f"storage unavailable: {cause}", retry)
        return error_response(500, "internal", exc.message)
    return error_response(422, "execution", exc.message)


def _selectors(values: list[str]) -> list[tuple[Matcher, ...]]:
    """``match[]`` values as matcher sets; each must be a plain series selector."""
    out = []
    for text in values:
        try:
            expr = parse(text)
        except KqlParseError as exc:
            raise ParamError(f'invalid parameter "match[]": {exc.brief}') from None
        if not isinstance(expr, VectorSelector) or expr.offset is not None or expr.at is not None:
            raise ParamError(f'invalid parameter "match[]": {text!r} is not a series selector')
        matchers = expr.all_matchers()
        if all(m.matches_empty() for m in matchers):
            raise ParamError(
                'invalid parameter "match[]": match[] must contain at least one non-empty matcher'
            )
        out.append(matchers)
    return out


def _bounds(params: _Params) -> tuple[int, int]:
    start = params.get("start")
    end = params.get("end")
    start_ms = parse_time(start, "start") if start else _STORE_MIN_MS
    end_ms = parse_time(end, "end") if end else _STORE_MAX_MS
    if end_ms < start_ms:
        raise ParamError('invalid parameter "end": end timestamp must not be before start time')
    return start_ms, end_ms


def _limit(params: _Params) -> int:
    text = params.get("limit")
    if not text:
        return 0
    try:
        limit = int(text)
    except ValueError:
        raise ParamError(f'invalid parameter "limit": cannot parse "{text}" to a valid integer') from None
    if limit < 0:
        raise ParamError('invalid parameter "limit": limit must be non-negative')
    return limit


def _truncate(items: list[Any], limit: int) -> tuple[list[Any], list[str]]:
    if limit and len(items) > limit:
        return items[:limit], ["results truncated due to limit"]
    return items, []


def prometheus_router(
    storage_factory: Callable[[], Storage],
    auth: Authenticator,
    *,
    limits: EngineLimits | None = None,
    metadata: MetricMetadata | None = None,
    version: str = "0.1.0",
    clock: Callable[[], float] = time.time,
    max_form_bytes: int = MAX_FORM_BYTES,
    inline_max_s: float = INLINE_MAX_S,
) -> APIRouter:
    """The query API over the storage ``storage_factory()`` returns (called once per request).

    ``limits`` bound every query (a request's ``timeout`` can only shorten it); form bodies larger
    than ``max_form_bytes`` are refused before they are buffered. A query request whose last
    evaluation took less than ``inline_max_s`` is evaluated on the event loop (0: never).
    """
    base_limits = limits or EngineLimits()
    router = APIRouter(tags=["prometheus"])
    read = Depends(auth.require(Scope.READ))

    def engine_limits(params: _Params) -> EngineLimits:
        text = params.get("timeout")
        if not text:
            return base_limits
        timeout_ms = parse_duration_param(text, "timeout")
        if timeout_ms <= 0:
            raise ParamError('invalid parameter "timeout": timeout must be positive')
        return dataclasses.replace(base_limits, timeout_s=min(base_limits.timeout_s, timeout_ms / 1000))

    async def handle(
        request: Request, work: Callable[[_Params], JSONResponse], hop: _Hop = run_in_threadpool
    ) -> JSONResponse:
        try:
            params = await _Params.read(request, max_form_bytes)
            return await hop(work, params)
        except (ParamError, KqlError) as exc:
            return _refusal(exc)

    def do_query(params: _Params) -> JSONResponse:
        query = params.get("query")
        if query is None:
            raise ParamError('invalid parameter "query": no query given')
        t = params.get("time")
        time_ms = parse_time(t, "time") if t else round(clock() * 1000)
        limits_ = engine_limits(params)
        with _query_param():
            result = Engine(storage_factory(), limits_).instant_query(query, time_ms)
        return _result_response(result)

    def do_query_range(params: _Params) -> JSONResponse:
        start_ms = parse_time(params.get("start") or "", "start")
        end_ms = parse_time(params.get("end") or "", "end")
        if end_ms < start_ms:
            raise ParamError('invalid parameter "end": end timestamp must not be before start time')
        step_ms = parse_duration_param(params.get("step") or "", "step")
        if step_ms <= 0:
            raise ParamError(
                'invalid parameter "step": zero or negative query resolution step widths are not accepted. '
                "Try a positive integer"
            )
        if (end_ms - start_ms) // step_ms > MAX_POINTS:
            raise ParamError(
                "exceeded maximum resolution of 11,000 points per timeseries. "
                "Try decreasing the query resolution (?step=XX)"
            )
        query = params.get("query")
        if query is None:
            raise ParamError('invalid parameter "query": no query given')
        limits_ = engine_limits(params)
        with _query_param():
            result = Engine(storage_factory(), limits_).range_query(query, start_ms, end_ms, step_ms)
        return _result_response(result)

    def listing_hints() -> SelectHints:
        """The hints of a series or label read: the query limits as its budget, which a store
        that honours it stops it by at the timeout and before it returns more samples than a
        query may hold."""
        return SelectHints(budget=base_limits.read_budget(time.monotonic() + base_limits.timeout_s))

    def listing(read: Callable[[], None]) -> None:
        read_within("storage failed", read)

    def do_series(params: _Params) -> JSONResponse:
        matches = params.get_all("match[]")
        if not matches:
            raise ParamError("no match[] parameter provided")
        sets = _selectors(matches)
        start_ms, end_ms = _bounds(params)
        storage = storage_factory()
        seen: dict[tuple[tuple[str, str], ...], None] = {}
        hints = listing_hints()

        def read() -> None:
            loaded = 0  # select() hands back samples too: the same limit as a query's
            for matchers in sets:
                for s in storage.select(matchers, start_ms, end_ms, hints):
                    seen[s.labels] = None
                    loaded += len(s.timestamps) + sum(h.sample_weight() for h in s.histograms)
                if loaded > base_limits.max_samples:
                    raise TooManySamplesError()

        listing(read)
        series, warnings = _truncate([dict(labels) for labels in sorted(seen)], _limit(params))
        return _success(series, warnings)

    def label_listing(
        params: _Params, fetch: Callable[[Storage, list[Matcher], int, int, SelectHints], list[str]]
    ) -> JSONResponse:
        """Label names or values of the ``match[]`` sets (all series without one), sorted and limited."""
        sets = _selectors(params.get_all("match[]")) or [()]
        start_ms, end_ms = _bounds(params)
        storage = storage_factory()
        found: set[str] = set()
        hints = listing_hints()

        def read() -> None:
            for matchers in sets:
                found.update(fetch(storage, list(matchers), start_ms, end_ms, hints))

        listing(read)
        out, warnings = _truncate(sorted(found), _limit(params))
        return _success(out, warnings)

    def do_labels(params: _Params) -> JSONResponse:
        return label_listing(
            params, lambda storage, m, start, end, hints: storage.label_names(m, start, end, hints)
        )

    def do_label_values(params: _Params) -> JSONResponse:
        name = params.path_params["name"]
        if name != "__name__" and not _LABEL_NAME.match(name):
            raise ParamError(f'invalid label name: "{name}"')
        return label_listing(
            params, lambda storage, m, start, end, hints: storage.label_values(name, m, start, end, hints)
        )

    def do_format_query(params: _Params) -> JSONResponse:
        query = params.get("query")
        if query is None:
            raise ParamError('invalid parameter "query": no query given')
        with _query_param():
            return _success(str(parse(query)))

    def do_exemplars(params: _Params) -> JSONResponse:
        query = params.get("query")
        if query is None:
            raise ParamError('invalid parameter "query": no query given')
        parse(query)  # a bad query is still a 400, as in Prometheus
        _bounds(params)
        return _success([])  # exemplars are not stored (docs/storage.md)

    def do_metadata(params: _Params) -> JSONResponse:
        limit = _limit(params)
        metric = params.get("metric")
        table = metadata or {}
        names = sorted(table) if not metric else [metric] if metric in table else []
        if limit:
            names = names[:limit]
        return _success({n: table[n] for n in names})

    # -- routes: one endpoint per path for GET and POST (a form body; Prometheus accepts both),
    # the parameters described once for the OpenAPI schema (every endpoint reads them through _Params)

    def route(path: str, work: Callable[[_Params], JSONResponse], summary: str, *params: _Param) -> None:
        async def endpoint(request: Request, _t: object = read) -> JSONResponse:
            return await handle(request, work)

        router.add_api_route(
            path,
            endpoint,
            methods=["GET"],
            summary=summary,
            response_class=JSONResponse,
            openapi_extra={"parameters": [p.openapi() for p in params]},
        )
        router.add_api_route(path, endpoint, methods=["POST"], include_in_schema=False)

    query, timeout = _Param("query", "kql / PromQL expression"), _Param("timeout", "evaluation timeout")
    start, end = _Param("start", "unix seconds or RFC 3339"), _Param("end", "unix seconds or RFC 3339")
    matches = _Param("match[]", "series selectors", repeated=True)
    route(
        "/api/v1/query",
        do_query,
        "Instant query (Prometheus API)",
        query,
        _Param("time", "evaluation time: unix seconds or RFC 3339; default now"),
        _Param("timeout", "evaluation timeout: seconds or a duration"),
    )
    route(
        "/api/v1/query_range",
        do_query_range,
        "Range query (Prometheus API)",
        query,
        start,
        end,
        _Param("step", "seconds or a duration"),
        timeout,
    )
    route(
        "/api/v1/series",
        do_series,
        "Series matching selectors (Prometheus API)",
        matches,
        start,
        end,
        _Param("limit", "at most this many series"),
    )
    route(
        "/api/v1/labels",
        do_labels,
        "Label names (Prometheus API)",
        matches,
        start,
        end,
        _Param("limit", "at most this many names"),
    )
    route(
        "/api/v1/label/{name}/values",
        do_label_values,
        "Values of one label (Prometheus API)",
        _Param("name", "label name", path=True),
        matches,
        start,
        end,
        _Param("limit", "at most this many values"),
    )
    route(
        "/api/v1/metadata",
        do_metadata,
        "Metric metadata (Prometheus API)",
        _Param("metric", "one metric name"),
        _Param("limit", "at most this many metrics"),
    )
    route("/api/v1/format_query", do_format_query, "The query pretty-printed (Prometheus API)", query)
    route(
        "/api/v1/query_exemplars",
        do_exemplars,
        "Exemplars (none are stored: always empty)",
        query,
        start,
        end,
    )

    @router.get("/api/v1/status/buildinfo", summary="Build information (Prometheus API)")
    async def buildinfo(_t: object = read) -> JSONResponse:
        return _success(
            {
                "version": version,
                "revision": "",
                "branch": "",
                "buildUser": "",
                "buildDate": "",
                "goVersion": "",
            }
        )

    # The two query endpoints are served by bare ASGI routes ahead of the FastAPI ones (which stay
    # for the OpenAPI schema): no dependency solving or parameter validation per request, and the
    # query runs inline or in a query thread (docs/api.md, "Query endpoints: the request path").
    runner = _QueryRunner(inline_max_s=inline_max_s)
    for path, work in (("/api/v1/query", do_query), ("/api/v1/query_range", do_query_range)):
        router.routes.insert(
            0,
            Route(
                path,
                _QueryEndpoint(path, work, auth, handle, runner),
                methods=["GET", "POST"],
                include_in_schema=False,
            ),
        )
    return router


def query_routes(router: APIRouter) -> list[BaseRoute]:
    """The bare query routes of a :func:`prometheus_router`, for an app to put ahead of all its
    routes: matched first, a query skips trying every included router's routes (a cost per request
    that ``make bench-kql`` shows on small queries)."""
    return [r for r in router.routes if isinstance(r, Route) and isinstance(r.endpoint, _QueryEndpoint)]


#: Runs a request's work (in a thread or inline) and awaits it.
_Hop = Callable[[Callable[[_Params], JSONResponse], _Params], Awaitable[JSONResponse]]


class _QueryRunner:
    """Runs a query's work in a query thread, or inline on the event loop when it is known to be quick.

    Handing work to a thread and back costs the event loop two wake-ups (as much as a small
    query's evaluation; on a loaded host each wake-up can also wait for a core). A request (same
    endpoint, query, step and time span) the quicker of whose last two runs took less than
    ``inline_max_s`` runs inline. Inline, it holds the loop (other requests on this collector
    wait) for at most that long; in a thread a query holds the GIL for most of its run anyway,
    the loop getting it back every switch interval (set by ``serve``). The short queries that
    dashboards ask most paid the hop: inline, bench-kql's instant queries took less collector CPU
    and wall time (bench/results/kql.md). Two runs, not one: on a loaded host a quick query's run
    is sometimes preempted past the bound, which alone would send the next to a thread.
    A request seen for the first time, or slow twice, runs in a thread; one that turns slow (a
    cache miss reading ClickHouse) holds the loop twice and runs in a thread from then on.
    ``loop.run_in_executor`` rather than anyio's ``to_thread``: its capacity limiter, cancel scope
    and run-var lookups cost the loop more a query (``make bench-kql``).
    """

    def __init__(self, workers: int = QUERY_THREADS, inline_max_s: float = INLINE_MAX_S) -> None:
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ki-query")
        self._inline_max_s = inline_max_s
        # request -> (last run, the run before): touched on the event loop only
        self._last_s: dict[tuple[str | None, ...], tuple[float, float]] = {}

    @staticmethod
    def key(path: str, params: _Params) -> tuple[str | None, ...]:
        """What makes two requests the same request: endpoint, query, step and time span."""
        return (path, params.get("query"), params.get("step"), *_span(params))

    def quick(self, key: tuple[str | None, ...]) -> bool:
        """Whether the quicker of the request's last two runs took less than the inline bound
        (on a loaded host a quick query's run is now and then preempted past it, and a thread
        hop then costs it two more waits for a core)."""
        runs = self._last_s.get(key)
        return runs is not None and min(runs) < self._inline_max_s

    def inline(
        self, key: tuple[str | None, ...], work: Callable[[_Params], JSONResponse], params: _Params
    ) -> JSONResponse:
        """Run ``work`` here and now (on the event loop), its time remembered."""
        runs = self._last_s.get(key)
        began = time.perf_counter()
        try:
            return work(params)
        finally:
            self._remember(key, runs, time.perf_counter() - began)

    async def run(self, path: str, work: Callable[[_Params], JSONResponse], params: _Params) -> JSONResponse:
        key = self.key(path, params)
        if self.quick(key):
            return self.inline(key, work, params)
        runs = self._last_s.get(key)
        took: list[float] = []  # the work's own time, once it ended (not when the request was cancelled)

        def timed() -> JSONResponse:
            began = time.perf_counter()
            try:
                return work(params)
            finally:
                took.append(time.perf_counter() - began)

        context = contextvars.copy_context()  # as to_thread does: the request's context vars go along
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, context.run, timed)
        finally:
            if took:
                self._remember(key, runs, took[0])

    def _remember(self, key: tuple[str | None, ...], runs: tuple[float, float] | None, took: float) -> None:
        if len(self._last_s) >= _REMEMBERED_REQUESTS:
            self._last_s.clear()
        self._last_s[key] = (took, took if runs is None else runs[0])


def _span(params: _Params) -> tuple[str | None, ...]:
    """A range query's span (end - start) in the key, so that a dashboard's moving window stays one request."""
    start, end = params.get("start"), params.get("end")
    if start is None or end is None:  # an instant query: no float("") raised and caught per request
        return (start, end)
    try:
        return (str(round(float(end or "") - float(start or ""), 3)),)
    except ValueError:
        return (start, end)


class _QueryEndpoint:
    """``/api/v1/query`` or ``/api/v1/query_range`` as a bare ASGI app: token check, parameters, work."""

    def __init__(
        self,
        path: str,
        work: Callable[[_Params], JSONResponse],
        auth: Authenticator,
        handle: Callable[[Request, Callable[[_Params], JSONResponse], _Hop], Awaitable[JSONResponse]],
        runner: _QueryRunner,
    ) -> None:
        self.path = path  # the route template the request metrics count under
        self._work = work
        self._auth = auth
        self._handle = handle
        self._runner = runner
        self._hop: _Hop = functools.partial(runner.run, path)

    async def __call__(self, scope: AsgiScope, receive: Receive, send: Send) -> None:
        scope["route"] = self
        headers = scope["headers"]
        authorization = next((v.decode("latin-1") for k, v in headers if k == b"authorization"), None)
        self._auth.check(authorization, Scope.READ)  # an ApiError is rendered by the app's handler
        response = await self._handle(Request(scope, receive), self._work, self._hop)
        await response(scope, receive, send)

    def at_once(
        self, query_string: bytes, authorization: str | None, memo: CheckMemo | None = None
    ) -> Callable[[], JSONResponse] | None:
        """The answer to a ``GET`` with this URL query, to compute here and now on the event loop,
        when its token is good and the request is known to be quick (:meth:`_QueryRunner.quick`);
        None for any other (a refused token, a new or slow query): that one takes the ASGI path.
        The answer is what :meth:`__call__` sends (the same work, the same refusals); an
        exception other than a refusal is raised. ``memo``: the connection's token check memo."""
        try:
            self._auth.check(authorization, Scope.READ, memo)
        except ApiError:
            return None  # rendered by the app's handler on the ASGI path
        params = _Params(_query_pairs(query_string))
        key = self._runner.key(self.path, params)
        if not self._runner.quick(key):
            return None
        runner, work = self._runner, self._work

        def answer() -> JSONResponse:
            try:
                return runner.inline(key, work, params)
            except (ParamError, KqlError) as exc:
                return _refusal(exc)

        return answer


#: An exception handler as Starlette keeps them: (request, exception) -> response, sync or async.
_Handler = Callable[[Request, Exception], Any]


class _FastEndpoint(Protocol):
    """What ``QueryFastPath`` answers with: a bare ASGI app with the route template it is counted under."""

    path: str

    async def __call__(self, scope: AsgiScope, receive: Receive, send: Send) -> None: ...


class QueryFastPath:
    """An ASGI app answering ``GET`` of the two query endpoints ahead of ``app``'s middleware stack.

    A small instant query's evaluation is short, and the stack around a route (uvicorn's proxy
    headers, Starlette's error and exception middleware, FastAPI's telemetry, body-limit and
    exit-stack layers, the request metrics) added a sizeable share of coroutine calls and send
    wrappers to each (``make bench-kql``). Here a query is handed straight to its :class:`_QueryEndpoint` (the
    ``query_routes``) with what that stack does for it kept: the request metrics
    (``observe(endpoint, method, status, seconds)``), the app's exception handlers (an
    :class:`~kernel_insight.api.errors.ApiError` from the token check is rendered as anywhere
    else) and a plain 500 for anything unhandled, which is raised on for the server to log.
    ``posts`` are bare ``POST`` endpoints by path answered the same way (remote_write:
    ``collector.RemoteWriteEndpoint``, whose own body limit replaces the stack's).
    Everything else, ``POST`` queries (form bodies, whose size the stack caps) included, goes to
    ``inner``: ``app`` with what the server wraps around it (docs/api.md, "Query endpoints: the
    request path").
    """

    def __init__(
        self,
        inner: ASGIApp,
        app: Any,
        routes: Sequence[BaseRoute],
        handlers: dict[Any, _Handler],
        observe: Callable[[str, str, int, float], None] | None = None,
        posts: Mapping[str, _FastEndpoint] | None = None,
    ) -> None:
        self._inner = inner
        self._app = app  # scope["app"], as Starlette sets it for the handlers
        self._endpoints: dict[str, _FastEndpoint] = {}
        for route in routes:
            if isinstance(route, Route) and isinstance(route.endpoint, _QueryEndpoint):
                self._endpoints[route.path] = route.endpoint
        self._posts: dict[str, _FastEndpoint] = dict(posts or {})
        self._handlers = handlers
        self._observe = observe

    async def __call__(self, scope: AsgiScope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            method = scope["method"]
            endpoints = self._endpoints if method == "GET" else self._posts if method == "POST" else None
            endpoint = endpoints.get(scope["path"]) if endpoints else None
            if endpoint is not None:
                await self._answer(endpoint, scope, receive, send)
                return
        await self._inner(scope, receive, send)

    async def _answer(self, endpoint: _FastEndpoint, scope: AsgiScope, receive: Receive, send: Send) -> None:
        began = time.perf_counter()
        status = 0  # none sent yet

        async def sent(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        scope["app"] = self._app
        try:
            try:
                await endpoint(scope, receive, sent)
            except Exception as exc:
                handler = self._handler(exc)
                if handler is None or status:
                    if not status:
                        await PlainTextResponse("Internal Server Error", status_code=500)(
                            scope, receive, sent
                        )
                    raise
                request = Request(scope, receive)
                if asyncio.iscoroutinefunction(handler):
                    response = await handler(request, exc)
                else:
                    response = await run_in_threadpool(handler, request, exc)
                await response(scope, receive, sent)
        finally:
            if self._observe is not None:
                self._observe(endpoint.path, scope["method"], status or 500, time.perf_counter() - began)

    def at_once(
        self,
        method: str,
        path: str,
        query_string: bytes,
        headers: Sequence[tuple[bytes, bytes]],
        state: dict[str, Any] | None = None,
    ) -> QuickAnswer | None:
        """A ``GET`` query the HTTP protocol can answer itself, without an ASGI request cycle
        (``api.connections.guarded_protocol``'s ``quick``): one with a good token that is known
        to be quick (:meth:`_QueryEndpoint.at_once`). None for any other request: that one is
        answered by :meth:`__call__`. The answer writes what :meth:`__call__` would (the same
        bytes, the request metrics), or nothing and False when the work raised anything but a
        refusal: then the request goes through :meth:`__call__` after all, which answers such
        an exception as it always does (a handler, or a logged 500). ``state``: the connection's
        (its token check is remembered there, :class:`~kernel_insight.api.auth.CheckMemo`)."""
        if method != "GET":
            return None
        endpoint = self._endpoints.get(path)
        if not isinstance(endpoint, _QueryEndpoint):
            return None
        began = time.perf_counter()
        authorization = next((v.decode("latin-1") for k, v in headers if k == b"authorization"), None)
        memo = None
        if state is not None:
            memo = state.get("auth")
            if memo is None:
                memo = state["auth"] = CheckMemo()
        compute = endpoint.at_once(query_string, authorization, memo)
        if compute is None:
            return None
        observe = self._observe

        def answer(write: ResponseWriter) -> bool:
            try:
                response = compute()
            except Exception:
                log.debug("a quick query raised; answering it through the ASGI path", exc_info=True)
                return False
            write(response.status_code, response.raw_headers, bytes(response.body))
            if observe is not None:
                observe(endpoint.path, method, response.status_code, time.perf_counter() - began)
            return True

        return answer

    def _handler(self, exc: Exception) -> _Handler | None:
        """The app's handler for ``exc``'s class or its nearest base (as Starlette looks them up),
        None for none short of ``Exception`` (Starlette's server-error layer owns that one)."""
        for cls in type(exc).__mro__:
            if cls is Exception:
                return None
            if cls in self._handlers:
                return self._handlers[cls]
        return None
