"""``make bench-fleet-ingest``: the collector's remote_write ingest path in process, per sample.

bench-fleet's node_exporter targets (bench/fleet/targets.py) go through what ``POST /api/v1/write``
runs for them, minus HTTP: ``parse_remote_write`` with the collector's series cache,
``Store.prepare`` and ``Store.insert_prepared`` in groups (as the batcher forms them), into an
embedded store with the head on. Round 0 brings every series new; the later rounds bring the
same series again (known). CPU is the process' (chDB's threads included), per sample, the body
building and compression of the sender left out.

``--churn P`` replaces P% of the targets before each known round (their series are new), the
mix a fleet with churning targets sends.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import tempfile
import time
import uuid

from bench.fleet.targets import TargetSet, node_exporter_page
from kernel_insight.collector.clickhouse.store import open_store
from kernel_insight.collector.head import DEFAULT_HEAD_BYTES
from kernel_insight.collector.remote_write import SeriesCache, parse_remote_write


def _cpu() -> float:
    return time.process_time()


def _threads_cpu() -> dict[str, float]:
    """CPU seconds of this process' threads by name (chDB names its pools: ThreadPool, MergeMutate...)."""
    out: dict[str, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


def main() -> None:
    ap = argparse.ArgumentParser(prog="bench-fleet-ingest", description=__doc__.split("\n\n")[0])
    ap.add_argument("--targets", type=int, default=250, help="node_exporter targets (828 series each)")
    ap.add_argument("--rounds", type=int, default=4, help="rounds of known series after the first")
    ap.add_argument("--group", type=int, default=20, help="requests per group commit")
    ap.add_argument(
        "--churn", type=float, default=0.0, help="percent of targets replaced before each known round"
    )
    ap.add_argument("--profile", choices=["new", "known"], default=None, help="cProfile that round kind")
    args = ap.parse_args()

    page = node_exporter_page()
    targets = TargetSet(page, 0, args.targets)
    per_target = targets.series_per_target
    with tempfile.TemporaryDirectory(prefix="bench-fleet-ingest-") as tmp:
        store = open_store(tmp, head_bytes=DEFAULT_HEAD_BYTES)
        cache = SeriesCache()
        ts = int(time.time() * 1000) - 60_000 * (args.rounds + 1)
        figures: dict[str, list[float]] = {"new": [], "known": []}
        prof = cProfile.Profile() if args.profile else None
        for r in range(args.rounds + 1):
            replaced = 0
            if r and args.churn:
                replaced = max(1, round(args.targets * args.churn / 100))
                for t in range(r * replaced, (r + 1) * replaced):
                    targets.replace(t % args.targets)
            targets.advance(10.0)
            bodies = [targets.body(t, ts + 10_000 * r) for t in range(args.targets)]
            kind = "new" if r == 0 else "known"
            profiling = prof is not None and args.profile == kind
            c0, t0 = _cpu(), _threads_cpu()
            if profiling:
                assert prof is not None
                prof.enable()
            for g in range(0, len(bodies), args.group):
                group = [
                    store.prepare(
                        f"rw:{uuid.uuid4().hex}", samples=parse_remote_write(b, cache=cache), record=False
                    )
                    for b in bodies[g : g + args.group]
                ]
                store.insert_prepared(group, f"bench:{uuid.uuid4().hex}")
            if profiling:
                assert prof is not None
                prof.disable()
            n = len(bodies) * per_target
            us = 1e6 * (_cpu() - c0) / n
            figures[kind].append(us)
            t1 = _threads_cpu()
            split = sorted(((t1[k] - t0.get(k, 0.0), k) for k in t1), reverse=True)
            shown = ", ".join(f"{k} {1e6 * v / n:.2f}" for v, k in split[:4] if v > 0)
            print(
                f"round {r} ({kind}{f', {replaced} targets replaced' if replaced else ''}): "
                f"{us:.2f} us/sample ({shown})"
            )
        store.close()
    known = sorted(figures["known"])[len(figures["known"]) // 2] if figures["known"] else 0.0
    new = figures["new"][0]
    if prof is not None:
        pstats.Stats(prof).sort_stats("cumulative").print_stats(45)
    print(
        f"BENCH fleet_ingest targets={args.targets} series={args.targets * per_target} "
        f"churn_pct={args.churn:g} known_us_per_sample={known:.2f} new_us_per_sample={new:.2f} "
        f"new_over_known={new / known if known else 0:.2f}"
    )


if __name__ == "__main__":
    main()
