"""The SDK against a running collector (uvicorn on loopback) over a real embedded store."""

from __future__ import annotations

import time

import pytest
from loopback import running_server

from kernel_insight.api import TokenStore, create_api_app
from kernel_insight.collector.clickhouse.store import EmbeddedStore
from kernel_insight.collector.rows import InstanceInfo, SampleBuilder
from kernel_insight.sdk import (
    AuthenticationError,
    BadRequestError,
    Failure,
    HealthClient,
    KqlClient,
    NoEligibleInstance,
    RouteFailed,
    SnapshotUnavailable,
    route,
)

GiB = 1 << 30
#: "now" for the data and the assertions: set when the module fixture builds the data, not at
#: import, since a full suite collects this module minutes before it runs (the data would be stale).
NOW_MS = int(time.time() * 1000)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    global NOW_MS
    NOW_MS = int(time.time() * 1000)
    store = EmbeddedStore(tmp_path_factory.mktemp("sdk-store"))
    b = SampleBuilder()
    for inst, free in (("n1", 30), ("n2", 2)):
        for t in (NOW_MS - 10_000, NOW_MS - 1_000):
            b.add({"__name__": "gpu_memory_free_bytes", "instance": inst, "gpu": "0"}, t, free * GiB)
            b.add({"__name__": "gpu_memory_total_bytes", "instance": inst, "gpu": "0"}, t, 80 * GiB)
    store.insert_samples(b.build())
    store.upsert_instances(
        [
            InstanceInfo(id=i, last_seen_ms=NOW_MS - 1_000, labels={"models": "llama-70b"})
            for i in ("n1", "n2")
        ]
    )
    tokens = TokenStore(tmp_path_factory.mktemp("sdk-tokens") / "tokens.json")
    token = tokens.create("sdk", ["read"]).token
    with running_server(create_api_app(store, tokens=tokens, interval_s=1.0)) as url:
        yield url, token
    store.close()


def test_health_client_selects_from_the_live_snapshot(served):
    url, token = served
    with HealthClient(url, token, ttl=0) as client:
        assert {client.select_instance(10 * GiB, model="llama-70b").id for _ in range(20)} == {"n1"}
        etag = client.snapshot().etag
        assert etag
        assert client.snapshot().etag == etag  # revalidated (ttl=0): 304 keeps the same snapshot
        with pytest.raises(NoEligibleInstance):
            client.select_instance(50 * GiB)


def test_route_retries_an_oom_on_more_room_and_excludes_an_nccl_timeout_live(served):
    url, token = served
    with HealthClient(url, token, ttl=0) as client:
        tried: list[str] = []

        def call(inst):
            tried.append(inst.id)
            if inst.id == "n2":  # 2 GiB free in the snapshot: the kernel ran out
                raise RuntimeError("CUDA error: out of memory")
            return inst.id

        for _ in range(10):
            tried.clear()
            assert route(client, call, required_free_bytes=GiB, model="llama-70b") == "n1"
            assert tried in (["n1"], ["n2", "n1"])
        with pytest.raises(RouteFailed, match="no instance left to try") as info:
            route(
                client,
                lambda inst: (_ for _ in ()).throw(RuntimeError("NCCL watchdog timeout")),
                model="llama-70b",
            )
        assert {a.failure for a in info.value.attempts} == {Failure.NCCL_TIMEOUT}
        assert set(client.excluded()) == {a.instance_id for a in info.value.attempts}


def test_kql_client_queries_and_reports_bad_queries(served):
    url, token = served
    with KqlClient(url, token) as kql:
        r = kql.query("sum by (instance) (gpu_memory_free_bytes)", time=NOW_MS / 1000)
        assert {s.labels["instance"]: s.value for s in r.samples} == {"n1": 30 * GiB, "n2": 2 * GiB}
        rr = kql.query_range("gpu_memory_free_bytes{instance='n2'}", NOW_MS / 1000 - 10, NOW_MS / 1000, 5)
        assert list(rr.series[0].values) == [2 * GiB] * 3
        with pytest.raises(BadRequestError) as info:
            kql.query("sum(")
        assert info.value.error_type == "bad_data"
        assert "parse error" in info.value.message
    with KqlClient(url, "ki_bad.token") as kql, pytest.raises(AuthenticationError):
        kql.query("1")


def test_unreachable_server_is_a_clear_error():
    with (
        HealthClient("http://127.0.0.1:9", "t", timeout=0.5) as client,
        pytest.raises(SnapshotUnavailable, match="cannot reach"),
    ):
        client.snapshot()
