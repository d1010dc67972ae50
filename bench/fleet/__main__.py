"""``make bench-fleet``: node_exporter fleets by remote_write, alert rules as instant queries, as
VictoriaMetrics' prometheus-benchmark drives a TSDB, into kql and its peers one at a time.

For each N (targets) and each system: a fresh process on loopback; N targets of ~828 series
(bench/fleet/targets.py) each pushed every ``--interval`` seconds, spread evenly over it, through
a few keep-alive connections (remote_write shards); after ``--warmup`` seconds, ``--seconds`` of
measurement with the 35 alert expressions (bench/fleet/alerts.py) asked as instant queries every
interval, four at a time. Per system and N: samples/s sent and accepted, how late the sender fell
behind its schedule (a system that answers slower than the stream arrives makes it late), server
CPU (% of a core, and per sample), peak RSS, disk bytes per sample, query p50/p99, alert round
p99, errors; a system *holds* N when every write was accepted, the sender stayed within one
interval of its schedule, and the alert rounds finished inside the interval (p99).

Then the GPU fleet of the project's own agents (bench/fleet/gpus.py, ``--gpus`` sizes and the
``--gpu-*`` options; ``--gpus ''`` skips it, ``make bench-fleet-gpus`` runs it alone): recorded real
agent batches replayed for N agents into one collector with deploy/rules loaded and the health
snapshot of 10,000 instances polled; it adds ``gpus_held`` and ``snapshot_p99_ms`` to the line.

Ends with ``BENCH fleet targets_held=... prometheus_targets_held=... vm_targets_held=...
query_p99_ratio_vs_prometheus=... round_p99_ratio_vs_prometheus=... rss_ratio_vs_prometheus=...
cpu_ratio_vs_prometheus=... ratio_peer=... ratio_targets=...``: ratios at the largest N that kql and
the peer both hold, against the newest Prometheus run (``ratio_peer`` names it).
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import json
import os
import shutil
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import numpy as np

from bench.e2e.__main__ import _batcher_counters
from bench.fleet import gpus
from bench.fleet.alerts import ALERT_EXPRESSIONS, CONCURRENCY
from bench.fleet.systems import SYSTEMS, System
from bench.fleet.targets import TargetSet, node_exporter_page
from bench.kql.servers import process_cpu_s


@dataclass
class Result:
    system: str
    targets: int
    series: int
    seconds: float
    sent_samples_per_s: float = 0.0
    write_errors: int = 0
    write_p99_ms: float = 0.0
    max_lateness_s: float = 0.0
    cpu_pct: float = 0.0
    cpu_us_per_sample: float = 0.0
    rss_peak_mb: float = 0.0
    #: The anonymous part (heap, arrays, caches): RSS less the mapped files' pages. ki's RSS holds
    #: ~250 MB of chDB's library pages (clean, shared, reclaimable), a Go binary's a few tens of MB.
    rss_anon_peak_mb: float = 0.0
    disk_bytes_per_sample: float = 0.0
    query_p50_ms: float = 0.0
    query_p99_ms: float = 0.0
    round_p99_s: float = 0.0
    query_errors: int = 0
    #: ki only: remote_write requests per group commit (one chDB insert) while measured.
    requests_per_flush: float = 0.0
    first_errors: list[str] = field(default_factory=list)
    holds: bool = False


class _Sender(threading.Thread):
    """Pushes every target once per interval, spread evenly, over ``shards`` keep-alive connections."""

    def __init__(self, url: str, targets: TargetSet, interval: float, shards: int, churn: float) -> None:
        super().__init__(name="fleet-sender", daemon=True)
        self.url, self.targets, self.interval, self.shards = url, targets, interval, shards
        #: Targets replaced by new hosts per interval (``--churn`` percent of targets per 10 minutes).
        self.replace_per_round = churn / 100 * targets.count * interval / 600
        self.stop = threading.Event()
        self.measuring = False
        self.lock = threading.Lock()
        self.latencies: list[float] = []
        self.errors: list[str] = []
        self.samples = 0
        self.max_lateness = 0.0
        self.replaced = 0

    def run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        n = self.targets.count
        queue: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue(maxsize=4 * self.shards)
        limits = httpx.Limits(max_connections=self.shards, max_keepalive_connections=self.shards)
        headers = {"Content-Encoding": "snappy", "Content-Type": "application/x-protobuf",
                   "X-Prometheus-Remote-Write-Version": "0.1.0"}  # fmt: skip
        async with httpx.AsyncClient(limits=limits, timeout=60.0, headers=headers) as client:

            async def shard() -> None:
                while (item := await queue.get()) is not None:
                    due, body = item
                    began = time.monotonic()
                    try:
                        r = await client.post(self.url, content=body)
                        ok = r.status_code < 300
                        err = "" if ok else f"{r.status_code} {r.text[:120]}"
                    except httpx.HTTPError as exc:
                        ok, err = False, f"{type(exc).__name__}: {exc}"
                    done = time.monotonic()
                    if self.measuring:
                        with self.lock:
                            self.latencies.append(done - began)
                            self.max_lateness = max(self.max_lateness, began - due)
                            if ok:
                                self.samples += self.targets.series_per_target
                            else:
                                self.errors.append(err)

            workers = [asyncio.create_task(shard()) for _ in range(self.shards)]
            start = time.monotonic()
            rnd = 0
            owed = 0.0
            while not self.stop.is_set():
                round_start = start + rnd * self.interval
                self.targets.advance(self.interval)
                owed += self.replace_per_round
                while owed >= 1.0:  # the next targets in turn get new hosts: their series are all new
                    self.targets.replace(self.replaced % n)
                    self.replaced += 1
                    owed -= 1.0
                ts_ms = int(time.time() * 1000)
                for t in range(n):
                    due = round_start + t * self.interval / n
                    delay = due - time.monotonic()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    if self.stop.is_set():
                        break
                    await queue.put((due, self.targets.body(t, ts_ms + int(t * self.interval * 1000 / n))))
                rnd += 1
            for _ in workers:
                await queue.put(None)
            await asyncio.gather(*workers)


def _rss_kb(pid: int) -> tuple[int, int]:
    """(VmRSS, RssAnon) of ``pid`` in kB; zeros once it is gone."""
    found = {"VmRSS:": 0, "RssAnon:": 0}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key = line.split(maxsplit=1)[0]
                if key in found:
                    found[key] = int(line.split()[1])
    except OSError:
        pass
    return found["VmRSS:"], found["RssAnon:"]


def _du(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.path.getsize(os.path.join(root, name))
    return total


def _query_rounds(
    base: str, stop: threading.Event, interval: float
) -> tuple[list[float], list[float], list[str]]:
    """The alert expressions every interval, CONCURRENCY at a time over keep-alive connections."""
    clients = [httpx.Client(base_url=base, timeout=60.0) for _ in range(CONCURRENCY)]
    local = threading.local()
    slots = iter(range(CONCURRENCY))
    slot_lock = threading.Lock()

    def ask(expr: str) -> tuple[float, str]:
        if not hasattr(local, "client"):
            with slot_lock:
                local.client = clients[next(slots)]
        began = time.perf_counter()
        try:
            r = local.client.get("/api/v1/query", params={"query": expr, "time": f"{time.time():.3f}"})
            err = (
                ""
                if r.status_code == 200 and r.json().get("status") == "success"
                else f"{r.status_code} {r.text[:160]}"
            )
        except httpx.HTTPError as exc:
            err = f"{type(exc).__name__}: {exc}"
        return time.perf_counter() - began, err

    latencies: list[float] = []
    rounds: list[float] = []
    errors: list[str] = []
    with concurrent.futures.ThreadPoolExecutor(CONCURRENCY) as pool:
        next_round = time.monotonic()
        while not stop.is_set():
            began = time.perf_counter()
            for took, err in pool.map(ask, ALERT_EXPRESSIONS):
                latencies.append(took)
                if err:
                    errors.append(err)
            rounds.append(time.perf_counter() - began)
            next_round += interval
            stop.wait(max(0.0, next_round - time.monotonic()))
    for c in clients:
        c.close()
    return latencies, rounds, errors


def run_one(system: System, n: int, args: argparse.Namespace, page_series: int, root: Path) -> Result:
    data = root / f"{system.name}-{n}"
    data.mkdir(parents=True)
    proc = system.start(data, root / f"{system.name}-{n}.log")
    res = Result(system.name, n, n * page_series, args.seconds)
    try:
        targets = TargetSet(PAGE, 0, n)
        sender = _Sender(proc.base + system.write_path, targets, args.interval, args.shards, args.churn)
        sender.start()
        time.sleep(args.warmup)
        cpu0, t0 = process_cpu_s(proc.pid), time.monotonic()
        groups0 = _batcher_counters(proc.base) if system.name == "ki" else {}
        sender.measuring = True
        stop = threading.Event()
        rss_peak = anon_peak = 0
        box: dict[str, tuple[list[float], list[float], list[str]]] = {}
        querier = threading.Thread(
            target=lambda: box.setdefault("q", _query_rounds(proc.base, stop, args.interval)), daemon=True
        )
        if args.queries:
            querier.start()
        while time.monotonic() - t0 < args.seconds:
            rss, anon = _rss_kb(proc.pid)
            rss_peak, anon_peak = max(rss_peak, rss), max(anon_peak, anon)
            time.sleep(1.0)
        stop.set()
        elapsed = time.monotonic() - t0
        cpu = process_cpu_s(proc.pid) - cpu0
        groups1 = _batcher_counters(proc.base) if system.name == "ki" else {}
        flushes = groups1.get("flushes", 0.0) - groups0.get("flushes", 0.0)
        if flushes > 0:
            res.requests_per_flush = (
                groups1.get("flushed_batches", 0.0) - groups0.get("flushed_batches", 0.0)
            ) / flushes
        sender.measuring = False
        if args.queries:
            querier.join(timeout=120)
        sender.stop.set()
        sender.join(timeout=120)
        lat, rounds, qerr = box.get("q", ([], [], ["the querier did not finish"] if args.queries else []))
        with sender.lock:
            res.sent_samples_per_s = sender.samples / elapsed
            res.write_errors = len(sender.errors)
            res.write_p99_ms = float(np.percentile(sender.latencies, 99) * 1000) if sender.latencies else 0.0
            res.max_lateness_s = sender.max_lateness
            res.first_errors = sender.errors[:3] + qerr[:3]
        res.cpu_pct = 100 * cpu / elapsed
        res.cpu_us_per_sample = 1e6 * cpu / max(1, sender.samples)
        res.rss_peak_mb = rss_peak / 1024
        res.rss_anon_peak_mb = anon_peak / 1024
        res.query_p50_ms = float(np.percentile(lat, 50) * 1000) if lat else 0.0
        res.query_p99_ms = float(np.percentile(lat, 99) * 1000) if lat else 0.0
        res.round_p99_s = float(np.percentile(rounds, 99)) if rounds else 0.0
        res.query_errors = len(qerr)
        res.holds = (
            res.write_errors == 0
            and res.max_lateness_s < args.interval
            and (bool(rounds) or not args.queries)
            and res.round_p99_s < args.interval
            and res.query_errors == 0
        )
    finally:
        proc.stop()
    total_sent = res.sent_samples_per_s * args.seconds
    res.disk_bytes_per_sample = _du(data) / max(1.0, total_sent + res.sent_samples_per_s * args.warmup)
    shutil.rmtree(data, ignore_errors=True)
    return res


PAGE = node_exporter_page()


def main() -> None:
    ap = argparse.ArgumentParser(prog="bench-fleet", description=__doc__.split("\n\n")[0])
    ap.add_argument("--targets", default="100,250,500,1000,2000", help="comma-separated N of targets")
    ap.add_argument("--systems", default="ki,prometheus-2,prometheus-3,vm-1.79,vm-1.145")
    ap.add_argument("--warmup", type=float, default=60.0, help="seconds of ingest before measuring")
    ap.add_argument("--seconds", type=float, default=300.0, help="seconds measured per system and N")
    ap.add_argument("--interval", type=float, default=10.0, help="scrape and rule interval, seconds")
    ap.add_argument(
        "--shards",
        type=int,
        default=16,
        help="remote_write connections, each with one request in flight (Prometheus scales its shards up to 50 when behind)",
    )
    ap.add_argument(
        "--churn",
        type=float,
        default=0.0,
        help="percent of targets replaced by new hosts every 10 minutes (prometheus-benchmark: 10)",
    )
    ap.add_argument(
        "--no-queries",
        dest="queries",
        action="store_false",
        help="ingest alone: no alert rounds (the ingest CPU per sample)",
    )
    ap.add_argument("--stop-after-fail", action="store_true", default=True,
                    help="skip larger N for a system once it fails to hold one")  # fmt: skip
    ap.add_argument("--json", type=Path, default=None, help="also write every result here")
    gpus.add_arguments(ap)
    args = ap.parse_args()
    names = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = [s for s in names if s not in SYSTEMS]
    if unknown:
        raise SystemExit(f"unknown systems {unknown}; known: {sorted(SYSTEMS)}")
    ns = [int(x) for x in args.targets.split(",")]
    results: list[Result] = []
    failed: set[str] = set()
    print(f"bench-fleet: {len(PAGE.labels)} series per target; load {os.getloadavg()[0]:.2f}", flush=True)
    with tempfile.TemporaryDirectory(prefix="ki-bench-fleet-") as tmp:
        root = Path(tmp)
        for n in ns:
            for name in names:
                if name in failed:
                    continue
                r = run_one(SYSTEMS[name], n, args, len(PAGE.labels), root)
                results.append(r)
                print(
                    f"{r.system:13s} N={n:5d} series={r.series:8d} holds={r.holds!s:5s} "
                    f"sent={r.sent_samples_per_s:8.0f}/s werr={r.write_errors} late={r.max_lateness_s:6.2f}s "
                    f"cpu={r.cpu_pct:6.1f}% us/sample={r.cpu_us_per_sample:6.2f} rss={r.rss_peak_mb:7.0f}MB anon={r.rss_anon_peak_mb:7.0f}MB "
                    f"disk={r.disk_bytes_per_sample:5.2f}B/s q50={r.query_p50_ms:7.1f}ms q99={r.query_p99_ms:7.1f}ms "
                    f"round99={r.round_p99_s:6.2f}s qerr={r.query_errors} req/flush={r.requests_per_flush:.1f} load={os.getloadavg()[0]:.2f} "
                    f"{'; '.join(r.first_errors)[:300]}",
                    flush=True,
                )
                if not r.holds and args.stop_after_fail:
                    failed.add(name)
    gpu_results = gpus.sweep(args)
    if args.json:
        args.json.write_text(
            json.dumps([asdict(r) for r in results] + [asdict(r) for r in gpu_results], indent=1)
        )
    print(f"{_bench_line(results)} {gpus.bench_keys(gpu_results)}")


def _held(results: list[Result], prefix: str) -> int:
    return max((r.targets for r in results if r.system.startswith(prefix) and r.holds), default=0)


def _bench_line(results: list[Result]) -> str:
    peer = next((p for p in ("prometheus-3", "prometheus-2") if any(r.system == p for r in results)), None)
    fields = {
        "targets_held": _held(results, "ki"),
        "prometheus_targets_held": _held(results, "prometheus"),
        "vm_targets_held": _held(results, "vm"),
    }
    ratios = {}
    if peer is not None:
        ki = {r.targets: r for r in results if r.system == "ki" and r.holds}
        pr = {r.targets: r for r in results if r.system == peer and r.holds}
        both = sorted(set(ki) & set(pr))
        if both:
            n = both[-1]
            a, b = ki[n], pr[n]
            ratios = {
                "query_p99_ratio_vs_prometheus": a.query_p99_ms / max(b.query_p99_ms, 1e-9),
                "round_p99_ratio_vs_prometheus": a.round_p99_s / max(b.round_p99_s, 1e-9),
                "rss_ratio_vs_prometheus": a.rss_peak_mb / max(b.rss_peak_mb, 1e-9),
                "rss_anon_ratio_vs_prometheus": a.rss_anon_peak_mb / max(b.rss_anon_peak_mb, 1e-9),
                "cpu_ratio_vs_prometheus": a.cpu_us_per_sample / max(b.cpu_us_per_sample, 1e-9),
                "ratio_targets": n,
            }
    out = " ".join(f"{k}={v}" for k, v in fields.items())
    out += "".join(f" {k}={v:.3g}" if isinstance(v, float) else f" {k}={v}" for k, v in ratios.items())
    return f"BENCH fleet {out} ratio_peer={peer or 'none'}"


if __name__ == "__main__":
    main()
