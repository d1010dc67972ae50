"""What a scrape of ``ki collector``'s /metrics costs with many agents reporting (issue 11).

A real ``ki collector`` process on 127.0.0.1; ``--agents`` enrolled agents each send one
sealed batch carrying every COUNTERS id (as ``ki-agent`` does), so /metrics holds ~29 series
per agent; then one keep-alive client scrapes ``--scrapes`` times. Ends with one
``BENCH metrics agents=<n> series=<n> bytes=<n> scrape_p50_ms=<n> scrape_p99_ms=<n>`` line.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np

from kernel_insight.agent import RECORD_DTYPE
from kernel_insight.collector import wire
from kernel_insight.collector.keys import AgentCredentials, KeyStore


def enrol(keys: KeyStore, n: int) -> list[AgentCredentials]:
    return [keys.add_agent(f"gpu{i}") for i in range(n)]


def batch(creds: AgentCredentials, now_ns: int) -> bytes:
    counters = {int(c): 1_000 + int(c) for c in wire.Counter}
    return wire.encode_batch(
        np.zeros(0, dtype=RECORD_DTYPE),
        agent_id=creds.agent_id,
        key_id=creds.key_id,
        key=creds.key,
        epoch=1,
        seq=0,
        counters=counters,
        now_ns=now_ns,
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--agents", type=int, default=1000)
    ap.add_argument("--scrapes", type=int, default=50)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp_:
        tmp = Path(tmp_)
        keys = KeyStore(tmp / "keys.json")
        creds = enrol(keys, args.agents)
        proc = subprocess.Popen(
            [sys.executable, "-m", "kernel_insight.cli", "collector", "--store", str(tmp / "data"),
             "--keys", str(tmp / "keys.json"), "--local-dev", "--port", "0"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            line = proc.stdout.readline()  # type: ignore[union-attr]
            if not line.startswith("ki: listening on "):
                print(line + proc.stderr.read(), file=sys.stderr)  # type: ignore[union-attr]
                return 1
            url = line.split("listening on ")[1].strip()
            now_ns = time.time_ns()
            with httpx.Client(base_url=url, timeout=60) as http:

                def send(c: AgentCredentials) -> int:
                    return http.post(wire.INGEST_PATH, content=batch(c, now_ns)).status_code

                with ThreadPoolExecutor(32) as pool:
                    codes = list(pool.map(send, creds))
                if codes.count(200) != args.agents:
                    print(f"batches not all stored: {sorted(set(codes))}", file=sys.stderr)
                    return 1
                times = []
                body = b""
                for _ in range(args.scrapes):
                    start = time.perf_counter()
                    r = http.get("/metrics")
                    times.append(time.perf_counter() - start)
                    body = r.content
            lines = body.decode().splitlines()
            series = sum(1 for x in lines if x and not x.startswith("#"))
            agents = sum(1 for x in lines if x.startswith("ki_collector_agent_ingest_lag_seconds{"))
            if agents != args.agents:
                print(f"/metrics shows {agents} agents, expected {args.agents}", file=sys.stderr)
                return 1
            times.sort()
            p50 = statistics.median(times) * 1000
            p99 = times[min(len(times) - 1, int(len(times) * 0.99))] * 1000
            print(
                f"BENCH metrics agents={args.agents} series={series} bytes={len(body)} "
                f"scrape_p50_ms={p50:.1f} scrape_p99_ms={p99:.1f}"
            )
        finally:
            proc.terminate()
            proc.communicate(timeout=60)
    return 0


if __name__ == "__main__":
    sys.exit(main())
