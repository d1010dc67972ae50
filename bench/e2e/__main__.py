"""make bench-e2e: the highest kernel-record rate one ``ki collector`` sustains from N real agents.

Real processes only (bench/e2e/fleet.py): one ``ki collector`` on the embedded store, and
per GPU a ring, a C producer (``ringtool paced``: KERNEL records at R/N per second plus 16
NVML-like metrics at 10 Hz) and a ``ki-agent`` with its own spool. A trial runs the
producers for ``--warmup`` + ``--seconds``; it passes when, over the measured window,

- the agents' spool backlog did not grow in the last 30 s (at most one batch per agent
  more than 30 s before), and
- after the producers stop and the agents deliver, every written record is stored exactly
  once (``lost`` counts records missing, dropped by a full ring, or stored twice).

Rates are tried from ``--start`` up (x1.5) while they pass and down (halving the gap) once
one fails, until ``--budget-s`` would be exceeded. Figures: the collector's CPU over the
window (% of one core), p99 time to acknowledge an ingest request (from the collector's
``/metrics`` histogram, when the collector serves one), the backlog at the end of the
window, and bytes per stored sample: ``du`` of the samples table's directory beside
``system.parts`` (active parts) after the run, and the same for the sample tables together
(samples, their series index and histograms). ``du_over_parts_pct`` is the samples table's
``du`` over its active parts' bytes; ``store_du_over_parts_pct`` the same for the whole store
directory (every table, kernel spans included, and the engine's own files) over every table's
active parts: the issue's "du of the store within 10% of what the store reports". Ends with one
``BENCH e2e ...`` line for the best passing rate.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

from bench.e2e.fleet import Collector, Node, build_ringtool, cpu_seconds, thread_cpu_seconds, wait_until
from kernel_insight.agent.launcher import agent_binary
from kernel_insight.collector.clickhouse.store import EmbeddedStore
from kernel_insight.collector.keys import KeyStore

INGEST_ENDPOINT = "/v1/ingest"
#: The tables a float or histogram sample lives in: its rows, and the series index that finds them.
SAMPLE_TABLES = ("samples", "series", "histograms")


@dataclass
class Trial:
    rate: int
    agents: int
    passed: bool = False
    written: int = 0
    stored: int = 0
    lost: int = 0
    ring_dropped: int = 0
    collector_cpu_pct: float = 0.0
    #: the collector's CPU (user + system, all threads) from when it answered /healthz until every
    #: record was delivered, per record written: the figure that survives a loaded machine
    collector_cpu_us_per_record: float = math.nan
    #: the same CPU seconds by thread name (chDB's threads apart from Python's), largest first
    collector_cpu_s_by_thread: dict[str, float] = field(default_factory=dict)
    #: the agents ran with --histograms=1 (kept spans + histograms, their default) instead of 0
    histograms: bool = False
    p99_ack_ms: float = math.nan
    #: the ingest write-ahead files of the whole trial (docs/storage.md, "Exactly once"): per
    #: flush of a group of agent batches, bytes written and the flusher's CPU milliseconds
    wal_files: int = 0
    wal_bytes_per_flush: float = math.nan
    wal_cpu_ms_per_flush: float = math.nan
    backlog_end: int = 0
    backlog_30s_before: int = 0
    backlog_max: int = 0
    drain_s: float = 0.0
    samples: int = 0
    bytes_per_sample_du: float = math.nan
    bytes_per_sample_store: float = math.nan
    #: samples + series + histograms tables (the index a sample needs to be read back), per sample
    bytes_per_sample_du_all: float = math.nan
    bytes_per_sample_store_all: float = math.nan
    #: native histogram samples (rows of the histograms table), each counted once as Prometheus
    #: counts them; the ``_counted`` pair is the sample tables' bytes over float + histogram samples
    histogram_samples: int = 0
    bytes_per_sample_du_counted: float = math.nan
    bytes_per_sample_store_counted: float = math.nan
    #: the whole store (every table, kernel spans included, and the engine's own files): du, the
    #: median of the same 11 samples, against system.parts' active parts of every table after the run
    store_du_bytes: int = 0
    store_parts_bytes: int = 0
    #: du over what system.parts reports, in %: the samples table, and the whole store
    du_over_parts_pct: float = math.nan
    store_du_over_parts_pct: float = math.nan
    #: the largest du of the samples directory among the samples the median was taken from
    du_max_bytes: int = 0
    #: the samples directory's largest entries (parts, logs) when du was taken: name -> KiB
    samples_dir_kib: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def _du_bytes(path: Path) -> int:
    """What ``du`` counts: allocated blocks, not file lengths, of every file and directory
    (a part's directory is a 4 KiB block of its own)."""
    total = 0
    for root, _, files in os.walk(path):
        for f in (root, *(os.path.join(root, f) for f in files)):
            with contextlib.suppress(FileNotFoundError):
                total += os.lstat(f).st_blocks * 512
    return total


def _ack_histogram(url: str) -> dict[float, float] | None:
    """Cumulative bucket counts of the ingest endpoint's request durations, if /metrics serves them."""
    try:
        r = httpx.get(f"{url}/metrics", timeout=5)
    except httpx.HTTPError:
        return None
    if r.status_code != 200:
        return None
    out: dict[float, float] = {}
    for line in r.text.splitlines():
        if not line.startswith("ki_collector_http_request_duration_seconds_bucket{"):
            continue
        labels, _, value = line.rpartition(" ")
        if f'endpoint="{INGEST_ENDPOINT}"' not in labels:
            continue
        le = labels.split('le="', 1)[1].split('"', 1)[0]
        out[math.inf if le == "+Inf" else float(le)] = out.get(
            math.inf if le == "+Inf" else float(le), 0
        ) + float(value)
    return out or None


def _batcher_counters(url: str) -> dict[str, float]:
    """The batcher's ``ki_collector_batcher_*_total`` counters from /metrics (empty if unreadable)."""
    try:
        r = httpx.get(f"{url}/metrics", timeout=5)
    except httpx.HTTPError:
        return {}
    out: dict[str, float] = {}
    for line in r.text.splitlines() if r.status_code == 200 else ():
        name, _, value = line.partition(" ")
        if name.startswith("ki_collector_batcher_") and name.endswith("_total"):
            out[name.removeprefix("ki_collector_batcher_").removesuffix("_total")] = float(value)
    return out


def _p99_ms(before: dict[float, float] | None, after: dict[float, float] | None) -> float:
    if after is None:
        return math.nan
    before = before or {}
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    total = counts[-1]
    if total <= 0:
        return math.nan
    want = 0.99 * total
    prev_b, prev_c = 0.0, 0.0
    for b, c in zip(bounds, counts, strict=True):
        if c >= want:
            if math.isinf(b):
                return prev_b * 1000
            return (prev_b + (b - prev_b) * (want - prev_c) / max(c - prev_c, 1e-9)) * 1000
        prev_b, prev_c = b, c
    return math.nan


def _launches_counted(store: EmbeddedStore) -> int:
    """Kernel records the agents' histograms counted: the last count of every
    ``kernel_duration_seconds`` series (one agent run each, so no counter resets)."""
    rows = store.query(
        "SELECT sum(c) AS n FROM (SELECT fingerprint, max(count) AS c FROM ki.histograms "
        "WHERE metric = 'kernel_duration_seconds' GROUP BY fingerprint)"
    ).to_pylist()
    return int(rows[0]["n"] or 0)


def run_trial(
    rate: int,
    agents: int,
    warmup: float,
    seconds: float,
    tmp: Path,
    ringtool: Path,
    *,
    histograms: bool = False,
) -> Trial:
    """One rate. With ``histograms`` the agents ship kept spans and histograms (their default);
    a record then counts as delivered once the stored histograms counted it."""
    trial = Trial(rate, agents, histograms=histograms)
    keys = KeyStore(tmp / "keys.json")
    nodes = [Node(tmp, i, keys, agent_binary(), ringtool) for i in range(agents)]
    collector = Collector(tmp / "data", tmp / "keys.json", tmp / "collector.log")
    with EmbeddedStore(tmp / "data", cache_bytes=0) as store:  # the schema, and where the sample tables live
        paths = {
            row["name"]: Path(row["data_paths"][0])
            for row in store.query(
                "SELECT name, data_paths FROM system.tables WHERE database = 'ki' AND name IN "
                f"({', '.join(repr(t) for t in SAMPLE_TABLES)})"
            ).to_pylist()
        }
    dirs = {t: p if p.is_absolute() else tmp / "data" / p for t, p in paths.items()}
    try:
        collector.start()
        cpu_ready, threads_ready = cpu_seconds(collector.pid), thread_cpu_seconds(collector.pid)
        for n in nodes:
            n.start_agent(collector.url, histograms=histograms)
        per_agent = rate // agents
        for n in nodes:
            n.start_producer(per_agent, warmup + seconds)
        t0 = time.monotonic()
        timeline: list[tuple[float, int]] = []
        cpu_start = hist_start = None
        while time.monotonic() - t0 < warmup + seconds:
            time.sleep(1.0)
            now = time.monotonic() - t0
            timeline.append((now, sum(n.backlog() for n in nodes)))
            if cpu_start is None and now >= warmup:
                cpu_start, cpu_t0 = cpu_seconds(collector.pid), time.monotonic()
                hist_start = _ack_histogram(collector.url)
        assert cpu_start is not None
        trial.collector_cpu_pct = 100 * (cpu_seconds(collector.pid) - cpu_start) / (time.monotonic() - cpu_t0)
        trial.p99_ack_ms = _p99_ms(hist_start, _ack_histogram(collector.url))
        end_t = timeline[-1][0]
        trial.backlog_end = timeline[-1][1]
        trial.backlog_30s_before = next(b for t, b in timeline if t >= end_t - 30)
        trial.backlog_max = max(b for t, b in timeline if t >= warmup)
        bounded = trial.backlog_end <= trial.backlog_30s_before + agents
        produced = [n.produced() for n in nodes]
        trial.written = sum(p[0] for p in produced)
        trial.ring_dropped = sum(p[1] for p in produced)
        drain_start = time.monotonic()
        try:
            wait_until(
                lambda: all(n.backlog() == 0 and n.ring_fill() == 0 for n in nodes), 180, "agents to deliver"
            )
        except TimeoutError as exc:
            trial.notes.append(str(exc))
        trial.drain_s = time.monotonic() - drain_start
        batcher = _batcher_counters(collector.url)
        trial.wal_files = int(batcher.get("wal_files", 0))
        if trial.wal_files:
            trial.wal_bytes_per_flush = batcher["wal_bytes"] / trial.wal_files
            trial.wal_cpu_ms_per_flush = 1000 * batcher["wal_cpu_seconds"] / trial.wal_files
        if trial.written:
            trial.collector_cpu_us_per_record = 1e6 * (cpu_seconds(collector.pid) - cpu_ready) / trial.written
        threads_now = thread_cpu_seconds(collector.pid)
        by_thread = {k: round(v - threads_ready.get(k, 0.0), 2) for k, v in threads_now.items()}
        trial.collector_cpu_s_by_thread = dict(sorted(by_thread.items(), key=lambda kv: -kv[1])[:12])

        # du while the collector and the agents run (as in production: the agents' heartbeats
        # keep the tables written): parts a merge replaced are deleted old_parts_lifetime (1 s)
        # after it, the store asking for the cleanup every 2 s (docs/storage.md, "Merges"), so
        # at any moment du may hold a part being replaced or deleted. Sampled every 2 s for
        # 20 s: the median is the figure, the largest sample goes in the JSON.
        def du_now() -> tuple[int, int, int]:
            return (
                _du_bytes(dirs["samples"]),
                sum(_du_bytes(d) for d in dirs.values()),
                _du_bytes(tmp / "data"),
            )

        sizes = []
        for _ in range(11):
            sizes.append(du_now())
            time.sleep(2.0)
        du = int(statistics.median(x[0] for x in sizes))
        du_all = int(statistics.median(x[1] for x in sizes))
        trial.store_du_bytes = int(statistics.median(x[2] for x in sizes))
        trial.du_max_bytes = max(x[0] for x in sizes)
        with contextlib.suppress(FileNotFoundError):
            entries = {e.name: _du_bytes(Path(e.path)) if e.is_dir() else e.stat().st_blocks * 512
                       for e in os.scandir(dirs["samples"])}  # fmt: skip
            trial.samples_dir_kib = {
                k: v // 1024 for k, v in sorted(entries.items(), key=lambda kv: -kv[1])[:10]
            }
        for n in nodes:
            n.stop_agent()
        collector.stop()
        with EmbeddedStore(tmp / "data", cache_bytes=0) as store:
            if histograms:  # kept spans only: every record is counted by its histogram
                trial.stored = _launches_counted(store)
                duplicates = 0
            else:
                rows = store.query(
                    "SELECT count() AS n, uniqExact(instance, correlation) AS u FROM ki.kernel_spans"
                ).to_pylist()[0]
                trial.stored = int(rows["u"])
                duplicates = int(rows["n"]) - int(rows["u"])
            trial.lost = abs(trial.written - trial.stored) + trial.ring_dropped + duplicates
            trial.samples = int(store.query("SELECT count() AS n FROM ki.samples").to_pylist()[0]["n"])
            trial.histogram_samples = int(
                store.query("SELECT count() AS n FROM ki.histograms").to_pylist()[0]["n"]
            )
            reported = store.disk_bytes("samples")
            reported_all = sum(store.disk_bytes(t) for t in SAMPLE_TABLES)
            trial.store_parts_bytes = int(
                store.query(
                    "SELECT sum(bytes_on_disk) AS b FROM system.parts WHERE active AND database = 'ki'"
                ).to_pylist()[0]["b"]
                or 0
            )
            if reported:
                trial.du_over_parts_pct = 100 * (du / reported - 1)
            if trial.store_parts_bytes:
                trial.store_du_over_parts_pct = 100 * (trial.store_du_bytes / trial.store_parts_bytes - 1)
            if trial.samples:
                trial.bytes_per_sample_store = reported / trial.samples
                trial.bytes_per_sample_du = du / trial.samples
                trial.bytes_per_sample_store_all = reported_all / trial.samples
                trial.bytes_per_sample_du_all = du_all / trial.samples
                counted = trial.samples + trial.histogram_samples
                trial.bytes_per_sample_store_counted = reported_all / counted
                trial.bytes_per_sample_du_counted = du_all / counted
        trial.passed = bounded and trial.lost == 0 and not trial.notes
        if not bounded:
            trial.notes.append(
                f"backlog grew: {trial.backlog_30s_before} -> {trial.backlog_end} batches in 30 s"
            )
        return trial
    finally:
        for n in nodes:
            n.close()
        collector.stop()


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.e2e", description=__doc__.splitlines()[0])
    p.add_argument("--agents", type=int, default=8, help="agents (one GPU, ring and producer each)")
    p.add_argument("--start", type=int, default=200_000, help="first total rate tried, kernel records/s")
    p.add_argument("--rates", default="", help="comma-separated total rates to run instead of the search")
    p.add_argument("--warmup", type=float, default=10.0)
    p.add_argument("--seconds", type=float, default=60.0, help="measured window after the warm-up (>= 30)")
    p.add_argument("--budget-s", type=float, default=450.0, help="start no trial that would end past this")
    p.add_argument("--keep", action="store_true", help="keep the trial directories")
    p.add_argument(
        "--histograms",
        action="store_true",
        help="agents with histograms on (their default: kept spans + native histograms); "
        "without it every record is shipped as a span and followed one by one",
    )
    args = p.parse_args()
    if args.seconds < 30:
        p.error("--seconds must be at least 30 (the backlog is judged over the last 30 s)")
    began = time.monotonic()
    root = Path(tempfile.mkdtemp(prefix="ki-bench-e2e-"))
    ringtool = build_ringtool(root)
    trials: list[Trial] = []
    fixed = [int(r) for r in args.rates.split(",") if r.strip()]
    rate = fixed.pop(0) if fixed else args.start
    lo, hi = 0, 0  # highest passing, lowest failing
    last_s = args.warmup + args.seconds + 40
    while True:
        tmp = root / f"rate-{rate}"
        tmp.mkdir()
        started = time.monotonic()
        t = run_trial(rate, args.agents, args.warmup, args.seconds, tmp, ringtool, histograms=args.histograms)
        last_s = time.monotonic() - started
        trials.append(t)
        print(json.dumps(asdict(t), default=str), flush=True)
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
        if t.passed:
            lo = max(lo, rate)
        else:
            hi = rate if hi == 0 else min(hi, rate)
        if fixed:
            rate = fixed.pop(0)
        elif args.rates:
            break
        else:
            nxt = int(lo * 1.5) if hi == 0 else (lo + hi) // 2 if lo else hi // 2
            nxt = nxt // (args.agents * 1000) * args.agents * 1000
            if (
                nxt <= 0
                or nxt in (t.rate for t in trials)
                or (hi and hi - lo <= max(hi // 8, args.agents * 1000))
            ):
                break
            rate = nxt
        if time.monotonic() - began + last_s > args.budget_s:
            break
    passing = [t for t in trials if t.passed]
    best = max(passing, key=lambda t: t.rate) if passing else min(trials, key=lambda t: t.rate)
    print(
        f"machine: {os.cpu_count()} cpus, load average {os.getloadavg()[0]:.1f} (1 min) at the end",
        flush=True,
    )
    for t in trials:
        print(
            f"  rate {t.rate:>8}/s: {'pass' if t.passed else 'FAIL'} cpu {t.collector_cpu_pct:5.1f}% "
            f"({t.collector_cpu_us_per_record:.2f} us/record) "
            f"backlog {t.backlog_30s_before}->{t.backlog_end} (max {t.backlog_max}) lost {t.lost} "
            f"drain {t.drain_s:.1f}s p99 ack {t.p99_ack_ms:.0f} ms bytes/sample du {t.bytes_per_sample_du:.2f} "
            f"store {t.bytes_per_sample_store:.2f} (with series: {t.bytes_per_sample_du_all:.2f} / "
            f"{t.bytes_per_sample_store_all:.2f}); du over parts: samples {t.du_over_parts_pct:+.1f}%, "
            f"whole store {t.store_du_over_parts_pct:+.1f}%; ingest WAL {t.wal_files} files, "
            f"{t.wal_bytes_per_flush / 1024:.0f} KiB and {t.wal_cpu_ms_per_flush:.2f} ms CPU per flush "
            f"{'; '.join(t.notes)}"
        )
    if not passing:
        print("no rate passed; figures of the lowest rate tried", file=sys.stderr)
    print(
        f"BENCH e2e gpus={best.agents} histograms={int(args.histograms)} records_per_s={best.rate if best.passed else 0} "
        f"collector_cpu_pct={best.collector_cpu_pct:.0f} "
        f"collector_cpu_us_per_record={best.collector_cpu_us_per_record:.2f} p99_ack_ms={best.p99_ack_ms:.0f} "
        f"backlog_batches={best.backlog_end} lost={best.lost} bytes_per_sample_du={best.bytes_per_sample_du:.2f} "
        f"bytes_per_sample_store={best.bytes_per_sample_store:.2f} "
        f"bytes_per_sample_du_all={best.bytes_per_sample_du_all:.2f} "
        f"bytes_per_sample_store_all={best.bytes_per_sample_store_all:.2f} "
        f"du_over_parts_pct={best.du_over_parts_pct:.1f} store_du_over_parts_pct={best.store_du_over_parts_pct:.1f} "
        f"samples={best.samples} histogram_samples={best.histogram_samples} "
        f"bytes_per_sample_du_counted={best.bytes_per_sample_du_counted:.2f} "
        f"bytes_per_sample_store_counted={best.bytes_per_sample_store_counted:.2f}"
    )
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
