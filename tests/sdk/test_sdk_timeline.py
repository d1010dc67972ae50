"""TimelineClient: paging, typed answers and errors over httpx.MockTransport; then a real collector and the CLI."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time

import httpx
import numpy as np
import pytest
from loopback import running_server
from trace_check import check_perfetto, check_trace

from kernel_insight.api import TokenStore, create_api_app
from kernel_insight.collector.clickhouse.store import EmbeddedStore
from kernel_insight.collector.rows import CallBatch, Event, InstanceInfo, SpanBatch
from kernel_insight.sdk import (
    AsyncTimelineClient,
    BadRequestError,
    GpuCall,
    Span,
    TimelineClient,
    TimelineSummary,
)

S = 1_000_000_000
#: The admin token of the served collector (set by its fixture).
ADMIN: dict[str, str] = {}


def _span_json(i: int) -> dict:
    return {
        "stream": 3,
        "kernel": "k",
        "start_ns": 10 * S + i,
        "end_ns": 10 * S + i + 5,
        "duration_ns": 5,
        "correlation": i,
        "pid": 1,
    }


def _paging_transport(seen: list[httpx.Request]) -> httpx.MockTransport:
    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        cursor = request.url.params.get("cursor")
        if cursor is None:
            return httpx.Response(200, json={"spans": [_span_json(0), _span_json(1)], "next_cursor": "c1"})
        assert cursor == "c1"
        return httpx.Response(200, json={"spans": [_span_json(2)], "next_cursor": None})

    return httpx.MockTransport(handler)


def test_spans_follow_cursors_and_come_back_typed():
    seen: list[httpx.Request] = []
    with TimelineClient("http://ki", "tok", transport=_paging_transport(seen)) as tl:
        spans = tl.spans("n1", 0, 10, 11, kernel="k.*", min_duration_ns=3, page_size=2)
    assert [s.correlation for s in spans] == [0, 1, 2]
    assert isinstance(spans[0], Span)
    assert spans[0].start_ns == 10 * S
    first = seen[0].url.params
    assert (first["instance"], first["gpu"], first["from"], first["to"]) == ("n1", "0", "10.0", "11.0")
    assert (first["kernel"], first["min_duration_ns"], first["limit"]) == ("k.*", "3", "2")
    assert seen[0].headers["authorization"] == "Bearer tok"
    assert len(seen) == 2


def test_async_client_pages_the_same_way():
    seen: list[httpx.Request] = []
    sync_transport = _paging_transport(seen)

    async def handler(request: httpx.Request) -> httpx.Response:
        return sync_transport.handle_request(request)

    async def go() -> list[Span]:
        async with AsyncTimelineClient("http://ki", transport=httpx.MockTransport(handler)) as tl:
            return await tl.spans("n1", 0, 10, 11)

    assert [s.correlation for s in asyncio.run(go())] == [0, 1, 2]


def test_a_400_raises_with_the_server_message_and_a_503_is_retried():
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.path)
        if request.url.path.endswith("/summary"):
            if len(calls) == 1:
                return httpx.Response(503, json={"status": "error", "errorType": "unavailable", "error": "x"})
            return httpx.Response(
                200, json={"span_count": 0, "total_ns": 0, "busy_ratio": 0.0, "kernels": []}
            )
        return httpx.Response(
            400, json={"status": "error", "errorType": "bad_data", "error": "invalid kernel regex: missing )"}
        )

    with TimelineClient("http://ki", transport=httpx.MockTransport(handler), sleep=lambda s: None) as tl:
        assert tl.summary("n1", 0, 1, 2) == TimelineSummary(0, 0, 0.0, ())
        with pytest.raises(BadRequestError, match="invalid kernel regex"):
            tl.spans("n1", 0, 1, 2, kernel="(")
    assert calls[:2] == ["/v1/timeline/summary", "/v1/timeline/summary"]


def test_to_perfetto_streams_to_the_file_retries_a_503_and_never_leaves_half_a_file(tmp_path):
    body = b'{"traceEvents":[' + b",".join(b'{"ph":"M"}' for _ in range(300_000)) + b"]}"  # > 1 chunk
    answers = [503, 200, 400]

    def handler(request: httpx.Request) -> httpx.Response:
        status = answers.pop(0)
        if status != 200:
            return httpx.Response(
                status, json={"status": "error", "errorType": "x", "error": "window too big"}
            )
        assert request.url.params["format"] == "perfetto"
        return httpx.Response(200, content=body)

    with TimelineClient("http://ki", transport=httpx.MockTransport(handler), sleep=lambda s: None) as tl:
        path = tl.to_perfetto(tmp_path / "t.json", "n1", 0, 1, 2, format="perfetto")
        assert path.read_bytes() == body
        with pytest.raises(BadRequestError, match="window too big"):
            tl.to_perfetto(tmp_path / "u.json", "n1", 0, 1, 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.json"]  # no u.json, no .part left

    async def fetch() -> bytes:
        async def asleep(s: float) -> None:
            return None

        answers[:] = [503, 200]
        async with AsyncTimelineClient(
            "http://ki", transport=httpx.MockTransport(handler), sleep=asleep
        ) as tl:
            out = await tl.to_perfetto(tmp_path / "a.json", "n1", 0, 1, 2, format="perfetto")
        return out.read_bytes()

    assert asyncio.run(fetch()) == body


# ---------------------------------------------------------------- a real collector


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    t0 = (time.time_ns() // S - 600) * S
    store = EmbeddedStore(tmp_path_factory.mktemp("sdk-timeline-store"))
    n = 300
    starts = t0 + np.arange(n, dtype=np.int64) * 1_000_000
    durations = np.where(np.arange(n) % 100 == 99, 900_000, 20_000).astype(np.int64)
    store.insert_spans(
        SpanBatch(
            instance=["n1"] * n,
            gpu=np.zeros(n, np.uint16),
            stream=(np.arange(n) % 3).astype(np.uint64),
            kernel=["slow" if d > 100_000 else "fast" for d in durations],
            start_ns=starts,
            end_ns=starts + durations,
            correlation=np.arange(n, dtype=np.uint64),
            pid=np.full(n, 7, np.uint32),
        )
    )
    # GPU 1: four spans, the first two while pod trainer-0 held the GPU, then one of no pod, then server-0's
    owners = [("", "", ""), ("trainer-0", "ml", "main"), ("server-0", "serving", "engine")]
    store.insert_spans(
        SpanBatch(
            instance=["n1"] * 4,
            gpu=np.ones(4, np.uint16),
            stream=np.zeros(4, np.uint64),
            kernel=["gemm", "gemm", "idle", "decode"],
            start_ns=t0 + np.arange(4, dtype=np.int64) * 1000,
            end_ns=t0 + np.arange(4, dtype=np.int64) * 1000 + 500,
            correlation=np.arange(4, dtype=np.uint64),
            pid=np.full(4, 7, np.uint32),
            owners=(np.array([1, 1, 0, 2], np.int32), owners),
        )
    )
    store.insert_events([Event("n1", 0, t0 + 150_000_000, "oom", 2, message="cudaMalloc failed")])
    calls = [("nccl", "allreduce", t0 + 10, 3_000_000, 1 << 30, 0xC0), ("nccl", "send", t0 + 20, 5, 8, 0xC0)]
    calls += [("memory", "alloc", t0 + 30, 0, 1 << 20, 0x7000), ("sync", "event", t0 + 40, 90_000, 0, 0x55)]
    store.insert_calls(CallBatch.of("n1", 0, calls, pid=7, tid=8, rank=1, nranks=2, failed=[0, 1, 0, 0]))
    tokens = TokenStore(tmp_path_factory.mktemp("sdk-timeline-tokens") / "tokens.json")
    token = tokens.create("sdk", ["read"]).token
    ADMIN["token"] = tokens.create("ops", ["admin"]).token
    store.upsert_instances([InstanceInfo(id="n1", gpu_count=1, last_seen_ms=t0 // 10**6)])
    with running_server(create_api_app(store, tokens=tokens, interval_s=3600)) as url:
        yield url, token, t0
    store.close()


def test_against_a_real_collector_spans_summary_correlation_and_perfetto(served, tmp_path):
    url, token, t0 = served
    with TimelineClient(url, token) as tl:
        spans = tl.spans("n1", 0, t0 / S, t0 / S + 1, page_size=64)
        summary = tl.summary("n1", 0, t0 / S, t0 / S + 1, slowest=2)
        corr = tl.correlation("n1", 0, t0 / S, t0 / S + 1)
        path = tl.to_perfetto(tmp_path / "t.json", "n1", 0, t0 / S, t0 / S + 1)
    assert len(spans) == 300
    assert len({s.correlation for s in spans}) == 300
    slow = next(k for k in summary.kernels if k.kernel == "slow")
    assert slow.count == 3
    assert slow.max_ns == 900_000
    assert [s.duration_ns for s in slow.slowest] == [900_000, 900_000]
    assert slow.slowest_links[0].startswith("/v1/timeline/spans?instance=n1")
    assert [e.kind for e in corr.events] == ["oom"]
    # the correlation view's calls, typed; fields a kind of call does not list are 0
    assert corr.nccl == (
        GpuCall(t0 + 10, "allreduce", 3_000_000, 1 << 30, 0xC0, rank=1, nranks=2),
        GpuCall(t0 + 20, "send", 5, 8, 0xC0, rank=1, nranks=2, failed=True),
    )
    assert corr.memory == (GpuCall(t0 + 30, "alloc", 0, 1 << 20, 0x7000, pid=7, tid=8),)
    assert corr.syncs == (GpuCall(t0 + 40, "event", 90_000, 0, 0x55, pid=7, tid=8),)
    assert corr.calls_truncated == frozenset()
    checked = check_trace(path.read_bytes())
    assert checked["cats"][("X", "kernel")] == 300
    assert (checked["cats"][("X", "nccl")], checked["cats"][("i", "memory")]) == (2, 1)
    # the send overlaps the all-reduce of its communicator: a second track
    assert sorted(checked["tracks"].values()) == [1, 1, 1, 100, 100, 100]  # + the sync


def test_spans_and_summary_filter_on_the_pod_that_held_the_gpu(served):
    url, token, t0 = served
    window = ("n1", 1, t0 / S, t0 / S + 1)
    with TimelineClient(url, token) as tl:
        mine = tl.spans(*window, pod="trainer-0")
        assert [(s.kernel, s.pod, s.namespace, s.container) for s in mine] == [
            ("gemm", "trainer-0", "ml", "main")
        ] * 2
        assert [s.kernel for s in tl.spans(*window, namespace="serving")] == ["decode"]
        assert [s.kernel for s in tl.spans(*window, pod="")] == ["idle"]  # no pod held the GPU
        assert [(k.kernel, k.count) for k in tl.summary(*window, container="main").kernels] == [("gemm", 2)]

    async def fetch() -> tuple[list[Span], TimelineSummary]:
        async with AsyncTimelineClient(url, token) as tl:
            return await tl.spans(*window, pod="server-0"), await tl.summary(*window, namespace="ml")

    spans, summary = asyncio.run(fetch())
    assert [(s.kernel, s.container) for s in spans] == [("decode", "engine")]
    assert [k.kernel for k in summary.kernels] == ["gemm"]


def test_ki_timeline_export_refuses_an_unknown_instance(served, tmp_path):
    """Issue 33: a mistyped --instance exited 0 with an empty 266-byte trace."""
    url, token, t0 = served
    out = tmp_path / "trace.json"
    done = subprocess.run(
        [sys.executable, "-m", "kernel_insight.cli", "timeline", "export", "--collector", url,
         "--instance", "typo", "--gpu", "0", "--from", str(t0 / S), "--to", str(t0 / S + 1), "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "KI_TOKEN": token},
    )  # fmt: skip
    assert done.returncode == 1
    assert done.stderr == "ki timeline: no such instance 'typo' (the collector knows n1)\n"
    assert not out.exists()


def test_ki_timeline_export_writes_a_trace_file(served, tmp_path):
    url, token, t0 = served
    token_file = tmp_path / "token"
    token_file.write_text(token)
    token_file.chmod(0o600)
    out = tmp_path / "trace.json"
    args = ["--instance", "n1", "--gpu", "0", "--from", str(t0 / S), "--to", str(t0 / S + 1)]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "kernel_insight.cli",
            "timeline",
            "export",
            "--collector",
            url,
            "--token-file",
            str(token_file),
            *args,
            "--kernel",
            "slow",
            "-o",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "KI_TOKEN": ""},
    )
    assert done.returncode == 0, done.stderr
    assert "ui.perfetto.dev" in done.stdout
    checked = check_trace(out.read_bytes())
    assert checked["cats"][("X", "kernel")] == 3
    assert json.loads(out.read_bytes())["otherData"]["instance"] == "n1"
    proto = tmp_path / "trace.perfetto-trace"
    done = subprocess.run(
        [sys.executable, "-m", "kernel_insight.cli", "timeline", "export", "--collector", url,
         "--token-file", str(token_file), *args, "--format", "perfetto", "-o", str(proto)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    tracks = check_perfetto(proto.read_bytes())["tracks"]
    assert sum(n for name, n in tracks.items() if name.startswith("stream")) == 300
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "kernel_insight.cli",
            "timeline",
            "export",
            "--collector",
            url,
            "--token-file",
            str(token_file),
            *args,
            "--kernel",
            "(",
            "-o",
            str(tmp_path / "x.json"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 1
    assert "invalid kernel regex" in bad.stderr
    assert not (tmp_path / "x.json").exists()


def test_ki_timeline_capture_needs_admin_and_stores_a_pending_request(served, tmp_path):
    url, token, _ = served
    admin = tmp_path / "admin"
    admin.write_text(ADMIN["token"])
    reader = tmp_path / "reader"
    reader.write_text(token)
    admin.chmod(0o600)
    reader.chmod(0o600)
    base = [sys.executable, "-m", "kernel_insight.cli", "timeline", "capture", "--collector", url]
    args = ["--instance", "n1", "--gpu", "0", "--seconds", "10"]
    refused = subprocess.run(
        [*base, "--token-file", str(reader), *args], capture_output=True, text=True, timeout=120
    )
    assert refused.returncode == 1
    assert "403" in refused.stderr or "admin" in refused.stderr
    done = subprocess.run(
        [*base, "--token-file", str(admin), *args], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "pending" in done.stdout
    with TimelineClient(url, token) as tl:
        pending = tl.pending_captures("n1")
    assert [(p.gpu, p.seconds, p.requested_by) for p in pending] == [(0, 10, "ops")]
    assert pending[0].id in done.stdout
