"""deploy/kubernetes: rendered, validated against the Kubernetes API schemas offline, and checked
for what the schemas cannot see (references between objects, flags, limits, capabilities)."""

from __future__ import annotations

import shutil
import subprocess
from typing import Any

import kubernetes_validate
import pytest
import yaml
from deployutil import DEPLOY, K8S_VERSION, agent_settings, collector_flags, render, unknown_flags

#: Secrets the operator creates (deploy/kubernetes/README.md), never committed.
README_SECRETS = {"ki-collector-tls", "ki-clickhouse", "ki-agent-enrol"}
OUR_IMAGES = {"kernel-insight:0.1.0", "kernel-insight-agent:0.1.0"}


@pytest.fixture(scope="module")
def objects() -> list[dict[str, Any]]:
    return render(DEPLOY)


def _pod_specs(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {
        o["metadata"]["name"]: o["spec"]["template"]["spec"]
        for o in objects
        if "template" in o.get("spec", {})
    }


def _find(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def test_every_object_is_valid_against_the_kubernetes_schemas(objects):
    assert len(objects) >= 15
    for obj in objects:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def test_a_broken_manifest_is_caught():
    bad = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "x"},
        "spec": {"replicas": "3"},
    }
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSION, strict=True)


def test_kubectl_kustomize_renders_the_same_objects(objects):
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed: the renderer in deployutil alone was checked")
    out = subprocess.run(
        ["kubectl", "kustomize", str(DEPLOY)], capture_output=True, text=True, timeout=120, check=True
    )
    theirs = [d for d in yaml.safe_load_all(out.stdout) if d]

    def key(o: dict[str, Any]) -> tuple[str, str]:
        return o["kind"], o["metadata"]["name"]

    assert sorted(theirs, key=key) == sorted(objects, key=key)


def test_pods_name_only_defined_secrets_configmaps_and_images(objects):
    config_maps = {o["metadata"]["name"] for o in objects if o["kind"] == "ConfigMap"}
    for name, spec in _pod_specs(objects).items():
        for volume in spec.get("volumes", []):
            if "secret" in volume:
                assert volume["secret"]["secretName"] in README_SECRETS, (name, volume)
            if "configMap" in volume:
                assert volume["configMap"]["name"] in config_maps, (name, volume)
        for c in spec.get("initContainers", []) + spec["containers"]:
            assert c["image"] in OUR_IMAGES or c["image"].startswith("clickhouse/"), c["image"]
            for env in c.get("env", []):
                ref = env.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    assert ref["name"] in README_SECRETS


def test_collector_and_agent_flags_exist(objects):
    pods = _pod_specs(objects)
    (collector,) = pods["ki-collector"]["containers"]
    assert collector["args"][0] == "collector"
    assert unknown_flags(collector["args"][1:], collector_flags()) == []
    settings = agent_settings()
    agents = [c for c in pods["ki-agent"]["containers"] if c["image"].startswith("kernel-insight-agent")]
    assert [c["name"] for c in agents] == [f"gpu{i}" for i in range(8)]
    for c in agents:
        assert unknown_flags(c["args"], settings) == []


def test_agents_are_capped_at_their_measured_footprint_and_unprivileged(objects):
    spec = _pod_specs(objects)["ki-agent"]
    for c in spec["containers"]:
        sc = c["securityContext"]
        assert sc.get("privileged", False) is False
        assert sc["allowPrivilegeEscalation"] is False
        if c["name"].startswith("gpu"):
            assert c["resources"]["limits"]["memory"] == "16Mi"
            assert sc["capabilities"] == {"drop": ["ALL"]}
    (probes,) = [c for c in spec["containers"] if c["name"] == "probes"]
    assert probes["securityContext"]["capabilities"] == {
        "drop": ["ALL"],
        "add": ["BPF", "PERFMON", "SYS_RESOURCE", "DAC_READ_SEARCH"],
    }
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert any(t["key"] == "nvidia.com/gpu" for t in spec["tolerations"])


def test_collectors_are_sticky_probed_and_scraped(objects):
    service = _find(objects, "Service", "ki-collector")
    assert service["spec"]["sessionAffinity"] == "ClientIP"
    deployment = _find(objects, "Deployment", "ki-collector")
    assert deployment["spec"]["replicas"] >= 2
    pod = deployment["spec"]["template"]
    assert pod["metadata"]["annotations"]["prometheus.io/path"] == "/metrics"
    (c,) = pod["spec"]["containers"]
    assert c["readinessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"


def test_the_service_monitor_selects_the_collector_service(objects):
    monitor = yaml.safe_load((DEPLOY / "kubernetes" / "monitoring" / "servicemonitor.yaml").read_text())
    service = _find(objects, "Service", "ki-collector")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0]["port"] in {p["name"] for p in service["spec"]["ports"]}


def test_clickhouse_cluster_is_two_shards_of_two_replicas_and_three_keepers(objects):
    sets = {o["metadata"]["name"]: o["spec"]["replicas"] for o in objects if o["kind"] == "StatefulSet"}
    assert sets == {"ki-keeper": 3, "clickhouse-s1": 2, "clickhouse-s2": 2}
    cluster_xml = _find(objects, "ConfigMap", "ki-clickhouse-cluster")["data"]["ki-cluster.xml"]
    for s in (1, 2):
        for r in (0, 1):
            assert (
                f"<host>clickhouse-s{s}-{r}.clickhouse-s{s}.kernel-insight.svc.cluster.local</host>"
                in cluster_xml
            )


def test_the_rules_config_map_holds_every_shipped_rule_file(objects):
    shipped = {p.name for p in (DEPLOY / "rules").glob("*.yml")}
    assert shipped, "deploy/rules has no rule files"
    assert set(_find(objects, "ConfigMap", "ki-rules")["data"]) == shipped


def test_the_cupti_workload_example_loads_the_library_the_daemonset_installs(objects):
    """examples/cupti-workload.yaml (not in the kustomization) is a valid pod whose
    CUDA_INJECTION64_PATH is the file agent.yaml's init container writes, in the directory it mounts."""
    (pod,) = yaml.safe_load_all((DEPLOY / "kubernetes" / "examples" / "cupti-workload.yaml").read_text())
    kubernetes_validate.validate(pod, K8S_VERSION, strict=True)
    agent = _pod_specs(objects)["ki-agent"]
    (lib,) = [v for v in agent["volumes"] if v["name"] == "cupti-lib"]
    (init,) = agent["initContainers"]
    assert {"name": "cupti-lib", "mountPath": lib["hostPath"]["path"]} in init["volumeMounts"]
    installed = f"{lib['hostPath']['path']}/libki_cupti.so.1"
    assert f"mv /opt/kernel-insight/lib/.libki_cupti.so.1.new {installed}" in init["args"][0]
    (server,) = pod["spec"]["containers"]
    env = {e["name"]: e["value"] for e in server["env"]}
    assert env["CUDA_INJECTION64_PATH"] == installed
    mounts = {m["name"]: m for m in server["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    (lib_mount,) = [m for m in mounts.values() if m["mountPath"] == lib["hostPath"]["path"]]
    assert lib_mount["readOnly"] is True
    assert volumes[lib_mount["name"]]["hostPath"]["path"] == lib["hostPath"]["path"]
    assert volumes[mounts["ki-shm"]["name"]]["hostPath"]["path"] == "/dev/shm"
    assert 10001 in pod["spec"]["securityContext"]["supplementalGroups"]


def test_the_probes_ask_the_kubelet_through_its_socket_mounted_read_only(objects):
    """Issue 38: the DaemonSet mounts the kubelet's pod-resources directory read-only into the
    container whose NVML sampler asks it, and passes the socket in that directory."""
    agent = _pod_specs(objects)["ki-agent"]
    volumes = {v["name"]: v for v in agent["volumes"]}
    (probes,) = [c for c in agent["containers"] if "--kubelet-socket" in " ".join(c.get("args", []))]
    socket = " ".join(probes["args"]).split("--kubelet-socket ")[1].split()[0]
    (mount,) = [m for m in probes["volumeMounts"] if socket.startswith(m["mountPath"] + "/")]
    assert mount["readOnly"] is True
    assert volumes[mount["name"]]["hostPath"]["path"] == "/var/lib/kubelet/pod-resources"
    assert socket == "/var/lib/kubelet/pod-resources/kubelet.sock"
