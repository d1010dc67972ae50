"""``GET /v1/instances`` and ``/v1/instances/{id}``: fingerprint, capacity and recent errors per instance.

The list and the capacity come from the health snapshot (no store read per request);
only an instance's recent errors are read from the store, on demand.
"""

from __future__ import annotations

import json

from fastapi import APIRouter, Depends, Path, Query, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from kernel_insight.api.auth import Authenticator, Scope
from kernel_insight.api.errors import ApiError
from kernel_insight.api.health import ERROR_RESPONSES, Snapshotter, cached_json, current_snapshot
from kernel_insight.api.models import InstanceDetail, InstanceList

__all__ = ["RECENT_ERRORS", "instances_router"]

#: How many of an instance's newest errors ``/v1/instances/{id}`` lists.
RECENT_ERRORS = 20


def instances_router(snapshotter: Snapshotter, auth: Authenticator) -> APIRouter:
    router = APIRouter(tags=["instances"])

    @router.get(
        "/v1/instances", response_model=InstanceList, responses=ERROR_RESPONSES, summary="Every instance"
    )
    async def list_instances(
        request: Request,
        healthy: bool | None = Query(None, description="only healthy (true) or unhealthy (false) instances"),
        _token: object = Depends(auth.require(Scope.READ)),
    ) -> Response:
        snap = await current_snapshot(snapshotter)
        positions = None if healthy is None else snap.select(None, None, healthy)
        frags = snap.fragments if positions is None else [snap.fragments[i] for i in positions]

        def body() -> bytes:
            return (
                b'{"as_of_ms":' + str(snap.as_of_ms).encode() + b',"instances":[' + b",".join(frags) + b"]}"
            )

        etag = snap.etag[:-1] + f"-i{'' if healthy is None else int(healthy)}" + '"'
        return cached_json(request, body, etag, snap)

    @router.get(
        "/v1/instances/{instance_id}",
        response_model=InstanceDetail,
        responses={404: {"description": "No such instance"}, **ERROR_RESPONSES},
        summary="One instance: fingerprint, capacity, health and its most recent errors",
    )
    async def get_instance(
        instance_id: str = Path(description="the instance (agent) id"),
        _token: object = Depends(auth.require(Scope.READ)),
    ) -> JSONResponse:
        snap = await current_snapshot(snapshotter)
        pos = snap.index.get(instance_id)
        if pos is None:
            raise ApiError(
                404, "not_found", f"no instance {instance_id!r} (known: {len(snap.records)} instances)"
            )
        try:
            errors = await run_in_threadpool(snapshotter.source.recent_errors, instance_id, RECENT_ERRORS)
        except Exception as exc:  # the store is down; a partial answer would hide that
            raise ApiError(
                503, "unavailable", f"cannot read recent errors: {exc}", {"Retry-After": "5"}
            ) from None
        record = json.loads(snap.fragments[pos])
        return JSONResponse(
            {"instance": record, "attributes": dict(snap.attributes[pos]), "recent_errors": errors}
        )

    return router
