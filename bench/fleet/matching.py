"""The head's series selection alone (collector/head.py ``Head.matching``), the step every
snapshot rebuild, rule and dashboard selector starts with: a head of ``--instances`` x
``--metrics`` series, and the snapshot-like selectors timed by CPU per call, through the postings
path alone (both of ``Head.matching``'s thresholds at 0) and as the head answers them.

``python -m bench.fleet.matching [--instances 2500 --metrics 83]``; ends with ``BENCH
fleet_matching ...``. An inner-function figure: what a selection costs end to end
``make bench-fleet`` measures.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

import numpy as np

from kernel_insight.collector import head as head_module
from kernel_insight.kql.storage import Matcher

SELECTORS: dict[str, list[Matcher]] = {
    "present": [Matcher("__name__", "=", "node_metric_5"), Matcher("instance", "!=", "")],
    "regex": [Matcher("__name__", "=", "node_metric_5"), Matcher("instance", "=~", "host-1.*")],
    "absent": [Matcher("__name__", "=", "gpu_memory_free_bytes"), Matcher("instance", "!=", "")],
}


def build(instances: int, metrics: int) -> head_module.Head:
    head = head_module.Head()
    labels = [
        (("__name__", f"node_metric_{m}"), ("instance", f"host-{i}:9100"), ("job", "node"))
        for i in range(instances)
        for m in range(metrics)
    ]
    n = len(labels)
    now = int(time.time() * 1000)
    head.append(
        labels,
        np.arange(1, n + 1, dtype=np.uint64),
        np.arange(n, dtype=np.int32),
        np.full(n, now),
        np.ones(n),
    )
    return head


def cpu_ms(head: head_module.Head, matchers: Sequence[Matcher], repeat: int) -> tuple[float, int]:
    matched = len(head.matching(matchers))
    t = time.process_time()
    for _ in range(repeat):
        head.matching(matchers)
    return (time.process_time() - t) / repeat * 1000, matched


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--instances", type=int, default=2500)
    ap.add_argument("--metrics", type=int, default=83)
    ap.add_argument("--repeat", type=int, default=10)
    args = ap.parse_args()
    head = build(args.instances, args.metrics)
    kept = head_module.FILTER_BY_LABELS_MAX, head_module.FILTER_BY_LABELS_SHARE
    figures: dict[str, float] = {}
    for name, matchers in SELECTORS.items():
        head_module.FILTER_BY_LABELS_MAX, head_module.FILTER_BY_LABELS_SHARE = 0, 0.0
        postings, matched = cpu_ms(head, matchers, args.repeat)
        head_module.FILTER_BY_LABELS_MAX, head_module.FILTER_BY_LABELS_SHARE = kept
        answered, _ = cpu_ms(head, matchers, args.repeat)
        print(
            f"{name:8s} {matched:6d} matched: postings path {postings:8.2f} ms, as answered {answered:8.2f} ms CPU"
        )
        figures[f"{name}_postings_ms"], figures[f"{name}_ms"] = postings, answered
    series = args.instances * args.metrics
    print(f"BENCH fleet_matching series={series} " + " ".join(f"{k}={v:.2f}" for k, v in figures.items()))


if __name__ == "__main__":
    main()
