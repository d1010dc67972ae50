"""Instance labels, end to end through a real ``ki collector``: set at enrolment (``ki keys add-agent
--label``), applied to the instance and its series, taken from the series of remote-written data;
``/v1/topology`` groups by them and the SDK's model filter selects on them."""

from __future__ import annotations

import struct
import subprocess
import sys
import time

import httpx
import numpy as np
import pytest
from support.collector import running_collector

from kernel_insight.agent import RECORD_DTYPE, FingerprintField, RecordFlag, RecordType
from kernel_insight.agent.metric_ids import MetricId
from kernel_insight.collector import wire
from kernel_insight.collector.keys import AgentCredentials, KeyStore, read_key_file
from kernel_insight.collector.remote_write import encode_write_request
from kernel_insight.sdk import HealthClient, KqlClient, NoEligibleInstance

GiB = 1 << 30


def _agent_batch(creds: AgentCredentials, free_gib: float, now_ns: int) -> bytes:
    """One GPU's fingerprint (product name) and memory samples, sealed as ki-agent seals them."""

    def rec(rtype: int, ident: int, payload: bytes, flags: int = 0) -> tuple[object, ...]:
        return (0, 1, 0, rtype, flags, 0, ident, now_ns, payload.ljust(32, b"\0"))

    recs = np.array(
        [
            rec(RecordType.FINGERPRINT, FingerprintField.NAME, struct.pack("<Q", 5), RecordFlag.FP_STRING),
            rec(RecordType.GPU_SAMPLE, MetricId.MEMORY_TOTAL, struct.pack("<dQ", 80.0 * GiB, 0)),
            rec(RecordType.GPU_SAMPLE, MetricId.MEMORY_FREE, struct.pack("<dQ", free_gib * GiB, 0)),
        ],
        RECORD_DTYPE,
    )
    recs["pos"] = np.arange(len(recs))
    return wire.encode_batch(
        recs,
        agent_id=creds.agent_id,
        key_id=creds.key_id,
        key=creds.key,
        epoch=int(time.time()),
        seq=0,
        strings={(1, 5): "NVIDIA H100 80GB HBM3"},
        now_ns=now_ns,
    )


def _ki(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kernel_insight.cli", *args], capture_output=True, text=True, timeout=120
    )


def test_labels_from_enrolment_and_remote_write_reach_topology_and_selection(tmp_path):
    with running_collector(tmp_path) as c:
        # Enrolment through the CLI, into the key store the running collector reads.
        key_file = tmp_path / "a.key"
        done = _ki(
            "keys", "add-agent", "node-1/gpu0", "--store", str(c.keys.path), "--key-file", str(key_file),
            "--label", "model=llama-70b", "--label", "rack=r1", "--label", "host=h1", "--label", "switch=s1",
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        bad = _ki("keys", "add-agent", "x", "--store", str(c.keys.path), "--label", "instance=x")
        assert bad.returncode == 1
        assert "set by the collector" in bad.stderr
        creds = read_key_file(key_file)
        assert KeyStore(c.keys.path).agent(creds.agent_id).labels == {
            "host": "h1",
            "model": "llama-70b",
            "rack": "r1",
            "switch": "s1",
        }
        now_ns = time.time_ns()
        r = httpx.post(c.url + wire.INGEST_PATH, content=_agent_batch(creds, 46, now_ns), timeout=30)
        assert r.status_code == 200, r.text

        # A remote-written instance: its series' labels become the instance's.
        now_ms = now_ns // 1_000_000
        body = encode_write_request(
            [
                (
                    {"__name__": name, "instance": "rw-1", "gpu": "0", "model": "mistral-7b", "rack": "r2"},
                    [(now_ms, value)],
                )
                for name, value in (
                    ("gpu_memory_free_bytes", 30.0 * GiB),
                    ("gpu_memory_total_bytes", 40.0 * GiB),
                )
            ]
        )
        r = httpx.post(
            c.url + "/api/v1/write",
            content=body,
            headers={
                "Authorization": f"Bearer {c.ingest_token}",
                "Content-Type": "application/x-protobuf",
                "Content-Encoding": "snappy",
                "X-Prometheus-Remote-Write-Version": "0.1.0",
            },
            timeout=30,
        )
        assert r.status_code == 204, r.text

        agent_instance = creds.agent_id.hex()
        with HealthClient(c.url, c.read_token, ttl=0, timeout=30) as health:
            deadline = time.monotonic() + 60
            while True:
                snap = health.snapshot()
                ids = {i.id for i in snap.instances}
                if {agent_instance, "rw-1"} <= ids and all(
                    i.gpu_memory_free_bytes for i in snap.instances if i.id in (agent_instance, "rw-1")
                ):
                    break
                assert time.monotonic() < deadline, snap
                time.sleep(0.2)
            agent = snap.get(agent_instance)
            assert agent is not None
            assert agent.models == ("llama-70b",)
            assert agent.labels["rack"] == "r1"
            assert agent.fingerprint.gpu_model == "NVIDIA H100 80GB HBM3"
            assert agent.name == "node-1/gpu0"  # the name it was enrolled under, beside its 32-hex id
            rw = snap.get("rw-1")
            assert rw is not None
            assert rw.models == ("mistral-7b",)
            assert rw.name is None  # no enrolled agent sent it
            assert rw.labels == {"model": "mistral-7b", "rack": "r2"}

            assert {health.select_instance(40 * GiB, model="llama-70b").id for _ in range(20)} == {
                agent_instance
            }
            assert {health.select_instance(GiB, model="mistral-7b").id for _ in range(20)} == {"rw-1"}
            with pytest.raises(NoEligibleInstance, match=r"serves model 'gpt-j'.*'llama-70b', 'mistral-7b'"):
                health.select_instance(GiB, model="gpt-j")

        topo = httpx.get(c.url + "/v1/topology", headers={"Authorization": f"Bearer {c.read_token}"}).json()
        groups = {(g["switch"], g["rack"], g["host"]): g["instances"] for g in topo["groups"]}
        assert groups[("s1", "r1", "h1")] == [agent_instance]
        assert groups[("", "r2", "")] == ["rw-1"]

        # The agent's series carry the served model and the GPU product, each under its own name.
        with KqlClient(c.url, c.read_token) as kql:
            res = kql.query(f"gpu_memory_free_bytes{{instance='{agent_instance}'}}", time=now_ns / 1e9)
        (sample,) = res.samples
        assert sample.labels["model"] == "llama-70b"
        assert sample.labels["gpu_product"] == "NVIDIA H100 80GB HBM3"
        assert sample.labels["rack"] == "r1"


def test_relabelled_remote_write_reaches_the_snapshot(tmp_path):
    # A Prometheus that knows nothing of `model` writes its vLLM job; the collector's rules derive
    # the served model from the job name and drop the Go runtime series nobody routes on.
    rules = tmp_path / "relabel.yml"
    rules.write_text(
        "relabel_configs:\n"
        "  - source_labels: [job]\n    regex: 'vllm-(.*)'\n    target_label: model\n"
        "  - source_labels: [__name__]\n    regex: 'go_.*'\n    action: drop\n"
        "  - action: labeldrop\n    regex: job\n"
    )
    bad = tmp_path / "bad.yml"
    bad.write_text("- action: explode\n")
    refused = subprocess.run(
        [sys.executable, "-m", "kernel_insight.cli", "collector", "--store", str(tmp_path / "x"),
         "--local-dev", "--port", "0", "--relabel-config", str(bad)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert refused.returncode == 2
    assert "unknown relabel action 'explode'" in refused.stderr

    with running_collector(tmp_path, "--relabel-config", str(rules)) as c:
        now_ms = time.time_ns() // 1_000_000
        base = {"instance": "rw-9", "gpu": "0", "job": "vllm-qwen-32b"}
        c.remote_write(
            [
                ({**base, "__name__": "gpu_memory_free_bytes"}, [(now_ms, 30.0 * GiB)]),
                ({**base, "__name__": "gpu_memory_total_bytes"}, [(now_ms, 40.0 * GiB)]),
                ({**base, "__name__": "go_goroutines"}, [(now_ms - 1000, 7.0), (now_ms, 8.0)]),
            ],
        )
        with HealthClient(c.url, c.read_token, ttl=0, timeout=30) as health:
            deadline = time.monotonic() + 60
            while (rw := health.snapshot().get("rw-9")) is None or not rw.gpu_memory_free_bytes:
                assert time.monotonic() < deadline
                time.sleep(0.2)
            assert rw.models == ("qwen-32b",)
            assert "job" not in rw.labels
            assert health.select_instance(GiB, model="qwen-32b").id == "rw-9"
        with KqlClient(c.url, c.read_token) as kql:
            assert not kql.query("go_goroutines", time=now_ms / 1e3).samples
            (free,) = kql.query("gpu_memory_free_bytes{instance='rw-9'}", time=now_ms / 1e3).samples
        assert free.labels["model"] == "qwen-32b"
        assert "job" not in free.labels
        text = httpx.get(c.url + "/metrics", headers={"Authorization": f"Bearer {c.read_token}"}).text
        assert "ki_collector_relabel_dropped_samples_total 2.0" in text
