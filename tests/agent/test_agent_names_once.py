"""Names once with the real processes (wire body version 5, issue 14): the real ki-agent starts while
its collector is down (spooled batches carry their names), then leaves out names it sent, and the
real ki collector, restarted between two exports, answers 424 to a batch naming kernels it no
longer knows; the agent sends its names and the batch again. Every histogram keeps its real name.

And when the names batch and the batch it was sent for reach different collectors (session 9): a
proxy lets the names batch be stored and answers the batch 503 (a busy store), then the collector
restarts (or the tier moves the agent): the batch's retry meets a collector that never saw the
names batch and answers 424 a second time. That batch must not be dead-lettered: the agent sends
its names again."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from support.collector import start_collector, stop_collector, stored_kernel_histograms, wait_for_log
from tier_proxy import UNAVAILABLE, Answer, TierProxy

from bench.histogram.pipeline import KERNEL_NAMES
from bench.histogram.producer import build_producer
from kernel_insight.agent.ring import Ring
from kernel_insight.collector.keys import KeyStore
from kernel_insight.collector.wire import BATCH_STATUS_HEADER
from kernel_insight.run import free_port

KERNELS = 20
INTERVAL_S = 12  # histogram exports: the collector restarts between two of them


@contextlib.contextmanager
def _names_agent(
    tmp_path: Path, agent_bin: Path, ring_name: str, url: str, *extra: str
) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """The real ki-agent (histograms every INTERVAL_S, no spans) sending to ``url``, fed 1,000
    kernels/s over 20 real names by the C producer (which registers them once) until ``_stop``;
    the agent and its log. The producer's output goes to a file: pipes nobody reads would be left
    open (a ResourceWarning)."""
    producer = build_producer(tmp_path)
    KeyStore(tmp_path / "keys.json").add_agent("names").write_key_file(tmp_path / "agent.key")
    ring = Ring.create(ring_name, capacity=1 << 16)
    log = tmp_path / "agent.log"
    agent = prod = None
    try:
        with log.open("w") as out:
            agent = subprocess.Popen(
                [str(agent_bin), "--ring", ring_name, "--collector", url,
                 "--key-file", str(tmp_path / "agent.key"), "--spool-dir", str(tmp_path / "spool"),
                 "--histogram-interval-s", str(INTERVAL_S), "--span-sample-rate", "0", "--span-tail-rate", "0",
                 "--heartbeat-s", "300", "--shutdown-timeout-s", "60", "--log-level", "debug", *extra],
                stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        with (tmp_path / "producer.log").open("w") as prod_out:
            prod = subprocess.Popen(
                [str(producer), ring_name, str(1000 * 30 * INTERVAL_S), str(KERNELS), "1000", "3", "-", str(KERNEL_NAMES)],
                stdout=prod_out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        yield agent, log
        prod.terminate()
        prod.wait(timeout=30)
        time.sleep(0.5)
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(timeout=120) == 0, log.read_text()[-3000:]
    finally:
        for p in (agent, prod):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait(timeout=30)
        ring.close()


def _names_round(log: Path, at: int) -> None:
    """A collector lacking names answered 424: the agent says so, sends a names batch of the 20
    names in front of the batch, and goes on to seal one more export."""
    at = wait_for_log(log, r"collector lacks names", at, 4 * INTERVAL_S)
    at = wait_for_log(log, r"names batch \d+/\d+: 20 names", at, 30)
    wait_for_log(log, r"sealed batch", at, 4 * INTERVAL_S)


def _assert_all_stored(tmp_path: Path, log: Path) -> None:
    """Nothing dead-lettered, every histogram under its real name, every folded kernel stored once."""
    text = log.read_text()
    assert "rejected batch" not in text, text[-3000:]
    assert not (tmp_path / "spool" / "dead-letter").exists()
    kernels, stored, aggregated = stored_kernel_histograms(tmp_path / "data")
    assert kernels == sorted(KERNEL_NAMES.read_text().splitlines()[:KERNELS])  # no unknown_<id>
    assert aggregated > 0
    assert stored == aggregated


def test_names_go_once_survive_a_collector_restart_and_a_spool(
    tmp_path: Path, agent_bin: Path, ring_name: str
):
    port = free_port()
    collector = None
    try:
        with _names_agent(tmp_path, agent_bin, ring_name, f"http://127.0.0.1:{port}") as (_agent, log):
            # No collector yet: the first export is spooled, and carries every name it uses.
            at = wait_for_log(log, r"unreachable", 0, 3 * INTERVAL_S)
            collector, _url = start_collector(tmp_path, "--port", str(port))
            at = wait_for_log(log, r"accepts batches again", at, 3 * INTERVAL_S)
            # Batches get through: an export leaves its 20 names out.
            at = wait_for_log(
                log, r"sealed batch \d+/\d+: \d+ records, 0 names \(20 left out\)", at, 3 * INTERVAL_S
            )
            time.sleep(1.0)  # its answer
            stop_collector(collector)
            collector, _url = start_collector(tmp_path, "--port", str(port))
            # The next export leaves them out again, and the restarted collector holds none of them: 424.
            # (Where the collector is slower to start than the interval, the request fails first; the
            # export, sealed without its names before that, waits in the spool and gets the 424 then.)
            _names_round(log, at)
    finally:
        if collector is not None:
            stop_collector(collector)
    _assert_all_stored(tmp_path, log)


class _Tier(TierProxy):
    """``pass``: requests go through. Once an answer held a 424 (``armed``), the next request of
    several frames is split: its first frame (the names batch) goes to the collector alone, the
    others are answered 503, and from then on (``hold``) every request is answered 503 until the
    test points the proxy at the next collector (``done``: requests go through again)."""

    def __init__(self) -> None:
        super().__init__()
        self.state = "pass"
        self.split = threading.Event()

    def answer(self, ctype: str, body: bytes) -> Answer:
        with self.lock:
            state = self.state
        if state == "hold":
            return UNAVAILABLE
        frames = self.frames(ctype, body)
        if state == "armed" and len(frames) >= 2:
            statuses = [self.forward_frame(frames[0])] + [503] * (len(frames) - 1)
            with self.lock:
                self.state = "hold"
            self.split.set()
            return self.settled(statuses, retry_after=True)
        status, headers, data = self.forward(ctype, body)
        with self.lock:
            if self.state == "pass" and "424" in headers.get(BATCH_STATUS_HEADER, str(status)):
                self.state = "armed"
        return status, headers, data

    def move_to(self, upstream: str) -> None:
        with self.lock:
            self.upstream = upstream
            self.state = "done"


def test_a_batch_whose_names_went_to_another_collector_is_not_lost(
    tmp_path: Path, agent_bin: Path, ring_name: str
):
    tier = _Tier()
    collector = None
    try:
        collector, url = start_collector(tmp_path)
        tier.point_at(url)
        with _names_agent(
            tmp_path, agent_bin, ring_name, tier.url, "--backoff-min-ms", "200", "--backoff-max-ms", "2000"
        ) as (_agent, log):
            # Batches get through: an export leaves its 20 names out.
            at = wait_for_log(
                log, r"sealed batch \d+/\d+: \d+ records, 0 names \(20 left out\)", 0, 4 * INTERVAL_S
            )
            time.sleep(1.0)  # its answer
            stop_collector(collector)
            collector, url = start_collector(tmp_path)
            tier.point_at(url)
            # The restarted collector holds none of the names: 424, then the names batch in front of the
            # batch, which the proxy splits: the names batch stored, the batch answered 503.
            at = wait_for_log(log, r"collector lacks names", at, 4 * INTERVAL_S)
            assert tier.split.wait(4 * INTERVAL_S), tier.statuses
            # The batch's retry reaches a collector that never saw that names batch: 424 again,
            # another round (before session 9 the agent dead-lettered the batch here).
            stop_collector(collector)
            collector, url = start_collector(tmp_path)
            tier.move_to(url)
            _names_round(log, at)
    finally:
        if collector is not None:
            stop_collector(collector)
        tier.close()
    split_at = next(i for i, s in enumerate(tier.statuses) if s.startswith("200") and s.endswith("503"))
    assert any("424" in s for s in tier.statuses[split_at + 1 :]), tier.statuses  # the second 424 happened
    _assert_all_stored(tmp_path, log)
