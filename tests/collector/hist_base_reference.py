"""``HistogramBases.resolve`` as it was before cumulative rows passed through unchanged (main at
3c808df): every row decoded, rebuilt and re-encoded one by one. The bases' rule is the module's
own (``_step``); what differs is the columnar pass, which test_hist_passthrough.py holds to this.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kernel_insight.collector.hist_base import HistogramBases, _columns, _cumulative_row, _Side
from kernel_insight.collector.wire_hist import WireHistograms


def absolute(spans: Sequence[tuple[int, int]], deltas: Sequence[int]) -> _Side:
    """Spans and Prometheus deltas -> the non-zero buckets (sorted indexes, counts)."""
    idx: list[int] = []
    i = 0
    for offset, length in spans:
        i += offset
        idx.extend(range(i, i + length))
        i += length
    counts = np.cumsum(np.asarray(deltas, dtype=np.int64))
    keep = counts != 0
    return np.asarray(idx, dtype=np.int32)[keep], counts[keep]


class RowByRow(HistogramBases):
    def resolve(self, h: WireHistograms, epoch: int) -> tuple[WireHistograms | None, int]:
        series = self._series(epoch)
        out = []
        unresolved = 0
        for row in h.rows():
            pos, neg = absolute(row.pos_spans, row.pos_deltas), absolute(row.neg_spans, row.neg_deltas)
            if np.any(pos[1] < 0) or np.any(neg[1] < 0):
                raise ValueError("a histogram with a negative bucket count")
            cum = self._step(series, row, pos, neg)
            if cum is None:
                unresolved += 1
                continue
            out.append(_cumulative_row(row, cum))
        return (_columns(h.ts_ns, out) if out else None), unresolved
