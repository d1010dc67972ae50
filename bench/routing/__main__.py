"""``make bench-routing``: the SDK's routing against today's inference routers (docs/routing.md).

Three parts, one seed:

1. The queueing fleet (queueing.py, fleet.py): the SDK and four baselines (static WRR, round
   robin, power of two choices with perfect knowledge, the Gateway API Inference Extension's
   default scorer) on the same simulated fleet and the same requests, at several offered loads,
   with degrading NCCL links and without; p99 time to first token, goodput at a 2 s p99 SLO, and
   ``docs/images/routing-p99.svg``.
2. Freshness (freshness.py): remote_write of vLLM metrics to a real collector until a watching
   ``HealthClient`` shows them.
3. The memory fleet (memory_fleet.py): the earlier comparison with static WRR, kept beside.

Ends with ``BENCH routing p99_ms=... gie_p99_ms=... p2c_p99_ms=... goodput_rps=... gie_goodput_rps=...``
and the other figures (``old_*``: the memory fleet).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

from bench.routing import freshness, memory_fleet
from bench.routing.plot import svg
from bench.routing.queueing import STRATEGIES, Result, Setup, run_sdk
from kernel_insight.sdk import LoadPolicy

ROOT = Path(__file__).resolve().parents[2]
SLO_MS = 2000.0


def goodput(results: list[Result], setup: Setup) -> float:
    """Requests per second completed at the highest offered load whose p99 TTFT meets the SLO; 0 if none."""
    best = 0.0
    for r in results:
        if r.p99_ms <= SLO_MS:
            best = max(best, len(r.ttft_ms) / (setup.measure_ms / 1000.0))
    return best


def fmt(v: float) -> str:
    return "inf" if not math.isfinite(v) else f"{v:.0f}"


def sweep(setup: Setup, names: list[str], rates: list[float], seed: int) -> dict[str, list[Result]]:
    out: dict[str, list[Result]] = {}
    for name in names:
        for rate in rates:
            t0 = time.monotonic()
            r = STRATEGIES[name](setup, rate, seed)
            out.setdefault(name, []).append(r)
            print(
                f"  {'faults' if setup.faults else 'queues only':11s} {name:4s} {rate:5.0f} rps: "
                f"p50 {fmt(r.p50_ms)} ms, p99 {fmt(r.p99_ms)} ms, e2e p99 {fmt(r.e2e_p99_ms)} ms, "
                f"first attempt suitable {r.suitable_pct:.1f} %, retries {r.retries_per_request:.3f}, "
                f"unfinished {r.unfinished + r.gave_up}, prefix hits {100 * r.prefix_hit:.0f} % "
                f"({time.monotonic() - t0:.0f} s)",
                file=sys.stderr,
                flush=True,
            )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.routing")
    ap.add_argument("--seed", type=int, default=18)
    ap.add_argument("--rates", default="200,250,275,300", help="offered loads, requests/s")
    ap.add_argument("--at", type=float, default=250.0, help="the load of the p99_ms figures")
    ap.add_argument("--measure-s", type=float, default=25.0)
    ap.add_argument("--svg", default=str(ROOT / "docs" / "images" / "routing-p99.svg"), help="'' for none")
    ap.add_argument("--skip-memory-fleet", action="store_true")
    ap.add_argument("--skip-freshness", action="store_true")
    args = ap.parse_args(argv)
    rates = sorted({float(r) for r in args.rates.split(",")} | {args.at})
    t0 = time.monotonic()
    figures: dict[str, float | str] = {}

    faulty = Setup(measure_ms=args.measure_s * 1000)
    calm = Setup(measure_ms=args.measure_s * 1000, faults=False)
    print(
        f"queueing fleet: {faulty.fast} + {faulty.slow} instances, {faulty.clients} SDK clients",
        file=sys.stderr,
    )
    with_faults = sweep(faulty, ["sdk", "gie", "p2c", "rr", "wrr"], rates, args.seed)
    queues_only = sweep(calm, ["sdk", "gie", "p2c", "rr", "wrr"], rates, args.seed)

    def at(results: dict[str, list[Result]], name: str) -> Result:
        return next(r for r in results[name] if r.rate_rps == args.at)

    sdk = at(with_faults, "sdk")
    figures["p99_ms"] = fmt(sdk.p99_ms)
    for name in ("gie", "p2c", "rr", "wrr"):
        figures[f"{name}_p99_ms"] = fmt(at(with_faults, name).p99_ms)
    figures["goodput_rps"] = f"{goodput(with_faults['sdk'], faulty):.0f}"
    for name in ("gie", "p2c", "rr", "wrr"):
        figures[f"{name}_goodput_rps"] = f"{goodput(with_faults[name], faulty):.0f}"
    figures["suitable_pct"] = f"{sdk.suitable_pct:.1f}"
    figures["retries_per_request"] = f"{sdk.retries_per_request:.3f}"
    figures["gie_suitable_pct"] = f"{at(with_faults, 'gie').suitable_pct:.1f}"
    figures["p50_ms"] = fmt(sdk.p50_ms)
    figures["gie_p50_ms"] = fmt(at(with_faults, "gie").p50_ms)
    figures["queues_p99_ms"] = fmt(at(queues_only, "sdk").p99_ms)
    for name in ("gie", "p2c"):
        figures[f"queues_{name}_p99_ms"] = fmt(at(queues_only, name).p99_ms)
    figures["queues_goodput_rps"] = f"{goodput(queues_only['sdk'], calm):.0f}"
    for name in ("gie", "p2c"):
        figures[f"queues_{name}_goodput_rps"] = f"{goodput(queues_only[name], calm):.0f}"
    # Herding: every client takes the least-loaded of 16 draws from its snapshot instead of 2.
    herd = run_sdk(calm, args.at, args.seed, policy=LoadPolicy(choices=16))
    print(f"  queues only sdk, 16 choices, {args.at:.0f} rps: p99 {fmt(herd.p99_ms)} ms", file=sys.stderr)
    figures["queues_herd_p99_ms"] = fmt(herd.p99_ms)
    noaff = run_sdk(calm, args.at, args.seed, affinity=False)
    print(f"  queues only sdk, no prefix key, {args.at:.0f} rps: p99 {fmt(noaff.p99_ms)} ms", file=sys.stderr)
    figures["queues_noaffinity_p99_ms"] = fmt(noaff.p99_ms)
    figures["prefix_hit_pct"] = f"{100 * sdk.prefix_hit:.0f}"
    figures["gie_prefix_hit_pct"] = f"{100 * at(with_faults, 'gie').prefix_hit:.0f}"

    if args.svg:
        Path(args.svg).write_text(
            svg(
                [
                    (
                        "With 3 degrading NCCL links",
                        {n: [(r.rate_rps, r.p99_ms) for r in v] for n, v in with_faults.items()},
                    ),
                    ("Queues only", {n: [(r.rate_rps, r.p99_ms) for r in v] for n, v in queues_only.items()}),
                ],
                note=f"make bench-routing, seed {args.seed}, {args.measure_s:g} s of arrivals a point; "
                "a square on the top edge: requests left unfinished",
            )
        )
    if not args.skip_freshness:
        figures.update(freshness.measure())
    if not args.skip_memory_fleet:
        figures.update({f"old_{k}": v for k, v in memory_fleet.run(seed=args.seed).items()})
    print(f"wall {time.monotonic() - t0:.0f} s", file=sys.stderr)
    print("BENCH routing " + " ".join(f"{k}={v}" for k, v in figures.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
