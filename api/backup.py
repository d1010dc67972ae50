"""``GET /api/v1/admin/backup``: the embedded store, keys and tokens as a tar stream (scope
``admin``; collector/backup.py, docs/backup.md). ``ki backup --collector URL`` unpacks it."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Depends, HTTPException
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from kernel_insight.api.auth import Authenticator, Scope
from kernel_insight.collector.backup import frozen, tar_chunks

__all__ = ["BACKUP_PATH", "backup_router"]

#: Where a running collector serves its backup.
BACKUP_PATH = "/api/v1/admin/backup"


def backup_router(store: Any, files: Mapping[str, Path], auth: Authenticator) -> APIRouter:
    """Serve a backup of ``store`` (an ``EmbeddedStore``) with ``files`` (name in the backup ->
    path: the key and token stores) to tokens with the ``admin`` scope."""
    router = APIRouter(tags=["admin"], dependencies=[Depends(auth.require(Scope.ADMIN))])

    @router.get(
        BACKUP_PATH,
        summary="A consistent backup of the embedded store, keys and tokens (application/x-tar)",
        responses={409: {"description": "The store is not an embedded one"}},
    )
    async def backup() -> StreamingResponse:
        if not hasattr(store, "writes_held"):
            raise HTTPException(
                409,
                "only an embedded store is backed up by the collector; back up a ClickHouse server with its own BACKUP",
            )
        snapshot = frozen(store, files)
        snap = await run_in_threadpool(snapshot.__enter__)

        def stream() -> Iterator[bytes]:
            try:
                yield from tar_chunks(snap)
            finally:
                snapshot.__exit__(None, None, None)

        return StreamingResponse(
            stream(),
            media_type="application/x-tar",
            headers={"x-ki-backup-bytes": str(snap.bytes), "cache-control": "no-store"},
        )

    return router
