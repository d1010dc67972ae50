"""End to end: 1M records through ring -> ki-agent -> real collector process -> embedded ClickHouse.

The collector is stopped for 30 s in the middle and the agent is killed with
SIGKILL and restarted during the outage; storage ends up with every record
exactly once.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from agent_harness import Collector, wait_for

from kernel_insight.agent.ring import Ring
from kernel_insight.collector.keys import KeyStore
from kernel_insight.run import free_port

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
                a.wait()
        collector.stop()
        ring.close()
    from kernel_insight.collector.clickhouse.store import EmbeddedStore

    store = EmbeddedStore(tmp_path / "data")
    try:
        row = {"n": store.row_count("kernel_spans"), "u": store.distinct_count("kernel_spans", "correlation")}
    finally:
        store.close()
    assert row == {"n": TOTAL, "u": TOTAL}


@pytest.mark.slow
def test_a_batch_of_several_errors_and_string_fingerprints_is_stored_not_refused(
    tmp_path, agent_bin, ring_name
):
    """Issue 33, item 1: a batch with two or more ERROR records, or two or more FINGERPRINT
    string records (the simulator's once-a-minute fingerprint), that named them by hash only
    (names sent once: the histogram export batches, body version 5) was refused with a 422 ("the
    last axis must be contiguous"), and the agent moved it to its dead-letter file, every minute
    of ``make run``. Through the real agent and ``ki collector``: every such batch is stored."""
    import httpx

    from kernel_insight.agent.records import ErrorKind, FingerprintField
    from kernel_insight.collector.clickhouse.store import EmbeddedStore

    keys = KeyStore(tmp_path / "keys.json")
    keys.add_agent("several").write_key_file(tmp_path / "agent.key")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    # ki collector itself: its /metrics counts each batch's outcome and the agent's counters.
    with (tmp_path / "collector.log").open("w") as log:
        collector = subprocess.Popen(
            [sys.executable, "-m", "kernel_insight.cli", "collector", "--store", str(tmp_path / "data"),
             "--keys", str(tmp_path / "keys.json"), "--port", str(port), "--local-dev"],
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip

    def answering() -> bool:
        try:
            return httpx.get(f"{url}/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def outcomes(what: str = "batches") -> dict[str, float]:
        found = re.findall(
            rf'^ki_collector_ingest_{what}_total\{{outcome="(\w+)"\}} (\S+)', text_of(url), re.M
        )
        return {k: float(v) for k, v in found}

    wait_for(answering, 120, "the collector")
    ring = Ring.create(ring_name, capacity=1 << 14)
    rounds = 0
    try:
        gemm = ring.intern("gemm")

        def write_round(t: int) -> None:
            ring.kernel(gemm, 0, t, t + 50_000)  # kernels: histogram exports, with increments
            for field, text in (
                (FingerprintField.NAME, "NVIDIA H100"),
                (FingerprintField.UUID, "GPU-1"),
                (FingerprintField.DRIVER_VERSION, "550.54.15"),
            ):
                ring.fingerprint(field, 0, t, ring.intern(text), 1)
            for i, kind in enumerate((ErrorKind.XID, ErrorKind.OOM, ErrorKind.XID)):
                ring.error(kind, 0, t + i, 13 + i, 0, 7, ring.intern(f"error {i}"))

        with (tmp_path / "agent.log").open("w") as log:
            agent = subprocess.Popen(
                [str(agent_bin), "--ring", ring_name, "--collector", url, "--key-file",
                 str(tmp_path / "agent.key"), "--spool-dir", str(tmp_path / "spool"),
                 "--histogram-interval-s", "1"],
                stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        try:
            # A round a drain (100 ms) for 12 s: the export batches (every second) carry rounds
            # whose names were sent before.
            end = time.monotonic() + 12
            while time.monotonic() < end and len(outcomes()) <= 1:
                write_round(time.time_ns())
                rounds += 1
                time.sleep(0.1)
            assert agent.poll() is None
        finally:
            agent.terminate()
            assert agent.wait(30) == 0
        refused = {k: v for k, v in outcomes().items() if k != "stored" and v}
        assert refused == {}, (refused, (tmp_path / "collector.log").read_text()[-2000:])
        wait_for(lambda: outcomes("records").get("stored", 0) >= rounds * 6, 60, "every round stored")
        dead = re.findall(r"^ki_agent_batches_dead_lettered_total\{[^}]*\} (\S+)", text_of(url), re.M)
        assert [float(x) for x in dead] == [0.0]
        assert not list((tmp_path / "spool").glob("dead-letter*"))
    finally:
        collector.terminate()
        collector.wait(60)
        ring.close()
        Ring.unlink(ring_name)
    store = EmbeddedStore(tmp_path / "data")
    try:
        kinds = store.query("SELECT kind FROM ki.events ORDER BY ts").column("kind").to_pylist()
        assert kinds == ["xid", "oom", "xid"] * rounds
    finally:
        store.close()


def text_of(url: str) -> str:
    import httpx

    return httpx.get(f"{url}/metrics", timeout=10).text
