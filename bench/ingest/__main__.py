"""Ingest into embedded chDB, end to end from decoded rows to rows visible to queries.

Targets (issue 4): >= 1M samples/s, >= 500k kernel spans/s, <= 1.5 bytes per sample on disk
for realistic gauge and counter data. Run: ``python -m bench.ingest [--quick]``.
Ends with one ``BENCH ingest samples_per_s=<n> spans_per_s=<n> bytes_per_sample=<n>`` line.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import numpy.typing as npt

from kernel_insight.agent import RECORD_DTYPE, RecordType
from kernel_insight.collector.clickhouse.store import EmbeddedStore
from kernel_insight.collector.derive import Deriver
from kernel_insight.collector.rows import Labels, SampleBatch, SpanBatch, canonical_labels

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]

#: A mix shaped like an NVML / dcgm-exporter scrape: slow integer gauges, step-changing gauges,
#: noisy floats, flat and busy counters (docs/storage.md, "Bytes per sample").
KINDS = (
    "temp",
    "mem_temp",
    "power",
    "sm_clock",
    "util",
    "mem_used",
    "energy_total",
    "ecc_total",
    "launches_total",
    "nvlink_tx_total",
)


def _series(n_series: int) -> list[Labels]:
    """Per GPU, eight metrics as an NVML/DCGM exporter would scrape them."""
    out = []
    for i in range(n_series):
        kind = KINDS[i % len(KINDS)]
        gpu = i // len(KINDS)
        out.append(
            canonical_labels(
                {
                    "__name__": f"gpu_{kind}",
                    "instance": f"node-{gpu // 8:04d}",
                    "gpu": str(gpu % 8),
                    "model": "H100",
                }
            )
        )
    return out


def _values(kind: str, n: int, rng: np.random.Generator) -> F64:
    """Realistic shapes: integer gauges that drift, step changes, noisy floats, counters."""
    steps = np.arange(n)
    if kind in ("temp", "mem_temp"):
        return (
            (60 + np.cumsum(rng.integers(-1, 2, n) * (rng.random(n) < 0.2))).clip(30, 90).astype(np.float64)
        )
    if kind == "power":
        return np.round(400 + 50 * np.sin(steps / 40) + rng.normal(0, 5, n), 1)
    if kind == "sm_clock":
        return np.repeat(rng.choice([1410e6, 1980e6], n // 500 + 1), 500)[:n]
    if kind == "util":
        return np.repeat(rng.integers(0, 101, n // 20 + 1) / 100, 20)[:n]
    if kind == "mem_used":
        return np.repeat(rng.integers(10, 80, n // 100 + 1) * float(1 << 30), 100)[:n]
    if kind == "energy_total":
        return np.cumsum(rng.integers(5000, 7000, n)).astype(np.float64)
    if kind == "ecc_total":
        return np.cumsum(rng.random(n) < 0.001).astype(np.float64)
    if kind == "launches_total":
        return np.cumsum(rng.integers(900, 1100, n)).astype(np.float64)
    busy = np.repeat(rng.random(n // 40 + 1) < 0.5, 40)[:n]  # NVLink: bursts of traffic, idle between
    return np.cumsum(busy * rng.integers(1 << 29, 1 << 30, n)).astype(np.float64)


def _scrapes(series: list[Labels], points: int, t0_ms: int, step_ms: int, seed: int = 1) -> tuple[F64, I64]:
    """Values and timestamps, one row per series."""
    rng = np.random.default_rng(seed)
    n = len(series)
    vals = np.stack([_values(dict(s)["__name__"][4:], points, rng) for s in series])  # (series, points)
    jitter = rng.integers(-1, 2, (n, points)) * (rng.random((n, points)) < 0.3)  # ms jitter of real clocks
    ts = t0_ms + np.arange(points) * step_ms + jitter
    return vals, ts


def _batches(series: list[Labels], vals: F64, ts: I64, per_batch_points: int) -> Iterator[SampleBatch]:
    """Time-major chunks of every series, as scrapes arrive."""
    n, points = vals.shape
    idx_one = np.repeat(np.arange(n, dtype=np.int32), per_batch_points)
    for p in range(0, points, per_batch_points):
        q = min(points, p + per_batch_points)
        k = q - p
        idx = idx_one if k == per_batch_points else np.repeat(np.arange(n, dtype=np.int32), k)
        yield SampleBatch(series, idx, ts[:, p:q].ravel().astype(np.int64), vals[:, p:q].ravel())


def bench_samples(path: Path, n_series: int, points: int, per_batch: int) -> tuple[float, int]:
    series = _series(n_series)
    t0 = (int(time.time()) // 86400) * 86_400_000 - 86_400_000
    vals, ts = _scrapes(series, points, t0, 10_000)
    batches = list(_batches(series, vals, ts, per_batch))
    total = sum(len(b) for b in batches)
    with EmbeddedStore(path) as store:
        store.insert_batch("warmup", samples=batches[0])  # first-use imports and caches, not timed
        start = time.perf_counter()
        for i, b in enumerate(batches[1:]):
            store.insert_batch(f"bench:{i}", samples=b)
        visible = store.query("SELECT count() AS c FROM ki.samples").column("c")[0].as_py()
        elapsed = time.perf_counter() - start
        assert visible == total, (visible, total)
    return (total - len(batches[0])) / elapsed, total - len(batches[0])


def bytes_per_sample(path: Path, n_series: int, points: int) -> tuple[float, float, int]:
    """After merging, compressed bytes of the samples table (and with the series index) per sample."""
    series = _series(n_series)
    t0 = (int(time.time()) // 86400) * 86_400_000 - 86_400_000
    vals, ts = _scrapes(series, points, t0, 15_000, seed=2)
    with EmbeddedStore(path) as store:
        for i, b in enumerate(_batches(series, vals, ts, 240)):
            store.insert_samples(b, dedup_token=f"bps:{i}")
        store.optimize("samples")
        store.optimize("series")
        n = vals.size
        samples_b = store.disk_bytes("samples")
        total_b = samples_b + store.disk_bytes("series")
    return samples_b / n, total_b / n, n


def _exposition(series: list[Labels], vals: F64, ts: I64, path: Path, openmetrics: bool) -> None:
    """The same samples as text: OpenMetrics (seconds) for promtool, Prometheus text (ms) for VictoriaMetrics."""
    with path.open("w") as f:
        for i, labels in enumerate(series):
            d = dict(labels)
            name = d.pop("__name__")
            lab = ",".join(f'{k}="{v}"' for k, v in sorted(d.items()))
            head = f"{name}{{{lab}}} "
            if openmetrics:
                f.writelines(
                    f"{head}{v!r} {t / 1000:.3f}\n"
                    for v, t in zip(vals[i].tolist(), ts[i].tolist(), strict=True)
                )
            else:
                f.writelines(
                    f"{head}{v!r} {t}\n" for v, t in zip(vals[i].tolist(), ts[i].tolist(), strict=True)
                )
        if openmetrics:
            f.write("# EOF\n")


def _du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def compare(root: Path, n_series: int, points: int) -> dict[str, float]:
    """Bytes per sample of chDB, Prometheus (promtool blocks) and VictoriaMetrics on identical data."""
    import shutil as sh
    import subprocess
    import urllib.request

    series = _series(n_series)
    t0 = (int(time.time()) // 86400) * 86_400_000 - 86_400_000
    vals, ts = _scrapes(series, points, t0, 15_000, seed=2)
    n = vals.size
    out: dict[str, float] = {}
    with EmbeddedStore(root / "cmp-chdb") as store:
        for i, b in enumerate(_batches(series, vals, ts, 240)):
            store.insert_samples(b, dedup_token=f"cmp:{i}")
        store.optimize("samples")
        out["chdb"] = store.disk_bytes("samples") / n
    if sh.which("promtool"):
        om = root / "cmp.om"
        _exposition(series, vals, ts, om, openmetrics=True)
        blocks = root / "prom-blocks"
        subprocess.run(
            [
                "promtool",
                "tsdb",
                "create-blocks-from",
                "openmetrics",
                "--max-block-duration=24h",
                str(om),
                str(blocks),
            ],
            check=True,
            capture_output=True,
        )
        out["prometheus"] = _du(blocks) / n
        om.unlink()
    if sh.which("victoria-metrics"):
        text = root / "cmp.prom"
        _exposition(series, vals, ts, text, openmetrics=False)
        data = root / "vm-data"
        port = 18428
        proc = subprocess.Popen(
            [
                "victoria-metrics",
                f"-storageDataPath={data}",
                f"-httpListenAddr=127.0.0.1:{port}",
                "-retentionPeriod=100y",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            base = f"http://127.0.0.1:{port}"
            for _ in range(100):
                try:
                    urllib.request.urlopen(base + "/health", timeout=1).read()
                    break
                except OSError:
                    time.sleep(0.1)
            req = urllib.request.Request(
                base + "/api/v1/import/prometheus", data=text.read_bytes(), method="POST"
            )
            urllib.request.urlopen(req, timeout=300).read()
            urllib.request.urlopen(base + "/internal/force_flush", timeout=60).read()
            month = time.strftime("%Y_%m", time.gmtime(t0 / 1000))
            urllib.request.urlopen(
                base + f"/internal/force_merge?partition_prefix={month}", timeout=300
            ).read()
            time.sleep(3)
            out["victoriametrics"] = _du(data / "data") / n
            out["victoriametrics_with_index"] = _du(data) / n
        finally:
            proc.terminate()
            proc.wait()
        text.unlink()
    return out


def bench_spans(path: Path, total: int, per_batch: int) -> float:
    rng = np.random.default_rng(3)
    kernels = [f"kernel_{i}" for i in range(200)]
    base = time.time_ns() - 3_600_000_000_000
    batches = []
    for b in range(total // per_batch):
        start = base + b * per_batch * 20_000 + np.cumsum(rng.integers(1_000, 30_000, per_batch))
        dur = rng.lognormal(11, 0.6, per_batch).astype(np.int64)
        batches.append(
            SpanBatch(
                instance=["node-0001"] * per_batch,
                gpu=rng.integers(0, 8, per_batch).astype(np.uint16),
                stream=rng.integers(0, 4, per_batch).astype(np.uint64),
                kernel=[kernels[i] for i in rng.integers(0, len(kernels), per_batch)],
                start_ns=start.astype(np.int64),
                end_ns=(start + dur).astype(np.int64),
                correlation=np.arange(b * per_batch, (b + 1) * per_batch, dtype=np.uint64),
                pid=np.full(per_batch, 4242, np.uint32),
            )
        )
    with EmbeddedStore(path) as store:
        store.insert_batch("warmup", spans=batches[0])
        t = time.perf_counter()
        for i, s in enumerate(batches[1:]):
            store.insert_batch(f"spans:{i}", spans=s)
        visible = store.query("SELECT count() AS c FROM ki.kernel_spans").column("c")[0].as_py()
        elapsed = time.perf_counter() - t
        assert visible == len(batches) * per_batch
    return float(visible - per_batch) / elapsed


def _kernel_records(b: int, n: int, rng: np.random.Generator) -> npt.NDArray[np.void]:
    """One agent batch of KERNEL records as the wire decoder hands them over (RECORD_DTYPE)."""
    a = np.zeros(n, RECORD_DTYPE)
    a["pos"] = np.arange(n) + b * n
    a["producer"] = 1
    a["type"] = RecordType.KERNEL
    a["id"] = rng.integers(1, 201, n)
    a["device"] = rng.integers(0, 8, n)
    start = time.time_ns() - 3_600_000_000_000 + b * n * 20_000 + np.cumsum(rng.integers(1_000, 30_000, n))
    a["ts_ns"] = start
    payload = np.zeros(
        n, np.dtype([("end", "<u8"), ("stream", "<u8"), ("corr", "<u8"), ("pid", "<u4"), ("r", "<u4")])
    )
    payload["end"] = start + rng.lognormal(11, 0.6, n).astype(np.int64)
    payload["stream"] = rng.integers(0, 4, n)
    payload["corr"] = np.arange(n) + b * n
    payload["pid"] = 4242
    a["payload"] = payload.view("V32")
    return a


def bench_records(path: Path, total: int, per_batch: int) -> float:
    """KERNEL records -> Deriver (spans + per-kernel metrics) -> insert_batch -> visible."""
    rng = np.random.default_rng(4)
    names = {(1, i): f"kernel_{i}" for i in range(1, 201)}
    batches = [_kernel_records(b, per_batch, rng) for b in range(total // per_batch + 1)]
    deriver = Deriver("node-0001")
    with EmbeddedStore(path) as store:
        d = deriver.derive(batches[0], strings=names)
        store.insert_batch("warmup", samples=d.samples, spans=d.spans)
        t = time.perf_counter()
        for i, b in enumerate(batches[1:]):
            d = deriver.derive(b, strings=names)
            store.insert_batch(f"records:{i}", samples=d.samples, spans=d.spans)
        visible = store.query("SELECT count() AS c FROM ki.kernel_spans").column("c")[0].as_py()
        elapsed = time.perf_counter() - t
        assert visible == len(batches) * per_batch
    return float(visible - per_batch) / elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--quick", action="store_true", help="small sizes, a smoke run")
    ap.add_argument(
        "--compare",
        action="store_true",
        help="also measure Prometheus (promtool) and VictoriaMetrics bytes/sample on the same data",
    )
    args = ap.parse_args()
    n_series = 1000 if args.quick else 2000
    root = Path(tempfile.mkdtemp(prefix="ki-bench-ingest-"))
    try:
        sps, n = bench_samples(root / "samples", n_series, 200 if args.quick else 2000, 50)
        print(f"samples: {n} in batches of {n_series * 50}: {sps:,.0f} samples/s (decoded rows -> visible)")
        spans_total = 200_000 if args.quick else 2_000_000
        sp = bench_spans(root / "spans", spans_total, 50_000)
        print(f"spans: {spans_total} in batches of 50000: {sp:,.0f} spans/s (decoded span rows -> visible)")
        rec_total = 200_000 if args.quick else 1_000_000
        rp = bench_records(root / "records", rec_total, 50_000)
        print(
            f"kernel records: {rec_total} in batches of 50000: {rp:,.0f} records/s (derive spans + metrics -> visible)"
        )
        bps, bps_total, n2 = bytes_per_sample(root / "bps", 1000, 1440 if args.quick else 5760)
        print(
            f"on disk: {bps:.3f} bytes/sample (samples table), {bps_total:.3f} with the series index, {n2} samples"
        )
        if args.compare:
            for name, value in compare(root, 1000, 1440).items():
                print(f"compare: {name} {value:.3f} bytes/sample (1000 series x 1440 points at 15 s)")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"BENCH ingest samples_per_s={sps:.0f} spans_per_s={sp:.0f} bytes_per_sample={bps:.3f}")


if __name__ == "__main__":
    main()
