"""A stream of small agent requests into the real collector app keeps the samples table's parts few.

One insert per table per request made a part per request (ClickHouse's small-insert
anti-pattern); group commit writes many requests' rows together (docs/storage.md).
"""

from __future__ import annotations

import threading
import time

import httpx
import numpy as np
from loopback import running_server

from kernel_insight.agent import RECORD_DTYPE, RecordType
from kernel_insight.collector import wire
from kernel_insight.collector.app import create_app
from kernel_insight.collector.clickhouse.store import EmbeddedStore
from kernel_insight.collector.ingest import ingest_router
from kernel_insight.collector.keys import KeyStore
from kernel_insight.collector.sink import StoreSink

AGENTS = 6
REQUESTS_PER_AGENT = 40  # 240 requests of 8 kernel records each


def _kernels(seq: int, n: int, now_ns: int) -> np.ndarray:
    arr = np.zeros(n, RECORD_DTYPE)
    arr["producer"] = 1
    arr["type"] = RecordType.KERNEL
    arr["id"] = 5
    arr["ts_ns"] = now_ns + seq * 1_000_000 + np.arange(n) * 1000
    payload = np.zeros(n, np.dtype([("end", "<u8"), ("stream", "<u8"), ("corr", "<u8"), ("rest", "V8")]))
    payload["end"] = arr["ts_ns"] + 500
    payload["corr"] = seq * n + np.arange(n)
    arr["payload"] = payload.view("V32")
    return arr


def _part_count(store: EmbeddedStore) -> int:
    """The most active parts of samples in one partition (a UTC day): ClickHouse bounds parts per
    partition, and a run across a UTC midnight writes into two: the total read 21 against the bound
    of 20 when run at 23:59:54 (scripts/test_at_time.sh), each day's partition under it."""
    q = (
        "SELECT max(n) AS n FROM (SELECT partition, count() AS n FROM system.parts"
        " WHERE active AND database = 'ki' AND table = 'samples' GROUP BY partition)"
    )
    rows = store.query(q).to_pylist()
    return int(rows[0]["n"]) if rows and rows[0]["n"] is not None else 0


def test_part_count_stays_bounded_under_many_small_requests(tmp_path):
    keys = KeyStore(tmp_path / "keys.json")
    agents = [keys.add_agent(f"a{i}") for i in range(AGENTS)]
    with EmbeddedStore(tmp_path / "data", cache_bytes=0) as store:
        sink = StoreSink(store)
        app = create_app(store, routers=[ingest_router(keys, sink)])
        most_parts = 0
        statuses: list[int] = []
        now_ns = time.time_ns()

        def agent(creds: wire.AgentCredentials | object) -> None:
            with httpx.Client(base_url=url, timeout=30) as client:
                for seq in range(REQUESTS_PER_AGENT):
                    body = wire.encode_batch(
                        _kernels(seq, 8, now_ns),
                        agent_id=creds.agent_id,  # type: ignore[attr-defined]
                        key_id=creds.key_id,  # type: ignore[attr-defined]
                        key=creds.key,  # type: ignore[attr-defined]
                        epoch=1,
                        seq=seq,
                        strings={(1, 5): "gemm"},
                    )
                    r = client.post(
                        wire.INGEST_PATH, content=body, headers={"Content-Type": wire.CONTENT_TYPE}
                    )
                    statuses.append(r.status_code)

        try:
            with running_server(app) as url:
                threads = [threading.Thread(target=agent, args=(c,)) for c in agents]
                for t in threads:
                    t.start()
                while any(t.is_alive() for t in threads):
                    most_parts = max(most_parts, _part_count(store))
                    time.sleep(0.05)
                for t in threads:
                    t.join()
                most_parts = max(most_parts, _part_count(store))
        finally:
            sink.close()
        requests = AGENTS * REQUESTS_PER_AGENT
        assert statuses == [200] * requests
        spans = store.row_count("kernel_spans")
        assert spans == requests * 8
        stats = sink.batcher.stats
        assert stats.flushed_batches == requests
        assert stats.flushes <= requests // 3  # requests share inserts
        assert most_parts <= 20, f"{most_parts} active parts of samples for {requests} requests"
