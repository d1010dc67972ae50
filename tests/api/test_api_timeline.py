"""``/v1/timeline/*`` over a real embedded store: spans paged and filtered, summary, correlation, export."""

from __future__ import annotations

import importlib
import logging
import time

import jsonschema
import numpy as np
import pytest
from api_helpers import TestClient
from trace_check import check_perfetto, check_trace

from kernel_insight.api import create_api_app
from kernel_insight.collector.clickhouse.store import EmbeddedStore
from kernel_insight.collector.rows import (
    CallBatch,
    Event,
    HistogramBuilder,
    InstanceInfo,
    SampleBuilder,
    SpanBatch,
)
from kernel_insight.kql.histogram import FloatHistogram

S = 1_000_000_000
#: An hour ago, on a whole second: older spans would fall to the 7-day TTL.
T0 = (time.time_ns() // S - 3600) * S


def _spans(instance: str, gpu: int, rows: list[tuple[int, str, int, int]]) -> SpanBatch:
    """rows: (stream, kernel, start_ns, duration_ns)."""
    return SpanBatch(
        instance=[instance] * len(rows),
        gpu=np.full(len(rows), gpu, np.uint16),
        stream=np.array([r[0] for r in rows], np.uint64),
        kernel=[r[1] for r in rows],
        start_ns=np.array([r[2] for r in rows], np.int64),
        end_ns=np.array([r[2] + r[3] for r in rows], np.int64),
        correlation=np.arange(1, len(rows) + 1, dtype=np.uint64),
        pid=np.full(len(rows), 42, np.uint32),
    )


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    st = EmbeddedStore(tmp_path_factory.mktemp("timeline-store"))
    rows = []
    # 100 gemm spans of 10 us .. 1 ms on stream 7, 50 copy spans of 2 us on stream 2**63+5 (a real
    # CUDA stream handle is a pointer), one nested pair, all inside [T0, T0 + 1 s).
    for i in range(100):
        rows.append((7, "gemm_fp16", T0 + i * 5_000_000 + 123, 10_000 * (i + 1)))
    for i in range(50):
        rows.append((2**63 + 5, 'copy<"q">', T0 + i * 5_000_000 + 1_000_001, 2_000))
    st.insert_spans(_spans("n1", 0, rows))
    st.insert_spans(_spans("n1", 1, [(7, "gemm_fp16", T0, 999)]))  # another GPU: never mixed in
    st.insert_spans(_spans("n1", 0, [(7, "late", T0 + 2 * S, 5)]))  # outside the window
    st.insert_events(
        [
            Event("n1", 0, T0 + 300_000_000, "xid", 79, message="fell off the bus"),
            Event("n1", 1, T0 + 300_000_000, "oom", 0),
        ]
    )
    b = SampleBuilder()
    for t in range(0, 1000, 100):
        b.add({"__name__": "gpu_memory_used_bytes", "instance": "n1", "gpu": "0"}, T0 // 10**6 + t, 1e9 + t)
        b.add({"__name__": "gpu_sm_utilization_ratio", "instance": "n1", "gpu": "0"}, T0 // 10**6 + t, 0.5)
    st.insert_samples(b.build())
    yield st
    st.close()


@pytest.fixture
def client(store, tokens, auth_headers):
    c = TestClient(create_api_app(store, tokens=tokens, interval_s=3600))
    c.headers.update(auth_headers)
    return c


WINDOW = {"instance": "n1", "gpu": 0, "from": T0 / S, "to": (T0 + S) / S}


def test_spans_page_through_the_window_in_start_order_without_gaps(client):
    seen: list[dict] = []
    cursor = None
    pages = 0
    while True:
        params = {**WINDOW, "limit": 40} | ({"cursor": cursor} if cursor else {})
        r = client.get("/v1/timeline/spans", params=params)
        assert r.status_code == 200, r.text
        body = r.json()
        seen.extend(body["spans"])
        pages += 1
        cursor = body["next_cursor"]
        if cursor is None:
            break
    assert pages == 4
    assert len(seen) == 150
    assert [s["start_ns"] for s in seen] == sorted(s["start_ns"] for s in seen)
    assert len({(s["start_ns"], s["stream"]) for s in seen}) == 150
    first = seen[0]
    assert first == {
        "stream": 7,
        "kernel": "gemm_fp16",
        "start_ns": T0 + 123,
        "end_ns": T0 + 123 + 10_000,
        "duration_ns": 10_000,
        "correlation": 1,
        "pid": 42,
        "launch_ns": 0,  # no host side recorded
        "launch_host_ns": 0,
        "tid": 0,
        "pod": "",  # no Kubernetes pod held the GPU
        "namespace": "",
        "container": "",
        "nvtx_range": "",  # no NVTX range enclosed its launch
    }
    assert any(s["stream"] == 2**63 + 5 for s in seen)  # uint64 streams survive JSON


def test_spans_filter_by_stream_kernel_regex_and_min_duration(client):
    r = client.get("/v1/timeline/spans", params={**WINDOW, "kernel": "copy.*", "limit": 1000})
    assert {s["kernel"] for s in r.json()["spans"]} == {'copy<"q">'}
    assert len(r.json()["spans"]) == 50
    r = client.get("/v1/timeline/spans", params={**WINDOW, "kernel": "gemm.*", "min_duration_ns": 500_000})
    assert [s["duration_ns"] for s in r.json()["spans"]] == [10_000 * i for i in range(50, 101)]
    r = client.get("/v1/timeline/spans", params={**WINDOW, "stream": 2**63 + 5})
    assert len(r.json()["spans"]) == 50
    r = client.get("/v1/timeline/spans", params={**WINDOW, "kernel": "gem"})  # anchored, as in PromQL
    assert r.json()["spans"] == []


@pytest.mark.parametrize(
    ("params", "words"),
    [
        ({"kernel": "(a"}, "invalid kernel regex"),
        ({"from": "x"}, "from"),
        ({"to": T0 / S}, "end must be after"),
        ({"to": T0 / S + 90_000}, "at most 86400 s"),
        ({"gpu": -1}, "gpu"),
        ({"limit": 10**6}, "limit"),
        ({"cursor": "!!!"}, "invalid cursor"),
        ({"min_duration_ns": -5}, "min_duration_ns"),
        ({"pod": "p" * 254}, "pod"),
        ({"stream": 2**64}, "stream"),
    ],
)
def test_bad_parameters_are_400_with_a_message(client, params, words):
    r = client.get("/v1/timeline/spans", params={**WINDOW, **params})
    assert r.status_code == 400, r.text
    assert r.json()["errorType"] == "bad_data"
    assert words in r.json()["error"]


def test_timeline_needs_a_read_token(client):
    r = client.get("/v1/timeline/spans", params=WINDOW, headers={"Authorization": ""})
    assert r.status_code == 401


def test_summary_counts_shares_quantiles_and_slowest_spans(client):
    r = client.get("/v1/timeline/summary", params={**WINDOW, "slowest": 3})
    assert r.status_code == 200, r.text
    body = r.json()
    gemm_total = sum(10_000 * (i + 1) for i in range(100))
    assert body["span_count"] == 150
    assert body["total_ns"] == gemm_total + 100_000
    gemm, copy = body["kernels"]
    assert gemm["kernel"] == "gemm_fp16"
    assert gemm["count"] == 100
    assert gemm["total_ns"] == gemm_total
    assert gemm["share"] == pytest.approx(gemm_total / (gemm_total + 100_000))
    assert gemm["max_ns"] == 1_000_000
    assert 450_000 <= gemm["p50_ns"] <= 550_000
    assert gemm["p99_ns"] >= 980_000 - 10_000
    assert [s["duration_ns"] for s in gemm["slowest"]] == [1_000_000, 990_000, 980_000]
    assert "instance=n1" in gemm["slowest"][0]["timeline"]
    assert copy["count"] == 50
    assert copy["p90_ns"] == 2000
    assert len(copy["slowest"]) == 3  # 50 spans of equal length: the earliest three
    assert [s["start_ns"] for s in copy["slowest"]] == [T0 + i * 5_000_000 + 1_000_001 for i in range(3)]
    assert {(s["stream"], s["pid"]) for s in copy["slowest"]} == {(2**63 + 5, 42)}
    assert body["busy_ratio"] == pytest.approx((gemm_total + 100_000) / S)
    top = client.get("/v1/timeline/summary", params={**WINDOW, "kernels": 1, "slowest": 0}).json()
    assert [k["kernel"] for k in top["kernels"]] == ["gemm_fp16"]
    assert top["span_count"] == 150  # the window's figures, not only the kernels listed
    assert top["kernels"][0]["slowest"] == []


def test_summary_shares_are_parts_of_one_total_when_only_some_kernels_have_histograms(client, store):
    # GPU 6: gemm's every launch in native histograms (100 launches of 100 us every 100 ms, as
    # cumulative exports), copy only in its kept spans, as from an agent whose histogram table
    # refused copy's key. Each kernel is counted from its own source, the total from both.
    hb = HistogramBuilder()
    labels = {"__name__": "kernel_duration_seconds", "instance": "n1", "gpu": "6", "kernel": "gemm"}
    for i in range(12):  # exports at T0 - 100 ms, T0, ..., T0 + 1 s
        hb.add_histogram(
            labels,
            T0 // 10**6 + (i - 1) * 100,
            FloatHistogram.from_observations(np.full(100 * (i + 1), 1e-4)),
        )
    store.insert_histograms(hb.build())
    kept = [(7, "gemm", T0 + 1_000, 2_000_000)] + [
        (8, "copy", T0 + i * 10_000_000, 500_000) for i in range(40)
    ]
    store.insert_spans(_spans("n1", 6, kept))
    r = client.get("/v1/timeline/summary", params={**WINDOW, "gpu": 6})
    assert r.status_code == 200, r.text
    body = r.json()
    # gemm: its exports' growth from T0 to T0 + 900 ms (the last before the window's end); copy: its spans.
    figures = [(k["kernel"], k["source"], k["count"], k["total_ns"]) for k in body["kernels"]]
    assert figures == [("gemm", "histograms", 900, 90_000_000), ("copy", "spans", 40, 20_000_000)]
    gemm, copy = body["kernels"]
    assert gemm["max_ns"] == 2_000_000  # its kept span
    assert body["total_ns"] == 110_000_000
    assert (gemm["share"], copy["share"]) == (pytest.approx(9 / 11), pytest.approx(2 / 11))
    assert body["busy_ratio"] == pytest.approx(0.11)
    assert body["span_count"] == 41


def test_correlation_lines_up_spans_events_and_nvml_samples(client):
    r = client.get("/v1/timeline/correlation", params=WINDOW)
    assert r.status_code == 200, r.text
    body = r.json()
    assert len(body["spans"]) == 150
    assert body["spans_truncated"] is False
    assert [(e["kind"], e["code"], e["message"]) for e in body["events"]] == [("xid", 79, "fell off the bus")]
    assert len(body["counters"]["memory_used_bytes"]) == 10
    assert body["counters"]["memory_used_bytes"][1] == [T0 // 10**6 + 100, 1e9 + 100]
    assert {v for _, v in body["counters"]["sm_utilization"]} == {0.5}


def _calls(rows: list[tuple[str, str, int, int, int, int]], gpu: int = 3) -> CallBatch:
    """rows: (track, op, start_ns, duration_ns, bytes, handle) of n1's GPU ``gpu``; broadcasts fail."""
    failed = [r[1] == "broadcast" for r in rows]
    return CallBatch.of("n1", gpu, rows, pid=42, tid=43, rank=1, nranks=8, failed=failed)


@pytest.fixture(scope="module")
def calls_window(store) -> dict[str, object]:
    """GPU 3 of n1: two kernels, three NCCL operations on two communicators (one failed), four memory
    operations and two syncs in [T0, T0 + 1 s), and one call after the window."""
    store.insert_spans(_spans("n1", 3, [(7, "gemm", T0 + 1_000, 50_000), (7, "gemm", T0 + 400_000, 50_000)]))
    rows = [
        ("nccl", "allreduce", T0 + 100_000, 2_000_000, 1 << 30, 0xC0),
        ("nccl", "allgather", T0 + 3_000_000, 1_000_000, 1 << 20, 0xC0),
        ("nccl", "broadcast", T0 + 3_500_000, 200_000, 4096, 0xD0),
        ("memory", "alloc", T0 + 50_000, 0, 1 << 30, 0x7000),
        ("memory", "memcpy", T0 + 60_000, 0, 1 << 20, 0x8000),
        ("memory", "free", T0 + 900_000_000, 0, 0, 0x7000),
        ("memory", "alloc_async", T0 + 900_000_001, 0, 4096, 0x9000),
        ("sync", "stream", T0 + 80_000, 300_000, 0, 0x55),
        ("sync", "event", T0 + 5_000_000, 70_000, 0, 0x66),
        ("nccl", "allreduce", T0 + 2 * S, 1, 1, 0xC0),  # outside the window
    ]
    store.insert_calls(_calls(rows))
    return {"instance": "n1", "gpu": 3, "from": T0 / S, "to": (T0 + S) / S}


def test_correlation_lists_nccl_memory_and_sync_calls_bounded_with_truncated_flags(
    client, calls_window, monkeypatch
):
    body = client.get("/v1/timeline/correlation", params=calls_window).json()
    assert [
        (c["op"], c["ts_ns"], c["duration_ns"], c["bytes"], c["handle"], c["failed"]) for c in body["nccl"]
    ] == [
        ("allreduce", T0 + 100_000, 2_000_000, 1 << 30, 0xC0, False),
        ("allgather", T0 + 3_000_000, 1_000_000, 1 << 20, 0xC0, False),
        ("broadcast", T0 + 3_500_000, 200_000, 4096, 0xD0, True),
    ]
    assert {(c["rank"], c["nranks"]) for c in body["nccl"]} == {(1, 8)}
    assert [(c["op"], c["bytes"], c["handle"], c["pid"], c["tid"]) for c in body["memory"]] == [
        ("alloc", 1 << 30, 0x7000, 42, 43),
        ("memcpy", 1 << 20, 0x8000, 42, 43),
        ("free", 0, 0x7000, 42, 43),
        ("alloc_async", 4096, 0x9000, 42, 43),
    ]
    assert [(c["op"], c["duration_ns"], c["handle"], c["tid"]) for c in body["syncs"]] == [
        ("stream", 300_000, 0x55, 43),
        ("event", 70_000, 0x66, 43),
    ]
    assert body["nccl_truncated"] is body["memory_truncated"] is body["syncs_truncated"] is False
    assert len(body["spans"]) == 2
    # the answer is what /openapi.json says it is
    schema = client.get("/openapi.json").json()["paths"]["/v1/timeline/correlation"]["get"]["responses"][
        "200"
    ]
    jsonschema.validate(body, schema["content"]["application/json"]["schema"])

    monkeypatch.setattr(importlib.import_module("kernel_insight.api.timeline"), "CORRELATION_CALLS", 2)
    body = client.get("/v1/timeline/correlation", params=calls_window).json()
    assert [c["op"] for c in body["memory"]] == ["alloc", "memcpy"]  # the first ones, oldest first
    assert (body["nccl_truncated"], body["memory_truncated"], body["syncs_truncated"]) == (True, True, False)
    # a GPU without calls: empty lists
    empty = client.get("/v1/timeline/correlation", params=WINDOW).json()
    assert empty["nccl"] == empty["memory"] == empty["syncs"] == []


def test_exports_draw_nccl_operations_per_communicator_and_memory_operations_on_their_tracks(
    client, calls_window
):
    checked = check_trace(client.get("/v1/timeline/export", params=calls_window).content)
    assert checked["cats"][("X", "nccl")] == 3
    assert checked["cats"][("i", "memory")] == 4
    assert checked["cats"][("X", "sync")] == 2
    assert checked["named"] == {
        "stream 7": 2,
        "NCCL comm 0xc0": 2,
        "NCCL comm 0xd0": 1,
        "memory": 4,
        "syncs": 2,
    }
    events = checked["doc"]["traceEvents"]
    origin = int(checked["doc"]["otherData"]["origin_ns"])
    failed = [e for e in events if e.get("cat") == "nccl" and e["args"]["failed"]]
    assert [(e["name"], e["args"]["start_ns"], e["args"]["dur_ns"], e["args"]["comm"]) for e in failed] == [
        ("broadcast", T0 + 3_500_000, 200_000, str(0xD0))
    ]
    alloc = next(e for e in events if e.get("cat") == "memory")
    assert (alloc["name"], origin + round(alloc["ts"] * 1000)) == (f"alloc {1 << 30} B", T0 + 50_000)
    assert alloc["args"]["address"] == str(0x7000)

    proto = check_perfetto(
        client.get("/v1/timeline/export", params={**calls_window, "format": "perfetto"}).content
    )
    assert proto["tracks"] == {"stream 7": 2, "NCCL comm 0xc0": 2, "NCCL comm 0xd0": 1, "syncs": 2}
    assert proto["types"]["TYPE_INSTANT"] == 4  # the memory operations (no events on this GPU)
    assert ("NCCL comm 0xc0", "allreduce", T0 + 100_000, T0 + 2_100_000) in proto["slices"]
    assert "memory" in proto["names"]
    assert ("syncs", "stream", T0 + 80_000, T0 + 380_000) in proto["slices"]


def test_overlapping_nccl_operations_of_one_communicator_go_to_a_second_track(client, store):
    store.insert_calls(
        _calls(
            [
                ("nccl", "allreduce", T0 + 1_000, 5_000, 8, 0xE0),
                ("nccl", "send", T0 + 2_000, 1_000, 8, 0xE0),  # inside the first: a second track
                ("nccl", "recv", T0 + 7_000, 1_000, 8, 0xE0),  # after it: back on the first
            ],
            gpu=4,
        )
    )
    window = {"instance": "n1", "gpu": 4, "from": T0 / S, "to": (T0 + S) / S}
    checked = check_trace(client.get("/v1/timeline/export", params=window).content)
    assert checked["named"] == {"NCCL comm 0xe0": 2, "NCCL comm 0xe0 (2)": 1}
    proto = check_perfetto(client.get("/v1/timeline/export", params={**window, "format": "perfetto"}).content)
    assert proto["tracks"] == {"NCCL comm 0xe0": 2, "NCCL comm 0xe0 (2)": 1}


def test_export_refuses_a_window_over_the_call_limit(client, calls_window):
    import kernel_insight.collector.trace as trace

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(trace.call_tracks, "__kwdefaults__", {"max_calls": 3})
        r = client.get("/v1/timeline/export", params=calls_window)
    assert r.status_code == 400
    assert "more than 3 memory operations" in r.json()["error"]


def test_export_is_a_valid_chrome_trace_with_a_track_per_stream(client):
    r = client.get("/v1/timeline/export", params=WINDOW)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/json"
    checked = check_trace(r.content)
    assert checked["phases"]["X"] == 150
    assert checked["phases"]["i"] == 1
    assert checked["phases"]["C"] == 20
    assert sorted(checked["tracks"].values()) == [50, 100]
    names = {e["args"]["name"] for e in checked["doc"]["traceEvents"] if e["name"] == "thread_name"}
    assert names == {"GPU", "stream 7", f"stream {2**63 + 5}"}
    kernels = {e["name"] for e in checked["doc"]["traceEvents"] if e["ph"] == "X"}
    assert kernels == {"gemm_fp16", 'copy<"q">'}
    gemm = sorted(
        (e["args"]["start_ns"], round(e["dur"] * 1000))
        for e in checked["doc"]["traceEvents"]
        if e["ph"] == "X" and e["name"] == "gemm_fp16"
    )
    assert gemm == [(T0 + i * 5_000_000 + 123, 10_000 * (i + 1)) for i in range(100)]  # exact ns


def test_export_of_an_empty_window_is_still_a_valid_trace(client):
    r = client.get("/v1/timeline/export", params={**WINDOW, "from": T0 / S - 100, "to": T0 / S - 50})
    checked = check_trace(r.content)
    assert checked["phases"]["X"] == 0
    assert checked["phases"]["M"] == 2


def test_export_refuses_a_window_over_the_span_limit(client, monkeypatch):
    import kernel_insight.collector.trace as trace

    monkeypatch.setattr(trace, "MAX_EXPORT_SPANS", 100)
    monkeypatch.setattr(trace.chrome_trace_parts, "__kwdefaults__", {"max_spans": 100})
    r = client.get("/v1/timeline/export", params=WINDOW)
    assert r.status_code == 400
    assert "150 spans" in r.json()["error"]


def _launched(store) -> dict[str, object]:
    """GPU 2 of n1: three spans whose host side the probe recorded (one launched before the window
    starts, two nested launches on one thread) and one without; returns the window's parameters."""
    rows = [(7, "step", T0 + 10_000, 50_000), (7, "fwd", T0 + 20_000, 5_000), (9, "bwd", T0 + 40_000, 8_000)]
    batch = _spans("n1", 2, [*rows, (9, "no_host_side", T0 + 70_000, 1_000)])
    batch.launch_ns[:3] = [T0 - 4_000, T0 + 1_000, T0 + 30_000]
    batch.launch_host_ns[:3] = [30_000, 2_000, 500]
    batch.tid[:3] = [77, 77, 78]
    store.insert_spans(batch)
    return {"instance": "n1", "gpu": 2, "from": T0 / S, "to": (T0 + S) / S}


def test_export_draws_a_flow_from_each_host_launch_to_its_kernel(client, store):
    window = _launched(store)
    checked = check_trace(client.get("/v1/timeline/export", params=window).content)
    doc = checked["doc"]
    origin = int(doc["otherData"]["origin_ns"])
    assert origin == T0 - 4_000  # the earliest launch, before the window's start
    assert checked["phases"]["s"] == checked["phases"]["f"] == 3
    launches = sorted(
        (e["tid"], e["args"]["start_ns"], round(e["dur"] * 1000), e["name"])
        for e in doc["traceEvents"]
        if e["ph"] == "X" and e["cat"] == "launch"
    )
    assert launches == [
        (77, T0 - 4_000, 30_000, "step"),
        (77, T0 + 1_000, 2_000, "fwd"),
        (78, T0 + 30_000, 500, "bwd"),
    ]
    host_side = [e for e in doc["traceEvents"] if e["ph"] == "s" or (e["ph"] == "X" and e["cat"] == "launch")]
    assert {e["pid"] for e in host_side} == {42}
    ends = {s["name"]: (f["pid"], origin + round(f["ts"] * 1000)) for s, f in checked["flows"]}
    assert ends == {"step": (2, T0 + 10_000), "fwd": (2, T0 + 20_000), "bwd": (2, T0 + 40_000)}
    names = {e["args"].get("name") for e in doc["traceEvents"] if e["ph"] == "M"}
    assert {"n1 process 42 (host)", "thread 77", "thread 78"} <= names

    spans = client.get("/v1/timeline/spans", params=window).json()["spans"]
    assert [(x["kernel"], x["launch_ns"], x["launch_host_ns"], x["tid"]) for x in spans] == [
        ("step", T0 - 4_000, 30_000, 77),
        ("fwd", T0 + 1_000, 2_000, 77),
        ("bwd", T0 + 30_000, 500, 78),
        ("no_host_side", 0, 0, 0),
    ]
    slowest = client.get("/v1/timeline/summary", params=window).json()["kernels"]
    assert {k["kernel"]: k["slowest"][0]["tid"] for k in slowest} == {
        "step": 77, "fwd": 77, "bwd": 78, "no_host_side": 0
    }  # fmt: skip

    proto = check_perfetto(client.get("/v1/timeline/export", params={**window, "format": "perfetto"}).content)
    assert sorted((src[0], src[1], src[2], dst[0], dst[2]) for src, dst in proto["flows"]) == [
        ("thread 77", "fwd", T0 + 1_000, "stream 7", T0 + 20_000),
        ("thread 77", "step", T0 - 4_000, "stream 7", T0 + 10_000),
        ("thread 78", "bwd", T0 + 30_000, "stream 9", T0 + 40_000),
    ]
    assert proto["tracks"]["thread 77"] == 2
    assert "n1 process 42 (host)" in proto["names"]


# ---------------------------------------------------------------- capture windows


@pytest.fixture
def admin_headers(tokens) -> dict[str, str]:
    return {"Authorization": f"Bearer {tokens.create('ops', ['admin']).token}"}


def test_a_capture_needs_an_admin_token(client):
    r = client.post("/v1/timeline/captures", json={"instance": "n1", "gpu": 0, "seconds": 10})
    assert r.status_code == 403


def test_a_capture_is_stored_pending_for_its_agent_and_audited(client, store, admin_headers, caplog):
    store.upsert_instances([InstanceInfo(id="n1", gpu_count=2, last_seen_ms=T0 // 10**6)])
    with caplog.at_level(logging.WARNING, logger="kernel_insight.audit"):
        r = client.post(
            "/v1/timeline/captures", json={"instance": "n1", "gpu": 1, "seconds": 10}, headers=admin_headers
        )
    assert r.status_code == 201, r.text
    made = r.json()
    assert (made["instance"], made["gpu"], made["seconds"], made["state"]) == ("n1", 1, 10, "pending")
    assert made["requested_by"] == "ops"
    lines = [rec.getMessage() for rec in caplog.records if rec.name == "kernel_insight.audit"]
    assert len(lines) == 1
    assert made["id"] in lines[0]
    assert "'ops'" in lines[0]
    pending = client.get("/v1/timeline/captures", params={"instance": "n1"}).json()["captures"]
    assert [p["id"] for p in pending] == [made["id"]]
    rows = store.query(f"SELECT token_name, seconds FROM {store.database}.capture_requests").to_pylist()
    assert {"token_name": "ops", "seconds": 10} in rows


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        ({"instance": "nope", "gpu": 0, "seconds": 10}, 404, "never reported"),
        ({"instance": "n1", "gpu": 5, "seconds": 10}, 400, "has 2 GPUs"),
        ({"instance": "n1", "gpu": 0, "seconds": 0}, 400, "seconds"),
        ({"instance": "n1", "gpu": 0, "seconds": 600}, 400, "seconds"),
        ({"instance": "n1", "gpu": 0}, 400, "seconds"),
    ],
)
def test_bad_capture_requests_are_refused_with_a_message(client, store, admin_headers, body, status, words):
    store.upsert_instances([InstanceInfo(id="n1", gpu_count=2, last_seen_ms=T0 // 10**6)])
    r = client.post("/v1/timeline/captures", json=body, headers=admin_headers)
    assert r.status_code == status, r.text
    assert words in r.text


def test_perfetto_export_reads_back_with_the_packages_own_messages(client):
    r = client.get("/v1/timeline/export", params={**WINDOW, "format": "perfetto"})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/x-protobuf"
    checked = check_perfetto(r.content)
    assert checked["types"]["TYPE_SLICE_BEGIN"] == 150
    assert checked["types"]["TYPE_INSTANT"] == 1
    assert checked["types"]["TYPE_COUNTER"] == 20
    assert checked["tracks"] == {"stream 7": 100, f"stream {2**63 + 5}": 50}
    assert "n1 GPU 0" in checked["names"]
    first = min(checked["slices"], key=lambda s: s[2])
    assert first == ("stream 7", "gemm_fp16", T0 + 123, T0 + 123 + 10_000)  # exact nanoseconds


def test_perfetto_export_refuses_more_spans_than_it_builds(client, monkeypatch):
    # the package exports the function under the module's name, so fetch the module itself
    proto = importlib.import_module("kernel_insight.collector.perfetto_trace")

    monkeypatch.setattr(proto.perfetto_trace, "__kwdefaults__", {"max_spans": 100})
    r = client.get("/v1/timeline/export", params={**WINDOW, "format": "perfetto"})
    assert r.status_code == 400
    assert "export JSON" in r.json()["error"]


def test_pages_split_inside_a_run_of_equal_starts_lose_and_repeat_nothing(client, store):
    # GPU 4: 25 spans starting at the same nanosecond (streams 1..5 x correlations), around others
    rows = [(1 + i % 5, "same", T0 + 500, 100) for i in range(25)] + [
        (9, "before", T0 + 100, 10),
        (9, "after", T0 + 900, 10),
    ]
    store.insert_spans(_spans("n1", 4, rows))
    window = {"instance": "n1", "gpu": 4, "from": T0 / S, "to": (T0 + S) / S}
    seen, cursor = [], None
    while True:
        body = client.get(
            "/v1/timeline/spans", params={**window, "limit": 7} | ({"cursor": cursor} if cursor else {})
        )
        assert body.status_code == 200, body.text
        seen += body.json()["spans"]
        cursor = body.json()["next_cursor"]
        if cursor is None:
            break
    keys = [(s["start_ns"], s["stream"], s["correlation"]) for s in seen]
    assert keys == sorted(keys)
    assert len(set(keys)) == len(keys) == 27
    assert (seen[0]["kernel"], seen[-1]["kernel"]) == ("before", "after")
