"""Hostile load against a running ``ki collector``, each kind in its own process so that the
process measuring latency competes with the collector only, not with its own load threads.

    python tests/load_clients.py flood HOST PORT SIZE SECONDS
    python tests/load_clients.py queries URL TOKEN SECONDS [SET]
    python tests/load_clients.py poison URL KEYFILE SECONDS

Each runs until its standard input closes (or SECONDS pass, a safety bound) and then prints
one JSON line with what it saw; ``Flood`` is also used in-process.
"""

from __future__ import annotations

import json
import os
import selectors
import socket
import struct
import sys
import threading
import time
from collections import Counter
from pathlib import Path

__all__ = ["HALF_SENT", "Flood"]

HALF_SENT = b"GET /v1/health/snapshot HTTP/1.1\r\nHost: collector\r\nX-Slow: "

#: Pathological queries by set: ``bounded`` are the ReDoS of issue #13 item 1 (exponential with a
#: backtracking engine) and subqueries of tens of billions of steps, which the engine must refuse
#: before building anything; ``within_limits`` is a subquery of 21.6 million steps, under
#: max_samples, which the engine evaluates.
QUERY_SETS = {
    "bounded": [
        'label_replace(label_replace(vector(1),"src","aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa!","",".*"),'
        '"dst","x","src","(a+)+b")',
        "max_over_time(vector(1)[1d:1ms])",
        "max_over_time(vector(1)[10000d:1ms])",
    ],
    "within_limits": ["max_over_time(vector(1)[6h:1ms])"],
}


class Flood:
    """Keeps ``size`` connections open that each sent half a request head, reopening any the
    server closes, until stopped: the slow-connection flood from one client."""

    def __init__(self, host_port: tuple[str, int], size: int) -> None:
        self.host_port, self.size = host_port, size
        self.opened = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def __enter__(self) -> Flood:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(30)

    def run(self) -> None:
        sel = selectors.DefaultSelector()
        socks: set[socket.socket] = set()
        try:
            while not self.stop.is_set():
                while len(socks) < self.size and not self.stop.is_set():
                    try:
                        s = socket.create_connection(self.host_port, timeout=2)
                        s.sendall(HALF_SENT)
                    except OSError:
                        break
                    s.setblocking(False)
                    sel.register(s, selectors.EVENT_READ)
                    socks.add(s)
                    self.opened += 1
                for key, _ in sel.select(timeout=0.02):
                    s = key.fileobj  # type: ignore[assignment]
                    try:
                        data = s.recv(4096)
                    except OSError:
                        data = b""
                    if not data:  # closed by the server: open another in its place
                        sel.unregister(s)
                        s.close()
                        socks.discard(s)
        finally:
            for s in socks:
                s.close()
            sel.close()


def _stopped(seconds: str) -> threading.Event:
    """Set when standard input closes (the test says stop) or after ``seconds``."""
    stop = threading.Event()

    def watch() -> None:
        sys.stdin.read()
        stop.set()

    threading.Thread(target=watch, daemon=True).start()
    threading.Timer(float(seconds), stop.set).start()
    return stop


def _flood(host: str, port: str, size: str, seconds: str) -> dict[str, object]:
    stop = _stopped(seconds)
    with Flood((host, int(port)), int(size)) as f:
        stop.wait()
    return {"opened": f.opened}


def _queries(url: str, token: str, seconds: str, which: str = "bounded") -> dict[str, object]:
    import httpx

    statuses: Counter[int] = Counter()
    slowest = 0.0
    stop = _stopped(seconds)
    with httpx.Client(headers={"Authorization": f"Bearer {token}"}, timeout=60) as client:
        while not stop.is_set():
            for q in QUERY_SETS[which]:
                t0 = time.monotonic()
                r = client.post(f"{url}/api/v1/query", data={"query": q, "timeout": "20s"})
                slowest = max(slowest, time.monotonic() - t0)
                statuses[r.status_code] += 1
    return {"statuses": dict(statuses), "slowest_s": slowest}


def _poison_batch(creds: object, seq: int) -> bytes:
    """A batch of good kernel records with bad ones among them (a memory total of 2^64-1, a time
    after 2150, a latency bucket of 1024): the collector must drop those and store the rest."""
    import numpy as np

    from kernel_insight.agent import RECORD_DTYPE, FingerprintField, RecordType
    from kernel_insight.agent.metric_ids import MetricId
    from kernel_insight.collector import wire

    now = time.time_ns()
    year_2150 = 5_680_281_600_000_000_000

    def rec(rtype: int, ident: int, ts: int, payload: bytes) -> tuple[object, ...]:
        return (0, 1, 0, rtype, 0, 0, ident, ts, payload.ljust(32, b"\0"))

    kernels = [
        rec(RecordType.KERNEL, 5, now + i, struct.pack("<QQQI4x", now + i + 500, 7, i, 42)) for i in range(5)
    ]
    bad = [
        rec(RecordType.FINGERPRINT, FingerprintField.MEMORY_TOTAL, now, struct.pack("<Q", 2**64 - 1)),
        rec(RecordType.KERNEL, 5, year_2150, struct.pack("<QQQI4x", year_2150 + 500, 7, 6, 42)),
        rec(RecordType.GPU_SAMPLE, MetricId.LAUNCH_HOST_LATENCY_BUCKET, now, struct.pack("<dQ", 1.0, 1024)),
    ]
    recs = np.array(kernels + bad, RECORD_DTYPE)
    recs["pos"] = np.arange(len(recs)) + seq * 100
    return wire.encode_batch(
        recs,
        agent_id=creds.agent_id,  # type: ignore[attr-defined]
        key_id=creds.key_id,  # type: ignore[attr-defined]
        key=creds.key,  # type: ignore[attr-defined]
        epoch=int(time.time()),
        seq=seq,
        strings={(1, 5): "gemm"},
        now_ns=now,
    )


def _poison(url: str, key_file: str, seconds: str) -> dict[str, object]:
    import httpx

    from kernel_insight.collector import wire
    from kernel_insight.collector.keys import read_key_file

    creds = read_key_file(Path(key_file))
    statuses: Counter[int] = Counter()
    stop = _stopped(seconds)
    seq = 0
    with httpx.Client(timeout=30) as client:
        while not stop.is_set():
            r = client.post(
                f"{url}{wire.INGEST_PATH}",
                content=_poison_batch(creds, seq),
                headers={"Content-Type": wire.CONTENT_TYPE},
            )
            statuses[r.status_code] += 1
            seq += 1
    return {"statuses": dict(statuses)}


def main(argv: list[str]) -> int:
    kinds = {"flood": _flood, "queries": _queries, "poison": _poison}
    print(json.dumps(kinds[argv[0]](*argv[1:])), flush=True)
    os._exit(0)  # the safety timer's thread would otherwise keep the process for SECONDS


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
