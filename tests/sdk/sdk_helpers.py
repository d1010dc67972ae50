"""Helpers for the SDK tests: snapshot bodies as the real server encodes them, a fake server and clock."""

from __future__ import annotations

import time

import httpx

from kernel_insight.api.health import HealthRule, InstanceFacts, build_snapshot

GiB = 1 << 30


def instance(
    id: str,
    free_gib: float | None = 40,
    *,
    models: str = "llama-70b",
    p99: float | None = 0.002,
    errors: int = 0,
    age_s: float = 1,
    now_ms: int | None = None,
) -> InstanceFacts:
    now_ms = now_ms or int(time.time() * 1000)
    return InstanceFacts(
        id=id,
        last_seen_ms=now_ms - int(age_s * 1000),
        labels={"models": models},
        gpu_memory_free_bytes=None if free_gib is None else free_gib * GiB,
        gpu_memory_total_bytes=80 * GiB,
        nccl_latencies=[] if p99 is None else [p99] * 10,
        errors_by_kind={"oom": errors} if errors else {},
    )


def snapshot_body(facts: list[InstanceFacts], now_ms: int | None = None) -> tuple[bytes, str]:
    """The snapshot JSON and ETag exactly as the server's build_snapshot makes them."""
    snap = build_snapshot(facts, HealthRule(max_errors_5m=100), now_ms or int(time.time() * 1000))
    return snap.body, snap.etag


class FakeServer:
    """A MockTransport handler serving a snapshot with ETag/304; it can fail on demand."""

    def __init__(self, facts: list[InstanceFacts]) -> None:
        self.set(facts)
        self.requests: list[httpx.Request] = []
        self.down = False
        self.status: int | None = None

    def set(self, facts: list[InstanceFacts]) -> None:
        self.body, self.etag = snapshot_body(facts)

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if self.down:
            raise httpx.ConnectError("connection refused", request=request)
        if self.status is not None:
            return httpx.Response(self.status, json={"status": "error", "errorType": "x", "error": "nope"})
        if request.headers.get("if-none-match") == self.etag:
            return httpx.Response(304, headers={"ETag": self.etag})
        return httpx.Response(
            200, content=self.body, headers={"ETag": self.etag, "Content-Type": "application/json"}
        )


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t
