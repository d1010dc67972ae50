"""``GET /v1/topology``: instances grouped by their ``host``, ``rack`` and ``switch`` labels.

Placement decides blast radius (a switch failure takes a whole group) and
NCCL locality, so SDKs and operators want the grouping without joining labels themselves.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from kernel_insight.api.auth import Authenticator, Scope
from kernel_insight.api.health import (
    ERROR_RESPONSES,
    Snapshot,
    Snapshotter,
    cached_json,
    current_snapshot,
    encode_json,
)
from kernel_insight.api.models import Topology

__all__ = ["PLACEMENT_LABELS", "topology", "topology_router"]

#: The labels that place an instance, outermost last; an absent label groups as "".
PLACEMENT_LABELS = ("host", "rack", "switch")


def topology(snap: Snapshot) -> dict[str, object]:
    """Groups sorted by (switch, rack, host), each listing its instance ids, how many are healthy, and
    each member's health and hardware fingerprint (GPU product, count, driver, CUDA, memory, NVLink)."""
    groups: dict[tuple[str, str, str], list[dict[str, object]]] = {}
    for r in snap.records:
        labels = r["labels"]
        key = (labels.get("switch", ""), labels.get("rack", ""), labels.get("host", ""))
        groups.setdefault(key, []).append(r)
    return {
        "as_of_ms": snap.as_of_ms,
        "groups": [
            {
                "host": host,
                "rack": rack,
                "switch": switch,
                "instances": [str(r["id"]) for r in members],
                "healthy": sum(1 for r in members if r["healthy"]),
                "members": [
                    {"id": str(r["id"]), "healthy": bool(r["healthy"]), "fingerprint": r["fingerprint"]}
                    for r in members
                ],
            }
            for (switch, rack, host), members in sorted(groups.items())
        ],
    }


def topology_router(snapshotter: Snapshotter, auth: Authenticator) -> APIRouter:
    router = APIRouter(tags=["instances"])

    @router.get(
        "/v1/topology",
        response_model=Topology,
        responses=ERROR_RESPONSES,
        summary="Instances by host, rack, switch",
    )
    async def get_topology(request: Request, _token: object = Depends(auth.require(Scope.READ))) -> Response:
        snap = await current_snapshot(snapshotter)
        return cached_json(request, lambda: encode_json(topology(snap)), snap.etag[:-1] + '-t"', snap)

    return router
