"""Collector CPU per histogram of a body version 4 HISTOGRAMS section, A/B against another
``hist_base`` module: ``HistogramBases.resolve`` alone and the whole ``Deriver.derive``.

An agent's section as docs/wire.md's increments make it: 10,000 kernel names, most of them
rarely launched (snapshots under ``BASE_MIN_COUNT`` observations, in client_golang's layout) and
a few hundred hot ones shipped as increments over their previous export. The two modules run
interleaved, batch for batch, so a loaded machine skews both alike (CPU time of this process).

    git show 3c808df:collector/hist_base.py > /tmp/hist_base_main.py   # before the pass-through
    python -m bench.derive.histograms --reference /tmp/hist_base_main.py

Ends with ``BENCH derive_histograms resolve_us_per_hist=<n> [reference_resolve_us_per_hist=<n>]
derive_us_per_hist=<n> [reference_derive_us_per_hist=<n>]``.
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import sys
import time
from typing import Any

import numpy as np

from kernel_insight.agent import RECORD_DTYPE
from kernel_insight.collector import wire
from kernel_insight.collector.derive import Deriver
from kernel_insight.collector.hist_base import BASE_MIN_COUNT, HistogramBases, _spans
from kernel_insight.collector.wire_hist import (
    HistKind,
    HistRow,
    WireHistograms,
    decode_histograms,
    encode_histograms,
)

T0 = 1_790_000_000_000_000_000
S = 7 * 10**9  # histogram_interval_s


def _layout(b: dict[int, int]) -> tuple[tuple[tuple[int, int], ...], tuple[int, ...]]:
    idx = sorted(i for i, c in b.items() if c)
    return _spans((np.asarray(idx, dtype=np.int32), np.asarray([b[i] for i in idx], dtype=np.int64)))


def sections(names: int, hot: int, batches: int) -> list[WireHistograms]:
    """``batches`` sections of one agent: every name each time (a snapshot), the ``hot`` first
    ones as increments after their first export."""
    rng = random.Random(7)
    state: dict[int, dict[int, int]] = {}
    counts: dict[int, int] = {}
    out = []
    header = wire.BatchHeader(bytes(16), 1, 1, 0, 0, 2**63, 0, 0, wire.COMPRESSION_NONE)
    for b in range(batches):
        rows = []
        for ident in range(1, names + 1):
            heavy = ident <= hot
            prev = dict(state.get(ident, {}))
            cur = dict(prev)
            adds = rng.randrange(3000, 6000) if heavy else rng.randrange(1, 6)
            if heavy and not prev:
                adds += BASE_MIN_COUNT
            for _ in range(adds if not heavy else 40):  # hot: 40 distinct draws, weighted
                i = int(rng.expovariate(0.25)) - 10 + ident % 7
                cur[i] = cur.get(i, 0) + (adds // 40 if heavy else 1)
            count = sum(cur.values())
            key: dict[str, Any] = dict(
                producer=1, id=ident, gpu=ident % 8, pid=4242, stream=ident % 4, schema=3
            )
            if heavy and prev:
                inc = {i: c - prev.get(i, 0) for i, c in cur.items() if c - prev.get(i, 0)}
                spans, deltas = _layout(inc)
                rows.append(HistRow(HistKind.KERNEL, **key, count=count, sum=count * 1e-4, pos_spans=spans,
                                    pos_deltas=deltas, increment=True, count_inc=count - counts[ident]))  # fmt: skip
            else:
                spans, deltas = _layout(cur)
                rows.append(HistRow(HistKind.KERNEL, **key, count=count, sum=count * 1e-4, pos_spans=spans,
                                    pos_deltas=deltas, first=not prev))  # fmt: skip
            state[ident], counts[ident] = cur, count
        data = encode_histograms(T0 + b * S, rows, 4)
        out.append(decode_histograms(wire._Reader(data, "HISTOGRAMS"), header, wire.DEFAULT_LIMITS, 4))
    return out


def _load(path: str) -> Any:
    spec = importlib.util.spec_from_file_location("hist_base_reference", path)
    assert spec is not None
    assert spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--names", type=int, default=10_000, help="kernel names (histograms a section)")
    ap.add_argument("--hot", type=int, default=300, help="names shipped as increments")
    ap.add_argument("--batches", type=int, default=8)
    ap.add_argument("--reference", help="another hist_base module (HistogramBases), timed beside")
    args = ap.parse_args()
    secs = sections(args.names, args.hot, args.batches)
    ref = _load(args.reference) if args.reference else None
    kinds: list[tuple[str, Any]] = [("", HistogramBases)]
    if ref is not None:
        kinds.append(("reference_", ref.HistogramBases))
    cpu = {f"{p}{what}": 0.0 for p, _ in kinds for what in ("resolve", "derive")}
    bases = {p: cls() for p, cls in kinds}
    derivers = {}
    for p, cls in kinds:
        d = Deriver("node-0001")
        d.hist_bases = cls()
        derivers[p] = d
    names = {(1, i): f"kernel_{i}" for i in range(1, args.names + 1)}
    empty = np.zeros(0, dtype=RECORD_DTYPE)
    for k, sec in enumerate(secs):
        for p, _ in kinds:  # interleaved: the same section through each module in turn
            t = time.process_time()
            bases[p].resolve(sec, 1)
            if k:
                cpu[f"{p}resolve"] += time.process_time() - t
            t = time.process_time()
            derivers[p].derive(
                empty, strings=names, now_ns=sec.ts_ns, histograms=sec, body_version=4, epoch=1
            )
            if k:
                cpu[f"{p}derive"] += time.process_time() - t
    hists = args.names * (len(secs) - 1)
    figures = " ".join(
        f"{p}{w}_us_per_hist={cpu[p + w] / hists * 1e6:.2f}" for p, _ in kinds for w in ("resolve", "derive")
    )
    print(f"BENCH derive_histograms {figures}")


if __name__ == "__main__":
    main()
