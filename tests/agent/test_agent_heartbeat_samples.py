"""The agent's own series (``ki_agent_*``, from each batch's COUNTERS) and ``ki_ingest_lag_seconds``
hold at most one sample per millisecond (issue 11, "nothing lost, nothing stale"; docs/metrics.md).

The parts of one histogram export that did not fit one section all carry the export's time, and
at SIGTERM they are sealed back to back: each batch wrote every counter a second time at one
timestamp with another value (a duplicate Prometheus refuses, and a value kql picked at random).
Now the agent seals each batch at least 1 ms after the one before (docs/wire.md) and the
collector stamps them 1 ms apart as well (tests/collector/test_derive.py, for older agents and
batches of one request received within a millisecond). Real ``ki-agent``, real ``ki collector``,
the store queried after.
"""

from __future__ import annotations

import itertools
import time
from pathlib import Path

from agent_harness import setup, wait_for
from support.collector import start_agent, start_collector, stop_collector

from kernel_insight.agent.ring import Ring
from kernel_insight.collector.clickhouse.store import EmbeddedStore
from kernel_insight.collector.keys import KeyStore

#: Distinct kernels, one histogram each: more than one 64 KiB HISTOGRAMS section holds, so the
#: export at SIGTERM goes out as several batches sealed within a millisecond or two.
KERNELS = 6000


def _produce(ring: Ring) -> None:
    """KERNELS kernels, each under its own name (one histogram each)."""
    names = [ring.intern(f"heartbeat_kernel_{i}") for i in range(KERNELS)]
    base = time.time_ns()
    for i, name in enumerate(names):
        assert ring.kernel(name, 0, base + i * 1000, base + i * 1000 + 500, 1, i) == 0


def test_agent_seals_each_batch_at_least_1_ms_after_the_one_before(
    tmp_path: Path, agent_bin: Path, ring_name: str
) -> None:
    """The agent's side (docs/wire.md, t_max_ns): its header times, which stamp its counters,
    hold one sample per millisecond across collector restarts too."""
    with setup(tmp_path, agent_bin, ring_name, capacity=1 << 15) as s:
        agent = s.start(
            "--histograms=1", "--histogram-interval-s", "3600", "--names-max", str(2 * KERNELS)
        )  # fmt: skip
        _produce(s.ring)
        wait_for(lambda: s.ring.stats()["fill"] == 0, 30, "the agent read the ring")
        assert agent.stop(timeout=30) == 0, agent.log()[-3000:]
        got = s.receiver.got
        headers = sorted((b.header for b in got.batches.values()), key=lambda h: (h.epoch, h.seq))
    with_histograms = sum(1 for b in got.batches.values() if b.histograms is not None)
    assert with_histograms >= 3, with_histograms  # the export went out in parts
    t_max = [h.t_max_ns for h in headers]
    assert all(b - a >= 1_000_000 for a, b in itertools.pairwise(t_max)), t_max


def test_agent_series_get_one_sample_per_millisecond(tmp_path: Path, agent_bin: Path, ring_name: str) -> None:
    KeyStore(tmp_path / "keys.json").add_agent("heartbeat").write_key_file(tmp_path / "agent.key")
    ring = Ring.create(ring_name, capacity=1 << 15)
    collector, url = start_collector(tmp_path)
    agent = None
    try:
        agent = start_agent(
            tmp_path, agent_bin, ring_name, url,
            "--histograms=1", "--histogram-interval-s", "3600",  # one export: the one SIGTERM seals
            "--names-max", str(2 * KERNELS), "--drain-interval-ms", "20", "--shutdown-timeout-s", "30",
        )  # fmt: skip
        _produce(ring)
        wait_for(lambda: ring.stats()["fill"] == 0, 30, "the agent read the ring")
        agent.terminate()  # seals the export in parts, then delivers the spool
        assert agent.wait(60) == 0, (tmp_path / "agent.log").read_text()[-3000:]
    finally:
        if agent is not None and agent.poll() is None:
            agent.kill()
            agent.wait()
        stop_collector(collector)
        ring.close()
    store = EmbeddedStore(tmp_path / "data")
    try:
        parts = store.query(
            "SELECT count() AS n FROM ki.samples WHERE metric = 'ki_agent_batches_sealed_total'"
        ).to_pylist()[0]["n"]
        shipped = store.query(
            "SELECT max(value) AS v FROM ki.samples WHERE metric = 'ki_agent_histograms_shipped_total'"
        ).to_pylist()[0]["v"]
        dups = store.query(
            "SELECT metric, fingerprint, ts, count() AS n, uniqExact(value) AS values FROM ki.samples"
            " WHERE metric LIKE 'ki\\\\_agent\\\\_%' OR metric = 'ki_ingest_lag_seconds'"
            " GROUP BY metric, fingerprint, ts HAVING n > 1 ORDER BY metric, ts"
        ).to_pylist()
    finally:
        store.close()
    assert shipped == KERNELS  # every histogram went out ...
    assert parts >= 3, parts  # ... in more than one batch (the case this test is about)
    assert dups == [], [(d["metric"], str(d["ts"]), d["n"], d["values"]) for d in dups[:8]]
