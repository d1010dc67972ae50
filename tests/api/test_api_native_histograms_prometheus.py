"""ki collector's /api/v1/query answers native histograms as a real Prometheus does, on the same samples.

A real Prometheus (Debian's package) scrapes a native histogram (protobuf exposition) from a
target in this process and remote-writes it to a real ki collector. Prometheus is then
restarted on its own TSDB without scraping, and the same queries go to both HTTP APIs at a
time both hold the same samples: the ``data`` objects must be equal, histogram encoding
(bucket boundary rules, bounds, counts as strings) included. The histogram has a zero bucket,
negative and positive buckets and moderate numbers, where Debian's Prometheus 2.42 and
Prometheus 3 write the same text; the queries avoid what 2.42 lacks or computes differently (arithmetic on
histograms, rate's extrapolation, histogram_quantile's interpolation, closed range ends).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from collector_process import running_collector
from native_histogram_exposition import (
    MetricFamily,
    delimited,
    free_port,
    remote_write_config,
    serve,
    start_prometheus,
    stop_prometheus,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        shutil.which("prometheus") is None, reason="the prometheus binary (Debian package) is not installed"
    ),
]

NAME = "ki_e2e_latency_seconds"


class _Target:
    """A histogram that grows on every scrape: zero bucket, two negative and three positive buckets."""

    def __init__(self) -> None:
        self.scrapes = 0
        self.lock = threading.Lock()

    def body(self) -> bytes:
        with self.lock:
            self.scrapes += 1
            n = self.scrapes
        mf = MetricFamily(name=NAME, help="test", type=4)
        m = mf.metric.add()
        m.label.add(name="kernel", value="gemm")
        h = m.histogram
        pos = [2 * n, 3 * n, n]
        neg = [n, n + 1]
        h.sample_count = sum(pos) + sum(neg) + n
        h.sample_sum = 2.5 * n
        h.schema = 1
        h.zero_threshold = 0.001
        h.zero_count = n
        h.positive_span.add(offset=-2, length=2)
        h.positive_span.add(offset=3, length=1)
        h.positive_delta.extend([pos[0], pos[1] - pos[0], pos[2] - pos[1]])
        h.negative_span.add(offset=1, length=2)
        h.negative_delta.extend([neg[0], neg[1] - neg[0]])
        return delimited(mf)


def _data(client: httpx.Client, path: str, params: dict[str, str]) -> Any:
    r = client.get(path, params=params)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["status"] == "success", body
    return body["data"]


def test_query_results_with_native_histograms_equal_prometheus(tmp_path: Path) -> None:
    target = _Target()
    server = serve(target.body)
    prom: subprocess.Popen[str] | None = None
    try:
        with running_collector(tmp_path) as collector:
            cred = tmp_path / "ingest.token"
            cred.write_text(collector.ingest_token + "\n")
            cred.chmod(0o600)
            prom_port = free_port()
            prom = start_prometheus(tmp_path, remote_write_config(server, collector.url, cred), prom_port)
            auth = {"Authorization": f"Bearer {collector.read_token}"}
            with httpx.Client(base_url=collector.url, headers=auth, timeout=10) as ki:
                # Wait for five histogram samples in ki collector (count_over_time sees histograms).
                deadline = time.monotonic() + 90
                seen = 0.0
                while time.monotonic() < deadline and seen < 5:
                    assert prom.poll() is None, prom.stderr.read() if prom.stderr else ""
                    result = _data(ki, "/api/v1/query", {"query": f"count_over_time({NAME}[5m])"})["result"]
                    seen = float(result[0]["value"][1]) if result else 0.0
                    if seen < 5:
                        time.sleep(0.5)
                assert seen >= 5, (
                    f"no histograms reached ki collector in 90 s: {collector.stderr.read_text()[-2000:]}"
                )
                stop_prometheus(prom)
                # Prometheus again on its own TSDB, without scraping: its API over the same samples.
                prom = start_prometheus(tmp_path, {"global": {"scrape_interval": "1s"}}, prom_port)
                with httpx.Client(base_url=f"http://127.0.0.1:{prom_port}", timeout=10) as real:
                    deadline = time.monotonic() + 60
                    while True:
                        try:
                            if real.get("/-/ready").status_code == 200:
                                break
                        except httpx.TransportError:
                            pass
                        assert time.monotonic() < deadline, "Prometheus did not come back"
                        time.sleep(0.2)
                    # The newest sample ki collector holds: both have every sample up to it.
                    stamp = _data(ki, "/api/v1/query", {"query": f"timestamp({NAME})"})["result"][0]["value"][
                        1
                    ]
                    at = f"{float(stamp):.3f}"
                    start = f"{float(stamp) - 3:.3f}"
                    instant = [
                        NAME,
                        f"{NAME}[3500ms]",  # off the scrape grid: 2.42 had closed ranges, 3.x left-open
                        f"histogram_count({NAME})",
                        f"histogram_sum({NAME})",
                        f"sum by (kernel) ({NAME})",
                    ]
                    for query in instant:
                        want = _data(real, "/api/v1/query", {"query": query, "time": at})
                        got = _data(ki, "/api/v1/query", {"query": query, "time": at})
                        assert got == want, f"{query}:\n{json.dumps(got)}\n{json.dumps(want)}"
                        assert want["result"], query  # the comparison saw a histogram result
                    for query in (NAME, f"histogram_count({NAME})"):
                        params = {"query": query, "start": start, "end": at, "step": "1"}
                        want = _data(real, "/api/v1/query_range", params)
                        got = _data(ki, "/api/v1/query_range", params)
                        assert got == want, f"{query}:\n{json.dumps(got)}\n{json.dumps(want)}"
                        assert want["result"][0].get("histograms") or want["result"][0]["values"], query
    finally:
        if prom is not None and prom.poll() is None:
            stop_prometheus(prom)
        server.shutdown()
        server.server_close()
