"""The alert round of ``make bench-fleet`` in one process, without HTTP or ingest: N node_exporter
targets' series (bench/fleet/targets.py's page and values) written into a collector head
(collector/head.py) and the 35 alert expressions (bench/fleet/alerts.py) evaluated as instant
queries by kql's engine over it, as the collector answers them when the head covers the window.

``python -m bench.fleet.inproc --targets 500 [--profile out.prof]`` prints each expression's
CPU time (best of ``--repeat``) and the round's total; the line ``BENCH fleet_inproc ...`` ends it.
What it leaves out (HTTP, JSON, ingest beside the queries) ``make bench-fleet`` measures.
"""

from __future__ import annotations

import argparse
import cProfile
import time
from collections.abc import Sequence

import numpy as np

from bench.fleet.alerts import ALERT_EXPRESSIONS
from bench.fleet.targets import TargetSet, node_exporter_page
from kernel_insight.collector.head import Head
from kernel_insight.kql.engine import Engine
from kernel_insight.kql.pushdown import GridColumns, SeriesColumns
from kernel_insight.kql.storage import (
    NO_HINTS,
    Capability,
    Labels,
    Matcher,
    SelectHints,
    SeriesData,
    StorageBase,
)

__all__ = ["HeadStorage", "fill_head", "main"]

#: Targets whose requests one write carries (the batcher's group commit at these rates).
GROUP_TARGETS = 20


class HeadStorage(StorageBase):
    """kql storage over a head alone (the collector's QueryStorage when the head covers the window)."""

    capabilities = frozenset({Capability.COLUMNS, Capability.LAST_ON_GRID})

    def __init__(self, head: Head) -> None:
        self.head = head

    def select_columns(
        self, matchers: Sequence[Matcher], start_ms: int, end_ms: int, hints: SelectHints = NO_HINTS
    ) -> SeriesColumns:
        cols = self.head.select_columns(matchers, start_ms, end_ms)
        assert cols is not None
        return cols

    def select_last_on_grid(
        self,
        matchers: Sequence[Matcher],
        start_ms: int,
        end_ms: int,
        hints: SelectHints,
        lookback_ms: int,
        sample_times: bool = True,
    ) -> GridColumns | None:
        if start_ms != end_ms:
            return None
        return self.head.select_last(matchers, end_ms, end_ms - lookback_ms + 1, sample_times=sample_times)

    def select(
        self, matchers: Sequence[Matcher], start_ms: int, end_ms: int, hints: SelectHints = NO_HINTS
    ) -> list[SeriesData]:
        return self.select_columns(matchers, start_ms, end_ms, hints).series()

    def label_names(
        self, matchers: Sequence[Matcher], start_ms: int, end_ms: int, hints: SelectHints = NO_HINTS
    ) -> list[str]:
        raise NotImplementedError

    def label_values(
        self,
        name: str,
        matchers: Sequence[Matcher],
        start_ms: int,
        end_ms: int,
        hints: SelectHints = NO_HINTS,
    ) -> list[str]:
        raise NotImplementedError


def fill_head(
    targets: int, rounds: int, interval_s: float, end_ms: int, group_targets: int = GROUP_TARGETS
) -> Head:
    """A head holding ``rounds`` scrapes of ``targets`` targets, the last at ``end_ms``, written
    ``group_targets`` targets at a time (0: a whole round a write)."""
    page = node_exporter_page()
    ts = TargetSet(page, 0, targets)
    per = len(page.labels)
    series: list[Labels] = []
    for t in range(targets):
        extra = [("instance", f"host-{t:05d}:9100"), ("job", ts.job)]
        series.extend(tuple(sorted([*lab, *extra])) for lab in page.labels)
    fps = np.arange(1, len(series) + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    idx = np.arange(len(series), dtype=np.int32)
    head = Head(window_ms=10 * 3600_000, max_bytes=1 << 34)
    # As the collector's batcher commits them: about 20 targets' requests a write.
    step = (group_targets or targets) * per
    for r in range(rounds):
        at = end_ms - (rounds - 1 - r) * int(interval_s * 1000)
        ts.advance(interval_s)
        values = ts._values.reshape(-1)
        for lo in range(0, len(series), step):
            part = idx[lo : lo + step]
            head.append(series, fps, part, np.full(len(part), at, np.int64), values[lo : lo + step].copy())
    assert len(series) == targets * per
    return head


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--targets", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=31, help="scrapes held (default: 5 minutes at 10 s)")
    ap.add_argument("--interval", type=float, default=10.0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument(
        "--group-targets", type=int, default=GROUP_TARGETS, help="targets a write carries (0: a whole round)"
    )
    ap.add_argument("--profile", default="", help="write a cProfile of one more round here")
    ap.add_argument("--only", default="", help="comma-separated indices of expressions to run")
    args = ap.parse_args()
    end_ms = 1_800_000_000_000
    began = time.perf_counter()
    head = fill_head(args.targets, args.rounds, args.interval, end_ms, args.group_targets)
    print(
        f"filled {head.stats().series} series x {args.rounds} rounds in {time.perf_counter() - began:.1f} s"
    )
    engine = Engine(HeadStorage(head))
    exprs = list(enumerate(ALERT_EXPRESSIONS))
    if args.only:
        keep = {int(x) for x in args.only.split(",")}
        exprs = [(i, e) for i, e in exprs if i in keep]
    for _, e in exprs:  # warm: parse cache, selections
        engine.instant_query(e, end_ms)
    best = {i: float("inf") for i, _ in exprs}
    counts = {}
    for _ in range(args.repeat):
        for i, e in exprs:
            c0 = time.process_time()
            res = engine.instant_query(e, end_ms)
            best[i] = min(best[i], time.process_time() - c0)
            counts[i] = res.stats.samples
    for i, e in exprs:
        print(f"{i:2d} {best[i] * 1000:8.1f} ms  samples={counts[i]:>9}  {e[:90]}")
    total = sum(best.values())
    print(
        f"BENCH fleet_inproc targets={args.targets} series={head.stats().series} round_cpu_ms={total * 1000:.0f}"
    )
    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        for _, e in exprs:
            engine.instant_query(e, end_ms)
        prof.disable()
        prof.dump_stats(args.profile)


if __name__ == "__main__":
    main()
