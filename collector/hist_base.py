"""Histogram increments (body version 4) back into cumulative histograms, against the bases kept here.

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

The bases of all of a collector's agents share one :class:`BaseBudget`, a bound in bytes
(``ki collector --histogram-base-mb``): past it the least recently used series lose their bases,
and their next increment is left out exactly like one whose base was never held.

Example::

    budget = BaseBudget(64 << 20)                 # one per collector
    bases = HistogramBases(budget=budget)         # one per agent
    cumulative, unresolved = bases.resolve(section, epoch)   # section: a decoded WireHistograms
"""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from kernel_insight.collector.defaults import BASE_MAX_BYTES
from kernel_insight.collector.wire_hist import FLAG_FIRST, FLAG_INCREMENT, HistKind, HistRow, WireHistograms

__all__ = ["BASE_MAX_BYTES", "BASE_MIN_COUNT", "BaseBudget", "HistogramBases"]

#: The wire's rule (docs/wire.md, "Increments"): an agent sends an increment only over an export
#: of at least this many observations, so no lighter export is kept as a base. An agent holds
#: thousands of rarely launched kernels; their bases would be memory spent for nothing.
BASE_MIN_COUNT = 4096
#: What the bases are estimated to cost (``BaseBudget.bytes``), as tracemalloc measured them: per
#: populated bucket 12 (an int32 index, an int64 count; 11-12 measured); per base 450 (its
#: dataclass, two numpy arrays, its entry in the series' dict: 445); per series 650 (its dict,
#: key and entries in the run's and the budget's dicts: 664). ~22 bytes a bucket in all at 60
#: buckets and four bases. tests/collector/test_hist_base_budget.py holds the estimate to the truth.
BUCKET_BYTES = 12
CUM_BYTES = 450
SERIES_BYTES = 650

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


#: The side of a histogram without buckets (kernel durations have no negative ones), shared: two
#: empty numpy arrays per base cost ~220 bytes, a fifth of a base's fixed cost.
_EMPTY: _Side = (np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.int64))
_EMPTY[0].flags.writeable = False
_EMPTY[1].flags.writeable = False


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


class _Series:
    """One series' bases (count -> cumulative histogram, oldest first) and their estimated bytes."""

    __slots__ = ("history", "nbytes")

    def __init__(self) -> None:
        self.history: dict[int, _Cum] = {}
        self.nbytes = SERIES_BYTES


class _Run:
    """The series of one agent run (epoch); ``token`` tells its series apart in the budget."""

    __slots__ = ("series", "token")

    def __init__(self, token: int) -> None:
        self.token = token
        self.series: dict[_Key, _Series] = {}


def _cum_bytes(cum: _Cum) -> int:
    return CUM_BYTES + BUCKET_BYTES * (len(cum.pos[0]) + len(cum.neg[0]))


class BaseBudget:
    """The bound on the bases of every agent of a collector: estimated bytes held, at most
    ``max_bytes``; past it, the series used least recently (looked up or stored by an export) lose
    all their bases first, whichever agent they belong to. A lost base costs one point of its
    series (the increment over it is left out and the agent asked for a snapshot), never a wrong
    one; a bound below the fleet's working set costs a point per series per export, which
    ``evictions`` and ``histogram_without_base`` show.

    Its lock guards every ``HistogramBases`` under it (an eviction edits another agent's series).

    >>> budget = BaseBudget(1 << 20)
    >>> budget.bytes, budget.series, budget.evictions
    (0, 0, 0)
    """

    def __init__(self, max_bytes: int = BASE_MAX_BYTES) -> None:
        if max_bytes < 0:
            raise ValueError("the bases' bound cannot be negative")
        self.max_bytes = max_bytes
        self.lock = threading.Lock()
        #: (run token, key) -> (its run, the series), least recently used first
        self._lru: OrderedDict[tuple[int, _Key], tuple[_Run, _Series]] = OrderedDict()
        self._tokens = itertools.count()
        self.bytes = 0  #: estimated bytes of every series held (BUCKET_BYTES, CUM_BYTES, SERIES_BYTES)
        self.evictions = 0  #: series whose bases were dropped to keep the bound

    @property
    def series(self) -> int:
        """Series held, over every agent and run."""
        return len(self._lru)

    def _run(self) -> _Run:
        return _Run(next(self._tokens))

    def _add_series(self, run: _Run, key: _Key) -> _Series:
        s = run.series[key] = _Series()
        self._lru[(run.token, key)] = (run, s)
        self.bytes += s.nbytes
        return s

    def _drop_series(self, run: _Run, key: _Key) -> None:
        s = run.series.pop(key)
        del self._lru[(run.token, key)]
        self.bytes -= s.nbytes

    def _used(self, run: _Run, key: _Key) -> None:
        self._lru.move_to_end((run.token, key))

    def _resize(self, s: _Series, delta: int) -> None:
        s.nbytes += delta
        self.bytes += delta

    def _evict(self) -> None:
        while self.bytes > self.max_bytes and self._lru:
            (_, key), (run, s) = self._lru.popitem(last=False)
            del run.series[key]
            self.bytes -= s.nbytes
            self.evictions += 1


class HistogramBases:
    """Per agent (one per ``Deriver``): the cumulative histograms its increments build on.

    ``keep`` bases per series; series of the ``epochs`` most recent agent runs (older runs'
    batches are spool replays, which the agent sends as snapshots); all under ``budget``'s bound
    (a collector's agents share one; a budget of its own, of ``BASE_MAX_BYTES``, if none is given).
    Thread-safe through the budget's lock.
    """

    def __init__(
        self, keep: int = 4, epochs: int = 2, min_count: int | None = None, budget: BaseBudget | None = None
    ) -> None:
        if keep < 1 or epochs < 1:
            raise ValueError("keep at least one base of at least one agent run")
        self.keep = keep
        self.epochs = epochs
        #: Exports of fewer observations are no base (BASE_MIN_COUNT unless given).
        self.min_count = BASE_MIN_COUNT if min_count is None else min_count
        self.budget = BaseBudget() if budget is None else budget
        self._runs: dict[int, _Run] = {}

    def __len__(self) -> int:
        """Series held, over every run."""
        with self.budget.lock:
            return sum(len(r.series) for r in self._runs.values())

    def _series(self, epoch: int) -> _Run:
        """The series of agent run ``epoch`` (the budget's lock held); runs older than the last
        ``epochs`` go, and their bytes with them."""
        run = self._runs.get(epoch)
        if run is None:
            run = self._runs[epoch] = self.budget._run()
            for old in sorted(self._runs)[: -self.epochs]:
                for key in list(self._runs[old].series):
                    self.budget._drop_series(self._runs[old], key)
                del self._runs[old]
        return run

    def resolve(self, h: WireHistograms, epoch: int) -> tuple[WireHistograms | None, int]:
        """The section with every increment rebuilt into its cumulative histogram, and how many
        increments were left out for want of their base (None when nothing is left). Every
        histogram shipped of at least ``min_count`` observations becomes a base for the next
        increments of its series.

        A cumulative row whose buckets are already laid out as :func:`_spans` lays them out
        (what an agent's export writes) goes on as it came: re-encoding it would give the same
        spans and deltas. Only increments, other layouts and the rows that touch the bases
        (bases kept, a series' first export) are looked at one by one; a section of light
        kernels' snapshots is handed on unchanged.

        Raises ValueError for a histogram with a negative bucket (no agent sends one).
        """
        n = len(h)
        pos = _section_side(h.n_pos_spans, h.pos_span_offset, h.pos_span_length, h.pos_delta, n)
        neg = _section_side(h.n_neg_spans, h.neg_span_offset, h.neg_span_length, h.neg_delta, n)
        if np.any(pos.counts < 0) or np.any(neg.counts < 0):
            raise ValueError("a histogram with a negative bucket count")
        increment = (h.flags & FLAG_INCREMENT) != 0
        passes = ~increment & pos.canonical & neg.canonical
        slow = ~passes | ((h.flags & FLAG_FIRST) != 0) | (h.count >= np.uint64(max(self.min_count, 0)))
        rebuilt: dict[int, HistRow] = {}
        dropped: list[int] = []
        unresolved = 0
        if not n:
            return None, 0
        which = np.flatnonzero(slow).tolist()
        with self.budget.lock:
            series = self._series(epoch)
            for i, row in zip(which, h.rows(which), strict=True):
                cum = self._step(series, row, pos.side(i), neg.side(i))
                if cum is None:
                    unresolved += 1
                    dropped.append(i)
                elif not passes[i]:
                    rebuilt[i] = _cumulative_row(row, cum)
        if not rebuilt and not dropped:
            return h, 0
        keep = np.ones(n, dtype=bool)
        keep[dropped] = False
        if rebuilt:
            keep[list(rebuilt)] = False
        order = np.concatenate(
            [np.flatnonzero(keep), np.fromiter(rebuilt, dtype=np.int64, count=len(rebuilt))]
        )
        if not len(order):
            return None, unresolved
        parts = _take(h, np.flatnonzero(keep))
        if rebuilt:
            parts = _concat(parts, _columns(h.ts_ns, list(rebuilt.values())))
        return _take(parts, np.argsort(order, kind="stable")), unresolved

    def _step(self, run: _Run, row: HistRow, pos: _Side, neg: _Side) -> _Cum | None:
        """One row against its series' bases: its cumulative histogram (None: an increment whose
        base is not held), kept as a base when heavy enough (the budget's lock held)."""
        budget = self.budget
        key = (
            int(row.kind),
            row.producer,
            row.id,
            row.gpu,
            row.pid,
            0 if row.stream is None else row.stream + 1,
        )
        series = run.series.get(key)
        if series is not None:
            budget._used(run, key)
        if row.increment:
            base = series.history.get(row.count - row.count_inc) if series else None
            if base is None or base.schema != row.schema or base.zero_threshold != row.zero_threshold:
                return None
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
            if series is not None and row.first:
                budget._drop_series(
                    run, key
                )  # a new start of the series: the old one's bases are none of its
                series = None
            if series is None:
                series = budget._add_series(run, key)
            old = series.history.get(cum.count)  # a retry's rebuild replaces its own, in its place
            budget._resize(series, _cum_bytes(cum) - (0 if old is None else _cum_bytes(old)))
            series.history[cum.count] = cum
            while len(series.history) > self.keep:
                budget._resize(series, -_cum_bytes(series.history.pop(next(iter(series.history)))))
            budget._evict()
        elif row.first and series is not None:
            budget._drop_series(run, key)  # a new start of the series: the old one's bases are none of its
        return cum


def _cumulative_row(row: HistRow, cum: _Cum) -> HistRow:
    """``row`` as the cumulative histogram ``cum``, its buckets laid out by :func:`_spans`."""
    ps, pd = _spans(cum.pos)
    ns, nd = _spans(cum.neg)
    return HistRow(
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


class _SectionSide:
    """One side (positive or negative) of every row of a section: where each row's spans and
    buckets lie in the flat columns, every bucket's index and absolute count, and which rows
    are laid out as :func:`_spans` would lay out their non-zero buckets (``canonical``)."""

    __slots__ = ("bucket_off", "canonical", "counts", "index", "span_off")

    def __init__(
        self, span_off: I64, bucket_off: I64, index: I64, counts: I64, canonical: npt.NDArray[np.bool_]
    ) -> None:
        self.span_off, self.bucket_off = span_off, bucket_off
        self.index, self.counts, self.canonical = index, counts, canonical

    def side(self, i: int) -> _Side:
        """Row ``i``'s non-zero buckets (sorted indexes, counts)."""
        a, b = int(self.bucket_off[i]), int(self.bucket_off[i + 1])
        if a == b:
            return _EMPTY
        counts = self.counts[a:b]
        keep = counts != 0
        return self.index[a:b][keep].astype(np.int32), counts[keep]


def _section_side(
    n_spans: npt.NDArray[np.uint64], offsets: I64, lengths: npt.NDArray[np.uint64], deltas: I64, n: int
) -> _SectionSide:
    """:class:`_SectionSide` of one side's columns, for all ``n`` rows at once."""
    span_off = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(n_spans.astype(np.int64), out=span_off[1:])
    length = lengths.astype(np.int64)
    span_end = np.zeros(len(length) + 1, dtype=np.int64)
    np.cumsum(length, out=span_end[1:])
    bucket_off = span_end[span_off]
    nb = int(bucket_off[-1])
    row_of_bucket = np.repeat(np.arange(n, dtype=np.int64), np.diff(bucket_off))
    # Prometheus deltas run across a row's spans: the absolute counts are a running sum
    # restarted at each row (int64 wrap-around as the per-row sum's).
    run = np.cumsum(deltas)
    before = np.concatenate([[0], run])[bucket_off[:-1]]
    counts = run - before[row_of_bucket] if nb else np.zeros(0, dtype=np.int64)
    # Bucket indexes: a span starts ``offset`` after the previous span's end (the first at ``offset``).
    row_of_span = np.repeat(np.arange(n, dtype=np.int64), np.diff(span_off))
    first_span = np.zeros(len(length), dtype=bool)
    first_span[span_off[:-1][np.diff(span_off) > 0]] = True
    step = offsets + np.where(first_span, 0, np.concatenate([[0], length[:-1]]))
    srun = np.cumsum(step)
    span_start = srun - np.concatenate([[0], srun])[span_off[:-1]][row_of_span] if len(length) else srun
    span_of_bucket = np.repeat(np.arange(len(length), dtype=np.int64), length)
    index = span_start[span_of_bucket] + (np.arange(nb, dtype=np.int64) - span_end[:-1][span_of_bucket])
    # _spans' layout: every span non-empty, a gap of more than two buckets before every span but
    # a row's first, each span's first and last bucket non-zero, no three zero buckets in a row.
    bad_span = (length == 0) | (~first_span & (offsets <= 2))
    if nb:
        zero = counts == 0
        bad_span |= zero[np.minimum(span_end[:-1], nb - 1)] | zero[np.maximum(span_end[1:] - 1, 0)]
        triple = np.zeros(nb, dtype=bool)
        triple[2:] = zero[2:] & zero[1:-1] & zero[:-2]
        bad_bucket = np.bincount(row_of_bucket[triple], minlength=n) > 0
    else:
        bad_bucket = np.zeros(n, dtype=bool)
    canonical = ~bad_bucket & ~(np.bincount(row_of_span[bad_span], minlength=n) > 0)
    return _SectionSide(span_off, bucket_off, index, counts, canonical)


_FIXED_COLUMNS = (
    "kind", "producer", "id", "gpu", "pid", "stream", "flags", "schema", "zero_threshold",
    "zero_count", "count", "sum", "n_pos_spans", "n_neg_spans", "count_inc",
)  # fmt: skip


def _ranges(off: I64, idx: I64) -> I64:
    """Positions ``off[i]:off[i + 1]`` for each ``i`` of ``idx``, concatenated."""
    starts, lengths = off[idx], off[idx + 1] - off[idx]
    ends = np.cumsum(lengths)
    out: I64 = np.repeat(starts - (ends - lengths), lengths) + np.arange(int(ends[-1]) if len(ends) else 0)
    return out


def _take(h: WireHistograms, idx: I64) -> WireHistograms:
    """Rows ``idx`` of a section, in that order."""
    n = len(h)
    cols = {name: getattr(h, name)[idx] for name in _FIXED_COLUMNS}
    for side in ("pos", "neg"):
        span_off = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(getattr(h, f"n_{side}_spans").astype(np.int64), out=span_off[1:])
        lengths = getattr(h, f"{side}_span_length")
        span_end = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths.astype(np.int64), out=span_end[1:])
        spans = _ranges(span_off, idx)
        cols[f"{side}_span_offset"] = getattr(h, f"{side}_span_offset")[spans]
        cols[f"{side}_span_length"] = lengths[spans]
        cols[f"{side}_delta"] = getattr(h, f"{side}_delta")[_ranges(span_end[span_off], idx)]
    return WireHistograms(h.ts_ns, **cols)


def _concat(a: WireHistograms, b: WireHistograms) -> WireHistograms:
    """The rows of ``a`` then those of ``b``."""
    names = (
        *_FIXED_COLUMNS,
        *(f"{s}_{c}" for s in ("pos", "neg") for c in ("span_offset", "span_length", "delta")),
    )
    return WireHistograms(a.ts_ns, **{k: np.concatenate([getattr(a, k), getattr(b, k)]) for k in names})


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
