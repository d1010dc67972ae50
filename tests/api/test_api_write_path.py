"""remote_write's own request path: answered ahead of the middleware stack, with the route's checks and answers."""

from __future__ import annotations

import asyncio
import threading
import time

import cramjam
import httpx
import pytest
from fastapi import Depends
from support.collector import running_collector

from kernel_insight.api import TokenStore, create_api_app, query_fast_path
from kernel_insight.collector import app as app_module
from kernel_insight.collector import create_app
from kernel_insight.collector.app import RemoteWriteEndpoint
from kernel_insight.collector.batcher import Batcher
from kernel_insight.collector.clickhouse.store import EmbeddedStore
from kernel_insight.collector.remote_write import announced_size, encode_write_request, parse_remote_write
from kernel_insight.kql.storage import Matcher

NOW = int(time.time() * 1000)
BODY_HEADERS = {"Content-Encoding": "snappy", "Content-Type": "application/x-protobuf"}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    s = EmbeddedStore(tmp_path_factory.mktemp("write-path"))
    yield s
    s.close()


def _body(job: str, n: int = 1) -> bytes:
    return encode_write_request(
        [({"__name__": "up", "job": job, "i": str(i)}, [(NOW, 1.0)]) for i in range(n)]
    )


def _count(store: EmbeddedStore, job: str) -> int:
    return len(store.storage().select([Matcher("job", "=", job)], NOW, NOW))


def test_remote_write_is_answered_ahead_of_the_stack_with_the_routes_answers(store, tmp_path, monkeypatch):
    decoded_in: list[str] = []

    def parse(*args, **kwargs):  # type: ignore[no-untyped-def]
        decoded_in.append(threading.current_thread().name)
        return parse_remote_write(*args, **kwargs)

    monkeypatch.setattr(app_module, "parse_remote_write", parse)
    monkeypatch.setattr(app_module, "INLINE_MAX_DECODED", 64 << 10)
    tokens = TokenStore(tmp_path / "tokens.json")
    app = create_api_app(store, tokens=tokens, interval_s=3600)
    batcher = app.state.remote_write_batcher = Batcher(store)  # as ki collector has it: group commit
    through_stack: list[str] = []

    @app.middleware("http")
    async def note(request, call_next):  # type: ignore[no-untyped-def]
        through_stack.append(f"{request.method} {request.url.path}")
        return await call_next(request)

    observed: list[tuple[str, str, int]] = []
    app.state.metrics.observe_request = lambda e, m, s, _t: observed.append((e, m, s))
    fast = query_fast_path(app, app)
    ingest = tokens.create("w", ["ingest"]).token
    read = tokens.create("r", ["read"]).token

    def post(body: bytes, token: str | None = ingest, **headers: str) -> httpx.Response:
        async def go() -> httpx.Response:
            transport = httpx.ASGITransport(app=fast, raise_app_exceptions=False)
            auth = {"Authorization": f"Bearer {token}"} if token else {}
            async with httpx.AsyncClient(transport=transport, base_url="http://ki") as c:
                return await c.post(
                    "/api/v1/write", content=body, headers={**BODY_HEADERS, **auth, **headers}
                )

        return asyncio.run(go())

    assert post(_body("fast")).status_code == 204
    assert _count(store, "fast") == 1
    # Over INLINE_MAX_DECODED (by its snappy header): decoded in a worker thread, stored the same.
    big = _body("big", 2_000)
    assert announced_size(big) > app_module.INLINE_MAX_DECODED > len(big)
    assert post(big).status_code == 204
    assert _count(store, "big") == 2_000
    loop_thread = threading.current_thread().name  # asyncio.run's loop runs here
    assert decoded_in[0] == loop_thread, decoded_in
    assert decoded_in[1] != loop_thread, decoded_in
    r = post(_body("none"), token=None)
    assert (r.status_code, r.json()["errorType"]) == (401, "unauthorized")
    assert r.headers["www-authenticate"].startswith("Bearer")
    r = post(_body("reader"), token=read)
    assert r.status_code == 403
    assert "'ingest' scope" in r.json()["error"]
    r = post(_body("gzip"), **{"Content-Encoding": "gzip"})
    assert r.status_code == 415
    assert "snappy" in r.json()["detail"]
    r = post(b"\x05not snappy at all")
    assert r.status_code == 400
    assert "malformed remote_write request" in r.json()["detail"]
    r = post(bytes(cramjam.snappy.compress_raw(b"\x0a\x03\x0a\x01")))  # a TimeSeries cut short
    assert r.status_code == 400, r.text
    r = post(b"\xff\xff\xff\xff\x0f")  # a snappy header announcing 4 GiB
    assert r.status_code == 413
    assert "too large" in r.json()["detail"]
    assert sum(_count(store, j) for j in ("none", "reader", "gzip")) == 0
    batcher.shutdown()
    r = post(_body("late"))
    assert r.status_code == 503
    assert r.headers["retry-after"] == "5"
    assert through_stack == [], "remote_write went through the middleware stack"
    assert observed == [
        ("/api/v1/write", "POST", 204),
        ("/api/v1/write", "POST", 204),
        ("/api/v1/write", "POST", 401),
        ("/api/v1/write", "POST", 403),
        ("/api/v1/write", "POST", 415),
        ("/api/v1/write", "POST", 400),
        ("/api/v1/write", "POST", 400),
        ("/api/v1/write", "POST", 413),
        ("/api/v1/write", "POST", 503),
    ]


def test_extra_route_dependencies_keep_remote_write_on_the_stack(store):
    """A check the fast path cannot run (a FastAPI dependency) leaves it no endpoint to skip it with."""
    refused: list[str] = []

    async def no(request) -> None:  # type: ignore[no-untyped-def]
        refused.append(request.url.path)
        raise RuntimeError("refused")

    assert create_app(store, write_dependencies=[Depends(no)]).state.remote_write_endpoint is None
    open_app = create_app(store)
    assert isinstance(open_app.state.remote_write_endpoint, RemoteWriteEndpoint)


def test_a_live_collector_counts_remote_write_under_its_route(tmp_path):
    with running_collector(tmp_path) as c:
        headers = {**BODY_HEADERS, "Authorization": f"Bearer {c.ingest_token}"}
        with httpx.Client(base_url=c.url, timeout=30) as client:  # one keep-alive connection
            for i in range(3):
                assert (
                    client.post("/api/v1/write", content=_body(f"live{i}", 50), headers=headers).status_code
                    == 204
                )
            r = client.post("/api/v1/write", content=_body("anon"), headers=BODY_HEADERS)
            assert r.status_code == 401
            metrics = client.get("/metrics", headers={"Authorization": f"Bearer {c.read_token}"}).text
            r = client.get(
                "/api/v1/query",
                params={"query": 'count(up{job=~"live.*"})', "time": str(NOW / 1000)},
                headers={"Authorization": f"Bearer {c.read_token}"},
            )
            assert r.json()["data"]["result"][0]["value"][1] == "150"
    counted = {
        line.split("{", 1)[1].split("}")[0]: float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("ki_collector_http_requests_total{") and "/api/v1/write" in line
    }
    assert counted['endpoint="/api/v1/write",method="POST",status="204"'] == 3
    assert counted['endpoint="/api/v1/write",method="POST",status="401"'] == 1
