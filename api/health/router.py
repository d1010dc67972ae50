"""``GET /v1/health/snapshot``: filters and joins the current snapshot's bytes; ETag, 304, Cache-Control."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Query, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from kernel_insight.api.auth import Authenticator, Scope
from kernel_insight.api.errors import ApiError
from kernel_insight.api.health.snapshot import Snapshot
from kernel_insight.api.health.snapshotter import MAX_WAIT_S, Snapshotter
from kernel_insight.api.models import ErrorBody, HealthSnapshot

__all__ = [
    "CACHE_CONTROL",
    "ERROR_RESPONSES",
    "accepts_gzip",
    "cached_json",
    "current_snapshot",
    "etag_matches",
    "health_router",
]

#: Clients may reuse a snapshot this long without asking; revalidation is a cheap 304.
CACHE_CONTROL = "max-age=30"


def etag_matches(if_none_match: str | None, etag: str) -> bool:
    """RFC 9110 weak comparison of an If-None-Match list against our ETag."""
    if not if_none_match:
        return False
    bare = etag.removeprefix("W/")
    for candidate in if_none_match.split(","):
        c = candidate.strip()
        if c == "*" or c.removeprefix("W/") == bare:
            return True
    return False


def _filtered_etag(etag: str, key: str) -> str:
    if not key:
        return etag
    return etag[:-1] + "-" + hashlib.blake2b(key.encode(), digest_size=6).hexdigest() + '"'


async def current_snapshot(snapshotter: Snapshotter) -> Snapshot:
    """The latest snapshot; a 503 with Retry-After when none could be built yet."""
    snap = snapshotter.snapshot
    if snap is not None:
        return snap
    try:
        return await run_in_threadpool(snapshotter.refresh)
    except Exception as exc:
        raise ApiError(
            503,
            "unavailable",
            f"no health snapshot yet: {exc}",
            {"Retry-After": str(max(1, int(snapshotter.interval_s)))},
        ) from None


def accepts_gzip(accept_encoding: str | None) -> bool:
    """Whether an Accept-Encoding header (RFC 9110) takes gzip: listed, or ``*``, with a q above 0."""
    if not accept_encoding:
        return False
    for item in accept_encoding.split(","):
        coding, _, params = item.strip().partition(";")
        if coding.strip().lower() not in ("gzip", "x-gzip", "*"):
            continue
        q = params.strip().lower()
        if q.startswith("q="):
            try:
                return float(q[2:]) > 0
            except ValueError:
                return False
        return True
    return False


def cached_json(
    request: Request, body: Callable[[], bytes], etag: str, snap: Snapshot, gzipped: bytes | None = None
) -> Response:
    """200 with ETag and Cache-Control, or 304 when the client already holds this ETag.

    ``gzipped``: ``body()`` already gzip-compressed, sent as such to a client that accepts gzip
    (httpx, the SDK and browsers ask for it by default); the ETag names the content either way."""
    headers = {
        "ETag": etag,
        "Cache-Control": CACHE_CONTROL,
        "X-Ki-Computed-At-Ms": str(snap.computed_at_ms),
    }
    if gzipped is not None:
        headers["Vary"] = "Accept-Encoding"
    if etag_matches(request.headers.get("if-none-match"), etag):
        return Response(status_code=304, headers=headers)
    if gzipped is not None and accepts_gzip(request.headers.get("accept-encoding")):
        headers["Content-Encoding"] = "gzip"
        return Response(gzipped, media_type="application/json", headers=headers)
    return Response(body(), media_type="application/json", headers=headers)


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorBody},
    401: {"model": ErrorBody},
    403: {"model": ErrorBody},
    503: {"model": ErrorBody},
}


def health_router(
    snapshotter: Snapshotter, auth: Authenticator, *, manage_lifecycle: bool = True
) -> APIRouter:
    """``GET /v1/health/snapshot``; starts and stops ``snapshotter`` with the app when ``manage_lifecycle``."""

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        snapshotter.start()
        try:
            yield
        finally:
            await run_in_threadpool(snapshotter.shutdown)

    router = APIRouter(tags=["health"], lifespan=lifespan if manage_lifecycle else None)

    @router.get(
        "/v1/health/snapshot",
        response_model=HealthSnapshot,
        responses={304: {"description": "Not modified (If-None-Match matched the ETag)"}, **ERROR_RESPONSES},
        summary="Every instance's capacity and health (cached; ETag)",
    )
    async def snapshot(
        request: Request,
        model: str | None = Query(None, description="only instances serving this model"),
        min_free_bytes: int | None = Query(
            None, ge=0, description="only instances with at least this much free GPU memory"
        ),
        healthy: bool | None = Query(None, description="only healthy (true) or unhealthy (false) instances"),
        pod: str | None = Query(None, description="only instances with a GPU this Kubernetes pod holds"),
        namespace: str | None = Query(
            None, description="only instances with a GPU a pod of this Kubernetes namespace holds"
        ),
        wait: float | None = Query(
            None,
            ge=0,
            le=MAX_WAIT_S,
            description="long-poll: when If-None-Match matches, hold the answer up to this many seconds"
            " until a rebuild changes it (then 200), else 304",
        ),
        _token: object = Depends(auth.require(Scope.READ)),
    ) -> Response:
        snap = await current_snapshot(snapshotter)
        filtered = not (
            model is None and min_free_bytes is None and healthy is None and pod is None and namespace is None
        )
        key = f"{model!r}|{min_free_bytes!r}|{healthy!r}|{pod!r}|{namespace!r}"

        def etag_of(s: Snapshot) -> str:
            return _filtered_etag(s.etag, key) if filtered else s.etag

        if wait:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + wait
            held = request.headers.get("if-none-match")
            # A rebuild may change the fleet but not this filter's answer: wait on.
            while etag_matches(held, etag_of(snap)) and (left := deadline - loop.time()) > 0:
                newer = await snapshotter.changed(snap.etag, left)
                if newer is None:
                    break
                snap = newer
        if not filtered:
            return cached_json(request, lambda: snap.body, snap.etag, snap, snap.body_gzip)
        return cached_json(
            request,
            lambda: snap.render(snap.select(model, min_free_bytes, healthy, pod, namespace)),
            etag_of(snap),
            snap,
        )

    return router
