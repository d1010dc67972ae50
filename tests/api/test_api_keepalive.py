"""Requests on a kept-alive connection are answered at once (Grafana, promtool and the SDK reuse connections)."""

from __future__ import annotations

import statistics
import time

import httpx
from collector_process import running_collector


def test_fifty_sequential_requests_on_one_connection_take_under_5_ms_each_at_the_median(tmp_path):
    # Without TCP_NODELAY on accepted connections, every response after the first on a
    # connection waited ~40 ms for the client's delayed ACK: the median would be ~40 ms.
    with running_collector(tmp_path) as c, httpx.Client(base_url=c.url, timeout=10) as client:
        # Warm-up: the first request opens the connection; a second of requests lets the
        # collector's start-up work (schema, first health snapshot, first merges) pass, which on a
        # 2-core host costs the requests it overlaps a few ms each: not what this test is about.
        warm_until = time.monotonic() + 1.0
        while time.monotonic() < warm_until:
            assert client.get("/healthz").status_code == 200
        took = []
        for _ in range(50):
            t0 = time.perf_counter()
            assert client.get("/healthz").status_code == 200
            took.append(time.perf_counter() - t0)
        connections = client._transport._pool.connections  # one connection served them all
        assert len(connections) == 1
    assert statistics.median(took) < 0.005, f"median {statistics.median(took) * 1e3:.1f} ms"
