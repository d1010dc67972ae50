"""The health snapshot: fields, the healthy/stale rule, filters, ETag/304, background recomputation."""

from __future__ import annotations

import time

import pytest
from api_helpers import FakeSource, GiB, TestClient, build_app, facts

from kernel_insight.api import Authenticator, HealthRule, Snapshotter, build_snapshot
from kernel_insight.api.models import HealthSnapshot


@pytest.fixture
def fleet(now_ms):
    return FakeSource(
        [
            facts(
                "a", now_ms=now_ms, free=60 * GiB, latencies=[0.001] * 50 + [0.010] * 50, rack="r1", host="h1"
            ),
            facts("b", now_ms=now_ms, models="mistral-7b,llama-70b", free=10 * GiB, rack="r1", host="h2"),
            facts("c", now_ms=now_ms, age_s=600, rack="r2", host="h3"),  # stale
            facts("d", now_ms=now_ms, errors={"xid": 1}),  # fatal error kind
            facts("e", now_ms=now_ms, free=None, latencies=[]),  # no memory data
        ]
    )


@pytest.fixture
def client(fleet, tokens, auth_headers):
    app, _ = build_app(fleet, Authenticator(tokens))
    c = TestClient(app)
    c.headers.update(auth_headers)
    return c


def _by_id(body):
    return {i["id"]: i for i in body["instances"]}


def test_snapshot_has_every_field_and_validates_against_the_model(client, now_ms):
    r = client.get("/v1/health/snapshot")
    assert r.status_code == 200
    snap = HealthSnapshot.model_validate_json(r.content)
    a = _by_id(r.json())["a"]
    assert a["models"] == ["llama-70b"]
    assert a["fingerprint"]["driver_version"] == "550.54"
    assert a["fingerprint"]["cuda_version"] == "12040"
    assert a["fingerprint"]["nvlink_bandwidth"] == 900.0
    assert a["fingerprint"]["gpu_model"] == "NVIDIA H100"
    assert a["gpu_memory_free_bytes"] == 60 * GiB
    assert a["gpu_memory_free_ratio"] == pytest.approx(0.75)
    assert a["nccl_latency_seconds"]["p50"] == pytest.approx(0.0055)
    assert a["nccl_latency_seconds"]["p99"] == pytest.approx(0.010)
    assert a["nccl_latency_seconds"]["count"] == 100
    assert a["temperature_celsius"] == 60.0
    assert a["power_watts"] == 350.0
    assert a["sm_utilization_ratio"] == 0.5
    assert a["healthy"]
    assert not a["stale"]
    assert a["reasons"] == []
    assert snap.rule.stale_after_s == 60.0
    assert [i.id for i in snap.instances] == ["a", "b", "c", "d", "e"]


def test_healthy_and_stale_follow_the_rule(client):
    body = _by_id(client.get("/v1/health/snapshot").json())
    assert body["c"]["stale"]
    assert not body["c"]["healthy"]
    assert "stale" in body["c"]["reasons"][0]
    assert not body["d"]["stale"]
    assert not body["d"]["healthy"]
    assert "xid" in body["d"]["reasons"][0]
    assert body["d"]["errors_5m"] == 1
    assert body["d"]["error_rate_per_s"] == pytest.approx(1 / 300)
    assert not body["e"]["healthy"]
    assert "gpu_memory_free_bytes" in body["e"]["reasons"][0]
    assert body["e"]["nccl_latency_seconds"] is None
    assert body["e"]["gpu_memory_free_ratio"] is None


def test_rule_thresholds_for_error_count_and_temperature(now_ms):
    rule = HealthRule(max_errors_5m=2, max_temperature_celsius=85)
    ok, _, _ = rule.judge(facts("x", now_ms=now_ms, errors={"oom": 2}), now_ms)
    assert ok
    ok, stale, reasons = rule.judge(facts("x", now_ms=now_ms, errors={"oom": 3}, temp=86.0), now_ms)
    assert not ok
    assert not stale
    assert len(reasons) == 2
    assert "3 errors" in reasons[0]
    assert "86" in reasons[1]


@pytest.mark.parametrize(
    ("query", "ids"),
    [
        ("model=llama-70b", ["a", "b", "c", "d", "e"]),
        ("model=mistral-7b", ["b"]),
        ("model=nope", []),
        ("min_free_bytes=" + str(20 * GiB), ["a", "c", "d"]),
        ("healthy=true", ["a", "b"]),
        ("healthy=false", ["c", "d", "e"]),
        ("healthy=true&min_free_bytes=" + str(20 * GiB) + "&model=llama-70b", ["a"]),
    ],
)
def test_filters(client, query, ids):
    r = client.get("/v1/health/snapshot?" + query)
    assert r.status_code == 200
    assert [i.id for i in HealthSnapshot.model_validate_json(r.content).instances] == ids


@pytest.mark.parametrize("query", ["min_free_bytes=lots", "min_free_bytes=-1", "healthy=perhaps"])
def test_bad_filters_are_bad_data_with_a_message(client, query):
    r = client.get("/v1/health/snapshot?" + query)
    assert r.status_code == 400
    assert r.json()["errorType"] == "bad_data"
    assert r.json()["error"].startswith(f'invalid parameter "{query.split("=")[0]}"')


def test_etag_cache_control_and_304(client):
    r = client.get("/v1/health/snapshot")
    etag = r.headers["etag"]
    assert r.headers["cache-control"] == "max-age=30"
    again = client.get("/v1/health/snapshot", headers={"If-None-Match": etag})
    assert again.status_code == 304
    assert again.content == b""
    assert again.headers["etag"] == etag
    assert client.get("/v1/health/snapshot", headers={"If-None-Match": f'"x", W/{etag}'}).status_code == 304
    assert client.get("/v1/health/snapshot", headers={"If-None-Match": '"other"'}).status_code == 200
    filtered = client.get("/v1/health/snapshot?healthy=true")
    assert filtered.headers["etag"] != etag
    assert client.get("/v1/health/snapshot?healthy=true", headers={"If-None-Match": etag}).status_code == 200


@pytest.mark.parametrize(
    ("accept", "gzipped"),
    [
        ("gzip", True),
        ("gzip, deflate", True),
        ("br;q=1.0, GZIP;q=0.5", True),
        ("*", True),
        ("identity", False),
        ("gzip;q=0", False),
        ("gzip;q=nonsense", False),
        ("", False),
    ],
)
def test_the_snapshot_is_sent_gzipped_to_a_client_that_accepts_it(client, accept, gzipped):
    """The snapshot's bytes as compressed once per rebuild (snapshot.body_gzip), to clients that
    ask for gzip; the same JSON either way, the same ETag, and a 304 is a 304."""
    plain = client.get("/v1/health/snapshot", headers={"Accept-Encoding": "identity"})
    assert "content-encoding" not in plain.headers
    r = client.get("/v1/health/snapshot", headers={"Accept-Encoding": accept})
    assert r.status_code == 200
    assert r.headers.get("content-encoding") == ("gzip" if gzipped else None)
    assert r.headers["vary"] == "Accept-Encoding"
    assert r.content == plain.content  # httpx undoes the gzip
    assert r.headers["etag"] == plain.headers["etag"]
    if gzipped:
        assert int(r.headers["content-length"]) < len(plain.content)
    again = client.get(
        "/v1/health/snapshot", headers={"Accept-Encoding": accept, "If-None-Match": r.headers["etag"]}
    )
    assert again.status_code == 304
    assert again.content == b""


def test_etag_survives_a_recomputation_that_changes_nothing_and_moves_when_data_changes(fleet, now_ms):
    rule = HealthRule()
    first = build_snapshot(fleet.facts, rule, now_ms)
    same = build_snapshot(fleet.facts, rule, now_ms + 1000, first)
    assert same.etag == first.etag
    assert same.as_of_ms == first.as_of_ms
    assert same.body == first.body
    fleet.facts[0].gpu_memory_free_bytes = 1.0
    changed = build_snapshot(fleet.facts, rule, now_ms + 2000, same)
    assert changed.etag != first.etag
    assert changed.as_of_ms == now_ms + 2000


def test_requests_do_not_recompute_and_the_background_thread_does(fleet, now_ms):
    snapshotter = Snapshotter(fleet, interval_s=0.05)
    snapshotter.refresh()
    calls = fleet.calls
    for _ in range(20):
        assert snapshotter.current() is snapshotter.snapshot
    assert fleet.calls == calls
    snapshotter.start()
    try:
        fleet.facts = fleet.facts[:1]
        deadline = time.monotonic() + 5
        while len(snapshotter.current().records) != 1:
            assert time.monotonic() < deadline
            time.sleep(0.02)
    finally:
        snapshotter.shutdown()
        snapshotter.shutdown()  # safe twice
    Snapshotter(fleet).shutdown()  # safe without start


def test_store_down_before_the_first_snapshot_is_a_503_then_the_last_snapshot_is_kept(
    fleet, tokens, auth_headers
):
    fleet.fail = ConnectionError("store unreachable")
    app, snapshotter = build_app(fleet, Authenticator(tokens))
    client = TestClient(app)
    r = client.get("/v1/health/snapshot", headers=auth_headers)
    assert r.status_code == 503
    assert "store unreachable" in r.json()["error"]
    assert r.headers["retry-after"]
    fleet.fail = None
    assert client.get("/v1/health/snapshot", headers=auth_headers).status_code == 200
    fleet.fail = ConnectionError("down again")
    assert snapshotter.tick() is False  # the background iteration: fails, logs, keeps the old snapshot
    assert isinstance(snapshotter.last_error, ConnectionError)
    assert len(client.get("/v1/health/snapshot", headers=auth_headers).json()["instances"]) == 5


def test_instances_turn_stale_while_the_store_cannot_be_read(fleet, now_ms):
    clock = [now_ms / 1000]
    snapshotter = Snapshotter(fleet, clock=lambda: clock[0])
    assert snapshotter.refresh().healthy.tolist() == [True, True, False, False, False]
    fleet.fail = ConnectionError("store down")
    clock[0] += 120
    assert snapshotter.tick() is False
    snap = snapshotter.current()
    assert [r["stale"] for r in snap.records] == [True] * 5
    assert not snap.healthy.any()
