"""Instant native-histogram queries as alert rules and the health views ask them, in process over
an EmbeddedStore: ``histogram_quantile`` and ``histogram_fraction`` of a bare selector (the latest
cumulative histogram of each series), and the same at 60 steps of an hour.

Data: ``--series`` kernel-latency series (bench.histstore's: schema 3, long-tailed, sparse
buckets), one hour at 15 s. CPU time of this process per query (chDB's threads included), the
median of ``--repeats`` after one warm-up run. Run the same file under two checkouts (one on
PYTHONPATH) and interleave the runs for an A/B on a loaded machine.

    python -m bench.histogram.instant [--series 1000]

Ends with ``BENCH histogram_instant quantile_cpu_ms=<n> fraction_cpu_ms=<n> quantile_60_cpu_ms=<n>
fraction_60_cpu_ms=<n>``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from bench.histstore.__main__ import STEP_MS, histograms
from kernel_insight.collector.clickhouse.store import EmbeddedStore
from kernel_insight.kql import Engine, Matrix, Vector
from kernel_insight.kql.values import QueryResult

#: A fixed hour (2026-12-01 00:00 UTC), so a kept store's samples are where the queries look.
T0_MS = 1_796_083_200_000
QUERIES = {
    "quantile": "histogram_quantile(0.99, kernel_duration_seconds)",
    "fraction": "histogram_fraction(0, 0.2e-3, kernel_duration_seconds)",
}


def _cpu_ms(engine: Engine, query: str, start: int, end: int, repeats: int) -> tuple[float, int]:
    """Median CPU ms of the query (instant when ``start == end``, else at 60 s steps) after a
    warm-up run, and how many series it answered."""

    def run() -> QueryResult:
        if start == end:
            return engine.instant_query(query, end)
        return engine.range_query(query, start, end, 60_000)

    run()
    cpu = []
    for _ in range(repeats):
        began = time.process_time()
        value = run().value
        cpu.append(time.process_time() - began)
    n = (
        len(value.series)
        if isinstance(value, Matrix)
        else len(value.samples)
        if isinstance(value, Vector)
        else 0
    )
    return statistics.median(cpu) * 1000, n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--series", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument(
        "--store", type=Path, help="keep the store here and reuse it (A/B runs read the same parts)"
    )
    args = ap.parse_args()
    points = 3600_000 // STEP_MS + 1
    figures: dict[str, float] = {}
    t0 = T0_MS
    end = t0 + (points - 1) * STEP_MS
    with (
        tempfile.TemporaryDirectory(prefix="ki-bench-instant-") as root,
        EmbeddedStore(args.store or Path(root) / "data") as store,
    ):
        if not store.histogram_metrics():
            store.insert_histograms(histograms(args.series, points, t0))
            store.optimize("histograms")
        engine = Engine(store.storage(use_cache=False))
        for name, query in QUERIES.items():
            for suffix, start in (("", end), ("_60", end - 3_540_000)):
                ms, n = _cpu_ms(engine, query, start, end, args.repeats)
                figures[f"{name}{suffix}_cpu_ms"] = ms
                print(f"{query} {'instant' if not suffix else '60 steps'}: {ms:.1f} ms CPU ({n} series)")
    print("BENCH histogram_instant " + " ".join(f"{k}={v:.1f}" for k, v in figures.items()))


if __name__ == "__main__":
    main()
