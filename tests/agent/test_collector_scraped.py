"""A real Prometheus scrapes a real ``ki collector`` fed by a real ki-agent: the self-metrics arrive.

Everything runs as its own process on 127.0.0.1: the collector (with tokens, so the test also
shows /metrics is open while the API is not), the agent draining a ring, and Prometheus with
a 1 s scrape interval. The assertions go through Prometheus' own query API.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import time

import httpx
import pytest
from support.collector import start_agent, start_collector, stop_collector

from kernel_insight.agent.ring import Ring
from kernel_insight.api import TokenStore
from kernel_insight.collector.keys import KeyStore
from kernel_insight.run import free_port

RECORDS = 3_000


def prom_value(prom: str, query: str) -> float | None:
    """The first value of an instant query against Prometheus, None when the result is empty."""
    r = httpx.get(f"{prom}/api/v1/query", params={"query": query}, timeout=10)
    assert r.status_code == 200, r.text
    result = r.json()["data"]["result"]
    return float(result[0]["value"][1]) if result else None


def wait_value(prom: str, query: str, check, timeout: float = 60) -> float:
    deadline = time.monotonic() + timeout
    last: float | None = None
    while time.monotonic() < deadline:
        last = prom_value(prom, query)
        if last is not None and check(last):
            return last
        time.sleep(0.2)
    raise AssertionError(f"{query}: last value {last} within {timeout} s")


@pytest.mark.slow
@pytest.mark.skipif(
    shutil.which("prometheus") is None, reason="the prometheus binary (Debian package) is not installed"
)
def test_prometheus_scrapes_ingest_and_agent_metrics_from_ki_collector(tmp_path, agent_bin, ring_name):
    keys = KeyStore(tmp_path / "keys.json")
    creds = keys.add_agent("scraped")
    creds.write_key_file(tmp_path / "agent.key")
    agent_hex = creds.agent_id.hex()
    TokenStore(tmp_path / "tokens.json").create("reader", ["read"])
    ring = Ring.create(ring_name, capacity=1 << 14)
    collector, url = start_collector(tmp_path, "--stats-interval", "0.5")
    agent: subprocess.Popen[bytes] | None = None
    prom: subprocess.Popen[str] | None = None
    try:
        # /metrics is open (Prometheus' convention; it carries no secret), the API is not.
        assert httpx.get(f"{url}/metrics", timeout=10).status_code == 200
        assert httpx.get(f"{url}/v1/health/snapshot", timeout=10).status_code == 401
        agent = start_agent(
            tmp_path, agent_bin, ring_name, url, "--drain-interval-ms", "20", "--heartbeat-s", "1"
        )
        name = ring.intern("gemm_kernel")
        base = time.time_ns()
        for i in range(RECORDS):
            assert ring.kernel(name, 0, base + i * 1_000, base + i * 1_000 + 500, 1, i) == 0
        prom_port = free_port()
        config = tmp_path / "prometheus.yml"
        config.write_text(
            json.dumps(  # YAML is a superset of JSON
                {
                    "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
                    "scrape_configs": [
                        {"job_name": "ki", "static_configs": [{"targets": [url.removeprefix("http://")]}]}
                    ],
                }
            )
        )
        prom = subprocess.Popen(
            ["prometheus", f"--config.file={config}", f"--web.listen-address=127.0.0.1:{prom_port}",
             f"--storage.tsdb.path={tmp_path / 'prom'}", "--log.level=warn"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        p = f"http://127.0.0.1:{prom_port}"
        deadline = time.monotonic() + 30
        while True:
            assert prom.poll() is None, prom.stderr.read()  # type: ignore[union-attr]
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{p}/-/ready", timeout=1).status_code == 200:
                    break
            assert time.monotonic() < deadline, "prometheus did not become ready"
            time.sleep(0.1)

        assert wait_value(p, 'up{job="ki"}', lambda v: v == 1) == 1
        # Every record the producer wrote: shipped by the agent (its counter, on the wire) and stored.
        stored = 'ki_collector_ingest_records_total{job="ki",outcome="stored"}'
        assert wait_value(p, stored, lambda v: v >= RECORDS) == RECORDS
        assert (
            wait_value(p, f'ki_agent_records_shipped_total{{agent="{agent_hex}"}}', lambda v: v >= RECORDS)
            == RECORDS
        )
        spans = 'ki_collector_rows_total{table="kernel_spans",outcome="stored"}'
        assert wait_value(p, spans, lambda v: v >= RECORDS) == RECORDS
        assert wait_value(p, 'ki_collector_ingest_batches_total{outcome="stored"}', lambda v: v > 0) > 0
        ok = 'sum(ki_collector_http_requests_total{endpoint="/v1/ingest",method="POST",status="200"})'
        assert wait_value(p, ok, lambda v: v > 0) > 0
        # The agent's own gauges and the collector's view of its lag; the store's parts.
        assert wait_value(p, f'ki_agent_spool_batches{{agent="{agent_hex}"}}', lambda v: v >= 0) >= 0
        lag = wait_value(p, f'ki_collector_agent_ingest_lag_seconds{{agent="{agent_hex}"}}', lambda v: v >= 0)
        assert lag < 30
        assert wait_value(p, 'ki_store_active_parts{table="kernel_spans"}', lambda v: v >= 1) >= 1
        assert (
            wait_value(p, 'ki_collector_insert_duration_seconds_count{table="samples"}', lambda v: v > 0) > 0
        )
        assert wait_value(p, "process_resident_memory_bytes{job='ki'}", lambda v: v > 0) > 0
        flushed = wait_value(p, "ki_collector_batcher_flushed_batches_total", lambda v: v > 0)
        assert wait_value(p, "ki_collector_batcher_flush_rows_count", lambda v: 1 <= v <= flushed) <= flushed
        assert (
            wait_value(
                p, 'ki_collector_records_dropped_total{reason="timestamp_out_of_range"}', lambda v: v == 0
            )
            == 0
        )
        # promtool lints the same exposition Prometheus scraped.
        text = httpx.get(f"{url}/metrics", timeout=10).text
        check = subprocess.run(
            ["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=30
        )
        assert check.returncode == 0, check.stdout + check.stderr
    finally:
        if prom is not None:
            prom.terminate()
            prom.communicate(timeout=30)
        if agent is not None:
            agent.terminate()
            agent.wait(30)
        stop_collector(collector)
        ring.close()
