"""Names once with the real processes (wire body version 5, issue 14): the real ki-agent starts while
its collector is down (spooled batches carry their names), then leaves out names it sent, and the
real ki collector, restarted between two exports, answers 424 to a batch naming kernels it no
longer knows; the agent sends its names and the batch again. Every histogram keeps its real name."""

from __future__ import annotations

import contextlib
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from collector_cli import start_collector, stop_collector

from kernel_insight.agent.ring import Ring
from kernel_insight.collector.keys import KeyStore

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.histogram.pipeline import KERNEL_NAMES
from bench.histogram.producer import build_producer

KERNELS = 20
INTERVAL_S = 12  # histogram exports: the collector restarts between two of them


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_for(log: Path, pattern: str, after: int, timeout_s: float) -> int:
    """Wait until the agent's log matches ``pattern`` past offset ``after``; the offset past the match."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = log.read_text()
        m = re.compile(pattern).search(text, after)
        if m:
            return m.end()
        time.sleep(0.2)
    raise AssertionError(f"agent log never said /{pattern}/:\n{log.read_text()[-3000:]}")


def test_names_go_once_survive_a_collector_restart_and_a_spool(
    tmp_path: Path, agent_bin: Path, ring_name: str
):
    producer = build_producer(tmp_path)
    KeyStore(tmp_path / "keys.json").add_agent("names").write_key_file(tmp_path / "agent.key")
    with contextlib.suppress(OSError):
        Ring.unlink(ring_name)
    ring = Ring.create(ring_name, capacity=1 << 16)
    port = _free_port()
    log = tmp_path / "agent.log"
    agent = collector = prod = None
    try:
        with log.open("w") as out:
            agent = subprocess.Popen(
                [str(agent_bin), "--ring", ring_name, "--collector", f"http://127.0.0.1:{port}",
                 "--key-file", str(tmp_path / "agent.key"), "--spool-dir", str(tmp_path / "spool"),
                 "--histogram-interval-s", str(INTERVAL_S), "--span-sample-rate", "0", "--span-tail-rate", "0",
                 "--heartbeat-s", "300", "--shutdown-timeout-s", "60", "--log-level", "debug"],
                stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        # 1,000 kernels/s over 20 real names for the whole test (the producer registers them once).
        # Its output goes to a file: pipes nobody reads would be left open (a ResourceWarning).
        with (tmp_path / "producer.log").open("w") as prod_out:
            prod = subprocess.Popen(
                [str(producer), ring_name, str(1000 * 20 * INTERVAL_S), str(KERNELS), "1000", "3", "-", str(KERNEL_NAMES)],
                stdout=prod_out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        # No collector yet: the first export is spooled, and carries every name it uses.
        at = _wait_for(log, r"unreachable", 0, 3 * INTERVAL_S)
        collector, _url = start_collector(tmp_path, "--port", str(port))
        at = _wait_for(log, r"accepts batches again", at, 3 * INTERVAL_S)
        # Batches get through: an export leaves its 20 names out.
        at = _wait_for(log, r"sealed batch \d+/\d+: \d+ records, 0 names \(20 left out\)", at, 3 * INTERVAL_S)
        time.sleep(1.0)  # its answer
        stop_collector(collector)
        collector, _url = start_collector(tmp_path, "--port", str(port))
        # The next export leaves them out again, and the restarted collector holds none of them: 424.
        # (Where the collector is slower to start than the interval, the request fails first; the
        # export, sealed without its names before that, waits in the spool and gets the 424 then.)
        at = _wait_for(log, r"collector lacks names", at, 3 * INTERVAL_S)
        at = _wait_for(log, r"names batch \d+/\d+: 20 names", at, 10)
        at = _wait_for(log, r"sealed batch", at, 3 * INTERVAL_S)  # one more export
        prod.terminate()
        prod.wait(timeout=30)
        time.sleep(0.5)
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(timeout=120) == 0, log.read_text()[-3000:]
    finally:
        for p in (agent, prod):
            if p is not None and p.poll() is None:
                p.kill()
        if collector is not None:
            stop_collector(collector)
        ring.close()
        with contextlib.suppress(OSError):
            Ring.unlink(ring_name)
    text = log.read_text()
    assert "rejected batch" not in text, text[-3000:]  # nothing dead-lettered: every batch resolved
    assert not (tmp_path / "spool" / "dead-letter").exists()
    from kernel_insight.collector.store import EmbeddedStore

    store = EmbeddedStore(tmp_path / "data")
    try:
        kernels = store.query(
            "SELECT DISTINCT labels['kernel'] AS k FROM ki.series WHERE metric = 'kernel_duration_seconds'"
        ).to_pylist()
        counts = store.query(
            "SELECT fingerprint, max(count) AS c FROM ki.histograms WHERE metric = 'kernel_duration_seconds'"
            " GROUP BY fingerprint"
        ).to_pylist()
        aggregated = store.query(
            "SELECT max(value) AS v FROM ki.samples WHERE metric = 'ki_agent_kernels_aggregated_total'"
        ).to_pylist()[0]["v"]
    finally:
        store.close()
    names = KERNEL_NAMES.read_text().splitlines()[:KERNELS]
    assert sorted(r["k"] for r in kernels) == sorted(names)  # real names only, no unknown_<id>
    assert aggregated > 0
    assert sum(r["c"] for r in counts) == aggregated  # every kernel the agent folded is stored, once
