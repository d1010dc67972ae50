"""make bench-kql: ~28 GPU-fleet queries through ``ki collector``'s HTTP API, Prometheus 2.42 and VictoriaMetrics.

Dataset (bench/kql/data.py): 2,050 series over 7 h at 15 s. ``ki collector`` (a separate
process over an embedded store, bearer tokens checked), Prometheus (promtool-made blocks) and
VictoriaMetrics (imported; only when installed, response cache off) each answer every query over
one keep-alive connection, interleaved, in three modes: range 1 h at 15 s, range 6 h at 60 s and
instant. Query times sit off the sample grid (samples at x.250 s, queries at x.500 s; 2.x
includes a sample exactly at a window's start, 3.x does not). kql's answers must agree with
Prometheus'. When ``scripts/fetch_peers.sh`` has unpacked Prometheus 3.5 (``build/peers``), every
answer is also compared with 3.5's over a copy of the same blocks (not timed: ``agree 3.5``,
``agree_prometheus3=`` on the BENCH line; ``--no-prometheus3`` leaves it out); the ratios stay
against 2.42. kql is also timed in-process (the engine alone over a copy of the store) as a
second column. The collector's sample cache is warmed first (two passes over the queries).
Ratios are kql's HTTP time over Prometheus' HTTP time, medians of ``--reps`` runs (``--quick-reps``
for a query both answer in under 20 ms, whose few-run median moved too much to judge 1.0); all
servers share the machine, so ratios measured in one run are comparable even on a busy one.
Beside them, each server process's CPU (all threads) from a request until its answer was read,
median per query: it moves far less with the machine's load, but it counts the server's
background threads too, so it is meaningful for answers well above a millisecond.
Ends with one ``BENCH kql median_ratio_vs_prometheus=<n> geomean_ratio_vs_prometheus=<n>
instant_geomean_ratio=<n> refused=<n> ... cpu_geomean_ratio=<n> instant_cpu_geomean_ratio=<n>``
line (median and geomean over the range modes).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from bench.kql.data import HOURS, SCRAPE_MS, dataset, load_chdb, prometheus_text, write_promtool_blocks
from bench.kql.servers import (
    Collector,
    HttpQuerier,
    Prometheus,
    Server,
    VictoriaMetrics,
    peer_binary,
    process_cpu_s,
)
from kernel_insight.collector.clickhouse.store import EmbeddedStore
from kernel_insight.kql.engine import Engine
from kernel_insight.kql.errors import KqlError
from kernel_insight.kql.values import Matrix, Sample, Series, Vector

#: (name, query): what dashboards and alerts of a GPU fleet ask: selectors (an ``up``-like one of 25
#: series, absent), rates, windows up to 1 h, aggregations, topk, joins with group_left, alerts, a subquery.
QUERIES: list[tuple[str, str]] = [
    ("up_like", "ki_agent_drain_lag_seconds"),
    ("absent", 'absent(ki_agent_drain_lag_seconds{instance="node-99"})'),
    ("selector", "gpu_temperature_celsius"),
    ("selector_regex", 'gpu_power_watts{instance=~"node-0[0-4]"}'),
    ("rate", "rate(kernel_launches_total[5m])"),
    ("irate", 'irate(kernel_launches_total{kernel="gemm_fp16"}[1m])'),
    ("increase_1h", "increase(gpu_energy_joules_total[1h])"),
    ("resets_1h", "resets(gpu_energy_joules_total[1h])"),
    ("sum_by_rate", "sum by (instance) (rate(kernel_launches_total[5m]))"),
    ("sum_by_2_rate", "sum by (model, kernel) (rate(kernel_launches_total[5m]))"),
    ("avg_over_time", "avg_over_time(gpu_temperature_celsius[10m])"),
    ("avg_over_time_1h", "avg_over_time(gpu_power_watts[1h])"),
    ("max_over_time", "max_over_time(gpu_power_watts[5m])"),
    ("quantile_over_time", "quantile_over_time(0.9, gpu_sm_utilization_ratio[10m])"),
    ("stddev_over_time", "stddev_over_time(gpu_temperature_celsius[15m])"),
    ("deriv", "deriv(gpu_memory_used_bytes[10m])"),
    ("avg_by", "avg by (model) (gpu_sm_utilization_ratio)"),
    ("quantile_by", "quantile by (model) (0.95, gpu_temperature_celsius)"),
    ("topk", "topk(5, gpu_power_watts)"),
    ("count_by_cmp", "count by (instance) (gpu_temperature_celsius > 80)"),
    (
        "match_on",
        "sum by (instance, gpu) (rate(kernel_launches_total[5m])) / on (instance, gpu) group_left (model) gpu_power_watts",
    ),
    (
        "share_group_left",
        "sum by (instance, gpu) (rate(kernel_launches_total[5m])) / on (instance) group_left "
        "sum by (instance) (rate(kernel_launches_total[5m]))",
    ),
    (
        "mul_group_left",
        "rate(kernel_launches_total[5m]) * on (gpu, instance) group_left gpu_sm_utilization_ratio",
    ),
    (
        "alert_and",
        "gpu_temperature_celsius > 80 and on (instance, gpu) rate(gpu_energy_joules_total[5m]) > 600",
    ),
    ("alert_or", "gpu_temperature_celsius > 85 or gpu_power_watts > 650"),
    (
        "alert_count_avg_1h",
        "count_over_time(gpu_temperature_celsius[1h]) > 100 and avg_over_time(gpu_temperature_celsius[1h]) > 70",
    ),
    ("subquery", "max_over_time(rate(kernel_launches_total[5m])[30m:1m])"),
    ("sum_all_rate", "sum(rate(gpu_energy_joules_total[5m]))"),
]

#: A query whose kql and Prometheus answers both took less than this (medians of the first
#: ``--reps`` runs) is run ``--quick-reps`` times in all.
QUICK_S = 0.02

#: mode -> (range ms, step ms); step 0 is an instant query at the end time.
MODES: dict[str, tuple[int, int]] = {
    "range_1h": (3600_000, 15_000),
    "range_6h": (6 * 3600_000, 60_000),
    "instant": (0, 0),
}


def compare(a: Matrix, b: Matrix, rtol: float = 1e-6, atol: float = 1e-9) -> str:
    """'' when both matrices agree (same series, timestamps, values within tolerance), else why not."""
    da = {s.labels: s for s in a.series}
    db = {s.labels: s for s in b.series}
    if da.keys() != db.keys():
        only_a, only_b = sorted(da.keys() - db.keys()), sorted(db.keys() - da.keys())
        return (
            f"series differ: {len(only_a)} only in kql (e.g. {only_a[:1]}), "
            f"{len(only_b)} only in prometheus (e.g. {only_b[:1]})"
        )
    for labels, sa in da.items():
        sb = db[labels]
        if not np.array_equal(sa.timestamps, sb.timestamps):
            return f"timestamps differ for {labels}: {len(sa.timestamps)} vs {len(sb.timestamps)} points"
        va, vb = np.asarray(sa.values), np.asarray(sb.values)
        same = np.isclose(va, vb, rtol=rtol, atol=atol) | (np.isnan(va) & np.isnan(vb))
        if not same.all():
            i = int(np.flatnonzero(~same)[0])
            return f"values differ for {labels} at {int(sa.timestamps[i])}: {va[i]!r} vs {vb[i]!r}"
    return ""


def as_matrix(value: object) -> Matrix:
    """An in-process result in the form :func:`bench.kql.servers.matrix_of` gives HTTP answers."""
    if isinstance(value, Matrix):
        return value
    if isinstance(value, Vector):
        samples: tuple[Sample, ...] = value.samples
        out = [
            Series(s.labels, np.array([s.timestamp_ms]), np.array([s.value]))
            for s in sorted(samples, key=lambda s: s.labels)
        ]
        return Matrix(tuple(out))
    raise TypeError(f"unexpected result {type(value).__name__}")


@dataclasses.dataclass
class Row:
    mode: str
    name: str
    query: str
    kql: float  # median seconds through ki collector's HTTP API
    inproc: float  # median seconds of the engine alone, in this process
    prom: float
    vm: float  # nan when VictoriaMetrics is not there
    series: int
    refused: str  # kql's error where Prometheus answered
    why: str  # '' when kql agrees with Prometheus
    kql_cpu: float = math.nan  # CPU seconds of the collector process per answer (all its threads)
    prom_cpu: float = math.nan  # the same for Prometheus
    why3: str | None = None  # '' when kql agrees with Prometheus 3.5, None when 3.5 was not run

    @property
    def ratio(self) -> float:
        return self.kql / self.prom

    @property
    def cpu_ratio(self) -> float:
        return self.kql_cpu / self.prom_cpu


def geomean(xs: list[float]) -> float:
    return math.exp(statistics.fmean(math.log(x) for x in xs)) if xs else math.nan


def cpu_geomean(rows: list[Row]) -> float:
    """Geometric mean of the collector's CPU per answer over Prometheus' (rows with both measured)."""
    return geomean([r.cpu_ratio for r in rows if r.kql_cpu > 0 and r.prom_cpu > 0])


def prepare(root: Path, vm_wanted: bool) -> tuple[int, bool]:
    """Load the dataset into chDB (two copies: the collector's and the in-process one), Prometheus blocks, and
    VictoriaMetrics when wanted; reuse what a previous ``--keep`` run loaded. Returns (t0, VictoriaMetrics loaded)."""
    stamp = root / "t0"
    if stamp.exists():
        t0 = int(stamp.read_text())
        print(f"reusing the dataset in {root}", flush=True)
    else:
        now = int(time.time()) * 1000
        t0 = (now - (HOURS + 1) * 3600_000) // 3600_000 * 3600_000
        data = dataset(t0)
        print(
            f"dataset: {len(data)} series, {sum(len(ts) for _, ts, _ in data)} samples, "
            f"{HOURS} h at {SCRAPE_MS // 1000} s",
            flush=True,
        )
        began = time.perf_counter()
        load_chdb(root / "chdb", data)
        shutil.copytree(root / "chdb", root / "chdb-http", symlinks=True)  # chDB links are relative
        print(f"chDB load: {time.perf_counter() - began:.1f} s", flush=True)
        began = time.perf_counter()
        write_promtool_blocks(root, data, root / "prom")
        print(f"promtool blocks: {time.perf_counter() - began:.1f} s", flush=True)
        stamp.write_text(str(t0))
    vm_stamp = root / "vm-loaded"
    if vm_wanted and not vm_stamp.exists():
        began = time.perf_counter()
        vm = VictoriaMetrics(root / "vm", root / "vm.log")
        try:
            vm.load(prometheus_text(dataset(t0)))
        finally:
            vm.stop()
        vm_stamp.touch()
        print(f"VictoriaMetrics import: {time.perf_counter() - began:.1f} s", flush=True)
    return t0, vm_wanted


def timed(fn: Callable[[], object]) -> float:
    began = time.perf_counter()
    fn()
    return time.perf_counter() - began


def run_mode(
    mode: str,
    queries: list[tuple[str, str]],
    t0: int,
    offset_ms: int,
    reps: int,
    kql: HttpQuerier,
    prom: HttpQuerier,
    vm: HttpQuerier | None,
    engine: Engine,
    wait_idle: Callable[[], object],
    pids: dict[str, int] | None = None,
    quick_reps: int = 0,
    prom3: HttpQuerier | None = None,
) -> list[Row]:
    range_ms, step_ms = MODES[mode]
    end = t0 + HOURS * 3600_000 - 1000 + offset_ms  # off the sample grid: samples x.250 s, queries x.500 s
    start = end - range_ms

    def in_process(q: str) -> object:
        if step_ms:
            return engine.range_query(q, start, end, step_ms).value
        return engine.instant_query(q, end).value

    for _ in range(2):  # warm both sample caches: a miss queues the fill of its hours
        for _, q in queries:
            kql.query(q, start, end, step_ms)
            with contextlib.suppress(KqlError):
                in_process(q)
        wait_idle()
    rows = []
    for name, q in queries:
        expected, got = prom.query(q, start, end, step_ms), kql.query(q, start, end, step_ms)
        why, refused, inproc_ok = "", "", True
        if expected.matrix is None:
            why = f"prometheus refused: {expected.error}"
        elif got.matrix is None:
            refused = why = got.error
        else:
            why = compare(got.matrix, expected.matrix)
            try:
                mine = as_matrix(in_process(q))
            except KqlError as exc:
                why, inproc_ok = why or f"in-process: {exc}", False
            else:
                if not why and (diff := compare(mine, expected.matrix)):
                    why = f"in-process: {diff}"
        why3 = None
        if prom3 is not None:  # the differential against Prometheus 3.5 (not timed)
            newer = prom3.query(q, start, end, step_ms)
            if newer.matrix is None:
                why3 = f"prometheus 3.5 refused: {newer.error}"
            elif got.matrix is None:
                why3 = got.error
            else:
                why3 = compare(got.matrix, newer.matrix)
        times: dict[str, list[float]] = {"kql": [], "inproc": [], "prom": [], "vm": []}
        servers = [("kql", kql), ("prom", prom)] + ([("vm", vm)] if vm is not None else [])
        # CPU of the server process (all its threads) from the request until its answer was read:
        # unlike wall time it hardly moves with the machine's load (other processes, preemption).
        cpu: dict[str, list[float]] = {label: [] for label in pids or {}}
        rep, wanted = 0, reps
        while rep < wanted:
            # Interleaved, so load changes hit all alike, and each server goes first in turn: a Go
            # server's garbage collection after its answer runs into the next server's time.
            turn = rep % len(servers)
            for label, server in servers[turn:] + servers[:turn]:
                pid = (pids or {}).get(label)
                before = process_cpu_s(pid) if pid is not None else 0.0
                times[label].append(server.query(q, start, end, step_ms).seconds)
                if pid is not None:
                    cpu[label].append(process_cpu_s(pid) - before)
            if inproc_ok:
                times["inproc"].append(timed(lambda q=q: in_process(q)))  # type: ignore[misc]
            rep += 1
            if (
                rep == reps
                and max(statistics.median(times["kql"]), statistics.median(times["prom"])) < QUICK_S
            ):
                # A few-millisecond answer's median over 5 runs moves by 10-20% from run to run
                # on a busy host, more than what is judged against 1.0: more runs for those.
                wanted = max(reps, quick_reps)

        def med(label: str, times: dict[str, list[float]] = times) -> float:
            return statistics.median(times[label]) if times[label] else math.nan

        row = Row(
            mode,
            name,
            q,
            med("kql"),
            med("inproc"),
            med("prom"),
            med("vm"),
            len(got.matrix) if got.matrix is not None else 0,
            refused,
            why,
            statistics.median(cpu["kql"]) if cpu.get("kql") else math.nan,
            statistics.median(cpu["prom"]) if cpu.get("prom") else math.nan,
            why3,
        )
        rows.append(row)
        print(
            f"{mode:9s} {name:20s} kql {row.kql * 1000:7.1f} ms (in-process {row.inproc * 1000:7.1f})  "
            f"prom {row.prom * 1000:7.1f}  vm {row.vm * 1000:7.1f}  ratio {row.ratio:5.2f}  "
            f"vm/prom {row.vm / row.prom:5.2f}  cpu kql {row.kql_cpu * 1000:7.2f} prom {row.prom_cpu * 1000:7.2f} "
            f"ratio {row.cpu_ratio:5.2f}  series {row.series:5d}  "
            f"{'ok' if not why else 'REFUSED: ' + why if refused else 'DIFFER: ' + why}"
            f"{'' if why3 is None else '  3.5 ok' if not why3 else '  3.5 DIFFER: ' + why3}",
            flush=True,
        )
    return rows


def report(rows: list[Row], vm_on: bool) -> int:
    print()
    print(
        "| mode | query | kql ms (HTTP) | kql ms (in-process) | Prometheus ms | VictoriaMetrics ms "
        "| kql / Prometheus | VictoriaMetrics / Prometheus | CPU ms kql / Prometheus | series | agree "
        "| agree 3.5 |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|")
    for r in rows:
        print(
            f"| {r.mode} | `{r.query.replace('|', chr(92) + '|')}` | {r.kql * 1000:.1f} | {r.inproc * 1000:.1f} | "
            f"{r.prom * 1000:.1f} | {r.vm * 1000:.1f} | {r.ratio:.2f} | {r.vm / r.prom:.2f} | "
            f"{r.kql_cpu * 1000:.2f} / {r.prom_cpu * 1000:.2f} | {r.series} | "
            f"{'yes' if not r.why else ('REFUSED: ' if r.refused else 'no: ') + r.why} | "
            f"{'-' if r.why3 is None else 'yes' if not r.why3 else 'no: ' + r.why3} |"
        )
    answered = [r for r in rows if not r.refused and not math.isnan(r.prom)]
    print()
    print(
        "| mode | kql / Prometheus geomean | median | max | in-process / Prometheus geomean "
        "| VictoriaMetrics / Prometheus geomean | CPU kql / Prometheus geomean |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for mode in MODES:
        rs = [r for r in answered if r.mode == mode]
        if rs:
            print(
                f"| {mode} | {geomean([r.ratio for r in rs]):.2f} | {statistics.median(r.ratio for r in rs):.2f} | "
                f"{max(r.ratio for r in rs):.2f} | {geomean([r.inproc / r.prom for r in rs if not math.isnan(r.inproc)]):.2f} | "
                f"{geomean([r.vm / r.prom for r in rs]) if vm_on else math.nan:.2f} | {cpu_geomean(rs):.2f} |"
            )
    ranged = [r for r in answered if r.mode != "instant"]
    instant = [r for r in answered if r.mode == "instant"]
    refused = sum(1 for r in rows if r.refused)
    agree = sum(1 for r in rows if not r.why)
    newer = [r for r in rows if r.why3 is not None]
    agree3 = sum(1 for r in newer if not r.why3)
    over = sum(1 for r in answered if r.ratio > 1.0)
    vm_part = (
        f" vm_geomean_ratio={geomean([r.vm / r.prom for r in ranged]):.2f}"
        f" vm_instant_geomean_ratio={geomean([r.vm / r.prom for r in instant]):.2f}"
        if vm_on
        else ""
    )
    print(
        f"BENCH kql median_ratio_vs_prometheus={statistics.median(r.ratio for r in ranged) if ranged else math.nan:.2f} "
        f"geomean_ratio_vs_prometheus={geomean([r.ratio for r in ranged]):.2f} "
        f"instant_geomean_ratio={geomean([r.ratio for r in instant]):.2f} refused={refused} "
        f"agree={agree}/{len(rows)} agree_prometheus3={agree3}/{len(newer)} above_1={over} "
        f"inprocess_geomean_ratio={geomean([r.inproc / r.prom for r in ranged if not math.isnan(r.inproc)]):.2f}"
        f"{vm_part} cpu_geomean_ratio={cpu_geomean(ranged):.2f} instant_cpu_geomean_ratio={cpu_geomean(instant):.2f}"
    )
    return 0 if agree == len(rows) and agree3 == len(newer) else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.kql", description=__doc__)
    ap.add_argument("--reps", type=int, default=5, help="timed runs per query and server (median reported)")
    ap.add_argument(
        "--quick-reps",
        type=int,
        default=25,
        help=f"timed runs in all of a query whose answers take under {QUICK_S * 1000:.0f} ms (median reported)",
    )
    ap.add_argument("--only", default="", help="comma-separated query names to run")
    ap.add_argument("--modes", default=",".join(MODES), help=f"comma-separated modes ({', '.join(MODES)})")
    ap.add_argument(
        "--offset-ms",
        type=int,
        default=500,
        help="query times past the whole second (samples sit at .250 s: 250 puts steps on some samples' grid)",
    )
    ap.add_argument("--keep", type=Path, default=None, help="work directory to keep and reuse")
    ap.add_argument("--no-vm", action="store_true", help="leave VictoriaMetrics out even when installed")
    ap.add_argument(
        "--no-prometheus3",
        action="store_true",
        help="leave out the differential against Prometheus 3.5 (scripts/fetch_peers.sh unpacks it)",
    )
    args = ap.parse_args(argv)
    for tool in ("prometheus", "promtool"):
        if shutil.which(tool) is None:
            print(f"{tool} missing: apt-get install -y prometheus", file=sys.stderr)
            return 2
    vm_wanted = not args.no_vm and shutil.which("victoria-metrics") is not None
    if not vm_wanted and not args.no_vm:
        print("victoria-metrics not installed (apt-get install -y victoria-metrics): its column is left out")
    prom3_bin = None if args.no_prometheus3 else peer_binary("prometheus")
    if prom3_bin is None and not args.no_prometheus3:
        print("Prometheus 3.5 not unpacked (scripts/fetch_peers.sh): its differential is left out")
    root = args.keep or Path(tempfile.mkdtemp(prefix="bench-kql-"))
    root.mkdir(parents=True, exist_ok=True)
    only = {q for q in args.only.split(",") if q}
    queries = [(n, q) for n, q in QUERIES if not only or n in only]
    modes = [m for m in args.modes.split(",") if m]
    servers: list[Server] = []
    rows: list[Row] = []
    # SIGTERM ends the run through the finally below, which stops the servers it started.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        t0, vm_on = prepare(root, vm_wanted)
        prom = Prometheus(root / "prom", root / "prometheus.log")
        servers.append(prom)
        prom3 = None
        if prom3_bin is not None:
            # Its own copy of the blocks: a newer TSDB may rewrite what it opens.
            shutil.rmtree(root / "prom3", ignore_errors=True)
            shutil.copytree(root / "prom", root / "prom3", ignore=shutil.ignore_patterns("wal", "lock"))
            prom3 = Prometheus(root / "prom3", root / "prometheus3.log", prom3_bin)
            servers.append(prom3)
        vm = VictoriaMetrics(root / "vm", root / "vm.log") if vm_on else None
        if vm is not None:
            servers.append(vm)
        collector = Collector(root / "chdb-http", root, root / "collector.log")
        servers.append(collector)
        kql, pq = collector.querier(), prom.querier()
        vq = vm.querier() if vm is not None else None
        with EmbeddedStore(root / "chdb") as store:
            cache = store.sample_cache
            assert cache is not None, "the embedded store's sample cache is on by default"
            engine = Engine(store.storage())
            for mode in modes:
                rows += run_mode(
                    mode,
                    queries,
                    t0,
                    args.offset_ms,
                    args.reps,
                    kql,
                    pq,
                    vq,
                    engine,
                    cache.wait_idle,
                    {"kql": collector.proc.pid, "prom": prom.proc.pid},
                    args.quick_reps,
                    prom3.querier() if prom3 is not None else None,
                )
    finally:
        for server in reversed(servers):
            server.stop()
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)
    return report(rows, vm_on)


if __name__ == "__main__":
    sys.exit(main())
