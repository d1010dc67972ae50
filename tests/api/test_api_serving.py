"""The serving engines' load in the snapshot: the mapping table, how series combine, remote_write to
the SDK through a real collector, and the ETag'd long-poll."""

from __future__ import annotations

import math
import threading
import time
from pathlib import Path

import httpx
import pytest
from api_helpers import FakeSource, TestClient, build_app, facts
from support.collector import RunningCollector, running_collector

from kernel_insight.api import Authenticator
from kernel_insight.api.health.serving import SERVING_METRICS, combine, markdown_table, serving_record
from kernel_insight.api.models import HealthSnapshot
from kernel_insight.sdk import HealthClient

DOCS = Path(__file__).resolve().parents[2] / "docs" / "api.md"


def test_docs_show_the_mapping_table_as_the_code_defines_it():
    assert markdown_table() in DOCS.read_text()


def test_series_of_one_instance_combine_by_field_and_nan_says_nothing():
    got = combine(
        [
            ("vllm:num_requests_waiting", 3.0, 1_000),
            ("vllm:num_requests_waiting", 4.0, 1_500),  # a second engine process on the same instance
            ("vllm:num_requests_running", 10.0, 1_000),
            ("vllm:kv_cache_usage_perc", 0.5, 1_000),
            ("vllm:kv_cache_usage_perc", 0.9, 1_000),
            ("vllm:prefix_cache_hits_total", 30.0, 1_000),
            ("vllm:prefix_cache_queries_total", 120.0, 1_000),
            ("vllm:num_requests_running", math.nan, 2_000),
            ("not_a_serving_metric", 1.0, 9_000),
        ]
    )
    rec = serving_record(got)
    assert rec == {
        "engines": ["vllm"],
        "requests_waiting": 7,
        "requests_running": 10,
        "kv_cache_usage_ratio": 0.9,
        "prefix_cache_hit_ratio": 0.25,
        "sample_ms": 1_500,
    }
    assert combine([("vllm:num_requests_waiting", math.nan, 5)]) is None
    tgi = serving_record(combine([("tgi_queue_size", 2.0, 7), ("tgi_batch_current_size", 5.0, 7)]))
    assert tgi is not None
    assert tgi["kv_cache_usage_ratio"] is None
    assert tgi["requests_running"] == 5
    assert {m.engine for m in SERVING_METRICS.values()} == {"vllm", "sglang", "tgi", "trtllm-serve"}


def test_snapshot_carries_serving_and_validates_against_the_model(now_ms, tokens, auth_headers):
    with_load = facts("a", now_ms=now_ms)
    with_load.serving = combine(
        [("sglang:num_queue_reqs", 2.0, now_ms - 300), ("sglang:token_usage", 0.4, now_ms)]
    )
    app, _ = build_app(FakeSource([with_load, facts("b", now_ms=now_ms)]), Authenticator(tokens))
    c = TestClient(app)
    c.headers.update(auth_headers)
    body = c.get("/v1/health/snapshot").json()
    HealthSnapshot.model_validate(body)
    by_id = {i["id"]: i for i in body["instances"]}
    assert by_id["a"]["serving"]["requests_waiting"] == 2
    assert by_id["a"]["serving"]["sample_ms"] == now_ms
    assert by_id["b"]["serving"] is None


def test_long_poll_answers_when_the_snapshot_changes_and_304_when_the_wait_runs_out(
    now_ms, tokens, auth_headers
):
    source = FakeSource([facts("a", now_ms=now_ms)])
    app, snapshotter = build_app(source, Authenticator(tokens))
    c = TestClient(app)
    c.headers.update(auth_headers)
    etag = c.get("/v1/health/snapshot").headers["etag"]
    t0 = time.monotonic()
    r = c.get("/v1/health/snapshot?wait=0.3", headers={"If-None-Match": etag})
    assert r.status_code == 304
    assert time.monotonic() - t0 >= 0.29
    assert c.get("/v1/health/snapshot?wait=31").status_code == 400  # at most MAX_WAIT_S

    def change() -> None:
        time.sleep(0.2)
        source.facts = [facts("a", now_ms=now_ms, free=1.0)]
        snapshotter.refresh()

    threading.Thread(target=change).start()
    r = c.get("/v1/health/snapshot?wait=20", headers={"If-None-Match": etag})
    assert r.status_code == 200
    assert r.headers["etag"] != etag
    assert r.json()["instances"][0]["gpu_memory_free_bytes"] == 1


def _write(c: RunningCollector, now_ms: int, waiting: float) -> None:
    base = {"instance": "node-1", "model_name": "llama", "model": "llama-70b"}
    c.remote_write(
        [
            ({**base, "__name__": "gpu_memory_free_bytes", "gpu": "0"}, [(now_ms, 8e9)]),
            ({**base, "__name__": "vllm:num_requests_waiting"}, [(now_ms, waiting)]),
            ({**base, "__name__": "vllm:num_requests_running"}, [(now_ms, 12.0)]),
            ({**base, "__name__": "vllm:kv_cache_usage_perc"}, [(now_ms, 0.625)]),
        ]
    )


@pytest.mark.timeout(180)
def test_remote_written_vllm_metrics_reach_the_sdk_and_a_long_poll_sees_the_next_write(tmp_path):
    with running_collector(tmp_path, interval_s=0.2) as c:
        now = int(time.time() * 1000)
        _write(c, now, 3.0)
        with httpx.Client(
            base_url=c.url, headers={"Authorization": f"Bearer {c.read_token}"}, timeout=40
        ) as http:
            deadline = time.monotonic() + 60
            while True:
                r = http.get("/v1/health/snapshot")
                inst = {i["id"]: i for i in r.json()["instances"]}.get("node-1")
                if inst is not None and inst["serving"] is not None:
                    break
                assert time.monotonic() < deadline, r.text[:2000]
                time.sleep(0.05)
            assert inst["serving"]["requests_waiting"] == 3
            assert inst["serving"]["kv_cache_usage_ratio"] == 0.625
            assert inst["serving"]["sample_ms"] == now
            etag = r.headers["etag"]

            later = now + 1000
            threading.Timer(0.3, _write, (c, later, 9.0)).start()
            polled = http.get("/v1/health/snapshot?wait=30", headers={"If-None-Match": etag})
            assert polled.status_code == 200
            got = {i["id"]: i for i in polled.json()["instances"]}["node-1"]["serving"]
            assert (got["requests_waiting"], got["sample_ms"]) == (9, later)

        with HealthClient(c.url, token=c.read_token, ttl=0) as health:
            serving = health.snapshot().get("node-1").serving  # type: ignore[union-attr]
            assert serving is not None
            assert serving.engines == ("vllm",)
            assert serving.requests_running == 12
            assert serving.age_s(later / 1000 + 2) == pytest.approx(2.0)

        # watch=True: a TTL of an hour, yet the next write shows without asking (the long-poll).
        with HealthClient(c.url, token=c.read_token, ttl=3600, watch=True) as health:
            assert health.snapshot().get("node-1").serving.requests_waiting == 9  # type: ignore[union-attr]
            _write(c, later + 1000, 5.0)
            deadline = time.monotonic() + 60
            while health.snapshot().get("node-1").serving.requests_waiting != 5:  # type: ignore[union-attr]
                assert time.monotonic() < deadline, "the watch thread did not bring the next write"
                time.sleep(0.02)
