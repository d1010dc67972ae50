"""The health snapshot names the Kubernetes pod holding each GPU (from the instance's FINGERPRINT
attributes, written by the NVML sampler from the kubelet), and filters on pod and namespace; the
SDK reads them and filters too."""

from __future__ import annotations

import dataclasses

import pytest
from api_helpers import FakeSource, TestClient, build_app, facts

from kernel_insight.api import Authenticator
from kernel_insight.api.models import HealthSnapshot
from kernel_insight.sdk import GpuPod
from kernel_insight.sdk import HealthSnapshot as SdkSnapshot


def held(f, *pods: tuple[int, str, str, str]):
    attributes = dict(f.attributes)
    for gpu, pod, namespace, container in pods:
        attributes |= {
            f"gpu{gpu}.pod": pod,
            f"gpu{gpu}.namespace": namespace,
            f"gpu{gpu}.container": container,
        }
    return dataclasses.replace(f, attributes=attributes)


@pytest.fixture
def client(now_ms, tokens, auth_headers):
    fleet = FakeSource(
        [
            held(facts("a", now_ms=now_ms), (0, "train-0", "ml", "trainer"), (1, "train-0", "ml", "trainer")),
            held(facts("b", now_ms=now_ms), (1, "vllm-0", "serving", "engine")),
            held(facts("c", now_ms=now_ms), (0, "", "", "")),  # the pod ended: no longer held
            facts("d", now_ms=now_ms),  # not on Kubernetes
        ]
    )
    app, _ = build_app(fleet, Authenticator(tokens))
    c = TestClient(app)
    c.headers.update(auth_headers)
    return c


def test_each_instance_lists_the_pods_holding_its_gpus(client):
    r = client.get("/v1/health/snapshot")
    assert r.status_code == 200
    by_id = {i.id: i for i in HealthSnapshot.model_validate_json(r.content).instances}
    assert [(p.gpu, p.pod, p.namespace, p.container) for p in by_id["a"].pods] == [
        (0, "train-0", "ml", "trainer"),
        (1, "train-0", "ml", "trainer"),
    ]
    assert [p.pod for p in by_id["b"].pods] == ["vllm-0"]
    assert by_id["c"].pods == []
    assert by_id["d"].pods == []


@pytest.mark.parametrize(
    ("query", "ids"),
    [
        ("namespace=ml", ["a"]),
        ("pod=vllm-0", ["b"]),
        ("pod=vllm-0&namespace=ml", []),  # both must hold for one GPU
        ("namespace=serving&healthy=true", ["b"]),
        ("namespace=nope", []),
    ],
)
def test_the_snapshot_filters_on_pod_and_namespace(client, query, ids):
    r = client.get("/v1/health/snapshot?" + query)
    assert r.status_code == 200
    assert [i.id for i in HealthSnapshot.model_validate_json(r.content).instances] == ids


def test_the_sdk_reads_the_pods_and_filters_on_them(client):
    r = client.get("/v1/health/snapshot")
    snap = SdkSnapshot.from_json(r.json(), r.headers.get("etag"))
    a = snap.get("a")
    assert a is not None
    assert a.pods[1] == GpuPod(1, "train-0", "ml", "trainer")
    assert [i.id for i in snap.held_by(namespace="ml")] == ["a"]
    assert [i.id for i in snap.held_by(pod="vllm-0", namespace="serving")] == ["b"]
    assert [i.id for i in snap.held_by()] == ["a", "b"]  # any pod at all
