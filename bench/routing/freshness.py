"""How fresh the snapshot is where the SDK reads it: remote_write of vLLM's metrics to a real
``ki collector`` (``--interval 0.25``) until a ``HealthClient(watch=True)`` on a kept-alive
connection shows the written value (docs/routing.md, "Freshness")."""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import httpx

from bench.routing.memory_fleet import collector
from kernel_insight.collector.remote_write import encode_write_request
from kernel_insight.sdk import HealthClient

INSTANCES = 32


def _write(http: httpx.Client, url: str, now_ms: int, waiting: float) -> None:
    series = []
    for i in range(INSTANCES):
        base = {"instance": f"gpu-{i:02d}", "model": "llama-70b", "model_name": "llama"}
        series.append(({**base, "__name__": "gpu_memory_free_bytes", "gpu": "0"}, [(now_ms, 8e9)]))
        series.append(({**base, "__name__": "vllm:num_requests_waiting"}, [(now_ms, waiting)]))
        series.append(({**base, "__name__": "vllm:num_requests_running"}, [(now_ms, 20.0)]))
        series.append(({**base, "__name__": "vllm:kv_cache_usage_perc"}, [(now_ms, 0.5)]))
    r = http.post(
        url + "/api/v1/write",
        content=encode_write_request(series),
        headers={"Content-Type": "application/x-protobuf", "Content-Encoding": "snappy"},
    )
    r.raise_for_status()


def measure(writes: int = 40, every_s: float = 0.25, interval_s: float = 0.25) -> dict[str, float]:
    """Milliseconds from a write's start until the watching client shows it: p50, p99, max."""
    lags: list[float] = []
    with (
        tempfile.TemporaryDirectory(prefix="ki-bench-freshness-") as tmp,
        collector(Path(tmp), interval_s) as url,
        httpx.Client(timeout=30) as http,
    ):
        _write(http, url, int(time.time() * 1000), 0.0)
        with HealthClient(url, ttl=3600, watch=True) as health:
            deadline = time.monotonic() + 60
            while (inst := health.snapshot().get("gpu-00")) is None or inst.serving is None:
                if time.monotonic() > deadline:
                    raise SystemExit("the snapshot did not show the first write within 60 s")
                time.sleep(0.01)
            for k in range(1, writes + 1):
                t0 = time.monotonic()
                _write(http, url, int(time.time() * 1000), float(k))
                until = t0 + 30
                while True:
                    inst = health.snapshot().get("gpu-00")
                    if inst is not None and inst.serving is not None and inst.serving.requests_waiting == k:
                        lags.append((time.monotonic() - t0) * 1000)
                        break
                    if time.monotonic() > until:
                        raise SystemExit(f"write {k} not seen within 30 s")
                    time.sleep(0.002)
                time.sleep(max(0.0, every_s - (time.monotonic() - t0)))
    lags.sort()
    return {
        "freshness_p50_ms": round(statistics.median(lags)),
        "freshness_p99_ms": round(lags[min(len(lags) - 1, int(0.99 * len(lags)))]),
    }
