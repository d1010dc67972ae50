"""Upgrades and rollbacks with live traffic: the previous release (``PREVIOUS_RELEASE``, built from
its git tag) and HEAD, collector and agent, swapped one at a time over the same embedded store,
ring, spool and port while a producer keeps writing; every record is stored exactly once, and the
store the earlier collector made answers the same queries under the new one."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import httpx
import pytest
from release_build import PREVIOUS_RELEASE, PREVIOUS_RELEASE_COMMIT, Release, build_release, release_ref

from kernel_insight.agent.metric_ids import MetricId
from kernel_insight.agent.ring import Ring
from kernel_insight.api import TokenStore
from kernel_insight.collector.clickhouse.store import EmbeddedStore
from kernel_insight.collector.keys import KeyStore

REPO = Path(__file__).resolve().parents[2]
#: Producer values: BASE + sequence number, one sample per record, told apart from anything else.
BASE = 1_000_000_000.0
#: Seconds of traffic each pairing of versions carries.
PHASE_S = 4.0


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> Release:
    if release_ref() is None:
        pytest.skip(
            f"this checkout has neither tag {PREVIOUS_RELEASE} nor commit {PREVIOUS_RELEASE_COMMIT}"
            " (a shallow clone): the previous release cannot be built"
        )
    return build_release(PREVIOUS_RELEASE, tmp_path_factory.mktemp("release"))


@pytest.fixture(scope="module")
def head_agent(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """HEAD's ki-agent compiled from agent/src now (never a stale agent/bin)."""
    out = tmp_path_factory.mktemp("head-agent")
    subprocess.run(
        ["make", "-s", "-C", str(REPO / "agent" / "src"), f"OUT={out}"], check=True, capture_output=True
    )
    return out / "ki-agent"


class _Producer(threading.Thread):
    """One MEMORY_FREE sample every 10 ms, value ``BASE + n``, until stopped; ``sent``: how many."""

    def __init__(self, ring: Ring) -> None:
        super().__init__(daemon=True)
        self.ring, self.sent = ring, 0
        self.stop = threading.Event()
        self.paused = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            if not self.paused.is_set():
                self.ring.sample(MetricId.MEMORY_FREE, 0, time.time_ns(), BASE + self.sent)
                self.sent += 1
            self.stop.wait(0.01)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Site:
    """The collector's store, keys, tokens and port, and the agent's ring, key and spool, kept
    across the versions that take turns at them."""

    def __init__(self, tmp: Path, ring: str, head_agent: Path) -> None:
        self.tmp, self.ring, self.port, self.head_agent = tmp, ring, _port(), head_agent
        creds = KeyStore(tmp / "keys.json").add_agent("upgrade/gpu0")
        creds.write_key_file(tmp / "agent.key")
        self.read = TokenStore(tmp / "tokens.json").create("reader", ["read"]).token
        self.url = f"http://127.0.0.1:{self.port}"

    def collector(self, release: Release | None) -> subprocess.Popen[str]:
        ki = release.ki() if release else [sys.executable, "-m", "kernel_insight.cli"]
        env = release.env() if release else None
        with (self.tmp / "collector.log").open("a") as log:
            proc = subprocess.Popen(
                [*ki, "collector", "--store", str(self.tmp / "data"), "--keys", str(self.tmp / "keys.json"),
                 "--tokens", str(self.tmp / "tokens.json"), "--port", str(self.port), "--interval", "0.5"],
                stdout=subprocess.PIPE, stderr=log, text=True, env=env,
            )  # fmt: skip
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "listening on" in line, (self.tmp / "collector.log").read_text()[-3000:]
        return proc

    def agent(self, release: Release | None) -> subprocess.Popen[bytes]:
        binary = release.agent if release else self.head_agent
        with (self.tmp / "agent.log").open("a") as log:
            return subprocess.Popen(
                [str(binary), "--ring", self.ring, "--collector", self.url, "--key-file", str(self.tmp / "agent.key"),
                 "--spool-dir", str(self.tmp / "spool"), "--drain-interval-ms", "100"],
                stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip

    def stored(self) -> int:
        """The producer's samples the running collector answers for."""
        r = httpx.get(
            f"{self.url}/api/v1/query",
            params={"query": "sum(count_over_time(gpu_memory_free_bytes[1h]))"},
            headers={"Authorization": f"Bearer {self.read}"},
            timeout=30,
        )
        r.raise_for_status()
        result = r.json()["data"]["result"]
        return int(float(result[0]["value"][1])) if result else 0


def _stop(proc: subprocess.Popen[str] | subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
    if proc.stdout is not None:
        proc.stdout.close()


def _wait_up(url: str) -> None:
    deadline = time.monotonic() + 120
    while True:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                return
        assert time.monotonic() < deadline, "the collector did not answer /healthz"
        time.sleep(0.1)


def _counts(data: Path) -> tuple[int, int]:
    with EmbeddedStore(data, cache_bytes=0) as store:
        row = store.query(
            "SELECT count() AS n, uniqExact(value) AS distinct FROM ki.samples "
            f"WHERE metric = 'gpu_memory_free_bytes' AND value >= {BASE}"
        ).to_pylist()[0]
    return int(row["n"]), int(row["distinct"])


@pytest.mark.slow
def test_collector_and_agent_swapped_between_releases_both_ways_under_live_traffic_lose_nothing(
    tmp_path, release, head_agent
):
    """Upgrade the collector, then the agent; roll the collector back, then the agent: five
    pairings, each carrying traffic, every swap while the producer writes."""
    ring_name = f"/ki_upgrade.{os.getpid()}.{uuid.uuid4().hex[:8]}"
    ring = Ring.create(ring_name, capacity=1 << 14)
    site = _Site(tmp_path, ring_name, head_agent)
    producer = _Producer(ring)
    old, new = release, None
    collector = site.collector(old)
    agent = site.agent(old)
    producer.start()
    try:
        _wait_up(site.url)
        time.sleep(PHASE_S)
        # The store made by the earlier collector: a query answered now and again by HEAD's.
        producer.paused.set()
        deadline = time.monotonic() + 60
        while (answered := site.stored()) < producer.sent:
            assert time.monotonic() < deadline, f"{answered} of {producer.sent} reached the old collector"
            time.sleep(0.2)
        at = time.time()
        before = _query(site, at)
        steps = [("collector", new), ("agent", new), ("collector", old), ("agent", old)]
        for i, (what, version) in enumerate(steps):
            if what == "collector":
                _stop(collector)
                collector = site.collector(version)
                _wait_up(site.url)
                if i == 0:
                    assert _query(site, at) == before  # HEAD opened the earlier store: the same answer
                    producer.paused.clear()
            else:
                _stop(agent)
                agent = site.agent(version)
            time.sleep(PHASE_S)
        producer.stop.set()
        producer.join(10)
        deadline = time.monotonic() + 120
        while (got := site.stored()) < producer.sent:
            assert time.monotonic() < deadline, f"{got} of {producer.sent} records stored"
            time.sleep(0.5)
    finally:
        producer.stop.set()
        _stop(agent)
        _stop(collector)
        with contextlib.suppress(OSError):
            Ring.unlink(ring_name)
    n, distinct = _counts(tmp_path / "data")
    assert distinct == producer.sent, f"{producer.sent - distinct} of {producer.sent} records lost"
    assert n == distinct, f"{n - distinct} records stored twice"


def _query(site: _Site, at: float) -> list[object]:
    r = httpx.get(
        f"{site.url}/api/v1/query",
        params={"query": "count_over_time(gpu_memory_free_bytes[1h])", "time": f"{at:.3f}"},
        headers={"Authorization": f"Bearer {site.read}"},
        timeout=30,
    )
    r.raise_for_status()
    return sorted(str(x) for x in r.json()["data"]["result"])
