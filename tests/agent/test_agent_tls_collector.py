"""The real ki-agent delivers over HTTPS to a real ``ki collector --tls-cert/--tls-key`` (issue #13 item 7)."""

from __future__ import annotations

import subprocess
import time

from agent_harness import wait_for
from pki import LocalCA
from support.collector import running_collector

from kernel_insight.agent.ring import Ring
from kernel_insight.collector.clickhouse.store import EmbeddedStore

RECORDS = 500


def test_the_agent_delivers_to_a_tls_collector_it_trusts_through_its_ca_file(tmp_path, agent_bin, ring_name):
    ca = LocalCA(tmp_path / "pki")
    server = ca.issue("server", server=True)
    tls = ("--tls-cert", str(server.cert), "--tls-key", str(server.key))
    ring = Ring.create(ring_name, capacity=1 << 12)
    try:
        with running_collector(tmp_path, *tls) as c:
            c.agent.write_key_file(tmp_path / "agent.key")
            port = c.host_port[1]
            log = tmp_path / "agent.log"
            with log.open("w") as out:
                agent = subprocess.Popen(
                    [str(agent_bin), "--ring", ring_name, "--collector", f"https://localhost:{port}",
                     "--tls-ca-file", str(ca.cert), "--key-file", str(tmp_path / "agent.key"),
                     "--spool-dir", str(tmp_path / "spool"), "--drain-interval-ms", "20", "--histograms=0",
                     "--shutdown-timeout-s", "10"],
                    stdout=out, stderr=subprocess.STDOUT,
                )  # fmt: skip
            try:
                name = ring.intern("tls_kernel")
                base = time.time_ns()
                for i in range(RECORDS):
                    assert ring.kernel(name, 0, base + i * 1000, base + i * 1000 + 500, 1, i) == 0
                wait_for(lambda: ring.stats()["fill"] == 0, 60, "ring drained")
                wait_for(lambda: not list((tmp_path / "spool").glob("*.kib")), 60, "spool delivered")
                agent.terminate()
                assert agent.wait(30) == 0, log.read_text()
            finally:
                if agent.poll() is None:
                    agent.kill()
                    agent.wait(10)
            text = log.read_text()
            assert "certificate" not in text.lower(), text
    finally:
        ring.close()
    store = EmbeddedStore(tmp_path / "data")
    try:
        row = {"n": store.row_count("kernel_spans")}
    finally:
        store.close()
    assert row == {"n": RECORDS}
