"""``/v1/instances``, ``/v1/instances/{id}`` and ``/v1/topology``."""

from __future__ import annotations

import pytest
from api_helpers import FakeSource, TestClient, build_app, facts

from kernel_insight.api import Authenticator
from kernel_insight.api.models import InstanceDetail, InstanceList, Topology


@pytest.fixture
def source(now_ms):
    src = FakeSource(
        [
            facts("n1", now_ms=now_ms, host="h1", rack="r1", switch="s1"),
            facts("n2", now_ms=now_ms, host="h1", rack="r1", switch="s1", errors={"ecc": 2}),
            facts("n3", now_ms=now_ms, host="h2", rack="r2", switch="s1"),
            facts("n4", now_ms=now_ms),  # no placement labels
        ]
    )
    src.errors["n2"] = [
        {"ts_ms": now_ms - 1000, "gpu": 1, "kind": "ecc", "code": 48, "message": "double bit"},
        {"ts_ms": now_ms - 2000, "gpu": 0, "kind": "ecc", "code": 48, "message": "double bit"},
    ]
    return src


@pytest.fixture
def client(source, tokens, auth_headers):
    app, _ = build_app(source, Authenticator(tokens))
    c = TestClient(app)
    c.headers.update(auth_headers)
    return c


def test_instances_lists_every_instance_and_filters_by_health(client):
    body = InstanceList.model_validate_json(client.get("/v1/instances").content)
    assert [i.id for i in body.instances] == ["n1", "n2", "n3", "n4"]
    unhealthy = InstanceList.model_validate_json(client.get("/v1/instances?healthy=false").content)
    assert [i.id for i in unhealthy.instances] == ["n2"]
    r = client.get("/v1/instances")
    assert client.get("/v1/instances", headers={"If-None-Match": r.headers["etag"]}).status_code == 304


def test_instance_detail_has_fingerprint_capacity_and_recent_errors(client):
    r = client.get("/v1/instances/n2")
    assert r.status_code == 200
    detail = InstanceDetail.model_validate_json(r.content)
    assert detail.instance.fingerprint.hardware_fingerprint == "fp-n2"
    assert detail.instance.gpu_memory_free_bytes == 40 << 30
    assert detail.attributes["gpu0.driver_version"] == "550.54"
    assert [e.gpu for e in detail.recent_errors] == [1, 0]
    assert detail.recent_errors[0].kind == "ecc"


def test_unknown_instance_is_a_404_with_a_message(client):
    r = client.get("/v1/instances/nope")
    assert r.status_code == 404
    assert r.json()["errorType"] == "not_found"
    assert "'nope'" in r.json()["error"]


def test_store_failure_on_recent_errors_is_a_503(client, source):
    client.get("/v1/instances")  # snapshot built while the store works
    source.fail = ConnectionError("gone")
    r = client.get("/v1/instances/n1")
    assert r.status_code == 503
    assert "gone" in r.json()["error"]


def test_topology_groups_by_switch_rack_and_host(client):
    topo = Topology.model_validate_json(client.get("/v1/topology").content)
    groups = [(g.switch, g.rack, g.host, g.instances, g.healthy) for g in topo.groups]
    assert groups == [
        ("", "", "", ["n4"], 1),
        ("s1", "r1", "h1", ["n1", "n2"], 1),
        ("s1", "r2", "h2", ["n3"], 1),
    ]
    # The graph's leaves: each member's health and hardware, where it sits.
    members = {m.id: (g.rack, m) for g in topo.groups for m in g.members}
    rack, n2 = members["n2"]
    assert rack == "r1"
    assert not n2.healthy
    assert n2.fingerprint.hardware_fingerprint == "fp-n2"
    assert (n2.fingerprint.driver_version, n2.fingerprint.cuda_version) == ("550.54", "12040")
    assert n2.fingerprint.nvlink_bandwidth == 900
    assert members["n1"][1].healthy


@pytest.mark.parametrize("path", ["/api/v1/nope", "/v1/instancez", "/v2/anything"])
def test_an_unknown_path_answers_the_one_error_shape(client, path):
    """Issue 33: an unknown path answered FastAPI's ``{"detail": "Not Found"}``, not the shape
    every other API answer has (Prometheus clients decode only that one)."""
    r = client.get(path)
    assert r.status_code == 404
    body = r.json()
    assert body["status"] == "error"
    assert body["errorType"] == "not_found"
    assert path in body["error"]


def test_a_method_the_path_does_not_take_answers_the_one_error_shape(client):
    r = client.request("DELETE", "/v1/instances")
    assert r.status_code == 405
    assert r.json()["errorType"] == "method_not_allowed"
    assert "allow" in {k.lower() for k in r.headers}
