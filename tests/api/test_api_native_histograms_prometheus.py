"""ki collector's /api/v1/query answers native histograms as a real Prometheus does, on the same samples.

A real Prometheus (Debian's package) scrapes a native histogram (protobuf exposition) from a
target in this process and remote-writes it to a real ki collector. Prometheus is then
restarted on its own TSDB without scraping, and the same queries go to both HTTP APIs at a
time both hold the same samples: the ``data`` objects must be equal, histogram encoding
(bucket boundary rules, bounds, counts as strings) included. The histogram has a zero bucket,
negative and positive buckets and moderate numbers, where Debian's Prometheus 2.42 and
Prometheus 3 write the same text; the queries avoid what 2.42 lacks or computes differently (arithmetic on
histograms, rate's extrapolation, histogram_quantile's interpolation, closed range ends).
Then Prometheus 3.5 (Debian unstable's, unpacked by scripts/fetch_peers.sh) opens a copy of the
same TSDB and answers those queries and the ones 2.42 computes differently, byte for byte as
ki collector does (the whole response body).
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
from native_histogram_exposition import (
    MetricFamily,
    delimited,
    free_port,
    remote_write_config,
    serve,
    start_prometheus,
    stop_prometheus,
)
from support.collector import running_collector

from bench.kql.servers import peer_binary

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


def _wait_ready(client: httpx.Client) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            if client.get("/-/ready").status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "Prometheus did not come back"
        time.sleep(0.2)


#: Queries Prometheus 3.x answers as kql does and 2.42 does not (3.x's rate extrapolation,
#: histogram_quantile's and histogram_fraction's interpolation, arithmetic on histograms,
#: left-open ranges on the scrape grid), asked of 3.5 only.
NEWER = [
    f"rate({NAME}[4s])",
    f"increase({NAME}[3s])",
    f"histogram_quantile(0.9, {NAME})",
    f"histogram_fraction(0, 1, {NAME})",
    f"histogram_avg({NAME})",
    f"histogram_stddev({NAME})",
    f"{NAME} * 2",
    f"{NAME} / 4",
    f"{NAME} + {NAME}",
    f"-{NAME}",
    f"sum_over_time({NAME}[3s])",
    f"avg_over_time({NAME}[3s])",
    f"{NAME}[3s]",
    f"histogram_count(rate({NAME}[4s])) > 0.000001",
]


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
                    _wait_ready(real)
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
                stop_prometheus(prom)
                prom = None
                newer = peer_binary("prometheus")
                if newer is None:
                    pytest.skip(
                        "Prometheus 3.5 is not unpacked (scripts/fetch_peers.sh): "
                        "the 2.42 comparison passed, the 3.5 one did not run"
                    )
                shutil.copytree(tmp_path / "prom", tmp_path / "prom3", ignore=shutil.ignore_patterns("lock"))
                prom = start_prometheus(
                    tmp_path, {"global": {"scrape_interval": "1s"}}, prom_port, newer, "prom3"
                )
                with httpx.Client(base_url=f"http://127.0.0.1:{prom_port}", timeout=10) as real:
                    _wait_ready(real)
                    for query in instant + NEWER:
                        params = {"query": query, "time": at}
                        want_r, got_r = (
                            real.get("/api/v1/query", params=params),
                            ki.get("/api/v1/query", params=params),
                        )
                        assert got_r.status_code == want_r.status_code == 200, (
                            query,
                            got_r.text,
                            want_r.text,
                        )
                        assert got_r.json() == want_r.json(), f"{query}:\n{got_r.text}\n{want_r.text}"
                        assert want_r.json()["data"]["result"], query
                    for query in (NAME, f"histogram_count({NAME})", f"rate({NAME}[4s])"):
                        params = {"query": query, "start": start, "end": at, "step": "1"}
                        want_r = real.get("/api/v1/query_range", params=params)
                        got_r = ki.get("/api/v1/query_range", params=params)
                        assert got_r.json() == want_r.json(), f"{query}:\n{got_r.text}\n{want_r.text}"
                    # A query that does not parse: Prometheus 3's error shape and text up to the
                    # message, whose wording is kql's own (docs/kql.md, known differences).
                    params = {"query": f"sum({NAME}"}
                    want_r, got_r = (
                        real.get("/api/v1/query", params=params),
                        ki.get("/api/v1/query", params=params),
                    )
                    assert got_r.status_code == want_r.status_code == 400
                    got_e, want_e = got_r.json(), want_r.json()
                    assert got_e["errorType"] == want_e["errorType"] == "bad_data"
                    head = 'invalid parameter "query": 1:27: parse error: '
                    assert want_e["error"].startswith(head), want_e
                    assert got_e["error"].startswith(head), got_e
    finally:
        if prom is not None and prom.poll() is None:
            stop_prometheus(prom)
        server.shutdown()
        server.server_close()
