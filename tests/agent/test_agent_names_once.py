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
import http.client
import json
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

from collector_cli import start_collector, stop_collector, stored_kernel_histograms, wait_for_log

from kernel_insight.agent.ring import Ring
from kernel_insight.collector.keys import KeyStore
from kernel_insight.collector.wire import BATCH_STATUS_HEADER, FRAMES_CONTENT_TYPE, split_frames

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.histogram.pipeline import KERNEL_NAMES
from bench.histogram.producer import build_producer

KERNELS = 20
INTERVAL_S = 12  # histogram exports: the collector restarts between two of them
FORWARDED = ("Content-Type", BATCH_STATUS_HEADER, "Retry-After", "KI-Capture", "KI-Histogram-Snapshot")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
    with contextlib.suppress(OSError):
        Ring.unlink(ring_name)
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
        with contextlib.suppress(OSError):
            Ring.unlink(ring_name)


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
    port = _free_port()
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


class _Tier:
    """A proxy in front of one collector at a time. ``pass``: requests go through. Once an answer
    held a 424, the next request of several frames is split: its first frame (the names batch) goes
    to the collector alone, the others are answered 503 by the proxy, and from then on (``hold``)
    every request is answered 503 until the test points the proxy at the next collector."""

    def __init__(self) -> None:
        self.upstream = ""
        self.state = "pass"  # pass -> armed (a 424 seen) -> hold (names batch split off) -> done
        self.split = threading.Event()
        self.lock = threading.Lock()
        self.statuses: list[str] = []  # every answer's statuses, in order
        tier = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                ctype = self.headers.get("Content-Type", "")
                with tier.lock:
                    state, upstream = tier.state, tier.upstream
                if state == "hold" or not upstream:
                    self._reply(503, {"Retry-After": "1"}, b'{"status":"unavailable"}')
                    return
                frames = split_frames(body) if ctype == FRAMES_CONTENT_TYPE else [memoryview(body)]
                if state == "armed" and len(frames) >= 2:
                    status, _headers, _data = tier.forward(
                        upstream, "application/octet-stream", bytes(frames[0])
                    )
                    statuses = [str(status)] + ["503"] * (len(frames) - 1)
                    with tier.lock:
                        tier.state = "hold"
                        tier.statuses.append(", ".join(statuses))
                    tier.split.set()
                    results = [{"status": int(s)} for s in statuses]
                    self._reply(
                        200,
                        {BATCH_STATUS_HEADER: ", ".join(statuses), "Retry-After": "1"},
                        json.dumps({"status": "settled", "results": results}).encode(),
                    )
                    return
                status, headers, data = tier.forward(upstream, ctype, body)
                seen = headers.get(BATCH_STATUS_HEADER, str(status))
                with tier.lock:
                    tier.statuses.append(seen)
                    if tier.state == "pass" and "424" in seen:
                        tier.state = "armed"
                self._reply(status, headers, data)

            def _reply(self, status: int, headers: dict[str, str], data: bytes) -> None:
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def forward(self, upstream: str, ctype: str, body: bytes) -> tuple[int, dict[str, str], bytes]:
        """One request to the collector; a collector that is not up reads as 503 (as a tier's would)."""
        u = urlsplit(upstream)
        conn = http.client.HTTPConnection(u.hostname or "127.0.0.1", u.port, timeout=60)
        try:
            conn.request("POST", "/v1/ingest", body=body, headers={"Content-Type": ctype})
            resp = conn.getresponse()
            data = resp.read()
            headers = {k: resp.getheader(k, "") for k in FORWARDED if resp.getheader(k) is not None}
            return resp.status, headers, data
        except OSError:
            return 503, {"Retry-After": "1"}, b'{"status":"unavailable"}'
        finally:
            conn.close()

    def point_at(self, upstream: str, state: str | None = None) -> None:
        with self.lock:
            self.upstream = upstream
            if state is not None:
                self.state = state

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=30)


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
            tier.point_at(url, "done")
            _names_round(log, at)
    finally:
        if collector is not None:
            stop_collector(collector)
        tier.close()
    split_at = next(i for i, s in enumerate(tier.statuses) if s.startswith("200") and s.endswith("503"))
    assert any("424" in s for s in tier.statuses[split_at + 1 :]), tier.statuses  # the second 424 happened
    _assert_all_stored(tmp_path, log)
