"""The query API over the embedded store reads settled hours from the sample cache, under a real
uvicorn with its thread pool, and still sees a late write at once."""

from __future__ import annotations

import time

import httpx
import pytest
from loopback import running_server

from kernel_insight.api import create_api_app
from kernel_insight.collector.clickhouse.store import EmbeddedStore
from kernel_insight.collector.rows import SampleBuilder
from kernel_insight.collector.sample_cache import BLOCK_MS

# Three whole hours that ended at least two hours ago: settled, so cacheable.
START_MS = int(time.time() * 1000) // BLOCK_MS * BLOCK_MS - 5 * BLOCK_MS
END_MS = START_MS + 3 * BLOCK_MS - 1


@pytest.fixture
def store(tmp_path):
    s = EmbeddedStore(tmp_path / "d")
    b = SampleBuilder()
    for inst in ("n1", "n2", "n3"):
        for i in range(3 * 240):
            t = START_MS + i * 15_000 + 250
            b.add({"__name__": "kernel_launches_total", "instance": inst, "gpu": "0"}, t, 10.0 * i)
    s.insert_samples(b.build())
    yield s
    s.close()


def _range(url: str, query: str) -> list[dict[str, object]]:
    r = httpx.get(
        f"{url}/api/v1/query_range",
        params={"query": query, "start": (START_MS + 600_000) / 1000, "end": END_MS / 1000, "step": 60},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    result: list[dict[str, object]] = r.json()["data"]["result"]
    return result


def test_range_queries_hit_the_cache_and_see_a_late_write(store):
    cache = store.sample_cache
    assert cache is not None
    query = 'sum by (instance) (rate(kernel_launches_total{gpu="0"}[5m]))'
    with running_server(create_api_app(store, local_dev=True, interval_s=3600)) as url:
        first = _range(url, query)  # answered without the cache; queues the fill
        assert cache.wait_idle()
        hits = cache.stats().hits
        assert _range(url, query) == first
        assert cache.stats().hits > hits  # the second request read the hours from memory
        assert {s["metric"]["instance"] for s in first} == {"n1", "n2", "n3"}  # type: ignore[index]
        late = SampleBuilder()
        late.add(
            {"__name__": "kernel_launches_total", "instance": "n4", "gpu": "0"}, START_MS + BLOCK_MS, 1.0
        )
        late.add(
            {"__name__": "kernel_launches_total", "instance": "n4", "gpu": "0"},
            START_MS + BLOCK_MS + 15_000,
            3.0,
        )
        store.insert_samples(late.build())
        after = _range(url, query)
        assert {s["metric"]["instance"] for s in after} == {"n1", "n2", "n3", "n4"}  # type: ignore[index]
