"""Native-histogram samples as columns (schema, counts, spans and buckets as flat arrays), as a
columnar store reads them: the engine's dense paths take their bucket matrices straight from
here, and ``FloatHistogram`` objects are made only for the paths that ask for them.
"""

from __future__ import annotations

import gc
import itertools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from kernel_insight.kql.histogram import (
    COUNTER_RESET,
    CUSTOM_BUCKETS_SCHEMA,
    NOT_COUNTER_RESET,
    FloatHistogram,
)
from kernel_insight.kql.histogram import GAUGE_TYPE as GAUGE
from kernel_insight.kql.histogram import UNKNOWN_COUNTER_RESET as UNKNOWN
from kernel_insight.kql.storage import STALE_NAN_BITS, is_stale

__all__ = [
    "HistSamples",
    "Ragged",
    "SparseHists",
    "bucket_indices",
    "renumbering",
    "tsdb_pending",
]

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]
BOOL = npt.NDArray[np.bool_]
OBJ = npt.NDArray[np.object_]


class Ragged:
    """One list per row as (row offsets, flat values): row ``i`` is ``flat[off[i]:off[i + 1]]``.

    ``flat`` may be 2-D (spans: one (offset, length) pair per element); ``off[0]`` is 0.
    """

    __slots__ = ("flat", "off")

    def __init__(self, off: I64, flat: npt.NDArray[Any]) -> None:
        self.off = off
        self.flat = flat

    @classmethod
    def empty(cls, rows: int, width: int = 0) -> Ragged:
        shape: tuple[int, ...] = (0, width) if width else (0,)
        dtype = np.int64 if width else np.float64
        return cls(np.zeros(rows + 1, dtype=np.int64), np.empty(shape, dtype=dtype))

    @property
    def lengths(self) -> I64:
        lengths: I64 = np.diff(self.off)
        return lengths

    def rows(self, a: int, b: int) -> Ragged:
        """Rows ``a:b`` (views of the flat values)."""
        lo, hi = int(self.off[a]), int(self.off[b])
        return Ragged(self.off[a : b + 1] - lo, self.flat[lo:hi])

    def take(self, idx: I64) -> Ragged:
        """Rows ``idx``, in that order."""
        from kernel_insight.kql.pushdown import gather_ranges

        lengths = self.lengths[idx]
        off = np.zeros(len(idx) + 1, dtype=np.int64)
        np.cumsum(lengths, out=off[1:])
        if not len(self.flat):
            return Ragged(off, self.flat)
        return Ragged(off, self.flat[gather_ranges(self.off[:-1][idx], lengths)])

    def take_ranges(self, starts: I64, lengths: I64) -> Ragged:
        """Rows ``starts[k] : starts[k] + lengths[k]`` for each ``k``, concatenated: one copy
        per range of the flat values (a series' rows are one range), no index per element."""
        if len(starts) * 64 > len(self.flat):  # many short ranges: an index is cheaper
            from kernel_insight.kql.pushdown import gather_ranges

            return self.take(gather_ranges(starts, lengths))
        first, last = self.off[starts], self.off[starts + lengths]
        row_lengths = self.lengths
        off = np.zeros(int(lengths.sum()) + 1, dtype=np.int64)
        np.cumsum(
            np.concatenate(
                [row_lengths[a : a + n] for a, n in zip(starts.tolist(), lengths.tolist(), strict=True)]
            )
            if len(starts)
            else np.zeros(0, dtype=np.int64),
            out=off[1:],
        )
        flat = np.concatenate(
            [self.flat[a:b] for a, b in zip(first.tolist(), last.tolist(), strict=True)] or [self.flat[:0]]
        )
        return Ragged(off, flat)

    def tuples(self) -> list[tuple[Any, ...]]:
        """Every row as a tuple of Python values (spans: tuples of (offset, length) pairs)."""
        n = len(self.off) - 1
        if not len(self.flat):
            return [()] * n
        values = [tuple(p) for p in self.flat.tolist()] if self.flat.ndim == 2 else self.flat.tolist()
        return [tuple(values[a:b]) for a, b in itertools.pairwise(self.off.tolist())]


class SparseHists:
    """``n`` native-histogram samples as columns, in the order a store read them.

    ``hint`` is each sample's counter-reset hint as Prometheus' TSDB returns it, except for the
    ``pending`` rows: those follow a counter histogram of the same chunk (the row right before
    them) with an unknown hint of their own, so their hint is "unknown" (0: the reset started a
    chunk, and TSDB reads a chunk's first sample as unknown) if ``detect_reset`` against that row
    says so, else "not a counter reset" (2). Deciding that
    needs the buckets of both rows; it is left to whoever reads the hints (:meth:`hints`, or a
    dense block that compares the rows' buckets anyway), so a read that only sums and ranks
    buckets never does it twice. Every operation keeps a pending row right after the row it
    follows.

    >>> h = FloatHistogram(schema=0, count=2, sum=3, positive_spans=((0, 2),), positive_buckets=(1, 1))
    >>> data = SparseHists.of_objects([h, h])
    >>> str(data.objects()[1])
    '{count:2, sum:3, (0.5,1]:1, (1,2]:1}'
    """

    __slots__ = (
        "_hints",
        "_objects",
        "count",
        "custom",
        "hint",
        "neg_buckets",
        "neg_spans",
        "pending",
        "pos_buckets",
        "pos_spans",
        "schema",
        "sum",
        "zero_count",
        "zero_threshold",
    )

    def __init__(
        self,
        schema: I64,
        zero_threshold: F64,
        zero_count: F64,
        count: F64,
        total: F64,
        hint: I64,
        pending: BOOL,
        pos_spans: Ragged,
        pos_buckets: Ragged,
        neg_spans: Ragged,
        neg_buckets: Ragged,
        custom: Ragged,
    ) -> None:
        self.schema, self.zero_threshold, self.zero_count = schema, zero_threshold, zero_count
        self.count, self.sum, self.hint, self.pending = count, total, hint, pending
        self.pos_spans, self.pos_buckets = pos_spans, pos_buckets
        self.neg_spans, self.neg_buckets = neg_spans, neg_buckets
        self.custom = custom
        self._hints: I64 | None = None
        self._objects: OBJ | None = None

    def __len__(self) -> int:
        return len(self.count)

    # ------------------------------------------------------------------ construction

    @classmethod
    def of_objects(cls, hs: Sequence[FloatHistogram]) -> SparseHists:
        """Columns of existing objects (hints as they are, none pending): tests and small inputs."""
        n = len(hs)

        def ragged(rows: list[tuple[Any, ...]], pairs: bool) -> Ragged:
            off = np.zeros(n + 1, dtype=np.int64)
            np.cumsum([len(r) for r in rows], out=off[1:])
            flat = [x for r in rows for x in r]
            if pairs:
                return Ragged(off, np.asarray(flat, dtype=np.int64).reshape(-1, 2))
            return Ragged(off, np.asarray(flat, dtype=np.float64))

        data = cls(
            np.asarray([h.schema for h in hs], dtype=np.int64),
            np.asarray([h.zero_threshold for h in hs], dtype=np.float64),
            np.asarray([h.zero_count for h in hs], dtype=np.float64),
            np.asarray([h.count for h in hs], dtype=np.float64),
            np.asarray([h.sum for h in hs], dtype=np.float64),
            np.asarray([h.counter_reset_hint for h in hs], dtype=np.int64),
            np.zeros(n, dtype=bool),
            ragged([tuple(h.positive_spans) for h in hs], True),
            ragged([tuple(h.positive_buckets) for h in hs], False),
            ragged([tuple(h.negative_spans) for h in hs], True),
            ragged([tuple(h.negative_buckets) for h in hs], False),
            ragged([tuple(h.custom_values) for h in hs], False),
        )
        holder = np.empty(n, dtype=object)
        holder[:] = list(hs)
        data._objects = holder
        return data

    def _mapped(self, arr: Callable[[Any], Any], rag: Callable[[Ragged], Ragged]) -> SparseHists:
        """The same rows through ``arr`` (each column) and ``rag`` (each list column), what was
        already decided (hints, objects) going with them."""
        out = SparseHists(
            arr(self.schema),
            arr(self.zero_threshold),
            arr(self.zero_count),
            arr(self.count),
            arr(self.sum),
            arr(self.hint),
            arr(self.pending),
            rag(self.pos_spans),
            rag(self.pos_buckets),
            rag(self.neg_spans),
            rag(self.neg_buckets),
            rag(self.custom),
        )
        if self._hints is not None:
            out._hints = arr(self._hints)
        if self._objects is not None:
            out._objects = arr(self._objects)
        return out

    def rows(self, a: int, b: int) -> SparseHists:
        """Rows ``a:b`` (views); row ``a`` must not be pending (chunks start at a series' first sample)."""
        return self._mapped(lambda x: x[a:b], lambda x: x.rows(a, b))

    def take(self, idx: I64) -> SparseHists:
        """Rows ``idx`` in that order; every pending row taken must come right after its predecessor."""
        return self._mapped(lambda x: x[idx], lambda x: x.take(idx))

    def take_ranges(self, starts: I64, lengths: I64) -> SparseHists:
        """Rows ``starts[k] : starts[k] + lengths[k]`` for each ``k``, concatenated (whole
        series moved to the order of their labels): list columns copied range by range."""
        from kernel_insight.kql.pushdown import gather_ranges

        idx = gather_ranges(starts, lengths)
        return self._mapped(lambda x: x[idx], lambda x: x.take_ranges(starts, lengths))

    def select(self, idx: I64) -> SparseHists:
        """Rows ``idx`` (in that order, any row any number of times) with their hints decided
        first (only the chosen pending rows are compared with the rows before them): what an
        instant selector keeps of a read, none pending, so it stands without its neighbours."""
        hint = self.hint[idx]
        pending = self.pending[idx]
        if pending.any():
            hint = hint.copy()
            if self._hints is not None:
                hint[pending] = self._hints[idx[pending]]
            else:
                rows, back = np.unique(idx[pending], return_inverse=True)
                decided = np.where(self._resets(rows), UNKNOWN, NOT_COUNTER_RESET)
                hint[pending] = decided[back]
        out = self._mapped(lambda x: x[idx], lambda x: x.take(idx))
        out.hint, out.pending, out._hints = hint, np.zeros(len(idx), dtype=bool), hint
        return out

    def with_hints(self, hint: I64) -> SparseHists:
        """The same rows with ``hint`` as their stated hints (none pending)."""
        out = self._mapped(lambda x: x, lambda x: x)
        out.hint, out.pending, out._hints, out._objects = hint, np.zeros(len(hint), dtype=bool), None, None
        return out

    def with_pending(self, pending: BOOL) -> SparseHists:
        """The same rows with ``pending`` as the rows whose hint is still to be decided."""
        out = self._mapped(lambda x: x, lambda x: x)
        out.pending, out._hints, out._objects = pending, None, None
        return out

    # ------------------------------------------------------------------ reading

    def stale(self) -> BOOL:
        """Which rows are staleness markers (the sum's StaleNaN bit pattern, as ``is_stale_histogram``)."""
        stale: BOOL = self.sum.view(np.uint64) == np.uint64(STALE_NAN_BITS)
        return stale

    def weights(self) -> I64:
        """Each row's :meth:`FloatHistogram.sample_weight`, from the list lengths alone."""
        parts = (
            self.pos_spans.lengths
            + self.neg_spans.lengths
            + self.pos_buckets.lengths
            + self.neg_buckets.lengths
            + self.custom.lengths
        )
        weights: I64 = (176 + 8 * parts) >> 4
        return weights

    def nonnegative(self) -> bool:
        """Every bucket count is >= 0 (no NaN): then a bucket absent from one row and present in
        another compares as a 0 count, as Prometheus' ``detectReset`` treats it."""
        return bool((self.pos_buckets.flat >= 0).all() and (self.neg_buckets.flat >= 0).all())

    def hints(self) -> I64:
        """Every row's counter-reset hint, the pending rows decided (:meth:`FloatHistogram.detect_reset`)."""
        if self._hints is None:
            hints = self.hint.copy()
            rows = np.flatnonzero(self.pending)
            if len(rows):
                resets = self._resets(rows)
                hints[rows] = np.where(resets, UNKNOWN, NOT_COUNTER_RESET)
            self._hints = hints
        return self._hints

    def _resets(self, rows: I64) -> BOOL:
        """``detect_reset(row, row - 1)`` for each of ``rows`` (hint unknown, rows > 0).

        Decided for whole columns where a row has its predecessor's layout (schema, zero
        threshold, spans, custom bounds, every bucket clear of the zero bucket): there
        Prometheus' ``DetectReset`` comes down to "the count, the zero count or a bucket went
        down". The other rows compare objects.
        """
        p = rows - 1
        sc, zt = self.schema, self.zero_threshold
        same = (sc[rows] == sc[p]) & (zt[rows] == zt[p])
        went_down = (self.count[rows] < self.count[p]) | (self.zero_count[rows] < self.zero_count[p])
        for spans, buckets in ((self.pos_spans, self.pos_buckets), (self.neg_spans, self.neg_buckets)):
            same &= _rows_equal(spans, rows)
            same &= buckets.lengths[rows] == buckets.lengths[p]
            lengths = spans.lengths
            has = lengths[rows] > 0
            first = np.zeros(len(rows), dtype=np.float64)
            first[has] = spans.flat[spans.off[rows[has]], 0]
            upper = np.exp2(first / np.exp2(sc[rows].astype(np.float64)))  # the lowest bucket's upper bound
            same &= ~has | (sc[rows] == CUSTOM_BUCKETS_SCHEMA) | (zt[rows] == 0) | (upper > zt[rows])
            went_down |= _rows_less(buckets, rows)
        same &= _rows_equal(self.custom, rows)
        out = went_down.copy()
        for k in np.flatnonzero(~same).tolist():
            r = int(rows[k])
            cur = self._object(r, UNKNOWN)
            out[k] = cur.detect_reset(self._object(r - 1, int(self.hint[r - 1])))
        return out

    def _object(self, r: int, hint: int) -> FloatHistogram:
        def pairs(x: Ragged) -> tuple[tuple[int, int], ...]:
            return tuple((int(o), int(n)) for o, n in x.flat[x.off[r] : x.off[r + 1]].tolist())

        def values(x: Ragged) -> tuple[float, ...]:
            return tuple(x.flat[x.off[r] : x.off[r + 1]].tolist())

        return FloatHistogram(
            schema=int(self.schema[r]),
            zero_threshold=float(self.zero_threshold[r]),
            zero_count=float(self.zero_count[r]),
            count=float(self.count[r]),
            sum=float(self.sum[r]),
            positive_spans=pairs(self.pos_spans),
            positive_buckets=values(self.pos_buckets),
            negative_spans=pairs(self.neg_spans),
            negative_buckets=values(self.neg_buckets),
            counter_reset_hint=hint,
            custom_values=values(self.custom),
        )

    def objects_made(self) -> bool:
        """Whether :meth:`objects` has made (or was given) the rows' objects."""
        return self._objects is not None

    def objects(self) -> OBJ:
        """One ``FloatHistogram`` per row (hints decided), made once."""
        if self._objects is None:
            n = len(self)
            out = np.empty(n, dtype=object)
            # Hundreds of thousands of new objects would set off the cyclic collector again and
            # again, each pass walking everything made so far: none of them can form a cycle.
            collecting = gc.isenabled()
            gc.disable()
            try:
                out[:] = [
                    FloatHistogram(s_, zt_, zc_, c_, t_, ps, pb, ns, nb, h_, cv)
                    for s_, zt_, zc_, c_, t_, ps, pb, ns, nb, h_, cv in zip(
                        self.schema.tolist(),
                        self.zero_threshold.tolist(),
                        self.zero_count.tolist(),
                        self.count.tolist(),
                        self.sum.tolist(),
                        self.pos_spans.tuples(),
                        self.pos_buckets.tuples(),
                        self.neg_spans.tuples(),
                        self.neg_buckets.tuples(),
                        self.hints().tolist(),
                        self.custom.tuples(),
                        strict=True,
                    )
                ]
            finally:
                if collecting:
                    gc.enable()
            self._objects = out
        return self._objects

    def dense_side(self, positive: bool) -> tuple[int, F64] | None:
        """(lowest bucket index, counts as an n x width matrix) of one side, bucket ``lo + k`` in
        column ``k`` (absent buckets 0), as ``histdense.DenseBlock`` lays out objects; None when
        some row's spans do not cover exactly its buckets (the object path decides those)."""
        spans, buckets = (
            (self.pos_spans, self.pos_buckets) if positive else (self.neg_spans, self.neg_buckets)
        )
        n = len(self)
        if not len(buckets.flat):
            return (0, np.zeros((n, 0))) if not len(spans.flat) or not spans.flat[:, 1].any() else None
        index = bucket_indices(spans, buckets)
        if index is None:
            return None
        lo, hi = int(index.min()), int(index.max())
        mat = np.zeros((n, hi - lo + 1))
        mat[np.repeat(np.arange(n), buckets.lengths), index - lo] = buckets.flat
        return lo, mat

    def compacted(self, every_row: bool = False) -> SparseHists | None:
        """These rows as ``FloatHistogram.compact(0)`` (Prometheus' ``Compact(0)``) leaves each
        row holding a bucket of 0 (±0: both sides' zero buckets dropped, their spans rebuilt as
        maximal runs), every other row as it is: what sum/avg make of a group's single member,
        as :func:`histdense.single_members` does for objects; with ``every_row`` every row
        compacted (``hcompact`` of each result of ``x * s``, ``x / s``). Itself when no row
        has a bucket of 0 (and not ``every_row``); None when a row to compact has spans that
        do not cover its buckets or go backwards (the object path decides those)."""
        zero = np.full(len(self), every_row, dtype=bool)
        for buckets in (self.pos_buckets, self.neg_buckets):
            zero[np.repeat(np.arange(len(self)), buckets.lengths)[buckets.flat == 0]] = True
        if not zero.any():
            return self
        sides = []
        for spans, buckets in ((self.pos_spans, self.pos_buckets), (self.neg_spans, self.neg_buckets)):
            side = _compact_rows(spans, buckets, zero)
            if side is None:
                return None
            sides.append(side)
        (ps, pb), (ns, nb) = sides
        out = SparseHists(
            self.schema,
            self.zero_threshold,
            self.zero_count,
            self.count,
            self.sum,
            self.hint,
            self.pending,
            ps,
            pb,
            ns,
            nb,
            self.custom,
        )
        out._hints = self._hints
        return out


def bucket_indices(spans: Ragged, buckets: Ragged) -> I64 | None:
    """The absolute bucket index of every element of ``buckets.flat`` as its row's spans place
    it; None when some row's spans do not cover exactly its buckets (or a length is negative)."""
    if not len(buckets.flat) and not len(spans.flat):
        return np.zeros(0, dtype=np.int64)
    pairs = spans.flat.reshape(-1, 2)
    offsets, lengths = pairs[:, 0], pairs[:, 1]
    if (lengths < 0).any():
        return None
    covered = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=covered[1:])
    if not np.array_equal(covered[spans.off[1:]] - covered[spans.off[:-1]], buckets.lengths):
        return None
    # A span starts ``offset`` after the end of the one before it in its row (the first: at
    # ``offset``): a running sum restarted at each row's first span.
    nspans = spans.lengths
    first = np.zeros(len(lengths), dtype=bool)
    first[spans.off[:-1][nspans > 0]] = True
    step = offsets.copy()
    step[1:] += np.where(first[1:], 0, lengths[:-1])
    run = np.cumsum(step)
    starts = run - np.repeat(run[first] - step[first], nspans[nspans > 0])
    span_of = np.repeat(np.arange(len(lengths)), lengths)
    index: I64 = starts[span_of] + (np.arange(len(span_of)) - covered[:-1][span_of])
    return index


def _compact_rows(spans: Ragged, buckets: Ragged, rows: BOOL) -> tuple[Ragged, Ragged] | None:
    """One side of :meth:`SparseHists.compacted`: the rows where ``rows`` without their
    buckets of 0 and with spans rebuilt as maximal runs of what is left (``_spans_from_indices``
    of the kept indices, what Go's ``Compact(0)`` makes); the other rows as they are. None when
    a compacted row's indices are not strictly ascending or its spans do not cover its buckets."""
    n = len(rows)
    if not len(buckets.flat) and not len(spans.flat):
        return spans, buckets
    sel = np.flatnonzero(rows)
    sub_spans, sub_buckets = spans.take(sel), buckets.take(sel)
    index = bucket_indices(sub_spans, sub_buckets)
    if index is None:
        return None
    row_of = np.repeat(np.arange(len(sel)), sub_buckets.lengths)
    same_row = row_of[1:] == row_of[:-1]
    if (np.diff(index)[same_row] <= 0).any():
        return None
    keep = sub_buckets.flat != 0  # NaN stays, ±0 goes (Go's ``!= 0``)
    index, row_of, values = index[keep], row_of[keep], sub_buckets.flat[keep]
    # Runs: a kept bucket starts one unless it follows the one before it in its row directly.
    start = np.ones(len(index), dtype=bool)
    start[1:] = (row_of[1:] != row_of[:-1]) | (index[1:] != index[:-1] + 1)
    run_at = np.flatnonzero(start)
    run_len = np.diff(np.append(run_at, len(index)))
    run_row = row_of[run_at]
    run_start = index[run_at]
    prev_end = np.zeros(len(run_at), dtype=np.int64)  # the end of the run before, 0 for a row's first
    if len(run_at) > 1:
        follows = run_row[1:] == run_row[:-1]
        prev_end[1:] = np.where(follows, run_start[:-1] + run_len[:-1], 0)
    new_spans = np.stack([run_start - prev_end, run_len], axis=1).astype(np.int64)
    # Put the compacted rows' lists back among the others' (each row from one source).
    old_span_row = np.repeat(np.arange(n), spans.lengths)
    old_bucket_row = np.repeat(np.arange(n), buckets.lengths)
    span_keep = ~rows[old_span_row]
    bucket_keep = ~rows[old_bucket_row]
    span_rows = np.concatenate([old_span_row[span_keep], sel[run_row]])
    bucket_rows = np.concatenate([old_bucket_row[bucket_keep], sel[row_of]])
    span_order = np.argsort(span_rows, kind="stable")
    bucket_order = np.argsort(bucket_rows, kind="stable")
    span_flat = np.concatenate([spans.flat.reshape(-1, 2)[span_keep], new_spans])[span_order]
    bucket_flat = np.concatenate([buckets.flat[bucket_keep], values])[bucket_order]
    span_off = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(span_rows, minlength=n), out=span_off[1:])
    bucket_off = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(bucket_rows, minlength=n), out=bucket_off[1:])
    return Ragged(span_off, span_flat), Ragged(bucket_off, bucket_flat)


def _rows_equal(x: Ragged, rows: I64) -> BOOL:
    """Per row ``r`` of ``rows``: whether list ``r`` equals list ``r - 1`` (length and elements)."""
    lengths = x.lengths
    out: BOOL = lengths[rows] == lengths[rows - 1]
    return out & ~_compare(x, rows, out, "!=")


def _rows_less(x: Ragged, rows: I64) -> BOOL:
    """Per row ``r`` of ``rows`` as long as row ``r - 1``: whether an element went down."""
    lengths = x.lengths
    return _compare(x, rows, lengths[rows] == lengths[rows - 1], "<")


def _compare(x: Ragged, rows: I64, comparable: BOOL, op: str) -> BOOL:
    """Whether some element of row ``rows[k]`` compares ``op`` to the same position of the row
    before it, for each ``k`` where ``comparable[k]`` (the two rows equally long)."""
    out = np.zeros(len(rows), dtype=bool)
    sel = np.flatnonzero(comparable & (x.lengths[rows] > 0))
    if not len(sel) or not len(x.flat):
        return out
    from kernel_insight.kql.pushdown import gather_ranges

    r = rows[sel]
    lengths = x.lengths[r]
    cur = gather_ranges(x.off[r], lengths)
    prev = gather_ranges(x.off[r - 1], lengths)
    a, b = x.flat[cur], x.flat[prev]
    bad = (a != b) if op == "!=" else (a < b)
    if bad.ndim == 2:
        bad = bad.any(axis=1)
    ends = np.cumsum(lengths)
    hits = np.add.reduceat(bad.astype(np.int64), ends - lengths) > 0
    out[sel] = hits
    return out


def tsdb_pending(data: SparseHists, ts: I64, offsets: I64, float_ts: I64, float_offsets: I64) -> SparseHists:
    """``data`` with the counter-reset hints Prometheus' TSDB returns on read, as
    :func:`kernel_insight.kql.storage.tsdb_hints` gives objects, for whole columns.

    Series ``i`` owns rows ``offsets[i]:offsets[i + 1]`` (at ``ts``, ascending) and the float
    samples ``float_ts[float_offsets[i]:float_offsets[i + 1]]``. A row follows a counter
    histogram of its chunk when it is not its series' first, the row before is no staleness
    marker, no float sample lies between the two and neither is a gauge histogram; such a row
    with an unknown hint becomes pending (decided against the row before it when read), a
    stated hint stays as it is (``detect_reset`` answers it), and so does every other row's.
    """
    n = len(data)
    if n == 0:
        return data
    stale = data.stale()
    hint = data.hint
    first = np.zeros(n, dtype=bool)
    first[offsets[:-1][offsets[:-1] < n]] = True  # a series' first row keeps the hint it was read with
    first[0] = True
    follows = ~first
    follows[1:] &= ~stale[:-1] & (hint[:-1] != GAUGE)
    follows &= ~stale
    if len(float_ts) and follows.any():
        follows &= ~_float_between(ts, offsets, float_ts, float_offsets)
    # A stated "counter reset" starts a chunk, and so does every later row that follows none:
    # TSDB reads a chunk's first sample as unknown (Go's counterResetHint), never as a reset.
    unknown = (hint == COUNTER_RESET) | ((hint == NOT_COUNTER_RESET) & ~follows & ~first)
    if unknown.any():
        data = data.with_hints(np.where(unknown, UNKNOWN, hint))
    return data.with_pending(follows & (data.hint == UNKNOWN) & ~unknown)


def _float_between(ts: I64, offsets: I64, float_ts: I64, float_offsets: I64) -> BOOL:
    """Per row ``r`` (not a series' first): whether its series has a float sample strictly
    between ``ts[r - 1]`` and ``ts[r]``."""
    n, series = len(ts), len(offsets) - 1
    row_series = np.repeat(np.arange(series, dtype=np.int64), np.diff(offsets))
    float_series = np.repeat(np.arange(series, dtype=np.int64), np.diff(float_offsets))
    out = np.zeros(n, dtype=bool)
    lo = int(min(ts.min(), float_ts.min()))
    width = int(max(ts.max(), float_ts.max())) - lo + 2
    if series * width < 2**62:  # (series, t) as one ordered key
        fkey = float_series * width + (float_ts - lo)
        key = row_series * width + (ts - lo)
        below = np.searchsorted(fkey, key[1:], side="left")  # floats before (series, t)
        upto_prev = np.searchsorted(fkey, row_series[1:] * width + (ts[:-1] - lo), side="right")
        out[1:] = below > upto_prev
        return out
    for i in range(series):
        a, b = int(offsets[i]), int(offsets[i + 1])
        f = float_ts[int(float_offsets[i]) : int(float_offsets[i + 1])]
        if b - a > 1 and len(f):
            out[a + 1 : b] = np.searchsorted(f, ts[a + 1 : b], "left") > np.searchsorted(
                f, ts[a : b - 1], "right"
            )
    return out


def renumbering(idx: npt.NDArray[np.intp], n: int) -> I64 | None:
    """Each of ``n`` rows' position in ``idx`` (-1: not taken), as ``StepVector.take`` renumbers
    rows; None when a row is taken twice (cells held apart cannot be in two rows)."""
    new_of_old = np.full(n, -1, dtype=np.int64)
    new_of_old[idx] = np.arange(len(idx))
    return None if np.count_nonzero(new_of_old >= 0) != len(idx) else new_of_old


class HistSamples:
    """Histogram samples held as ``FloatHistogram`` objects or as columns (:class:`SparseHists`):
    ``hs`` gives objects either way. Of columns, they are the columns' own
    (:meth:`SparseHists.objects`, made the first time any holder of the same columns reads them,
    and carried by the row selections made of them): one array, not one per holder."""

    __slots__ = ("_source",)

    def __init__(self, hs: OBJ | SparseHists) -> None:
        self._source = hs

    @property
    def data(self) -> SparseHists | None:
        """The columns, None where the samples are held as objects."""
        return self._source if isinstance(self._source, SparseHists) else None

    @property
    def hs(self) -> OBJ:
        """FloatHistogram per sample; stale markers have the StaleNaN bit pattern as sum."""
        return self._source.objects() if isinstance(self._source, SparseHists) else self._source

    def objects_at(self, rows: I64) -> OBJ:
        """An object array as long as the samples holding the ``FloatHistogram`` of each of
        ``rows`` (None elsewhere, where columns were not made objects): all of ``hs`` when the
        objects are made already or there are no columns."""
        data = self.data
        if data is None or data.objects_made():
            return self.hs
        out = np.full(len(data), None, dtype=object)
        out[rows] = data.select(rows).objects()
        return out

    def source(self) -> OBJ | SparseHists:
        """The columns where there are some, else the objects (what another holder of the same
        samples is made of)."""
        return self._source

    def weight(self) -> int:
        """What the samples count as toward ``max_samples`` (their ``sample_weight``s)."""
        if self.data is not None:
            return int(self.data.weights().sum())
        return sum(h.sample_weight() for h in self.hs)


def stats_read_hints(hist: HistSamples, offsets: I64) -> OBJ | SparseHists:
    """The samples with the counter-reset hints Prometheus' ``HistogramStatsIterator`` gives a
    selector read only for counts and sums (under ``histogram_count``/``_sum``/``_avg``): a sample
    read as "unknown" (a chunk's first) that follows an earlier non-stale histogram of its series
    in the same read is "counter reset" if ``detect_reset`` against that one says so, else "not a
    counter reset"; the others keep the hint the read gave them. Series ``i`` owns rows
    ``offsets[i]:offsets[i + 1]``."""
    data = hist.data
    if data is not None:
        hints = data.hints()
        stale = data.stale()
    else:
        hs = hist.hs.tolist()
        hints = np.fromiter((h.counter_reset_hint for h in hs), dtype=np.int64, count=len(hs))
        stale = is_stale(np.fromiter((h.sum for h in hs), dtype=np.float64, count=len(hs)))
    n = len(hints)
    idx = np.arange(n, dtype=np.int64)
    last_valid = np.maximum.accumulate(np.where(stale, -1, idx)) if n else idx
    prev = np.concatenate([[-1], last_valid[:-1]]).astype(np.int64) if n else idx
    first_of_series = np.repeat(offsets[:-1], np.diff(offsets))
    rows = np.flatnonzero((hints == UNKNOWN) & ~stale & (prev >= first_of_series))
    if not len(rows):
        return hist.source()
    if data is not None:
        objs = data.select(np.concatenate([rows, prev[rows]])).objects().tolist()
        cur, before = objs[: len(rows)], objs[len(rows) :]
    else:
        cur = [hs[r] for r in rows.tolist()]
        before = [hs[p] for p in prev[rows].tolist()]
    decided = np.fromiter(
        (COUNTER_RESET if c.detect_reset(b) else NOT_COUNTER_RESET for c, b in zip(cur, before, strict=True)),
        dtype=np.int64,
        count=len(rows),
    )
    if data is not None:
        new_hints = hints.copy()
        new_hints[rows] = decided
        return data.with_hints(new_hints)
    out = hist.hs.copy()
    for r, c, hint in zip(rows.tolist(), cur, decided.tolist(), strict=True):
        out[r] = c.copy(counter_reset_hint=hint)
    return out
