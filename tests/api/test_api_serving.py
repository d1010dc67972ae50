"""The serving engines' load in the snapshot: the mapping table, how series combine, remote_write to
the SDK through a real collector, and the ETag'd long-poll."""

from __future__ import annotations

import contextlib
import http.server
import json
import math
import shutil
import subprocess
import sys
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
from kernel_insight.run import free_port
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


#: One instance per engine, its metrics with the labels the engine itself exports: (labels, value).
_ENGINES: dict[str, dict[str, list[tuple[dict[str, str], float]]]] = {
    "vllm-0": {  # two engine processes (data parallel): queues add up, the fuller KV cache counts
        "vllm:num_requests_waiting": [({"engine": "0"}, 3.0), ({"engine": "1"}, 4.0)],
        "vllm:num_requests_running": [({"engine": "0"}, 10.0), ({"engine": "1"}, 12.0)],
        "vllm:kv_cache_usage_perc": [({"engine": "0"}, 0.5), ({"engine": "1"}, 0.625)],
        "vllm:prefix_cache_hits_total": [({"engine": "0"}, 300.0)],
        "vllm:prefix_cache_queries_total": [({"engine": "0"}, 1200.0)],
    },
    "sglang-0": {
        "sglang:num_queue_reqs": [({"tp_rank": "0"}, 2.0)],
        "sglang:num_running_reqs": [({"tp_rank": "0"}, 9.0)],
        "sglang:token_usage": [({"tp_rank": "0"}, 0.4)],
        "sglang:cache_hit_rate": [({"tp_rank": "0"}, 0.6)],
    },
    "tgi-0": {"tgi_queue_size": [({}, 5.0)], "tgi_batch_current_size": [({}, 16.0)]},
    "trtllm-0": {
        "trtllm_num_requests_waiting": [({"engine_type": "trtllm"}, 1.0)],
        "trtllm_num_requests_running": [({"engine_type": "trtllm"}, 7.0)],
        "trtllm_kv_cache_utilization": [({"engine_type": "trtllm"}, 0.3)],
    },
}
_EXPECTED = {
    "vllm-0": (["vllm"], 7, 22, 0.625, 0.25),
    "sglang-0": (["sglang"], 2, 9, 0.4, 0.6),
    "tgi-0": (["tgi"], 5, 16, None, None),
    "trtllm-0": (["trtllm-serve"], 1, 7, 0.3, None),
}


def _serving(c: RunningCollector, ids: set[str]) -> dict[str, dict]:
    """The snapshot's ``serving`` of ``ids`` once every one has it (generous deadline)."""
    with httpx.Client(base_url=c.url, headers={"Authorization": f"Bearer {c.read_token}"}, timeout=30) as h:
        deadline = time.monotonic() + 60
        while True:
            got = {i["id"]: i["serving"] for i in h.get("/v1/health/snapshot").json()["instances"]}
            if all(got.get(i) is not None for i in ids):
                return {i: got[i] for i in ids}
            assert time.monotonic() < deadline, got
            time.sleep(0.05)


@pytest.mark.timeout(180)
def test_every_engine_in_the_table_reaches_the_snapshot_by_remote_write(tmp_path):
    """Each engine's own metric names and labels, remote-written to a real collector beside the GPU
    gauge that puts the instance in the snapshot, come out as its ``serving`` figures."""
    assert {SERVING_METRICS[n].engine for m in _ENGINES.values() for n in m} == {
        m.engine for m in SERVING_METRICS.values()
    }  # every engine the table lists is exercised here
    with running_collector(tmp_path, interval_s=0.2) as c:
        now = int(time.time() * 1000)
        series: list[tuple[dict[str, str], list[tuple[int, float]]]] = []
        for inst, metrics in _ENGINES.items():
            base = {"instance": inst, "model_name": "llama"}
            series.append(({**base, "__name__": "gpu_memory_free_bytes", "gpu": "0"}, [(now, 8e9)]))
            for name, rows in metrics.items():
                series += [({**base, **labels, "__name__": name}, [(now, v)]) for labels, v in rows]
        c.remote_write(series)
        got = _serving(c, set(_ENGINES))
    for inst, (engines, waiting, running, kv, hit) in _EXPECTED.items():
        s = got[inst]
        assert (s["engines"], s["requests_waiting"], s["requests_running"]) == (engines, waiting, running), (
            inst
        )
        assert s["kv_cache_usage_ratio"] == (None if kv is None else pytest.approx(kv)), inst
        assert s["prefix_cache_hit_ratio"] == (None if hit is None else pytest.approx(hit)), inst
        assert s["sample_ms"] == now


#: vLLM's /metrics as it serves it (an excerpt: its gauges, a counter, a histogram), no timestamps.
_VLLM_METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="meta-llama/Llama-3.1-70B-Instruct"} 14.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="meta-llama/Llama-3.1-70B-Instruct"} 6.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="meta-llama/Llama-3.1-70B-Instruct"} 0.8125
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="meta-llama/Llama-3.1-70B-Instruct"} 4000.0
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="meta-llama/Llama-3.1-70B-Instruct"} 3000.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="meta-llama/Llama-3.1-70B-Instruct"} 90.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="meta-llama/Llama-3.1-70B-Instruct"} 100.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="meta-llama/Llama-3.1-70B-Instruct"} 100.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="meta-llama/Llama-3.1-70B-Instruct"} 7.5
"""


def _enrol_by_series(c: RunningCollector, tmp_path: Path, instance: str) -> Path:
    """Put ``instance`` in the snapshot (its GPU gauge, remote-written) and return a 0600 file
    holding the collector's ingest token, for the sender under test."""
    token = tmp_path / "ingest.token"
    token.write_text(c.ingest_token)
    token.chmod(0o600)
    now = int(time.time() * 1000)
    c.remote_write([({"__name__": "gpu_memory_free_bytes", "instance": instance, "gpu": "0"}, [(now, 8e9)])])
    return token


def _assert_the_vllm_excerpt(s: dict) -> None:
    assert (s["engines"], s["requests_waiting"], s["requests_running"]) == (["vllm"], 6, 14)
    assert s["kv_cache_usage_ratio"] == pytest.approx(0.8125)
    assert s["prefix_cache_hit_ratio"] == pytest.approx(0.75)  # 3,000 of 4,000 tokens


@pytest.mark.timeout(180)
def test_without_prometheus_ki_import_brings_vllm_metrics_in(tmp_path):
    """docs/routing.md's recipe for a fleet without Prometheus: the engine's /metrics text piped to
    ``ki import - --collector`` with a relabel rule naming the instance; the import stamps the
    samples with its own time."""
    rules = tmp_path / "instance.yml"
    rules.write_text("- target_label: instance\n  replacement: gpu-node-7\n")
    with running_collector(tmp_path, interval_s=0.2) as c:
        before = int(time.time() * 1000)
        token = _enrol_by_series(c, tmp_path, "gpu-node-7")
        done = subprocess.run(
            [sys.executable, "-m", "kernel_insight.cli", "import", "-", "--collector", c.url,
             "--token-file", str(token), "--relabel-config", str(rules)],
            input=_VLLM_METRICS, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        after = int(time.time() * 1000)
        assert done.returncode == 0, done.stderr
        s = _serving(c, {"gpu-node-7"})["gpu-node-7"]
    _assert_the_vllm_excerpt(s)
    assert before <= s["sample_ms"] <= after


class _VllmMetrics(http.server.BaseHTTPRequestHandler):
    """A stand-in for a vLLM server's /metrics (the engine is outside the system): its exposition."""

    def do_GET(self) -> None:
        body = _VLLM_METRICS.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # a scrape given up on
            self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.skipif(
    shutil.which("prometheus") is None, reason="the prometheus binary (Debian package) is not installed"
)
@pytest.mark.timeout(180)
def test_prometheus_in_agent_mode_scrapes_vllm_into_the_snapshot(tmp_path):
    """docs/routing.md's recipe for a fleet without a Prometheus server: Prometheus in agent mode
    (no local TSDB) scrapes the engine every 250 ms, names the instance by a relabel rule and
    remote-writes to the collector."""
    engine = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _VllmMetrics)
    threading.Thread(target=engine.serve_forever, daemon=True).start()
    prom: subprocess.Popen[str] | None = None
    with running_collector(tmp_path, interval_s=0.2) as c:
        try:
            token = _enrol_by_series(c, tmp_path, "gpu-node-9")
            config = tmp_path / "agent.yml"
            config.write_text(
                json.dumps(  # YAML is a superset of JSON
                    {
                        "global": {"scrape_interval": "250ms", "scrape_timeout": "200ms"},
                        "scrape_configs": [
                            {
                                "job_name": "vllm",
                                "static_configs": [{"targets": [f"127.0.0.1:{engine.server_port}"]}],
                                "relabel_configs": [
                                    {"target_label": "instance", "replacement": "gpu-node-9"}
                                ],
                            }
                        ],
                        "remote_write": [
                            {
                                "url": f"{c.url}/api/v1/write",
                                "authorization": {"type": "Bearer", "credentials_file": str(token)},
                                "queue_config": {"batch_send_deadline": "250ms"},
                            }
                        ],
                    }
                )
            )
            prom = subprocess.Popen(
                ["prometheus", "--enable-feature=agent", f"--config.file={config}",
                 f"--web.listen-address=127.0.0.1:{free_port()}",
                 f"--storage.agent.path={tmp_path / 'agent'}", "--log.level=warn"],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            )  # fmt: skip
            s = _serving(c, {"gpu-node-9"})["gpu-node-9"]
            assert prom.poll() is None, prom.stderr.read() if prom.stderr else ""
        finally:
            if prom is not None:
                prom.terminate()
                prom.communicate(timeout=30)
            engine.shutdown()
            engine.server_close()
    _assert_the_vllm_excerpt(s)
