"""Requests on a kept-alive connection are answered at once (Grafana, promtool and the SDK reuse connections)."""

from __future__ import annotations

import statistics
import subprocess
import sys
import time

import httpx


def test_fifty_sequential_requests_on_one_connection_take_under_5_ms_each_at_the_median(tmp_path):
    # Without TCP_NODELAY on accepted connections, every response after the first on a
    # connection waited ~40 ms for the client's delayed ACK: the median would be ~40 ms.
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kernel_insight.cli",
            "collector",
            "--local-dev",
            "--store",
            str(tmp_path / "d"),
            "--port",
            "0",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        line = proc.stdout.readline()
        assert line.startswith("ki: listening on "), line
        base = line.split()[-1]
        with httpx.Client(base_url=base, timeout=10) as client:
            for _ in range(5):  # warm-up: the first request opens the connection
                assert client.get("/healthz").status_code == 200
            took = []
            for _ in range(50):
                t0 = time.perf_counter()
                assert client.get("/healthz").status_code == 200
                took.append(time.perf_counter() - t0)
            connections = client._transport._pool.connections  # one connection served them all
            assert len(connections) == 1
        assert statistics.median(took) < 0.005, f"median {statistics.median(took) * 1e3:.1f} ms"
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        proc.stdout.close()
