"""End to end: 1M records through ring -> ki-agent -> real collector process -> embedded ClickHouse.

The collector is stopped for 30 s in the middle and the agent is killed with
SIGKILL and restarted during the outage; storage ends up with every record
exactly once.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from pathlib import Path

import pytest
from agent_harness import Collector, free_port, wait_for

from kernel_insight.agent.ring import Ring
from kernel_insight.collector.keys import KeyStore

HERE = Path(__file__).resolve().parent
TOTAL = 1_000_000
OUTAGE_S = 30.0


@pytest.mark.slow
def test_million_records_exactly_once_through_outage_and_sigkill(tmp_path, agent_bin, ring_name):
    keys = KeyStore(tmp_path / "keys.json")
    creds = keys.add_agent("e2e")
    creds.write_key_file(tmp_path / "agent.key")
    port = free_port()
    collector = Collector(tmp_path / "data", tmp_path / "keys.json", port, tmp_path / "collector.log")
    collector.start()
    with contextlib.suppress(OSError):
        Ring.unlink(ring_name)
    ring = Ring.create(ring_name, capacity=1 << 16)
    agents: list[subprocess.Popen[bytes]] = []

    def start_agent() -> subprocess.Popen[bytes]:
        with (tmp_path / f"agent-{len(agents)}.log").open("w") as log:
            p = subprocess.Popen(
                [str(agent_bin), "--ring", ring_name, "--collector", f"http://127.0.0.1:{port}",
                 "--key-file", str(tmp_path / "agent.key"), "--spool-dir", str(tmp_path / "spool"),
                 "--backoff-max-ms", "1000", "--shutdown-timeout-s", "30",
                 "--histograms=0"],  # every kernel span must arrive exactly once
                stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        agents.append(p)
        return p

    names = [ring.intern(f"kernel_{i}") for i in range(8)]
    written = 0

    def produce(upto: int) -> None:
        nonlocal written
        base = time.time_ns()
        while written < upto:
            if ring.stats()["fill"] > 40_000:
                time.sleep(0.005)
                continue
            for _ in range(1000):
                t = base + written * 1000
                assert ring.kernel(names[written % 8], 0, t, t + 500, 1, written) == 0
                written += 1

    try:
        agent = start_agent()
        produce(300_000)
        collector.stop()
        outage_started = time.monotonic()
        produce(450_000)
        time.sleep(0.5)
        agent.kill()
        agent.wait()
        agent = start_agent()
        produce(600_000)
        time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - outage_started)))
        collector.start()
        produce(TOTAL)
        wait_for(lambda: ring.stats()["fill"] == 0, 60, "ring drained")
        wait_for(lambda: not list((tmp_path / "spool").glob("*.kib")), 120, "spool delivered")
        agent.terminate()
        assert agent.wait(60) == 0
    finally:
        for a in agents:
            if a.poll() is None:
                a.kill()
        collector.stop()
        ring.close()
        with contextlib.suppress(OSError):
            Ring.unlink(ring_name)
    from kernel_insight.collector.store import EmbeddedStore

    store = EmbeddedStore(tmp_path / "data")
    try:
        row = store.query(
            "SELECT count() AS n, uniqExact(correlation) AS u FROM ki.kernel_spans"
        ).to_pylist()[0]
    finally:
        store.close()
    assert row == {"n": TOTAL, "u": TOTAL}
