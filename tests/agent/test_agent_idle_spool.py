"""Idle keys are not evicted while the agent's spool is not empty (issue 14, session 9; docs/agent.md,
"Idle keys are evicted"): the real ki-agent (histogram_idle_s 2) ships a burst of 20 kernels while
its collector is away, so its batches wait in the spool for several idle periods; then every batch
sealed in the outage is refused for good (400, as a collector that cannot take them would) and
dead-lettered. The export after it re-sends every histogram the table holds: the keys must still be
there (an agent that swept them in the outage lost every count), and once the spool is empty they
are evicted as idle after all."""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from pathlib import Path

from support.collector import start_collector, stop_collector, stored_kernel_histograms, wait_for_log
from support.stored import metric_samples
from tier_proxy import UNAVAILABLE, Answer, TierProxy

from bench.histogram.pipeline import KERNEL_NAMES
from bench.histogram.producer import build_producer
from kernel_insight.agent.ring import Ring
from kernel_insight.collector.clickhouse.store import EmbeddedStore
from kernel_insight.collector.keys import KeyStore
from kernel_insight.collector.wire import parse_header

KERNELS = 20
IDLE_S = 2


class _Outage(TierProxy):
    """``down``: every request 503. ``refuse``: each batch sealed before ``until_ns`` (its header's
    t_max) is answered 400, the others go to the collector one by one."""

    def __init__(self) -> None:
        super().__init__()
        self.until_ns = 0  # 0: down
        self.refused = threading.Event()

    def answer(self, ctype: str, body: bytes) -> Answer:
        with self.lock:
            until = self.until_ns
        if not until:
            return UNAVAILABLE
        statuses = []
        for frame in self.frames(ctype, body):
            if parse_header(frame).t_max_ns <= until:
                statuses.append(400)
                self.refused.set()
            else:
                statuses.append(self.forward_frame(frame))
        if ctype == "application/octet-stream":
            return statuses[0], {}, b"{}"
        return self.settled(statuses)


def test_no_idle_key_is_evicted_while_its_last_change_waits_in_the_spool(
    tmp_path: Path, agent_bin: Path, ring_name: str
):
    producer = build_producer(tmp_path)
    KeyStore(tmp_path / "keys.json").add_agent("idle").write_key_file(tmp_path / "agent.key")
    ring = Ring.create(ring_name, capacity=1 << 16)
    proxy = _Outage()
    log = tmp_path / "agent.log"
    agent = collector = None
    try:
        collector, url = start_collector(tmp_path)
        proxy.point_at(url)
        with log.open("w") as out:
            agent = subprocess.Popen(
                [str(agent_bin), "--ring", ring_name, "--collector", proxy.url,
                 "--key-file", str(tmp_path / "agent.key"), "--spool-dir", str(tmp_path / "spool"),
                 "--histogram-interval-s", "1", "--histogram-idle-s", str(IDLE_S),
                 "--span-sample-rate", "0", "--span-tail-rate", "0", "--heartbeat-s", "300",
                 "--backoff-min-ms", "200", "--backoff-max-ms", "1000",
                 "--shutdown-timeout-s", "60", "--log-level", "debug"],
                stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        # 20,000 kernels over 20 real names in ~2 s, all of it while the collector is away.
        with (tmp_path / "producer.log").open("w") as prod_out:
            subprocess.run(
                [str(producer), ring_name, "20000", str(KERNELS), "10000", "5", "-", str(KERNEL_NAMES)],
                stdout=prod_out, stderr=subprocess.STDOUT, check=True, timeout=120,
            )  # fmt: skip
        at = wait_for_log(log, r"unreachable|answered 503", 0, 60)
        # Three idle periods and more after the last change: an agent that swept would have evicted
        # every key by now (a key goes between IDLE_S and twice that after its last export).
        time.sleep(4 * IDLE_S + 2)
        with proxy.lock:
            proxy.until_ns = time.time_ns()
        assert proxy.refused.wait(60), proxy.statuses
        at = wait_for_log(log, r"rejected batch", at, 60)
        # The export after the dead letters re-sends every histogram; once it got through and the
        # spool is empty, the keys are idle again and are evicted two periods later.
        at = wait_for_log(log, r"sealed batch", at, 30)
        time.sleep(3 * IDLE_S + 2)
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(timeout=120) == 0, log.read_text()[-3000:]
    finally:
        if agent is not None and agent.poll() is None:
            agent.kill()
            agent.wait(timeout=30)
        if collector is not None:
            stop_collector(collector)
        proxy.close()
        ring.close()
    assert (tmp_path / "spool" / "dead-letter").exists()  # the outage's batches were refused for good
    kernels, stored, aggregated = stored_kernel_histograms(tmp_path / "data")
    assert aggregated == 20000
    assert kernels == sorted(KERNEL_NAMES.read_text().splitlines()[:KERNELS])
    assert stored == aggregated, log.read_text()[-3000:]  # the re-sent snapshot had every key
    store = EmbeddedStore(tmp_path / "data")
    try:
        evicted = max(v for _, v in metric_samples(store, "ki_agent_histogram_evicted_total"))
    finally:
        store.close()
    assert evicted == KERNELS  # the sweep was put off, not lost
