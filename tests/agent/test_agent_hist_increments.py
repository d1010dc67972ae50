"""Histogram increments from the agent (agent/src/histinc.c, kstats.c; wire body version 4): the C
export's increments, rebuilt by the collector's code, are the exact cumulative histograms; and
end to end through the real ki-agent and ki collector at a 1 s interval."""

from __future__ import annotations

import signal
import struct
import subprocess
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from support.collector import start_collector, stop_collector
from support.stored import metric_series
from test_agent_units import run_unit
from test_histogram import bounds_table, go_index

from bench.histogram.producer import build_producer
from kernel_insight.agent.records import RECORD_DTYPE, RecordType
from kernel_insight.agent.ring import Ring
from kernel_insight.api import TokenStore
from kernel_insight.collector import wire
from kernel_insight.collector.hist_base import HistogramBases
from kernel_insight.collector.keys import KeyStore
from kernel_insight.collector.wire_hist import HistRow, decode_histograms
from kernel_insight.run import free_port

REPO = Path(__file__).resolve().parents[2]

T0 = 1_700_000_000 * 10**9


def _absolute(spans: tuple[tuple[int, int], ...], deltas: tuple[int, ...]) -> dict[int, int]:
    out, i, run, k = {}, 0, 0, 0
    for off, length in spans:
        i += off
        for _ in range(length):
            run += deltas[k]
            k += 1
            if run:
                out[i] = run
            i += 1
    return out


def _sections(raw: bytes) -> dict[int, list[bytes]]:
    out: dict[int, list[bytes]] = {}
    while raw:
        export, length = struct.unpack_from("<II", raw)
        out.setdefault(export, []).append(raw[8 : 8 + length])
        raw = raw[8 + length :]
    return out


def _write_kernels(path: Path, name: np.ndarray, dur: np.ndarray) -> None:
    """KERNEL records of producer 3, pid 42, at T0: kernel name[i] lasting dur[i] ns, as the C
    test's raw 64-byte records."""
    n = len(name)
    recs = np.zeros(n, dtype=RECORD_DTYPE)
    recs["pos"] = np.arange(n)
    recs["producer"] = 3
    recs["type"] = RecordType.KERNEL
    recs["ts_ns"] = T0
    recs["id"] = name
    payload = np.zeros(
        n, dtype=[("end", "<u8"), ("stream", "<u8"), ("c", "<u8"), ("pid", "<u4"), ("r", "<u4")]
    )
    payload["end"] = T0 + dur
    payload["pid"] = 42
    recs["payload"] = payload.view("V32")
    path.write_bytes(recs.tobytes())


def test_c_increments_rebuild_into_the_exact_cumulative_histograms(tmp_path: Path) -> None:
    """Ten exports of a growing long tail, a forced snapshot before the seventh: every export,
    rebuilt by the collector's HistogramBases, equals the exact bucket counts of the records so far."""
    rng = np.random.default_rng(14)
    n, k, snap = 60_000, 10, 6
    name = rng.integers(1, 5, n).astype(np.uint32)  # kernels 1-3 busy, 4 rare below
    name[rng.random(n) < 0.9995] %= 4
    name[name == 0] = 1
    dur = (
        rng.lognormal(np.log(20_000), 0.6, n) * np.where(rng.random(n) < 0.01, rng.pareto(1.3, n) + 1, 1)
    ).astype(np.uint64) + 1
    _write_kernels(tmp_path / "records.bin", name, dur)
    stdout = run_unit(tmp_path, "test_kstats", "increments", str(tmp_path / "records.bin"),
                      str(tmp_path / "sections.bin"), str(k), str(snap))  # fmt: skip
    increments = int(stdout.split()[1])
    assert increments > 0
    exports = _sections((tmp_path / "sections.bin").read_bytes())
    assert sorted(exports) == list(range(k))
    header = wire.BatchHeader(bytes(16), 1, 1, 0, 0, 2**63, 0, 0, wire.COMPRESSION_NONE)
    bases = HistogramBases()
    bounds = bounds_table()
    truth: dict[int, Counter[int]] = {}
    seen_inc = 0
    for j in range(k):
        lo, hi = n * j // k, n * (j + 1) // k
        for i in range(lo, hi):
            truth.setdefault(int(name[i]), Counter())[go_index(int(dur[i]) * 1e-9, 3, bounds)] += 1
        rows: list[HistRow] = []
        for section in exports[j]:
            r = wire._Reader(section, "HISTOGRAMS")
            h = decode_histograms(r, header, wire.DEFAULT_LIMITS, 4)
            assert r.done()
            wire_rows = h.rows()
            flags = [(row.first, row.increment) for row in wire_rows]
            if j == 0:
                assert all(f == (True, False) for f in flags)
            elif j == snap:
                assert all(f == (False, False) for f in flags)  # ki_kstats_snapshot: cumulative again
            seen_inc += sum(inc for _, inc in flags)
            rebuilt, missing = bases.resolve(h, epoch=1)
            assert missing == 0
            assert rebuilt is not None
            rows += rebuilt.rows()
        got = {row.id: row for row in rows}
        assert set(got) <= set(truth)
        for ident, row in got.items():
            assert row.count == sum(truth[ident].values())
            assert _absolute(row.pos_spans, row.pos_deltas) == dict(truth[ident]), (j, ident)
    assert seen_inc == increments
    # the busy kernels' exports were increments once they held 4,096 kernels (ki_histinc.h:
    # ~2,000 each per export here), but for the snapshots
    assert seen_inc >= 3 * (k - 5)


def test_c_idle_keys_evicted_after_export_and_back_as_a_reset(tmp_path: Path) -> None:
    """histogram_idle_s 2 with exports 1 s apart (sweeps before exports 0, 2, 4, ...), increments
    on: kernel 1 busy in chunk 0 only is evicted at export 4 (unchanged through a whole sweep
    period, its change shipped at export 0); kernel 5, new in chunk 5, takes its slot; kernel 1
    back in chunk 6 is a new series: first flag, cumulative, only its new observations; kernel 3
    fed right before the sweep at export 4 is shipped by it, not evicted (at 8 instead, with 5).
    Every export, rebuilt by the collector's HistogramBases, is each series' exact histogram."""
    rng = np.random.default_rng(15)
    k, per = 10, 6_000
    plan = {0: {1: 5_000, 2: 1_000}, 4: {3: 300}, 5: {5: 2_000}, 6: {1: 700}}
    names: list[int] = []
    for j in range(k):
        extra = plan.get(j, {})
        row = [name for name, cnt in extra.items() for _ in range(cnt)]
        row += [2] * (per - len(row))  # kernel 2: busy in every chunk
        names += row
    name = np.array(names, dtype=np.uint32)
    dur = rng.lognormal(np.log(20_000), 0.8, len(names)).astype(np.uint64) + 1
    _write_kernels(tmp_path / "records.bin", name, dur)
    stdout = run_unit(tmp_path, "test_kstats", "increments", str(tmp_path / "records.bin"),
                      str(tmp_path / "sections.bin"), str(k), "-1", "2")  # fmt: skip
    _, increments, evicted = stdout.split()
    assert int(increments) > 0
    assert int(evicted) == 3  # kernel 1 at export 4, kernels 3 and 5 at export 8
    exports = _sections((tmp_path / "sections.bin").read_bytes())
    header = wire.BatchHeader(bytes(16), 1, 1, 0, 0, 2**63, 0, 0, wire.COMPRESSION_NONE)
    bases = HistogramBases()
    bounds = bounds_table()
    truth: dict[int, Counter[int]] = {}
    shipped: dict[int, list[tuple[int, bool]]] = {}
    for j in range(k):
        if j == 6:
            truth.pop(1)  # evicted at export 4: back as a new series
        for i in range(per * j, per * (j + 1)):
            truth.setdefault(int(name[i]), Counter())[go_index(int(dur[i]) * 1e-9, 3, bounds)] += 1
        for section in exports.get(j, []):
            r = wire._Reader(section, "HISTOGRAMS")
            h = decode_histograms(r, header, wire.DEFAULT_LIMITS, 4)
            assert r.done()
            for row in h.rows():
                shipped.setdefault(row.id, []).append((j, row.first))
            rebuilt, missing = bases.resolve(h, epoch=1)
            assert missing == 0
            assert rebuilt is not None
            for row in rebuilt.rows():
                assert row.count == sum(truth[row.id].values()), (j, row.id)
                assert _absolute(row.pos_spans, row.pos_deltas) == dict(truth[row.id]), (j, row.id)
    assert shipped[1] == [(0, True), (6, True)]  # a counter reset when it comes back
    assert shipped[3] == [(4, True)]
    assert shipped[5] == [(5, True)]
    assert [j for j, _ in shipped[2]] == list(range(k))
    assert sum(first for _, first in shipped[2]) == 1


def _through_a_real_collector(
    tmp_path: Path,
    agent_bin: Path,
    ring_name: str,
    total: int,
    *collector_args: str,
    agent_args: tuple[str, ...] = (),
    kernels: int = 3,
    runs: int = 1,
    evicted_between: int = 0,
) -> tuple[list[dict[str, Any]], dict[str, float], str]:
    """C producer (50k kernels/s; runs processes one after the other; with ``evicted_between``,
    the next starts once the collector has stored an evicted counter of that many keys a run so
    far: the previous process's keys have gone idle and were evicted) ->
    ki-agent (1 s interval) -> ki collector -> ClickHouse: each series' last stored histogram, the
    agent's histogram counters (the last value stored of ki_agent_histogram_<name>_total), and the
    collector's /metrics."""
    producer = build_producer(tmp_path)
    KeyStore(tmp_path / "keys.json").add_agent("inc").write_key_file(tmp_path / "agent.key")
    reader = TokenStore(tmp_path / "tokens.json").create("reader", ["read"]).token
    ring = Ring.create(ring_name, capacity=1 << 16)
    collector, url = start_collector(tmp_path, *collector_args)
    agent = None
    try:
        with (tmp_path / "agent.log").open("w") as log:
            agent = subprocess.Popen(
                [str(agent_bin), "--ring", ring_name, "--collector", url, "--key-file", str(tmp_path / "agent.key"),
                 "--spool-dir", str(tmp_path / "spool"), "--shutdown-timeout-s", "60",
                 "--histogram-interval-s", "1", *agent_args],
                stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        durations = b""
        for run in range(runs):
            part = tmp_path / f"durations.{run}.bin"
            r = subprocess.run([str(producer), ring_name, str(total), str(kernels), "50000", str(7 + run), str(part)],
                               capture_output=True, text=True, timeout=120)  # fmt: skip
            assert r.returncode == 0, r.stdout + r.stderr
            durations += part.read_bytes()
            if evicted_between and run < runs - 1:
                _wait_evicted(url, reader, evicted_between * (run + 1))
        (tmp_path / "durations.bin").write_bytes(durations)
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(timeout=120) == 0, (tmp_path / "agent.log").read_text()[-3000:]
        with urllib.request.urlopen(url + "/metrics", timeout=30) as answer:
            metrics = answer.read().decode()
    finally:
        if agent is not None and agent.poll() is None:
            agent.kill()
            agent.wait()
        stop_collector(collector)
        ring.close()
    from kernel_insight.collector.clickhouse.store import EmbeddedStore

    store = EmbeddedStore(tmp_path / "data")
    try:
        last = store.query(
            "SELECT fingerprint, argMax(count, ts) AS count, argMax(positive_span_offsets, ts) AS po,"
            " argMax(positive_span_lengths, ts) AS pl, argMax(positive_counts, ts) AS pc, count() AS samples"
            " FROM ki.histograms WHERE metric = 'kernel_duration_seconds' GROUP BY fingerprint"
        ).to_pylist()
        counters: dict[str, float] = {}
        for s in metric_series(store, "ki_agent_histogram_.*_total", "=~"):
            name = dict(s.labels)["__name__"].removeprefix("ki_agent_histogram_").removesuffix("_total")
            counters[name] = max([counters.get(name, float("-inf")), *s.values.tolist()])
    finally:
        store.close()
    return last, counters, metrics


def _wait_evicted(url: str, token: str, keys: int, timeout_s: float = 180) -> None:
    """Until the agent's evicted counter stored in the collector reaches ``keys``: an idle key goes
    between histogram_idle_s and twice that after its last change once that change is delivered
    (later on a loaded machine), and the counter arrives with the next batch (a heartbeat)."""
    deadline = time.monotonic() + timeout_s
    evicted = 0.0
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30) as http:
        while evicted < keys:
            assert time.monotonic() < deadline, (
                f"{evicted:.0f} of {keys} idle keys evicted in {timeout_s:.0f} s"
            )
            time.sleep(0.2)
            r = http.get("/api/v1/query", params={"query": "max(ki_agent_histogram_evicted_total)"})
            assert r.status_code == 200, r.text
            result = r.json()["data"]["result"]
            evicted = float(result[0]["value"][1]) if result else 0.0


def _exact(tmp_path: Path, last: list[dict[str, Any]]) -> None:
    """The stored cumulative buckets are the exact ones of every duration the producer wrote."""
    exact = np.fromfile(tmp_path / "durations.bin", dtype="<u8")
    bounds = bounds_table()
    want = Counter(go_index(int(d) * 1e-9, 3, bounds) for d in exact)
    got: Counter[int] = Counter()
    for h in last:
        spans = tuple(zip(h["po"], h["pl"], strict=True))
        i = 0
        k = 0
        for off, length in spans:
            i += off
            for _ in range(length):
                if h["pc"][k]:
                    got[i] += int(h["pc"][k])
                k += 1
                i += 1
    assert got == want


def test_the_agent_ships_increments_that_the_collector_stores_as_exact_cumulative_histograms(
    tmp_path: Path, agent_bin: Path, ring_name: str
) -> None:
    """200k kernels at 50k/s: increments rebuilt, every kernel counted once, one point a second."""
    total = 200_000
    last, counters, metrics = _through_a_real_collector(tmp_path, agent_bin, ring_name, total)
    assert len(last) == 3
    assert counters["increments"] > 0  # the agent did send increments ...
    assert sum(h["count"] for h in last) == total  # ... and every kernel is counted exactly once
    assert min(h["samples"] for h in last) >= 3  # one point per second of the run, about
    assert _metric(metrics, "ki_collector_increment_base_evictions_total") == 0
    assert _metric(metrics, 'ki_collector_records_dropped_total{reason="histogram_without_base"}') == 0
    _exact(tmp_path, last)


def test_bases_evicted_by_the_collector_bound_cost_points_not_counts(
    tmp_path: Path, agent_bin: Path, ring_name: str
) -> None:
    """A collector whose bound holds one series' bases (--histogram-base-mb 0.002: 2 KiB) of the
    agent's three: the increments over evicted bases are left out and the agent is asked for
    snapshots, so points go missing, but the stored histograms stay exact and end at every kernel."""
    total = 200_000
    last, counters, metrics = _through_a_real_collector(
        tmp_path, agent_bin, ring_name, total, "--histogram-base-mb", "0.002"
    )
    assert len(last) == 3
    assert counters["increments"] > 0
    assert _metric(metrics, "ki_collector_increment_base_evictions_total") > 0
    assert _metric(metrics, 'ki_collector_records_dropped_total{reason="histogram_without_base"}') > 0
    assert _metric(metrics, "ki_collector_increment_base_bytes") <= 2 * 1024 * 1.0  # 0.002 MiB, rounded down
    assert sum(h["count"] for h in last) == total  # the snapshots asked for bring every count back
    _exact(tmp_path, last)


def test_idle_keys_make_room_for_the_next_process(tmp_path: Path, agent_bin: Path, ring_name: str) -> None:
    """A table of 16 keys (--histogram-max-keys 16) filled by one producer process's 16 kernels;
    after it exits its keys go idle and are evicted (--histogram-idle-s 1), so the next process's
    16 kernels are all taken: none refused, 32 series stored, every kernel counted exactly. Without
    the eviction the second process's kernels would all be refused."""
    total = 20_000
    last, counters, _ = _through_a_real_collector(
        tmp_path, agent_bin, ring_name, total, kernels=16, runs=2, evicted_between=16,
        agent_args=("--histogram-max-keys", "16", "--histogram-idle-s", "1", "--heartbeat-s", "1"),
    )  # fmt: skip
    assert counters["evicted"] >= 16
    assert counters.get("refused", 0.0) == 0
    assert len(last) == 32
    assert sum(h["count"] for h in last) == 2 * total
    _exact(tmp_path, last)


def _metric(text: str, name: str) -> float:
    """One sample's value in an exposition (``name`` with its labels as written)."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{name} not exported")


def test_a_collector_restart_costs_no_counts(tmp_path: Path, agent_bin: Path, ring_name: str) -> None:
    """The collector dies mid-run and a new one (no bases in memory) takes over on the same port:
    the agent sends snapshots after the failed requests (and the new collector asks for them when an
    increment from the spool lacks its base), so the stored cumulative histograms end exact."""
    producer = build_producer(tmp_path)
    KeyStore(tmp_path / "keys.json").add_agent("restart").write_key_file(tmp_path / "agent.key")
    ring = Ring.create(ring_name, capacity=1 << 16)
    port = str(free_port())
    collector, url = start_collector(tmp_path, "--port", port)
    agent = None
    durations = [tmp_path / f"durations{i}.bin" for i in range(3)]

    def produce(i: int) -> None:
        r = subprocess.run([str(producer), ring_name, "60000", "3", "30000", str(11 + i), str(durations[i])],
                           capture_output=True, text=True, timeout=120)  # fmt: skip
        assert r.returncode == 0, r.stdout + r.stderr

    try:
        with (tmp_path / "agent.log").open("w") as log:
            agent = subprocess.Popen(
                [str(agent_bin), "--ring", ring_name, "--collector", url, "--key-file", str(tmp_path / "agent.key"),
                 "--spool-dir", str(tmp_path / "spool"), "--shutdown-timeout-s", "60",
                 "--histogram-interval-s", "1", "--backoff-max-ms", "500"],
                stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        produce(0)
        stop_collector(collector)
        produce(1)  # the agent spools meanwhile
        collector, url2 = start_collector(tmp_path, "--port", port)
        assert url2 == url
        produce(2)
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(timeout=120) == 0, (tmp_path / "agent.log").read_text()[-3000:]
    finally:
        if agent is not None and agent.poll() is None:
            agent.kill()
            agent.wait()
        stop_collector(collector)
        ring.close()
    from kernel_insight.collector.clickhouse.store import EmbeddedStore

    store = EmbeddedStore(tmp_path / "data")
    try:
        last = store.query(
            "SELECT fingerprint, argMax(count, ts) AS count, argMax(positive_span_offsets, ts) AS po,"
            " argMax(positive_span_lengths, ts) AS pl, argMax(positive_counts, ts) AS pc"
            " FROM ki.histograms WHERE metric = 'kernel_duration_seconds' GROUP BY fingerprint"
        ).to_pylist()
    finally:
        store.close()
    assert sum(h["count"] for h in last) == 180_000
    bounds = bounds_table()
    want = Counter(go_index(int(d) * 1e-9, 3, bounds) for p in durations for d in np.fromfile(p, dtype="<u8"))
    got: Counter[int] = Counter()
    for h in last:
        i = k = 0
        for off, length in zip(h["po"], h["pl"], strict=True):
            i += off
            for _ in range(length):
                if h["pc"][k]:
                    got[i] += int(h["pc"][k])
                k += 1
                i += 1
    assert got == want
