"""make bench-samplestore: where a float sample's bytes go on disk, per column, codec by codec.

Three realistic datasets, each in its own embedded store:

- ``ingest``: bench/ingest's exporter-like gauges and counters (1,000 series at 15 s);
- ``import``: bench/kql's fleet (2,050 series, 7 h at 15 s, values with 6 decimals), the data
  of ``make bench-import`` and its VictoriaMetrics / promtool comparison;
- ``e2e``: what ``make bench-e2e`` stores: the collector's own derivation of real agents'
  KERNEL records (per batch and kernel: launches, busy seconds, mean execution time) plus the
  NVML-like samples and the agents' heartbeats. A short trial of bench/e2e is run for it
  (real collector and agents), or ``--e2e-store`` names a kept trial's ``data`` directory.

For each variant (the schema's samples table with other codecs, another sort key or index
granularity) the dataset's rows are copied into a scratch table, merged into one part per day
(``OPTIMIZE FINAL``, wide parts so each column has its own files), and the compressed bytes of
each column are read from ``system.parts_columns``; ``total`` is ``system.parts.bytes_on_disk``
per sample (marks, index and checksums included). ``cpu`` is this process' CPU time for the copy
and merge per sample (chDB runs in process): what a codec costs at insert and at each merge.
Then, per dataset, where the bytes go under the schema's codecs: the metrics with the largest
share of the column bytes (one part per metric), with their bytes of ``ts`` and ``value``.
The e2e dataset's kernel spans (the store's largest table) get the same treatment, per span.
Ends with ``BENCH samplestore ingest=<n> import=<n> e2e=<n> e2e_spans=<n>`` (bytes per sample,
and per kernel span, the schema's codecs, one merged part).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.e2e.__main__ import run_trial
from bench.e2e.fleet import build_ringtool
from bench.ingest.__main__ import _batches, _scrapes, _series
from bench.kql.data import dataset
from kernel_insight.collector.clickhouse.schema import Column, table
from kernel_insight.collector.clickhouse.store import EmbeddedStore
from kernel_insight.collector.rows import SampleBuilder

SCRATCH = "codecs"


@dataclasses.dataclass(frozen=True)
class Variant:
    name: str
    codecs: dict[str, str] = dataclasses.field(default_factory=dict)  # column -> codec (others: the schema's)
    order_by: str = "metric, fingerprint, ts"
    granularity: int = 8192
    select: dict[str, str] = dataclasses.field(default_factory=dict)  # column -> what the copy writes


#: The value columns as before decimals: every value a float (``value`` Float64 then).
FLOATS_ONLY = {"float_value": "value", "mantissa": "0", "scale": "-1"}
#: The columns that hold a sample's value (``value`` is their ALIAS).
VALUE_COLUMNS = ("float_value", "mantissa", "scale")


#: What was tried (docs/storage.md, "Codecs"); "schema" is the samples table as shipped.
VARIANTS = (
    Variant("schema"),
    Variant("floats only (before decimals)", select=FLOATS_ONLY),
    Variant(
        "before (issue 11)",
        {"fingerprint": "Delta, ZSTD(1)", "ts": "DoubleDelta, ZSTD(3)", "float_value": "Gorilla, ZSTD(3)"},
        select=FLOATS_ONLY,
    ),
    Variant("mantissa ZSTD(3)", {"mantissa": "ZSTD(3)"}),
    Variant("mantissa T64, ZSTD(3)", {"mantissa": "T64, ZSTD(3)"}),
    Variant("mantissa DoubleDelta, ZSTD(3)", {"mantissa": "DoubleDelta, ZSTD(3)"}),
    Variant("mantissa Delta, ZSTD(1)", {"mantissa": "Delta, ZSTD(1)"}),
    Variant("mantissa Delta, ZSTD(7)", {"mantissa": "Delta, ZSTD(7)"}),
    Variant("ts DoubleDelta, ZSTD(1)", {"ts": "DoubleDelta, ZSTD(1)"}),
    Variant("ts DoubleDelta (no ZSTD)", {"ts": "DoubleDelta"}),
    Variant("ts T64, ZSTD(3)", {"ts": "T64, ZSTD(3)"}),
    Variant("ts ZSTD(3)", {"ts": "ZSTD(3)"}),
    Variant("ts Delta, ZSTD(1)", {"ts": "Delta, ZSTD(1)"}),
    Variant("ts Delta, ZSTD(9)", {"ts": "Delta, ZSTD(9)"}),
    Variant("value Gorilla, ZSTD(1) (floats only)", {"float_value": "Gorilla, ZSTD(1)"}, select=FLOATS_ONLY),
    Variant("value Gorilla (no ZSTD) (floats only)", {"float_value": "Gorilla"}, select=FLOATS_ONLY),
    Variant("value FPC, ZSTD(3) (floats only)", {"float_value": "FPC, ZSTD(3)"}, select=FLOATS_ONLY),
    Variant("value ZSTD(3) (floats only)", {"float_value": "ZSTD(3)"}, select=FLOATS_ONLY),
    Variant(
        "value DoubleDelta, ZSTD(3) (floats only)",
        {"float_value": "DoubleDelta, ZSTD(3)"},
        select=FLOATS_ONLY,
    ),
    Variant("value Delta, ZSTD(1) (floats only)", {"float_value": "Delta, ZSTD(1)"}, select=FLOATS_ONLY),
    Variant("value Delta, ZSTD(7) (floats only)", {"float_value": "Delta, ZSTD(7)"}, select=FLOATS_ONLY),
    Variant("value Delta, LZ4HC(9) (floats only)", {"float_value": "Delta, LZ4HC(9)"}, select=FLOATS_ONLY),
    Variant("fingerprint Delta, ZSTD(1)", {"fingerprint": "Delta, ZSTD(1)"}),
    Variant("fingerprint T64, ZSTD(1)", {"fingerprint": "T64, ZSTD(1)"}),
    Variant("order (fingerprint, ts)", order_by="fingerprint, ts"),
    Variant("order (metric, ts, fingerprint)", order_by="metric, ts, fingerprint"),
    Variant("index_granularity 1024", granularity=1024),
)


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


#: The kernel spans of the e2e dataset, the same way (bytes per span): the store's largest table.
SPAN_VARIANTS = (
    Variant("schema", order_by="instance, gpu, start"),
    Variant(
        "before (issue 11)",
        {
            "start": "DoubleDelta, ZSTD(1)",
            "end": "DoubleDelta, ZSTD(1)",
            "duration_ns": "T64, ZSTD(1)",
            "correlation": "Delta, ZSTD(1)",
            "stream": "ZSTD(1)",
        },
        order_by="instance, gpu, start",
    ),
    Variant(
        "start/end DoubleDelta, ZSTD(3)",
        {"start": "DoubleDelta, ZSTD(3)", "end": "DoubleDelta, ZSTD(3)"},
        order_by="instance, gpu, start",
    ),
    Variant(
        "start/end Delta, ZSTD(3)",
        {"start": "Delta, ZSTD(3)", "end": "Delta, ZSTD(3)"},
        order_by="instance, gpu, start",
    ),
    Variant("duration_ns ZSTD(3)", {"duration_ns": "ZSTD(3)"}, order_by="instance, gpu, start"),
)


def measure(store: EmbeddedStore, v: Variant, samples: int, name: str = "samples") -> dict[str, float]:
    """Bytes per row of each column, in total, and CPU ns per row, for one variant of a table."""
    t = table(name)
    cols = [dataclasses.replace(c, codec=v.codecs.get(c.name, c.codec)) for c in t.columns]
    store.command(f"DROP TABLE IF EXISTS {SCRATCH}.v SYNC")
    store.command(
        f"CREATE TABLE {SCRATCH}.v ({', '.join(Column.sql(c) for c in cols)}) ENGINE = MergeTree "
        f"PARTITION BY {t.partition_by} ORDER BY ({v.order_by}) "
        f"SETTINGS min_bytes_for_wide_part = 0, index_granularity = {v.granularity}"
    )
    stored = [c.name for c in cols if not (c.default or "").startswith("ALIAS")]
    names = ", ".join(stored)
    exprs = ", ".join(f"{v.select.get(c, c)} AS {c}" for c in stored)
    cpu = _cpu_s()
    store.command(f"INSERT INTO {SCRATCH}.v ({names}) SELECT {exprs} FROM ki.{name}")
    store.command(f"OPTIMIZE TABLE {SCRATCH}.v FINAL")
    cpu = _cpu_s() - cpu
    where = f"active AND database = '{SCRATCH}' AND table = 'v'"
    out = {
        r["column"]: int(r["b"]) / samples
        for r in store.query(
            f"SELECT column, sum(column_data_compressed_bytes) AS b FROM system.parts_columns WHERE {where} GROUP BY column"
        ).to_pylist()
    }
    out["total"] = (
        int(
            store.query(f"SELECT sum(bytes_on_disk) AS b FROM system.parts WHERE {where}").to_pylist()[0]["b"]
        )
        / samples
    )
    out["cpu_ns"] = cpu / samples * 1e9
    store.command(f"DROP TABLE {SCRATCH}.v SYNC")
    return out


def by_metric(store: EmbeddedStore, samples: int, top: int) -> list[dict[str, float | str]]:
    """Where the bytes go under the schema's codecs: one part per metric (a scratch table
    partitioned by metric), its samples, its bytes of ``ts`` and ``value`` per sample, and its
    share of the dataset's column bytes; the ``top`` largest shares."""
    t = table("samples")
    store.command(f"DROP TABLE IF EXISTS {SCRATCH}.m SYNC")
    store.command(
        f"CREATE TABLE {SCRATCH}.m ({', '.join(Column.sql(c) for c in t.columns)}) ENGINE = MergeTree "
        "PARTITION BY metric ORDER BY (fingerprint, ts) SETTINGS min_bytes_for_wide_part = 0"
    )
    names = ", ".join(c.name for c in t.columns if not (c.default or "").startswith("ALIAS"))
    store.command(f"INSERT INTO {SCRATCH}.m ({names}) SELECT {names} FROM ki.samples")
    store.command(f"OPTIMIZE TABLE {SCRATCH}.m FINAL")
    rows = store.query(
        "SELECT partition AS metric, column, sum(rows) AS n, sum(column_data_compressed_bytes) AS b "
        f"FROM system.parts_columns WHERE active AND database = '{SCRATCH}' AND table = 'm' "
        "GROUP BY partition, column"
    ).to_pylist()
    store.command(f"DROP TABLE {SCRATCH}.m SYNC")
    per: dict[str, dict[str, float]] = {}
    for r in rows:
        m = per.setdefault(str(r["metric"]).strip("'"), {"n": 0.0, "all": 0.0})
        m["n"] = float(r["n"])
        m[str(r["column"])] = float(r["b"])
        m["all"] += float(r["b"])
    total = sum(m["all"] for m in per.values()) or 1.0
    out: list[dict[str, float | str]] = [
        {
            "metric": name,
            "samples": m["n"],
            "share_of_samples": m["n"] / samples,
            "ts": m.get("ts", 0.0) / m["n"],
            "value": sum(m.get(c, 0.0) for c in VALUE_COLUMNS) / m["n"],
            "share_of_bytes": m["all"] / total,
        }
        for name, m in per.items()
    ]
    return sorted(out, key=lambda r: -float(r["share_of_bytes"]))[:top]


def load_ingest(path: Path) -> None:
    series = _series(1000)
    t0 = (int(time.time()) // 86400) * 86_400_000 - 86_400_000
    vals, ts = _scrapes(series, 1440, t0, 15_000, seed=2)
    with EmbeddedStore(path, cache_bytes=0) as store:
        for i, b in enumerate(_batches(series, vals, ts, 240)):
            store.insert_samples(b, dedup_token=f"ingest:{i}")


def load_import(path: Path) -> None:
    data = dataset((int(time.time()) // 86400) * 86_400_000 - 2 * 86_400_000)  # within the default retention
    with EmbeddedStore(path, cache_bytes=0) as store:
        for i in range(0, len(data), 250):
            b = SampleBuilder()
            for labels, ts, vs in data[i : i + 250]:
                b.add_series(labels, ts, vs)
            store.insert_samples(b.build(), dedup_token=f"import:{i}")


def load_e2e(path: Path, rate: int, seconds: float) -> None:
    """A bench/e2e trial (real collector, agents and producers); its store is kept at ``path``."""
    root = path.parent / "e2e-trial"
    root.mkdir()
    trial = run_trial(rate, 8, 5.0, seconds, root, build_ringtool(root))
    print(f"e2e trial: {trial.rate} records/s, {trial.samples} samples, passed={trial.passed}", flush=True)
    (root / "data").rename(path)


def measure_dataset(name: str, path: Path, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Load one dataset into a store at ``path`` and measure every variant on it (one process:
    chDB opens one data directory per process)."""
    if name == "ingest":
        load_ingest(path)
    elif name == "import":
        load_import(path)
    elif name == "e2e" and args.e2e_store:
        shutil.copytree(args.e2e_store, path, symlinks=True)  # the database directories are links
    elif name == "e2e":
        load_e2e(path, args.e2e_rate, args.e2e_seconds)
    else:
        raise SystemExit(f"unknown dataset {name!r}")
    out: dict[str, dict[str, float]] = {}
    with EmbeddedStore(path, cache_bytes=0) as store:
        samples = int(store.query("SELECT count() AS n FROM ki.samples").to_pylist()[0]["n"])
        store.command(f"CREATE DATABASE IF NOT EXISTS {SCRATCH}")
        print(f"\n{name}: {samples} samples", flush=True)
        measure(store, VARIANTS[0], samples)  # warm-up: the first copy pays for first-use set-up
        for v in VARIANTS[:2] if args.quick else VARIANTS:
            r = measure(store, v, samples)
            out[v.name] = r
            r["value"] = sum(r.get(c, 0.0) for c in VALUE_COLUMNS)
            cols = " ".join(
                f"{c} {r.get(c, 0.0):.3f}" for c in ("metric", "fingerprint", "ts", "value", *VALUE_COLUMNS)
            )
            print(f"  {v.name:40s} total {r['total']:.3f}  {cols}  cpu {r['cpu_ns']:.0f} ns", flush=True)
        spans = int(store.query("SELECT count() AS n FROM ki.kernel_spans").to_pylist()[0]["n"])
        if spans:
            print(f"  kernel spans: {spans}", flush=True)
            for v in SPAN_VARIANTS[:2] if args.quick else SPAN_VARIANTS:
                r = measure(store, v, spans, "kernel_spans")
                out[f"spans {v.name}"] = r
                top = " ".join(
                    f"{c} {b:.2f}"
                    for c, b in sorted(r.items(), key=lambda kv: -kv[1])
                    if c not in ("total", "cpu_ns")
                )
                print(
                    f"    {v.name:38s} total {r['total']:.3f} bytes/span  {top}  cpu {r['cpu_ns']:.0f} ns",
                    flush=True,
                )
        print("  where the bytes go (the schema's codecs, one part per metric):", flush=True)
        for m in by_metric(store, samples, 8):
            print(
                f"    {m['metric']:42s} {float(m['share_of_samples']):6.1%} of samples  ts {float(m['ts']):.2f}  "
                f"value {float(m['value']):.2f} bytes/sample  {float(m['share_of_bytes']):6.1%} of the bytes",
                flush=True,
            )
    return out


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.samplestore", description=__doc__.splitlines()[0])
    p.add_argument(
        "--e2e-store", type=Path, help="a kept bench-e2e trial's data directory (copied, not changed)"
    )
    p.add_argument("--e2e-rate", type=int, default=200_000, help="kernel records/s of the e2e trial")
    p.add_argument("--e2e-seconds", type=float, default=40.0, help="measured seconds of the e2e trial")
    p.add_argument("--datasets", default="ingest,import,e2e")
    p.add_argument("--quick", action="store_true", help="the schema and the previous codecs only")
    p.add_argument("--one", nargs=2, metavar=("DATASET", "DIR"), help=argparse.SUPPRESS)  # a child's work
    args = p.parse_args()
    if args.one:
        name, path = args.one
        print("RESULT " + json.dumps(measure_dataset(name, Path(path), args)), flush=True)
        return
    root = Path(tempfile.mkdtemp(prefix="ki-bench-samplestore-"))
    results: dict[str, dict[str, dict[str, float]]] = {}
    try:
        for name in args.datasets.split(","):
            argv = [sys.executable, "-m", "bench.samplestore", "--one", name, str(root / name)]
            argv += ["--e2e-rate", str(args.e2e_rate), "--e2e-seconds", str(args.e2e_seconds)]
            argv += ["--e2e-store", str(args.e2e_store)] if args.e2e_store else []
            argv += ["--quick"] if args.quick else []
            proc = subprocess.run(argv, stdout=subprocess.PIPE, text=True, check=True)
            for line in proc.stdout.splitlines():
                if line.startswith("RESULT "):
                    results[name] = json.loads(line[7:])
                else:
                    print(line, flush=True)
            shutil.rmtree(root / name, ignore_errors=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(results), flush=True)
    print(f"machine: {os.cpu_count()} cpus, load average {os.getloadavg()[0]:.1f} (1 min) at the end")
    spans = "".join(
        f" {k}_spans={v['spans schema']['total']:.3f}" for k, v in results.items() if "spans schema" in v
    )
    print(
        "BENCH samplestore " + " ".join(f"{k}={v['schema']['total']:.3f}" for k, v in results.items()) + spans
    )


if __name__ == "__main__":
    main()
