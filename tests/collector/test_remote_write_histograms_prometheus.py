"""A real Prometheus scrapes native histograms (protobuf exposition) and remote-writes them to ki collector.

The target is a small HTTP server in this process serving ``io.prometheus.client.MetricFamily``
messages (varint-delimited, built by Google's protobuf library from client_model's
metrics.proto, tests/native_histogram_exposition.py); Prometheus (Debian's 2.42) runs with
``--enable-feature=native-histograms`` and ``send_native_histograms: true``.
"""

from __future__ import annotations

import shutil
import threading
import time
from http.server import ThreadingHTTPServer

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

from kernel_insight.collector.clickhouse.store import EmbeddedStore


class _Target:
    """The scraped histogram: every scrape adds observations, so each remote-written sample differs."""

    def __init__(self) -> None:
        self.scrapes = 0
        self.lock = threading.Lock()

    def state(self) -> tuple[int, list[int], int]:
        with self.lock:
            self.scrapes += 1
            n = self.scrapes
        # Buckets at schema 0: indices -1, 0 (span offset -1, length 2) and 3 (offset 2, length 1).
        buckets = [n, 2 * n, 3 * n]
        return n, buckets, 1

    def body(self) -> bytes:
        n, buckets, zero = self.state()
        mf = MetricFamily(name="ki_test_latency_seconds", help="test", type=4)
        m = mf.metric.add()
        m.label.add(name="kernel", value="gemm")
        h = m.histogram
        h.sample_count = sum(buckets) + zero
        h.sample_sum = 1.5 * n
        h.schema = 0
        h.zero_threshold = 1e-9
        h.zero_count = zero
        h.positive_span.add(offset=-1, length=2)
        h.positive_span.add(offset=2, length=1)
        h.positive_delta.extend([buckets[0], buckets[1] - buckets[0], buckets[2] - buckets[1]])
        return delimited(mf)


def _serve(target: _Target) -> ThreadingHTTPServer:
    return serve(target.body)


@pytest.mark.slow
@pytest.mark.skipif(
    shutil.which("prometheus") is None, reason="the prometheus binary (Debian package) is not installed"
)
def test_real_prometheus_remote_writes_native_histograms(tmp_path):
    target = _Target()
    server = _serve(target)
    prom = None
    try:
        with running_collector(tmp_path) as collector:
            cred = tmp_path / "ingest.token"
            cred.write_text(collector.ingest_token + "\n")
            cred.chmod(0o600)
            prom_port = free_port()
            prom = start_prometheus(tmp_path, remote_write_config(server, collector.url, cred), prom_port)
            # The collector's own counter of rows stored by table says when three samples landed.
            deadline = time.monotonic() + 90
            stored = 0.0
            auth = {"Authorization": f"Bearer {collector.read_token}"}
            with httpx.Client(base_url=collector.url, headers=auth, timeout=10) as http:
                while time.monotonic() < deadline and stored < 3:
                    assert prom.poll() is None, prom.stderr.read()  # type: ignore[union-attr]
                    r = http.get("/metrics")
                    assert r.status_code == 200, r.text
                    stored = sum(
                        float(line.rsplit(" ", 1)[1])
                        for line in r.text.splitlines()
                        if line.startswith("ki_collector_rows_total{")
                        and 'table="histograms"' in line
                        and 'outcome="stored"' in line
                    )
                    if stored < 3:
                        time.sleep(0.5)
            assert stored >= 3, (
                f"no histograms reached the store in 90 s: {collector.stderr.read_text()[-2000:]}"
            )
            # Histogram-only series are listed like any other (the series index, the label APIs).
            with httpx.Client(base_url=collector.url, headers=auth, timeout=10) as http:
                r = http.get("/api/v1/series", params={"match[]": "ki_test_latency_seconds"})
            assert r.status_code == 200, r.text
            (listed,) = r.json()["data"]
            assert listed["job"] == "nh"
            assert listed["kernel"] == "gemm"
            # kql over the stored histograms answers as Prometheus does over its own TSDB: every
            # sample ki holds (a range selector's raw samples) equals Prometheus' at that time,
            # in the HTTP API's JSON ("histograms": [[t, {count, sum, buckets}], ...]).
            at = {"query": "ki_test_latency_seconds[1h]", "time": f"{time.time():.3f}"}
            with httpx.Client(base_url=collector.url, headers=auth, timeout=10) as http:
                ours = http.get("/api/v1/query", params=at)
            theirs = httpx.get(f"http://127.0.0.1:{prom_port}/api/v1/query", params=at, timeout=10)
            assert ours.status_code == 200, ours.text
            assert theirs.status_code == 200, theirs.text
            (mine,) = ours.json()["data"]["result"]
            (prom_series,) = theirs.json()["data"]["result"]
            assert mine["metric"] == prom_series["metric"]
            assert "values" not in mine
            by_time = {t: h for t, h in prom_series["histograms"]}
            assert len(mine["histograms"]) >= 3
            for t, h in mine["histograms"]:
                assert h == by_time[t], (t, h, by_time.get(t))
            stop_prometheus(prom)
            prom = None
        with EmbeddedStore(tmp_path / "data") as store:
            rows = store.query(
                "SELECT labels, schema, zero_threshold, zero_count, count, sum, positive_span_offsets, "
                "positive_span_lengths, positive_counts, positive_float_counts FROM ki.histograms AS h "
                "INNER JOIN (SELECT DISTINCT fingerprint, labels FROM ki.series) AS s USING fingerprint "
                "WHERE h.metric = 'ki_test_latency_seconds' ORDER BY ts"
            ).to_pylist()
    finally:
        if prom is not None:
            stop_prometheus(prom)
        server.shutdown()
        server.server_close()
    assert len(rows) >= 3, rows
    for row in rows:
        assert dict(row["labels"])["job"] == "nh"
        assert dict(row["labels"])["kernel"] == "gemm"
        n = round(row["sum"] / 1.5)  # the scrape this sample came from
        assert row["schema"] == 0
        assert row["zero_threshold"] == 1e-9
        assert row["zero_count"] == 1.0
        assert row["positive_span_offsets"] == [-1, 2]
        assert row["positive_span_lengths"] == [2, 1]
        assert row["positive_counts"] == [n, 2 * n, 3 * n]
        assert row["positive_float_counts"] == []
        assert row["count"] == 6 * n + 1
