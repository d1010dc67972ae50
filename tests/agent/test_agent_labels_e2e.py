"""Instance labels from the agent's own configuration (``ki-agent --labels``, issue #18): they
travel in every batch's LABELS section, reach the health snapshot, the topology and the series,
and enrolment labels win over them."""

from __future__ import annotations

import contextlib
import subprocess
import time
from pathlib import Path

import httpx
from agent_harness import wait_for
from support.collector import RunningCollector, running_collector
from support.rings import fresh_ring

from kernel_insight.collector.keys import KeyStore, read_key_file
from kernel_insight.sdk import HealthClient, KqlClient


@contextlib.contextmanager
def _agent(agent_bin: Path, c: RunningCollector, tmp: Path, ring_name: str, key: Path, labels: str):
    with fresh_ring(ring_name, capacity=1 << 12) as ring:
        log = tmp / f"agent-{key.stem}.log"
        with log.open("w") as out:
            proc = subprocess.Popen(
                [str(agent_bin), "--ring", ring_name, "--collector", c.url, "--key-file", str(key),
                 "--spool-dir", str(tmp / f"spool-{key.stem}"), "--drain-interval-ms", "20", "--labels", labels,
                 "--shutdown-timeout-s", "10"],
                stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        try:
            name = ring.intern("labelled_kernel")
            base = time.time_ns()
            for i in range(200):
                assert ring.kernel(name, 0, base + i * 1000, base + i * 1000 + 500, 1, i) == 0
            yield proc, log
        finally:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(30)


def test_configured_labels_reach_the_snapshot_and_series_and_enrolment_wins(tmp_path, agent_bin, ring_name):
    with running_collector(tmp_path) as c:
        plain = tmp_path / "plain.key"
        c.agent.write_key_file(plain)
        enrolled = tmp_path / "enrolled.key"
        KeyStore(c.keys.path).add_agent("node-2/gpu0", labels={"model": "llama-70b"}).write_key_file(enrolled)
        a_id, b_id = read_key_file(plain).agent_id.hex(), read_key_file(enrolled).agent_id.hex()
        with (
            _agent(agent_bin, c, tmp_path, ring_name, plain, "model=qwen-7b, rack=r9,host=h9"),
            _agent(agent_bin, c, tmp_path, ring_name + "b", enrolled, "model=not-this-one,rack=r1"),
            HealthClient(c.url, c.read_token, ttl=0, timeout=30) as health,
        ):

            def labelled() -> bool:
                snap = health.snapshot()
                a, b = snap.get(a_id), snap.get(b_id)
                return a is not None and b is not None and "rack" in a.labels and "rack" in b.labels

            wait_for(labelled, 60, "both instances in the snapshot with their labels")
            snap = health.snapshot()
            a, b = snap.get(a_id), snap.get(b_id)
            assert a is not None
            assert b is not None
            assert a.labels == {"model": "qwen-7b", "rack": "r9", "host": "h9"}
            assert a.models == ("qwen-7b",)
            assert b.labels == {"model": "llama-70b", "rack": "r1"}  # the enrolment's model wins

        topo = httpx.get(
            c.url + "/v1/topology", headers={"Authorization": f"Bearer {c.read_token}"}, timeout=30
        ).json()
        groups = {(g["rack"], g["host"]): g["instances"] for g in topo["groups"]}
        assert groups[("r9", "h9")] == [a_id]
        with KqlClient(c.url, c.read_token) as kql:
            res = kql.query(f'kernel_duration_seconds{{instance="{a_id}"}}')
        assert res.samples, "the agent's kernel histogram series"
        assert all(s.labels["model"] == "qwen-7b" and s.labels["rack"] == "r9" for s in res.samples)
        assert sum(s.histogram.count for s in res.samples if s.histogram is not None) == 200


def test_bad_labels_stop_the_agent_at_start_with_the_reason(tmp_path, agent_bin):
    for labels, reason in (
        ("instance=x", "label set by the collector itself"),
        ("model", "expected name=value"),
        ("9lives=x", "invalid label name"),
        ("model=a,model=b", "label given twice"),
        ("model=" + "x" * 201, "1-200 bytes"),
        (",".join(f"k{i}=v" for i in range(17)), "more than 16 labels"),
    ):
        done = subprocess.run(
            [str(agent_bin), "--labels", labels, "--key-file", str(tmp_path / "none.key")],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        assert done.returncode != 0, labels
        assert reason in done.stderr, (labels, done.stderr)
