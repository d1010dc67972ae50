"""make bench-kql: ~20 range queries through kql on embedded chDB and through Prometheus 2.42, side by side.

Dataset: 2,000 GPU series (gauges and counters, labels instance/gpu/kernel/model) over 6 h at
15 s. Prometheus gets the same samples through ``promtool tsdb create-blocks-from openmetrics``
and runs on loopback. Every query runs as a range query at times off the sample grid (2.x
includes a sample exactly at a window's start, 3.x does not); both answers must agree.
kql is timed four ways: through the embedded store's sample cache once it holds the hours
(the headline, what a dashboard or rule re-reading recent hours gets), on the first read
after the cache was cleared (cold: answered without it while its hours are queued for a
background fill), without the cache (ClickHouse computes grids: push-down), and with neither.
Ends with one ``BENCH kql median_ratio_vs_prometheus=<n> agree=<n>/<n> ...`` line.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

from kernel_insight.collector.query import ClickHouseStorage
from kernel_insight.collector.rows import SampleBuilder
from kernel_insight.collector.store import EmbeddedStore
from kernel_insight.kql.engine import Engine
from kernel_insight.kql.pushdown import SeriesColumns
from kernel_insight.kql.storage import Labels, Matcher, SeriesData
from kernel_insight.kql.values import Matrix

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]

SCRAPE_MS = 15_000
HOURS = 6
INSTANCES = 25
GPUS = 8
KERNELS = ("gemm_fp16", "flash_attn_fwd", "flash_attn_bwd", "nccl_allreduce", "layernorm")
MODELS = ("llama-70b", "llama-8b", "mistral-7b", "mixtral-8x22b")

#: (name, query): selectors, rate, *_over_time, aggregations with by, topk, vector matching,
#: alert-style and/or, a subquery.
QUERIES: list[tuple[str, str]] = [
    ("selector", "gpu_temperature_celsius"),
    ("selector_regex", 'gpu_power_watts{instance=~"node-0[0-4]"}'),
    ("rate", "rate(kernel_launches_total[5m])"),
    ("irate", 'irate(kernel_launches_total{kernel="gemm_fp16"}[1m])'),
    ("increase", "increase(gpu_energy_joules_total[1h])"),
    ("sum_by_rate", "sum by (instance) (rate(kernel_launches_total[5m]))"),
    ("sum_by_2_rate", "sum by (model, kernel) (rate(kernel_launches_total[5m]))"),
    ("avg_over_time", "avg_over_time(gpu_temperature_celsius[10m])"),
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
        "alert_and",
        "gpu_temperature_celsius > 80 and on (instance, gpu) rate(gpu_energy_joules_total[5m]) > 600",
    ),
    ("alert_or", "gpu_temperature_celsius > 85 or gpu_power_watts > 650"),
    ("subquery", "max_over_time(rate(kernel_launches_total[5m])[30m:1m])"),
    ("sum_all_rate", "sum(rate(gpu_energy_joules_total[5m]))"),
]


# --------------------------------------------------------------------------------- data


def dataset(t0_ms: int, seed: int = 5) -> list[tuple[Labels, I64, F64]]:
    """2,000 series: 4 gauges and 1 energy counter per GPU (1,000) plus launches per kernel per GPU (1,000).

    Each instance scrapes at its own phase (whole seconds + 250 ms); counters reset once on a few GPUs
    (a process restart), so rate/increase see resets as in a real fleet.
    """
    rng = np.random.default_rng(seed)
    points = HOURS * 3600_000 // SCRAPE_MS
    out: list[tuple[Labels, I64, F64]] = []
    for n in range(INSTANCES):
        inst = f"node-{n:02d}"
        model = MODELS[n % len(MODELS)]
        # Scrapes at x.250 s: query steps (x.500 s) and subquery steps (whole minutes) never hit a sample.
        ts = t0_ms + (n % 15) * 1000 + 250 + np.arange(points, dtype=np.int64) * SCRAPE_MS
        for gpu in range(GPUS):
            base = {"instance": inst, "gpu": str(gpu), "model": model}
            load = np.clip(0.6 + np.cumsum(rng.normal(0, 0.02, points)), 0.0, 1.0)

            def add(
                name: str,
                values: F64,
                extra: dict[str, str] | None = None,
                base: dict[str, str] = base,
                ts: I64 = ts,
            ) -> None:
                labels = {**base, **(extra or {}), "__name__": name}
                out.append((tuple(sorted(labels.items())), ts, np.round(values, 6)))

            add("gpu_temperature_celsius", 45 + 40 * load + rng.normal(0, 1.5, points))
            add("gpu_power_watts", 120 + 560 * load + rng.normal(0, 15, points))
            add("gpu_sm_utilization_ratio", np.clip(load + rng.normal(0, 0.05, points), 0, 1))
            add("gpu_memory_used_bytes", np.floor((20 + 50 * load) * 2**30))
            reset = int(rng.integers(points // 4, points)) if rng.random() < 0.2 else points
            energy = np.cumsum((120 + 560 * load) * 15.0)
            energy[reset:] -= energy[reset - 1] if reset < points else 0
            add("gpu_energy_joules_total", energy)
            for k, kernel in enumerate(KERNELS):
                per_scrape = rng.poisson(200 * (k + 1) * load + 1)
                launches = np.cumsum(per_scrape).astype(np.float64)
                if reset < points:
                    launches[reset:] -= launches[reset - 1]
                add("kernel_launches_total", launches, {"kernel": kernel})
    return out


def load_chdb(path: Path, data: list[tuple[Labels, I64, F64]]) -> None:
    with EmbeddedStore(path) as store:
        for i in range(0, len(data), 250):
            b = SampleBuilder()
            for labels, ts, vs in data[i : i + 250]:
                b.add_series(labels, ts, vs)
            store.insert_samples(b.build(), dedup_token=f"bench-kql:{i}")
        store.optimize("samples")


def write_openmetrics(path: Path, data: list[tuple[Labels, I64, F64]]) -> None:
    """OpenMetrics text for promtool: one family at a time, series contiguous, timestamps in seconds."""
    by_name: dict[str, list[tuple[Labels, I64, F64]]] = {}
    for item in data:
        by_name.setdefault(dict(item[0])["__name__"], []).append(item)
    with path.open("w") as f:
        for name, items in by_name.items():
            kind = "counter" if name.endswith("_total") else "gauge"
            family = name.removesuffix("_total") if kind == "counter" else name
            f.write(f"# TYPE {family} {kind}\n")
            for labels, ts, vs in items:
                lab = ",".join(f'{k}="{v}"' for k, v in labels if k != "__name__")
                head = f"{name}{{{lab}}} "
                f.writelines(
                    f"{head}{v!r} {t // 1000}.{t % 1000:03d}\n"
                    for v, t in zip(vs.tolist(), ts.tolist(), strict=True)
                )
        f.write("# EOF\n")


# --------------------------------------------------------------------------------- prometheus


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Prometheus:
    """A Prometheus 2.x server on loopback over promtool-made blocks; stopped on exit."""

    def __init__(self, data_dir: Path, log: Path) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self._log = log.open("w")
        self.proc = subprocess.Popen(
            [
                "prometheus",
                f"--storage.tsdb.path={data_dir}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                f"--config.file={self._config(data_dir.parent)}",
                "--storage.tsdb.retention.time=100y",
                "--query.max-samples=500000000",
                "--query.timeout=5m",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    @staticmethod
    def _config(root: Path) -> Path:
        cfg = root / "prometheus.yml"
        cfg.write_text("global:\n  scrape_interval: 1h\nscrape_configs: []\n")
        return cfg

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited with {self.proc.returncode}; see {self._log.name}")
            try:
                with urllib.request.urlopen(self.base + "/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError("prometheus not ready in time")

    def range_query(
        self, query: str, start_ms: int, end_ms: int, step_ms: int
    ) -> tuple[Matrix, float, float]:
        """(result, HTTP wall seconds, engine seconds as Prometheus's own stats report them)."""
        params = urllib.parse.urlencode(
            {
                "query": query,
                "start": f"{start_ms / 1000:.3f}",
                "end": f"{end_ms / 1000:.3f}",
                "step": f"{step_ms / 1000:.3f}",
                "stats": "all",
            }
        )
        began = time.perf_counter()
        with urllib.request.urlopen(f"{self.base}/api/v1/query_range?{params}", timeout=600) as r:
            body = r.read()
        wall = time.perf_counter() - began
        doc = json.loads(body)
        if doc.get("status") != "success":
            raise RuntimeError(f"prometheus: {doc}")
        timings = doc["data"].get("stats", {}).get("timings", {})
        engine = float(timings.get("execTotalTime", wall))
        from kernel_insight.kql.values import Series

        series = []
        for item in doc["data"]["result"]:
            labels = tuple(sorted(item["metric"].items()))
            ts = np.array([round(float(t) * 1000) for t, _ in item["values"]], dtype=np.int64)
            vs = np.array([float(v) for _, v in item["values"]], dtype=np.float64)
            series.append(Series(labels, ts, vs))
        series.sort(key=lambda s: s.labels)
        return Matrix(tuple(series)), wall, engine

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


# --------------------------------------------------------------------------------- compare


def compare(a: Matrix, b: Matrix, rtol: float = 1e-6, atol: float = 1e-9) -> str:
    """'' when both matrices agree (same series, timestamps, values within tolerance), else why not."""
    da = {s.labels: s for s in a.series}
    db = {s.labels: s for s in b.series}
    if da.keys() != db.keys():
        only_a, only_b = sorted(da.keys() - db.keys()), sorted(db.keys() - da.keys())
        return f"series differ: {len(only_a)} only in kql (e.g. {only_a[:1]}), {len(only_b)} only in prometheus (e.g. {only_b[:1]})"
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


class RawReads:
    """The same store without its push-down methods: the engine reads raw samples (columnar) and computes all."""

    def __init__(self, inner: ClickHouseStorage) -> None:
        self._inner = inner

    def select(self, matchers: Sequence[Matcher], start_ms: int, end_ms: int) -> list[SeriesData]:
        return self._inner.select(matchers, start_ms, end_ms)

    def select_columns(self, matchers: Sequence[Matcher], start_ms: int, end_ms: int) -> SeriesColumns:
        return self._inner.select_columns(matchers, start_ms, end_ms)

    def label_names(self, matchers: Sequence[Matcher], start_ms: int, end_ms: int) -> list[str]:
        return self._inner.label_names(matchers, start_ms, end_ms)

    def label_values(self, name: str, matchers: Sequence[Matcher], start_ms: int, end_ms: int) -> list[str]:
        return self._inner.label_values(name, matchers, start_ms, end_ms)


@dataclasses.dataclass(frozen=True)
class Row:
    name: str
    query: str
    kql: dict[str, float]  # median seconds: cached (warm), cold, pushdown (no cache), raw (neither)
    prom: float  # median seconds, as --prometheus-time chooses
    prom_http: float
    series: int
    why: str  # '' when every kql path agreed with Prometheus


def timed(fn: Callable[[], object], reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        began = time.perf_counter()
        fn()
        out.append(time.perf_counter() - began)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.kql", description=__doc__)
    ap.add_argument("--reps", type=int, default=5, help="timed runs per query and engine (median reported)")
    ap.add_argument("--step", type=float, default=60.0, help="range query step in seconds")
    ap.add_argument("--only", default="", help="comma-separated query names to run")
    ap.add_argument(
        "--offset-ms",
        type=int,
        default=500,
        help="query times past the whole second (samples sit at .250 s: 250 puts steps on some samples' grid)",
    )
    ap.add_argument(
        "--keep", type=Path, default=None, help="work directory to keep (default: a temporary one)"
    )
    ap.add_argument(
        "--prometheus-time",
        choices=("engine", "http"),
        default="engine",
        help="compare against Prometheus's own execTotalTime (default) or its HTTP round trip",
    )
    args = ap.parse_args(argv)
    for tool in ("prometheus", "promtool"):
        if shutil.which(tool) is None:
            print(f"{tool} missing: apt-get install -y prometheus", file=sys.stderr)
            return 2
    root = args.keep or Path(tempfile.mkdtemp(prefix="bench-kql-"))
    root.mkdir(parents=True, exist_ok=True)
    now = int(time.time()) * 1000
    t0 = (now - (HOURS + 1) * 3600_000) // 3600_000 * 3600_000
    stamp = root / "t0"
    if args.keep is not None and stamp.exists():
        t0 = int(stamp.read_text())  # reuse the data a previous --keep run loaded
        print(f"reusing the dataset in {root}", flush=True)
    else:
        data = dataset(t0)
        samples = sum(len(ts) for _, ts, _ in data)
        print(
            f"dataset: {len(data)} series, {samples} samples, {HOURS} h at {SCRAPE_MS // 1000} s", flush=True
        )
        began = time.perf_counter()
        load_chdb(root / "chdb", data)
        print(f"chDB load: {time.perf_counter() - began:.1f} s", flush=True)
        om = root / "data.om"
        began = time.perf_counter()
        write_openmetrics(om, data)
        subprocess.run(
            ["promtool", "tsdb", "create-blocks-from", "openmetrics", str(om), str(root / "prom")],
            check=True,
            capture_output=True,
        )
        om.unlink()
        print(f"promtool blocks: {time.perf_counter() - began:.1f} s", flush=True)
        del data
        stamp.write_text(str(t0))

    # Off the sample grid: samples sit on x.250 s, queries on x.500 s.
    step_ms = round(args.step * 1000)
    start = t0 + 3600_000 + args.offset_ms
    end = t0 + HOURS * 3600_000 - 1000 + args.offset_ms
    only = {q for q in args.only.split(",") if q}
    queries = [(n, q) for n, q in QUERIES if not only or n in only]

    prom = Prometheus(root / "prom", root / "prometheus.log")
    rows: list[Row] = []
    try:
        prom.wait_ready()
        with EmbeddedStore(root / "chdb") as store:
            cache = store.sample_cache
            assert cache is not None, "the embedded store's sample cache is on by default"
            # The dataset's hours all ended over an hour ago: settled, so the cache may serve them.
            engines = {
                "cached": Engine(store.storage()),
                "pushdown": Engine(store.storage(use_cache=False)),
                "raw": Engine(RawReads(store.storage(use_cache=False))),
            }
            for name, query in queries:
                expected, _, _ = prom.range_query(query, start, end, step_ms)
                why = ""
                got = Matrix(())
                for label, eng in engines.items():
                    answer = eng.range_query(query, start, end, step_ms).value
                    assert isinstance(answer, Matrix)
                    if label == "cached":
                        got = answer
                    if not why and (diff := compare(answer, expected)):
                        why = f"{label}: {diff}"
                times: dict[str, list[float]] = {"cold": [], "cached": [], "pushdown": [], "raw": []}
                run = functools.partial(engines["cached"].range_query, query, start, end, step_ms)
                for _ in range(args.reps):  # interleaved, so load changes hit all alike
                    cache.clear()
                    times["cold"] += timed(run, 1)  # answered without the cache; queues its fill
                    cache.wait_idle()  # the fill runs in the background (a dashboard refreshes later)
                    times["cached"] += timed(run, 1)
                    for label in ("pushdown", "raw"):
                        eng = engines[label]
                        times[label] += timed(
                            functools.partial(eng.range_query, query, start, end, step_ms), 1
                        )
                prom_wall, prom_engine = [], []
                for _ in range(args.reps):
                    _, wall, eng_s = prom.range_query(query, start, end, step_ms)
                    prom_wall.append(wall)
                    prom_engine.append(eng_s)
                med = {label: statistics.median(ts) for label, ts in times.items()}
                p = statistics.median(prom_engine if args.prometheus_time == "engine" else prom_wall)
                rows.append(Row(name, query, med, p, statistics.median(prom_wall), len(got), why))
                print(
                    f"{name:20s} kql {med['cached'] * 1000:7.1f} ms (cold {med['cold'] * 1000:7.1f}, "
                    f"no cache {med['pushdown'] * 1000:7.1f}, no push-down {med['raw'] * 1000:7.1f})  "
                    f"prom {p * 1000:7.1f} ms (http {statistics.median(prom_wall) * 1000:7.1f})  "
                    f"ratio {med['cached'] / p:5.2f}  series {len(got):5d}  {'ok' if not why else 'DIFFER: ' + why}",
                    flush=True,
                )
            print(f"sample cache after the run: {cache.stats()}")
    finally:
        prom.stop()
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)

    print()
    print(
        "| query | kql ms | kql ms, cold cache | kql ms, no cache | kql ms, no cache, no push-down "
        "| Prometheus ms (engine) | Prometheus ms (HTTP) | ratio | ratio, no cache | series | agree |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for row in rows:
        m = row.kql
        print(
            f"| `{row.query.replace('|', chr(92) + '|')}` | {m['cached'] * 1000:.1f} | {m['cold'] * 1000:.1f} | "
            f"{m['pushdown'] * 1000:.1f} | {m['raw'] * 1000:.1f} | {row.prom * 1000:.1f} | {row.prom_http * 1000:.1f} | "
            f"{m['cached'] / row.prom:.2f} | {m['pushdown'] / row.prom:.2f} | {row.series} | "
            f"{'yes' if not row.why else 'no: ' + row.why} |"
        )
    agree = sum(1 for row in rows if not row.why)

    def median_ratio(label: str) -> float:
        return statistics.median([row.kql[label] / row.prom for row in rows]) if rows else math.nan

    print(
        f"BENCH kql median_ratio_vs_prometheus={median_ratio('cached'):.2f} agree={agree}/{len(rows)} "
        f"cold_median_ratio={median_ratio('cold'):.2f} nocache_median_ratio={median_ratio('pushdown'):.2f}"
    )
    return 0 if agree == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
