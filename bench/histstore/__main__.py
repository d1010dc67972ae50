"""Native histograms on disk: bytes per histogram sample in the ``histograms`` table, per codec choice.

Data: kernel-latency histograms as Prometheus scrapes them (cumulative counters at 15 s,
schema 3, sparse buckets that fill in over time): ``--series`` series (kernels x GPUs), each
with its own launch rate (1 to 2,000/s) and a log-normal duration with a long tail (a few
percent of launches 10-100x slower), ``--hours`` of samples. Every codec variant gets the
same rows (one table per variant, merged into one part), so the figures compare codecs only.
Run: ``python -m bench.histstore [--quick]``. Ends with one
``BENCH histstore bytes_per_histogram=<n> buckets_per_histogram=<n> insert_histograms_per_s=<n>
read_histograms_per_s=<n> read_histograms_per_cpu_s=<n>`` line (the read: one hour of every series as
kql's storage returns it, columns, and the dense blocks kql's histogram paths build of them).
"""

from __future__ import annotations

import argparse
import itertools
import math
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import numpy.typing as npt

from kernel_insight.collector.clickhouse.schema import SCHEMA, Table, single_ddl
from kernel_insight.collector.clickhouse.store import EmbeddedStore
from kernel_insight.collector.rows import HistogramBatch, HistogramBuilder
from kernel_insight.kql.histdense import DENSE_CHUNK, DenseBlock
from kernel_insight.kql.storage import Matcher

SCHEMA_N = 3
STEP_MS = 15_000


def _bucket_probabilities(rng: np.random.Generator) -> tuple[int, npt.NDArray[np.float64]]:
    """(first bucket index, probabilities) of one kernel's durations at schema 3."""
    median = math.exp(rng.uniform(math.log(5e-6), math.log(5e-3)))  # 5 us .. 5 ms
    sigma = rng.uniform(0.05, 0.4)
    draws = median * np.exp(rng.normal(0, sigma, 20_000))
    tail = rng.random(20_000) < rng.uniform(0.001, 0.03)  # stragglers: 10-100x slower
    draws[tail] *= np.exp(rng.uniform(math.log(10), math.log(100), int(tail.sum())))
    # Prometheus' bucket index at schema s: ceil(log2(v) * 2^s) (upper bound inclusive).
    idx = np.ceil(np.log2(draws) * (1 << SCHEMA_N)).astype(np.int64)
    lo = int(idx.min())
    p = np.bincount(idx - lo).astype(np.float64)
    return lo, p / p.sum()


def histograms(n_series: int, points: int, t0_ms: int, seed: int = 7) -> HistogramBatch:
    """Cumulative kernel-latency histograms, every series scraped every 15 s."""
    rng = np.random.default_rng(seed)
    b = HistogramBuilder()
    for s in range(n_series):
        labels = {
            "__name__": "kernel_duration_seconds",
            "instance": f"node-{s // 64:03d}",
            "gpu": str(s % 8),
            "kernel": f"kernel_{s % 64:02d}",
        }
        lo, p = _bucket_probabilities(rng)
        rate = math.exp(rng.uniform(0, math.log(2000)))
        n = rng.poisson(rate * STEP_MS / 1000, points)
        counts = np.cumsum(rng.multinomial(n, p), axis=0).astype(np.float64)  # points x buckets
        sums = np.cumsum(n * float(np.sum(p * 2.0 ** ((np.arange(len(p)) + lo) / (1 << SCHEMA_N)))))
        for t in range(points):
            row = counts[t]
            nz = np.flatnonzero(row)
            spans: list[tuple[int, int]] = []
            prev = None
            for i in nz.tolist():
                if prev is not None and i == prev + 1:
                    spans[-1] = (spans[-1][0], spans[-1][1] + 1)
                else:
                    spans.append(((lo + i + 1) if prev is None else i - prev - 1, 1))
                prev = i
            b.add(
                labels,
                t0_ms + t * STEP_MS,
                schema=SCHEMA_N,
                count=float(row.sum()),
                sum=float(sums[t]),
                zero_threshold=2.938735877055719e-39,
                positive_spans=spans,
                positive_buckets=row[nz].tolist(),
            )
    return b.build()


def _variant(base: Table, name: str, codecs: dict[str, str]) -> str:
    """The histograms DDL under another name, some columns' codecs (or ``Type CODEC(...)``) replaced."""
    ddl = next(s for s in single_ddl() if "ki.histograms\n" in s)
    ddl = ddl.replace("ki.histograms\n", f"ki.{name}\n", 1)
    for col in base.columns:
        if col.name in codecs and col.codec:
            want = codecs[col.name]
            typed = want if want.startswith("Array") else f"{col.type} CODEC({want})"
            ddl = ddl.replace(f"{col.name} {col.type} CODEC({col.codec})", f"{col.name} {typed}")
    return ddl


ARRAYS = ("positive_span_offsets", "positive_span_lengths", "positive_counts")
SCALARS = ("zero_count", "count", "sum")
B = "positive_counts"  # where integer histograms' bucket counts go (all of this data)
VARIANTS: dict[str, dict[str, str]] = {
    "chosen (counts Array(Int64) Delta+ZSTD(1), scalars Delta+ZSTD(3))": {},
    "scalars Gorilla+ZSTD(3) (before)": dict.fromkeys(SCALARS, "Gorilla, ZSTD(3)"),
    "counts Array(Int64) ZSTD(3)": {B: "ZSTD(3)"},
    "counts Array(Int64) Delta+ZSTD(3)": {B: "Delta, ZSTD(3)"},
    "counts Array(Int64) T64+ZSTD(3)": {B: "T64, ZSTD(3)"},
    "counts Array(Int64) DoubleDelta+ZSTD(3)": {B: "DoubleDelta, ZSTD(3)"},
    "counts Array(Int64) Delta+ZSTD(9)": {B: "Delta, ZSTD(9)"},
    "counts Array(Float64) ZSTD(3)": {B: "Array(Float64) CODEC(ZSTD(3))"},
    "counts Array(Float64) ZSTD(9)": {B: "Array(Float64) CODEC(ZSTD(9))"},
    "counts Array(Float64) Gorilla+ZSTD(3)": {B: "Array(Float64) CODEC(Gorilla, ZSTD(3))"},
    "counts Array(Float64) FPC+ZSTD(3)": {B: "Array(Float64) CODEC(FPC, ZSTD(3))"},
    "counts Array(Float64) Delta+ZSTD(3)": {B: "Array(Float64) CODEC(Delta, ZSTD(3))"},
    "spans Delta+ZSTD(3)": {
        "positive_span_offsets": "Delta, ZSTD(3)",
        "positive_span_lengths": "Delta, ZSTD(3)",
    },
    "scalars ZSTD(3) only": dict.fromkeys(SCALARS, "ZSTD(3)"),
    "everything LZ4": dict.fromkeys((*ARRAYS, *SCALARS), "LZ4"),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--quick", action="store_true", help="small sizes, a smoke run")
    ap.add_argument("--series", type=int, default=200)
    ap.add_argument("--hours", type=float, default=6.0)
    args = ap.parse_args()
    n_series = 50 if args.quick else args.series
    points = int((1 if args.quick else args.hours) * 3600_000 // STEP_MS)
    t0 = (int(time.time()) // 86400) * 86_400_000 - 86_400_000
    made = time.perf_counter()
    batch = histograms(n_series, points, t0)
    n = len(batch)
    buckets = len(batch.pos_buckets) / n
    print(
        f"data: {n} histogram samples ({n_series} series x {points} at 15 s), {buckets:.1f} buckets each, made in {time.perf_counter() - made:.1f} s"
    )
    base = next(t for t in SCHEMA if t.name == "histograms")
    root = Path(tempfile.mkdtemp(prefix="ki-bench-histstore-"))
    results: dict[str, float] = {}
    try:
        with EmbeddedStore(root / "data") as store:
            store.insert_histograms(HistogramBuilder().build())
            start = time.perf_counter()
            step = 20_000
            for i in range(0, n, step):
                store.insert_histograms(batch.slice(i, min(n, i + step)))
            rate = n / (time.perf_counter() - start)
            store.optimize("histograms")
            # kql's read: one hour of every series through ClickHouseStorage.select_columns as kql
            # takes it (columns, kql/sparsehists.py: no object per sample; counter-reset hints
            # pending) and the dense bucket blocks rate and histogram_quantile build from them
            # (DenseBlock.of_sparse, DENSE_CHUNK samples a block); the median of three, wall and
            # CPU of this process (chDB's threads included).
            storage = store.storage(use_cache=False)
            selector = [Matcher("__name__", "=", "kernel_duration_seconds")]
            reads, cpus = [], []
            read_n = 0
            for _ in range(3):
                began, cpu = time.perf_counter(), time.process_time()
                got = storage.select_columns(selector, t0, t0 + 3_600_000 - 1)
                data = None if got.hist is None else got.hist.data
                assert data is not None, "the store hands kql histogram columns"
                # Blocks of whole series (a block starts at a series' first sample, as rate's).
                assert got.hist is not None
                offsets = got.hist.offsets
                cuts = np.unique(
                    np.append(
                        offsets[np.searchsorted(offsets, np.arange(0, len(data), DENSE_CHUNK))], len(data)
                    )
                )
                for a, b in itertools.pairwise(cuts.tolist()):
                    DenseBlock.of_sparse(data.rows(a, b))
                reads.append(time.perf_counter() - began)
                cpus.append(time.process_time() - cpu)
                read_n = len(data)
            read_s, read_cpu = sorted(reads)[1], sorted(cpus)[1]
            read_rate = read_n / read_s
            print(
                f"read: {read_n} histogram samples (1 hour, {n_series} series) as columns and dense blocks: "
                f"{read_s:.2f} s wall ({read_rate:,.0f}/s), {read_cpu:.2f} s CPU ({read_n / read_cpu:,.0f}/s)"
            )
            data = store.query("SELECT * EXCEPT (metric) FROM ki.histograms")
            for k, (label, codecs) in enumerate(VARIANTS.items()):
                name = f"histograms_v{k}"
                try:
                    store.command(_variant(base, name, codecs))
                except Exception as exc:  # a codec the engine refuses for this type
                    print(f"{label}: refused ({str(exc).splitlines()[0][:120]})")
                    continue
                began = time.perf_counter()
                store.command(f"INSERT INTO ki.{name} SELECT * FROM ki.histograms")
                store.command(f"OPTIMIZE TABLE ki.{name} FINAL")
                took = time.perf_counter() - began
                cols = store.query(
                    "SELECT column AS name, sum(column_data_compressed_bytes) AS b FROM system.parts_columns "
                    f"WHERE active AND database = 'ki' AND table = '{name}' GROUP BY name"
                ).to_pylist()
                per_col = {c["name"]: c["b"] / n for c in cols}
                disk = (
                    store.query(
                        f"SELECT sum(bytes_on_disk) AS b FROM system.parts WHERE active AND database = 'ki' AND table = '{name}'"
                    )
                    .column("b")[0]
                    .as_py()
                )
                results[label] = disk / n
                top = ", ".join(f"{c} {v:.2f}" for c, v in sorted(per_col.items(), key=lambda x: -x[1])[:5])
                print(
                    f"{label}: {disk / n:.2f} bytes/histogram sample on disk, insert+merge {took:.2f} s ({top})"
                )
            del data
    finally:
        shutil.rmtree(root, ignore_errors=True)
    chosen = results[next(iter(VARIANTS))]
    print(f"insert: {rate:,.0f} histogram samples/s (insert_histograms, batches of 20,000)")
    print(
        f"BENCH histstore bytes_per_histogram={chosen:.2f} buckets_per_histogram={buckets:.1f} "
        f"insert_histograms_per_s={rate:.0f} read_histograms_per_s={read_rate:.0f} "
        f"read_histograms_per_cpu_s={read_n / read_cpu:.0f}"
    )


if __name__ == "__main__":
    main()
