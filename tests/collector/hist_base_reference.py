"""The collector's hist_base as it was before cumulative rows passed through unchanged (main at
3c808df): every row re-encoded one by one. tests/collector/test_hist_passthrough.py holds the
columnar resolve to this one's answers and bases; bench/derive --histograms times both.

Histogram increments (body version 4) back into cumulative histograms, against the bases kept here.

An agent that ships increments (docs/wire.md, "Increments") sends, per series, only the zero
count and buckets added since its previous export of that series; ``count`` and ``sum`` stay
cumulative, and ``count_inc`` (count minus the previous export's count) names the base. Within one
agent run (epoch) a series is exported only when its count grew, so the base's count identifies
the base exactly. This module keeps, per (epoch, series), the last few cumulative histograms the
agent shipped of at least ``BASE_MIN_COUNT`` observations (snapshots and rebuilt increments alike) and rebuilds each increment into the
cumulative histogram the agent holds, bucket for bucket, so storage and kql see exactly what a
snapshot would have said.

An increment whose base is not held (the collector restarted, another collector of the tier took
the previous batch, a batch went missing) cannot be rebuilt: it is left out and counted, and the
caller asks the agent for a snapshot. Rebuilding is a pure function of (base, increment), so a
retried batch yields the same histogram again and never adds an increment twice; the last
``KEEP`` bases per series are kept so a retry still finds its base after later batches were
derived (the ingest pipeline derives the frames of a request before any is stored).

Example::

    bases = HistogramBases()
    cumulative, unresolved = bases.resolve(section, epoch)   # section: a decoded WireHistograms
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from kernel_insight.collector.wire_hist import FLAG_FIRST, HistKind, HistRow, WireHistograms

__all__ = ["BASE_MIN_COUNT", "HistogramBases"]

#: The wire's rule (docs/wire.md, "Increments"): an agent sends an increment only over an export
#: of at least this many observations, so no lighter export is kept as a base. An agent holds
#: thousands of rarely launched kernels; their bases would be memory spent for nothing.
BASE_MIN_COUNT = 4096

_Key = tuple[int, int, int, int, int, int]  # kind, producer, id, gpu, pid, stream (the wire's key)


I32 = npt.NDArray[np.int32]
I64 = npt.NDArray[np.int64]
#: One side's populated buckets: sorted indexes and their counts (12 bytes a bucket, not a dict's ~100).
_Side = tuple[I32, I64]


@dataclass(frozen=True, slots=True)
class _Cum:
    """One cumulative histogram: populated buckets only."""

    schema: int
    zero_threshold: float
    zero_count: int
    count: int
    sum: float
    pos: _Side
    neg: _Side


def _absolute(spans: Sequence[tuple[int, int]], deltas: Sequence[int]) -> _Side:
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


def _spans(side: _Side) -> tuple[tuple[tuple[int, int], ...], tuple[int, ...]]:
    """client_golang's makeBuckets: spans with gaps of up to two buckets filled with zeros, counts
    as deltas (what the agent's export writes, so a rebuilt histogram equals its snapshot)."""
    spans: list[list[int]] = []
    deltas: list[int] = []
    prev, nxt = 0, 0
    for i, c in zip(side[0].tolist(), side[1].tolist(), strict=True):
        gap = i - nxt
        if not spans or gap > 2:
            spans.append([gap, 0])
        else:
            for _ in range(gap):
                spans[-1][1] += 1
                deltas.append(-prev)
                prev = 0
        spans[-1][1] += 1
        deltas.append(c - prev)
        prev = c
        nxt = i + 1
    return tuple((o, n) for o, n in spans), tuple(deltas)


def _add(base: _Side, inc: _Side) -> _Side:
    if not len(inc[0]):
        return base
    idx = np.union1d(base[0], inc[0]).astype(np.int32)
    counts = np.zeros(len(idx), dtype=np.int64)
    counts[np.searchsorted(idx, base[0])] += base[1]
    counts[np.searchsorted(idx, inc[0])] += inc[1]
    return idx, counts


class HistogramBases:
    """Per agent (one per ``Deriver``): the cumulative histograms its increments build on.

    ``keep`` bases per series; series of the ``epochs`` most recent agent runs (older runs'
    batches are spool replays, which the agent sends as snapshots). Not thread-safe: the
    deriver's lock covers it.
    """

    def __init__(self, keep: int = 4, epochs: int = 2, min_count: int | None = None) -> None:
        if keep < 1 or epochs < 1:
            raise ValueError("keep at least one base of at least one agent run")
        self.keep = keep
        self.epochs = epochs
        #: Exports of fewer observations are no base (BASE_MIN_COUNT unless given).
        self.min_count = BASE_MIN_COUNT if min_count is None else min_count
        self._runs: dict[int, dict[_Key, dict[int, _Cum]]] = {}

    def __len__(self) -> int:
        """Series held, over every run."""
        return sum(len(s) for s in self._runs.values())

    def _series(self, epoch: int) -> dict[_Key, dict[int, _Cum]]:
        run = self._runs.get(epoch)
        if run is None:
            run = self._runs[epoch] = {}
            for old in sorted(self._runs)[: -self.epochs]:
                del self._runs[old]
        return run

    def resolve(self, h: WireHistograms, epoch: int) -> tuple[WireHistograms | None, int]:
        """The section with every increment rebuilt into its cumulative histogram, and how many
        increments were left out for want of their base (None when nothing is left). Every
        histogram shipped of at least ``min_count`` observations becomes a base for the next
        increments of its series.

        Raises ValueError for an increment that would make a bucket negative (no agent sends one).
        """
        series = self._series(epoch)
        out: list[HistRow] = []
        unresolved = 0
        for row in h.rows():
            key = (
                int(row.kind),
                row.producer,
                row.id,
                row.gpu,
                row.pid,
                0 if row.stream is None else row.stream + 1,
            )
            pos, neg = _absolute(row.pos_spans, row.pos_deltas), _absolute(row.neg_spans, row.neg_deltas)
            if np.any(pos[1] < 0) or np.any(neg[1] < 0):
                raise ValueError("a histogram with a negative bucket count")
            history = series.get(key)
            if row.increment:
                base = history.get(row.count - row.count_inc) if history else None
                if base is None or base.schema != row.schema or base.zero_threshold != row.zero_threshold:
                    unresolved += 1
                    continue
                cum = _Cum(
                    row.schema,
                    row.zero_threshold,
                    base.zero_count + row.zero_count,
                    row.count,
                    row.sum,
                    _add(base.pos, pos),
                    _add(base.neg, neg),
                )
            else:
                cum = _Cum(row.schema, row.zero_threshold, row.zero_count, row.count, row.sum, pos, neg)
            if cum.count >= self.min_count:
                if history is None or row.first:
                    history = series[key] = {}
                history[cum.count] = cum
                while len(history) > self.keep:
                    del history[next(iter(history))]
            elif row.first and history is not None:
                del series[key]  # a new start of the series: the bases of the old one are none of its
            ps, pd = _spans(cum.pos)
            ns, nd = _spans(cum.neg)
            out.append(
                HistRow(
                    HistKind(row.kind),
                    producer=row.producer,
                    id=row.id,
                    gpu=row.gpu,
                    pid=row.pid,
                    stream=row.stream,
                    schema=cum.schema,
                    zero_threshold=cum.zero_threshold,
                    zero_count=cum.zero_count,
                    count=cum.count,
                    sum=cum.sum,
                    pos_spans=ps,
                    pos_deltas=pd,
                    neg_spans=ns,
                    neg_deltas=nd,
                    first=row.first,
                )
            )
        return (_columns(h.ts_ns, out) if out else None), unresolved


def _columns(ts_ns: int, rows: Sequence[HistRow]) -> WireHistograms:
    """Rows back into a section's columns (cumulative: no increment flag, count_inc 0)."""

    def u(values: list[int]) -> npt.NDArray[np.uint64]:
        return np.asarray(values, dtype=np.uint64)

    def i(values: list[int]) -> npt.NDArray[np.int64]:
        return np.asarray(values, dtype=np.int64)

    return WireHistograms(
        ts_ns,
        kind=np.asarray([int(r.kind) for r in rows], dtype=np.uint8),
        producer=u([r.producer for r in rows]),
        id=u([r.id for r in rows]),
        gpu=u([r.gpu for r in rows]),
        pid=u([r.pid for r in rows]),
        stream=u([0 if r.stream is None else r.stream + 1 for r in rows]),
        flags=np.asarray([FLAG_FIRST if r.first else 0 for r in rows], dtype=np.uint8),
        schema=i([r.schema for r in rows]),
        zero_threshold=np.asarray([r.zero_threshold for r in rows], dtype=np.float64),
        zero_count=u([r.zero_count for r in rows]),
        count=u([r.count for r in rows]),
        sum=np.asarray([r.sum for r in rows], dtype=np.float64),
        n_pos_spans=u([len(r.pos_spans) for r in rows]),
        n_neg_spans=u([len(r.neg_spans) for r in rows]),
        pos_span_offset=i([o for r in rows for o, _ in r.pos_spans]),
        pos_span_length=u([n for r in rows for _, n in r.pos_spans]),
        pos_delta=i([d for r in rows for d in r.pos_deltas]),
        neg_span_offset=i([o for r in rows for o, _ in r.neg_spans]),
        neg_span_length=u([n for r in rows for _, n in r.neg_spans]),
        neg_delta=i([d for r in rows for d in r.neg_deltas]),
        count_inc=np.zeros(len(rows), dtype=np.uint64),
    )
