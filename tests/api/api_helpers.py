"""Helpers for the API tests: a fake health source, an ASGI test client, apps over memory storage, a real server."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import Callable
from typing import Any

import httpx
from fastapi import FastAPI

from kernel_insight.api import (
    Authenticator,
    HealthRule,
    InstanceFacts,
    Snapshotter,
    default_metadata,
    health_router,
    install_error_handlers,
    instances_router,
    prometheus_router,
    topology_router,
)
from kernel_insight.kql.storage import MemoryStorage

GiB = 1 << 30


class TestClient:
    """A synchronous face on httpx's ASGI transport (starlette's TestClient warns on import)."""

    __test__ = False

    def __init__(self, app: FastAPI) -> None:
        self.app = app
        self.headers: dict[str, str] = {}

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        headers = {**self.headers, **kwargs.pop("headers", {})}

        async def go() -> httpx.Response:
            transport = httpx.ASGITransport(app=self.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://ki") as c:
                return await c.request(method, path, headers=headers, **kwargs)

        return asyncio.run(go())

    def get(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.request("GET", path, **kwargs)

    def post(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.request("POST", path, **kwargs)


class FakeSource:
    """A HealthSource whose facts the test edits; counts collect() calls."""

    def __init__(self, facts: list[InstanceFacts] | None = None) -> None:
        self.facts = facts or []
        self.errors: dict[str, list[dict]] = {}
        self.calls = 0
        self.fail: Exception | None = None

    def collect(self, now_ms: int) -> list[InstanceFacts]:
        self.calls += 1
        if self.fail is not None:
            raise self.fail
        return list(self.facts)

    def recent_errors(self, instance_id: str, limit: int) -> list[dict]:
        if self.fail is not None:
            raise self.fail
        return self.errors.get(instance_id, [])[:limit]


def facts(
    id: str,
    *,
    now_ms: int,
    models: str = "llama-70b",
    free: float | None = 40 * GiB,
    total: float = 80 * GiB,
    age_s: float = 1.0,
    errors: dict[str, int] | None = None,
    temp: float | None = 60.0,
    latencies: list[float] | None = None,
    **labels: str,
) -> InstanceFacts:
    return InstanceFacts(
        id=id,
        last_seen_ms=now_ms - int(age_s * 1000),
        labels={"models": models, **labels},
        attributes={
            "gpu0.driver_version": "550.54",
            "gpu0.cuda_version": "12040",
            "gpu0.nvlink_bandwidth": "450",
            "gpu1.nvlink_bandwidth": "450",
            "gpu0.name": "NVIDIA H100",
        },
        hardware_fingerprint="fp-" + id,
        gpu_model="NVIDIA H100",
        gpu_count=2,
        memory_total_bytes=int(total),
        gpu_memory_free_bytes=free,
        gpu_memory_total_bytes=total,
        temperature_celsius=temp,
        power_watts=350.0,
        sm_utilization_ratio=0.5,
        nccl_latencies=latencies if latencies is not None else [0.001, 0.002, 0.003],
        errors_by_kind=errors or {},
    )


def build_app(
    source: FakeSource,
    auth: Authenticator,
    storage: MemoryStorage | None = None,
    rule: HealthRule | None = None,
    clock: Callable[[], float] = time.time,
) -> tuple[FastAPI, Snapshotter]:
    snapshotter = Snapshotter(source, rule, interval_s=3600, clock=clock)
    mem = storage if storage is not None else MemoryStorage()
    app = FastAPI()
    for router in (
        health_router(snapshotter, auth, manage_lifecycle=False),
        instances_router(snapshotter, auth),
        topology_router(snapshotter, auth),
        prometheus_router(lambda: mem, auth, metadata=default_metadata(), clock=clock),
    ):
        app.include_router(router)
    install_error_handlers(app)
    return app, snapshotter


def read_until_closed(s: socket.socket, deadline_s: float) -> bytes:
    """Everything the server sends until it closes the connection (or the deadline passes)."""
    s.settimeout(deadline_s)
    out = b""
    with contextlib.suppress(OSError):
        while chunk := s.recv(65536):
            out += chunk
    return out
