"""make bench-timeline: one GPU's hour of kept spans plus a 10 s full capture, read through a real collector.

Targets (issue 15): API time for a 10 s window p99 <= 100 ms (keep-alive client); export of a
60 s window to a file <= 1 s; span bytes on disk <= 12 per span. Windows of the kept hour
(500 spans/s) and the capture (100k/s) are reported apart: the BENCH line's first three keys
are the kept hour's, ``capture_*`` the dense window's. The data (an hour at 500
spans/s = 1.8M spans, plus 10 s at 100k kernels/s = 1M spans, 8 streams, 40 kernel names) is
written into an embedded store in agent-sized batches, then ``ki collector`` serves that store
as its own process on 127.0.0.1. Ends with one ``BENCH timeline ...`` line.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

from bench.collector_process import start_collector
from kernel_insight.api.auth import TokenStore
from kernel_insight.collector.clickhouse.store import EmbeddedStore
from kernel_insight.collector.rows import SpanBatch
from kernel_insight.sdk import TimelineClient

S = 1_000_000_000
KERNELS = [f"ampere_sgemm_{i}x{i}_tn" for i in range(32)] + [
    f"void at::native::kernel_{i}<float>" for i in range(8)
]
STREAMS = 8
INSTANCE = "bench-node-1"
BATCH = 50_000  # spans per insert, as one ingest request of a busy agent


def _batch(rng: np.random.Generator, starts: np.ndarray, corr0: int) -> SpanBatch:
    n = len(starts)
    durations = rng.lognormal(np.log(20_000), 1.0, n).astype(np.int64) + 1_000
    return SpanBatch(
        instance=[INSTANCE] * n,
        gpu=np.zeros(n, np.uint16),
        stream=(0x7F00_0000_0000 + rng.integers(0, STREAMS, n) * 0x100).astype(np.uint64),
        kernel=[KERNELS[i] for i in rng.integers(0, len(KERNELS), n)],
        start_ns=starts,
        end_ns=starts + durations,
        correlation=np.arange(corr0, corr0 + n, dtype=np.uint64),
        pid=np.full(n, 4242, np.uint32),
    )


def populate(data: Path, t0: int, hour_rate: int, capture_rate: int, capture_at: int) -> int:
    """The hour (uniform ``hour_rate``/s) and the capture (``capture_rate``/s for 10 s); the span count."""
    rng = np.random.default_rng(15)
    hour = np.sort(t0 + rng.integers(0, 3600 * S, 3600 * hour_rate)).astype(np.int64)
    capture = np.sort(capture_at + rng.integers(0, 10 * S, 10 * capture_rate)).astype(np.int64)
    total = 0
    with EmbeddedStore(data) as store:
        for starts in (hour, capture):
            for i in range(0, len(starts), BATCH):
                total += store.insert_spans(_batch(rng, starts[i : i + BATCH], total))
        store.optimize("kernel_spans")
    return total


def start_server(data: Path, tokens: Path) -> tuple[subprocess.Popen[str], str]:
    return start_collector("--store", str(data), "--tokens", str(tokens), "--interval", "60")


def window_times(client: httpx.Client, starts: list[int]) -> list[float]:
    """ms per request: for each 10 s window, a page of 1000 spans and the per-kernel summary."""
    out: list[float] = []
    for start in starts:
        params = {"instance": INSTANCE, "gpu": "0", "from": repr(start / S), "to": repr(start / S + 10)}
        for path, extra in (("/v1/timeline/spans", {"limit": "1000"}), ("/v1/timeline/summary", {})):
            t = time.perf_counter()
            r = client.get(path, params=params | extra)
            out.append((time.perf_counter() - t) * 1000)
            if r.status_code != 200:
                raise SystemExit(f"{path} answered {r.status_code}: {r.text[:200]}")
    return out


def export_seconds(client: TimelineClient, start: int, out: Path) -> tuple[float, int, int]:
    """Median seconds of three exports of the 60 s window at ``start`` written to ``out`` by the SDK
    (``to_perfetto``: what ``ki timeline export`` runs, streamed to the file); spans, bytes."""
    times = []
    for _ in range(3):
        t = time.perf_counter()
        client.to_perfetto(out, INSTANCE, 0, start / S, start / S + 60)
        times.append(time.perf_counter() - t)
    content = out.read_bytes()
    return statistics.median(times), content.count(b'"ph":"X"'), len(content)


def _p(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100)[q - 1]


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.timeline", description=__doc__)
    ap.add_argument("--hour-rate", type=int, default=500, help="kept spans per second over the hour")
    ap.add_argument(
        "--capture-rate", type=int, default=100_000, help="kernels per second in the 10 s capture"
    )
    ap.add_argument(
        "--requests", type=int, default=200, help="10 s windows asked (each: spans page + summary)"
    )
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="ki-bench-timeline-") as tmp:
        data, tokens_path = Path(tmp) / "data", Path(tmp) / "tokens.json"
        t0 = (time.time_ns() // S - 3700) * S  # the last hour: inside the 7-day span retention
        capture_at = t0 + 1800 * S
        t = time.perf_counter()
        spans = populate(data, t0, args.hour_rate, args.capture_rate, capture_at)
        print(f"stored {spans} spans in {time.perf_counter() - t:.1f} s")
        with EmbeddedStore(data) as store:
            disk = store.disk_bytes("kernel_spans")
            parts = store.query(
                f"SELECT column, sum(column_data_compressed_bytes) AS b FROM system.parts_columns"
                f" WHERE database = '{store.database}' AND table = 'kernel_spans' AND active GROUP BY column ORDER BY b DESC"
            ).to_pylist()
        per_span = disk / spans
        print(f"kernel_spans on disk: {disk / 1e6:.1f} MB, {per_span:.2f} bytes/span; by column:")
        for p in parts:
            print(f"  {p['column']:12} {p['b'] / spans:.2f} bytes/span")
        token = TokenStore(tokens_path).create("bench", ["read"]).token
        proc, url = start_server(data, tokens_path)
        try:
            with (
                httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=120) as c,
                TimelineClient(url, token, timeout=120) as tl,
            ):
                rng = random.Random(1)
                hour = [t0 + rng.randrange(0, 3590) * S for _ in range(args.requests)]
                hour = [h for h in hour if abs(h - capture_at) > 20 * S]
                window_times(c, [*hour[:5], capture_at])  # warm up: first reads load marks and codecs
                sampled = window_times(c, hour)
                dense = window_times(c, [capture_at] * max(10, args.requests // 10))
                out = Path(tmp) / "trace.json"
                export_hour = export_seconds(tl, t0 + 600 * S, out)
                export_dense = export_seconds(tl, capture_at - 25 * S, out)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    window_p99, dense_p99 = _p(sampled, 99), _p(dense, 99)
    print(
        f"10 s windows of the kept hour (~5k spans; spans page + summary): p50 {_p(sampled, 50):.1f} ms, p99 {window_p99:.1f} ms"
    )
    print(
        f"the 10 s capture window (1M spans; spans page + summary): p50 {_p(dense, 50):.1f} ms, p99 {dense_p99:.1f} ms"
    )
    for what, (secs, n, size) in (("of the kept hour", export_hour), ("around the capture", export_dense)):
        print(
            f"export of a 60 s window {what}: {n} spans, {size / 1e6:.1f} MB, median {secs:.2f} s to a file"
        )
    print(f"cpus {os.cpu_count()}, load average {os.getloadavg()[0]:.1f}; server and client share them")
    print(
        f"BENCH timeline window_p99_ms={window_p99:.1f} export_60s_s={export_hour[0]:.2f} bytes_per_span={per_span:.2f}"
        f" capture_window_p99_ms={dense_p99:.1f} export_capture_60s_s={export_dense[0]:.2f}"
    )


if __name__ == "__main__":
    main()
