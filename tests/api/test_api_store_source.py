"""The snapshot read from a real embedded store: instances table, GPU samples via kql, events."""

from __future__ import annotations

import time

import numpy as np
import pytest
from api_helpers import TestClient

from kernel_insight.api import StoreSource, TokenStore, create_api_app
from kernel_insight.api.models import HealthSnapshot, InstanceDetail
from kernel_insight.collector.clickhouse.health import quantiles_by_instance
from kernel_insight.collector.clickhouse.store import EmbeddedStore, ServerStore
from kernel_insight.collector.keys import KeyStore
from kernel_insight.collector.rows import Event, InstanceInfo, SampleBuilder
from kernel_insight.kql.storage import STALE_NAN

GiB = 1 << 30
#: "now" for the data and the assertions: set when the module fixture builds the data, not at
#: import, since a full suite collects this module minutes before it runs (the data would be stale).
NOW_MS = int(time.time() * 1000)


@pytest.fixture(scope="module", params=["embedded", "clickhouse-connect-chdb"])
def store(request, tmp_path_factory):
    global NOW_MS
    NOW_MS = int(time.time() * 1000)
    path = tmp_path_factory.mktemp("api-store")
    # The second back end is ServerStore's code path (clickhouse-connect) over its in-process chDB driver.
    s = EmbeddedStore(path) if request.param == "embedded" else ServerStore.connect(f"chdb://{path}")
    b = SampleBuilder()
    for inst, free in (("n1", 30 * GiB), ("n2", 5 * GiB)):
        for gpu in ("0", "1"):
            base = {"instance": inst, "gpu": gpu, "model": "NVIDIA H100", "models": "llama-70b"}
            for t in (NOW_MS - 20_000, NOW_MS - 5_000):
                b.add({**base, "__name__": "gpu_memory_free_bytes"}, t, free / 2)
                b.add({**base, "__name__": "gpu_memory_total_bytes"}, t, 40 * GiB)
                b.add({**base, "__name__": "gpu_temperature_celsius"}, t, 50.0 + int(gpu))
                b.add({**base, "__name__": "gpu_power_watts"}, t, 300.0)
                b.add({**base, "__name__": "gpu_sm_utilization_ratio"}, t, 0.25 * (1 + int(gpu)))
            for i in range(100):
                b.add(
                    {**base, "__name__": "nccl_op_latency_seconds", "op": "allreduce"},
                    NOW_MS - 60_000 + i,
                    (i + 1) / 1000,
                )
    b.add(
        {
            "__name__": "gpu_power_watts",
            "instance": "n2",
            "gpu": "1",
            "model": "NVIDIA H100",
            "models": "llama-70b",
        },
        NOW_MS - 4_000,
        STALE_NAN,
    )
    # an instance only seen in samples, 200 s ago (stale)
    b.add({"__name__": "gpu_memory_free_bytes", "instance": "old", "gpu": "0"}, NOW_MS - 200_000, 1.0)
    s.insert_samples(b.build())
    s.upsert_instances(
        [
            InstanceInfo(
                id=i,
                last_seen_ms=NOW_MS - 2_000,
                hardware_fingerprint="hw-" + i,
                gpu_count=2,
                gpu_model="NVIDIA H100",
                memory_total_bytes=80 * GiB,
                labels={"models": "llama-70b", "host": "h-" + i, "rack": "r1"},
                attributes={
                    "gpu0.driver_version": "550.54",
                    "gpu0.cuda_version": "12040",
                    "gpu0.nvlink_bandwidth": "18",
                },
            )
            for i in ("n1", "n2")
        ]
    )
    s.insert_events(
        [
            Event("n2", 0, (NOW_MS - 30_000) * 1_000_000, "xid", 79, message="fell off the bus"),
            Event("n2", 1, (NOW_MS - 3_600_000) * 1_000_000, "oom", 2, message="old"),
        ]
    )
    yield s
    s.close()


def test_store_source_collects_capacity_latency_and_errors(store):
    facts = {f.id: f for f in StoreSource(store).collect(NOW_MS)}
    assert set(facts) == {"n1", "n2", "old"}
    n1 = facts["n1"]
    assert n1.gpu_memory_free_bytes == 30 * GiB
    assert n1.gpu_memory_total_bytes == 80 * GiB
    assert n1.temperature_celsius == 51.0
    assert n1.power_watts == 600.0
    assert n1.sm_utilization_ratio == pytest.approx(0.375)
    expected = np.quantile(np.tile(np.arange(1, 101) / 1000, 2), [0.5, 0.9, 0.99])
    assert n1.nccl_quantiles is not None
    assert n1.nccl_quantiles[:3] == pytest.approx(expected.tolist())
    assert n1.nccl_quantiles[3] == 200
    assert facts["n2"].power_watts == 300.0  # GPU 1's power series ended with a staleness marker
    assert n1.labels["host"] == "h-n1"
    assert n1.last_seen_ms == NOW_MS - 2_000
    assert facts["n2"].errors_by_kind == {"xid": 1}  # the oom is older than 5 minutes
    assert facts["old"].gpu_memory_free_bytes == 1.0  # within the 5-minute lookback
    assert facts["old"].last_seen_ms == NOW_MS - 200_000  # known from its samples alone


def test_api_app_over_the_store_serves_snapshot_and_recent_errors(store, tmp_path):
    tokens = TokenStore(tmp_path / "tokens.json")
    app = create_api_app(store, tokens=tokens)
    client = TestClient(app)
    client.headers["Authorization"] = "Bearer " + tokens.create("r", ["read"]).token
    snap = HealthSnapshot.model_validate_json(client.get("/v1/health/snapshot").content)
    by_id = {i.id: i for i in snap.instances}
    assert by_id["n1"].healthy
    assert by_id["n1"].fingerprint.driver_version == "550.54"
    assert by_id["n1"].nccl_latency_seconds is not None
    assert by_id["n1"].nccl_latency_seconds.p50 == pytest.approx(0.0505)
    assert by_id["n1"].gpu_memory_free_ratio == pytest.approx(30 / 80)
    assert not by_id["n2"].healthy
    assert by_id["n2"].errors_5m == 1
    assert by_id["old"].stale
    assert not by_id["old"].healthy
    detail = InstanceDetail.model_validate_json(client.get("/v1/instances/n2").content)
    assert [(e.kind, e.code, e.message) for e in detail.recent_errors] == [
        ("xid", 79, "fell off the bus"),
        ("oom", 2, "old"),
    ]
    r = client.get(
        "/api/v1/query", params={"query": "sum(gpu_memory_free_bytes{instance='n1'})", "time": NOW_MS / 1000}
    )
    assert r.status_code == 200
    assert r.json()["data"]["result"][0]["value"][1] == str(30 * GiB)
    assert client.get("/healthz").status_code == 200  # the collector's liveness probe needs no token
    client.headers.pop("Authorization")
    assert client.get("/v1/topology").json()["errorType"] == "unauthorized"


def test_the_snapshot_names_an_enrolled_agents_instance_and_leaves_others_unnamed(store, tmp_path):
    # The instance an enrolled agent feeds is its 32-hex id; the snapshot carries the name it was
    # enrolled under (ki keys list's) beside it, for people; ids no agent has get null.
    keys = KeyStore(tmp_path / "keys.json")
    agent = keys.add_agent("gpu-box-7", {"rack": "r2"}).agent_id.hex()
    store.upsert_instances([InstanceInfo(id=agent, last_seen_ms=NOW_MS - 1_000, gpu_count=1)])
    tokens = TokenStore(tmp_path / "tokens.json")
    client = TestClient(create_api_app(store, tokens=tokens, keys=keys))
    client.headers["Authorization"] = "Bearer " + tokens.create("r", ["read"]).token
    snap = HealthSnapshot.model_validate_json(client.get("/v1/health/snapshot").content)
    names = {i.id: i.name for i in snap.instances}
    assert names[agent] == "gpu-box-7"
    assert names["n1"] is None
    assert client.get(f"/v1/instances/{agent}").json()["instance"]["name"] == "gpu-box-7"
    assert keys.name_of("not-an-agent-id") is None


class _Statements:
    """A store whose reads are recorded (the statement texts) and passed on."""

    def __init__(self, store):
        self._store = store
        self.sql: list[str] = []

    def query_rows(self, sql, params=None):
        self.sql.append(sql)
        return self._store.query_rows(sql, params)

    def __getattr__(self, name):
        return getattr(self._store, name)


def test_latency_quantiles_skip_the_join_when_no_series_of_the_metric_is_in_the_window(store):
    # A fleet without NCCL series (host metrics by remote_write) has nothing to join: the join's
    # setup is not paid at every snapshot rebuild, and the answer is the same (no rows).
    spy = _Statements(store)
    assert quantiles_by_instance(spy, "no_such_metric", NOW_MS - 300_000, NOW_MS) == []
    assert spy.sql
    assert not any("JOIN" in s for s in spy.sql)
    # Days before the data: the series rows are per day, so the window's days decide.
    assert (
        quantiles_by_instance(
            spy, "nccl_op_latency_seconds", NOW_MS - 400 * 86_400_000, NOW_MS - 300 * 86_400_000
        )
        == []
    )
    assert not any("JOIN" in s for s in spy.sql)
    rows = quantiles_by_instance(spy, "nccl_op_latency_seconds", NOW_MS - 300_000, NOW_MS)
    assert {r["instance"]: r["n"] for r in rows} == {"n1": 200, "n2": 200}
    assert any("JOIN" in s for s in spy.sql)
