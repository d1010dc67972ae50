"""Native histograms as dense numpy blocks: the fast paths of histogram_quantile/fraction, rate,
sum/avg and the histogram statistics over many histograms of one layout, each bit for bit the
per-histogram path (tests/kql/test_columnar_histograms.py, test_kql_native_histograms.py)."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from kernel_insight.kql import histogram as nh
from kernel_insight.kql.histogram import COUNTER_RESET, CUSTOM_BUCKETS_SCHEMA, NOT_COUNTER_RESET
from kernel_insight.kql.histogram import GAUGE_TYPE as GAUGE
from kernel_insight.kql.histogram import UNKNOWN_COUNTER_RESET as UNKNOWN
from kernel_insight.kql.histogram.gomath import kahan_inc_into
from kernel_insight.kql.histsamples import BOOL, F64, I64, OBJ, H, Totals, hcompact, hstdvar, safe_divide
from kernel_insight.kql.sparsehists import SparseHists, bucket_indices
from kernel_insight.kql.values import HistRange, RangeInput, hist_mask

if TYPE_CHECKING:
    from kernel_insight.kql.values import CallContext


def dense_avg(block: Totals) -> F64:
    """histogram_avg of every row: IEEE division as :func:`fdiv` does it (x/0 is +-Inf, 0/0 NaN)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        avg: F64 = block.sum / block.count
    return avg


def dense_stdvar(block: Totals) -> F64:
    """histogram_stdvar of every row of a dense block or of a selector's columns, as
    ``histogram.quantile._variance`` makes it of each object (Go's ``histogramVariance``): the same IEEE
    operations per bucket, the Kahan sum run bucket by bucket for all rows at once. Custom-bucket
    rows and rows whose spans do not cover their buckets are left to the objects."""
    if isinstance(block, DenseBlock):
        n = len(block.count)
        rows = np.arange(n, dtype=np.int64)
        sides = []
        for lo, mat in ((block.neg_lo, block.neg), (block.pos_lo, block.pos)):
            r, k = np.nonzero(mat)
            sides.append((r.astype(np.int64), (lo + k).astype(np.int64), mat[r, k]))
        schema = np.full(n, block.schema, dtype=np.int64)
        zt = np.full(n, block.zero_threshold)
        return _variances(schema, zt, block.zero, block.count, block.sum, sides[0], sides[1])
    assert isinstance(block, SparseHists)
    data = block
    out = np.empty(len(data))
    exact = data.schema != CUSTOM_BUCKETS_SCHEMA
    got = []
    for spans, buckets in ((data.neg_spans, data.neg_buckets), (data.pos_spans, data.pos_buckets)):
        index = bucket_indices(spans, buckets)
        if index is None:
            exact[:] = False
            break
        r = np.repeat(np.arange(len(data), dtype=np.int64), buckets.lengths)
        keep = exact[r]
        got.append((r[keep], index[keep], buckets.flat[keep]))
    rows = np.flatnonzero(exact)
    if len(got) == 2 and len(rows):
        out[exact] = _variances(
            data.schema, data.zero_threshold, data.zero_count, data.count, data.sum, got[0], got[1]
        )[exact]
    others = np.flatnonzero(~exact)
    if len(others):
        out[others] = [hstdvar(h) for h in data.select(others).objects().tolist()]
    return out


def dense_stddev(block: Totals) -> F64:
    """histogram_stddev of every row (:func:`dense_stdvar`'s square root, NaN where negative)."""
    v = dense_stdvar(block)
    out: F64 = np.where(v >= 0, np.sqrt(np.where(v >= 0, v, 0.0)), np.nan)
    return out


def _variances(
    schema: I64,
    zt: F64,
    zero: F64,
    count: F64,
    total: F64,
    neg: tuple[I64, I64, F64],
    pos: tuple[I64, I64, F64],
) -> F64:
    """``histogram.quantile._variance`` of every row from its buckets as (row, index, count) elements of
    each side (exponential schemas): per row the negative buckets most negative first, the zero
    bucket (when its count is > 0), the positive ones, Kahan-summed in that order."""
    n = len(count)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        mean = safe_divide(total, count)
        parts_row, parts_key, parts_term = [], [], []
        for part, (rows, idx, counts) in ((0, neg), (2, pos)):
            up = np.empty(len(idx))
            below = np.empty(len(idx))
            sc = schema[rows]
            for s_ in np.unique(sc).tolist():
                at = sc == s_
                up[at] = nh.bounds_exponential(idx[at], s_)
                below[at] = nh.bounds_exponential(idx[at] - 1, s_)
            lo, hi = (below, up) if part == 2 else (-up, -below)
            z = zt[rows]
            lo = np.where((z > 0) & (lo > 0) & (lo < z), z, lo)
            hi = np.where((z > 0) & (hi < 0) & (hi > -z), -z, hi)
            val = np.sqrt(hi * lo)
            val = np.where(hi < 0, -val, val)
            val = np.where((lo <= 0) & (hi >= 0), 0.0, val)
            delta = val - mean[rows]
            terms = counts * delta * delta
            keep = counts != 0
            order = np.flatnonzero(keep)
            parts_row.append(rows[keep])
            parts_key.append(-order if part == 0 else order)  # the negative side most negative first
            parts_term.append(terms[keep])
            if part == 0:
                zrows = np.flatnonzero(zero > 0)
                zterm = zero[zrows] * (0.0 - mean[zrows]) * (0.0 - mean[zrows])
                parts_row.append(zrows.astype(np.int64))
                parts_key.append(np.zeros(len(zrows), dtype=np.int64))
                parts_term.append(zterm)
        part_of = np.concatenate([np.full(len(r), k, dtype=np.int64) for k, r in enumerate(parts_row)])
        rows = np.concatenate(parts_row)
        keys = np.concatenate(parts_key)
        terms = np.concatenate(parts_term)
        order = np.lexsort((keys, part_of, rows))
        rows, terms = rows[order], terms[order]
        lengths = np.bincount(rows, minlength=n)
        starts = np.zeros(n, dtype=np.int64)
        np.cumsum(lengths[:-1], out=starts[1:])
        rank = np.arange(len(rows)) - starts[rows]
        width = int(lengths.max()) if n else 0
        # A row's terms in columns 0..len-1, then +0.0: adding it leaves the sum and its
        # compensation as they are (the sum is never -0.0: it starts at +0.0).
        mat = np.zeros((width, n))
        mat[rank, rows] = terms
        variance = np.zeros(n)
        comp = np.zeros(n)
        t, bb = np.empty(n), np.empty(n)
        for inc in mat:
            kahan_inc_into(variance, comp, inc, t, bb)
        out = safe_divide(variance + comp, count)
    return out


def chunked_cells(
    ctx: CallContext,
    rows: I64,
    steps: I64,
    values: F64,
    present: BOOL,
    dense_fn: Callable[[I64, DenseBlock], tuple[F64, BOOL]],
    one: Callable[[int, int, H], float],
    block_of: Callable[[int, int], DenseBlock | None],
    objects_of: Callable[[I64], list[H]],
) -> None:
    """:func:`_native_cells` of cells ``(rows[k], steps[k])``: blocks of cells ``a:b``
    (``block_of``, None where they share no layout), the rest one object at a time."""
    decided = np.zeros(len(rows), dtype=bool)
    for a in range(0, len(rows), DENSE_CHUNK):
        b = min(a + DENSE_CHUNK, len(rows))
        chunk = block_of(a, b) if b - a >= DENSE_MIN_CELLS else None
        if chunk is not None:
            found, done = dense_fn(steps[a:b], chunk)
            decided[a:b] = done
            values[rows[a:b][done], steps[a:b][done]] = found[done]
    rest = np.flatnonzero(~decided)
    for n, (k, h) in enumerate(zip(rest.tolist(), objects_of(rest), strict=True)):
        if n % 1024 == 1023:
            ctx.check()
        i, j = int(rows[k]), int(steps[k])
        values[i, j] = one(i, j, h)
    present[rows, steps] = True


#: Below this many histogram cells the per-histogram path is as fast as building a dense block.
DENSE_MIN_CELLS = 64


class DenseBlock:
    """Histograms of one standard exponential schema and zero threshold as dense matrices.

    Row ``r`` holds one histogram: ``pos[r, k]`` is the count of positive bucket ``pos_lo + k``,
    ``neg[r, k]`` of negative bucket ``neg_lo + k`` (absent buckets are 0; ``has_pos``/``has_neg``
    remember whether the histogram had any bucket on that side, which the quantile's zero
    bucket rule reads). Lets histogram_quantile work on thousands of histograms with numpy
    instead of one Python call each.
    """

    __slots__ = (
        "_weights",
        "count",
        "has_neg",
        "has_pos",
        "neg",
        "neg_lo",
        "pos",
        "pos_lo",
        "schema",
        "sum",
        "zero",
        "zero_threshold",
    )
    count: F64
    sum: F64

    def __init__(self, hs: list[H]) -> None:
        self._weights: I64 | None = None
        first = hs[0]
        self.schema = int(first.schema)
        self.zero_threshold = float(first.zero_threshold)
        n = len(hs)
        (self.pos_lo, self.pos), (self.neg_lo, self.neg) = (_dense_side(hs, True), _dense_side(hs, False))
        self.has_pos = np.fromiter((len(h.positive_buckets) > 0 for h in hs), dtype=bool, count=n)
        self.has_neg = np.fromiter((len(h.negative_buckets) > 0 for h in hs), dtype=bool, count=n)
        self.zero = np.fromiter((h.zero_count for h in hs), dtype=np.float64, count=n)
        self.count = np.fromiter((h.count for h in hs), dtype=np.float64, count=n)
        self.sum = np.fromiter((h.sum for h in hs), dtype=np.float64, count=n)

    @classmethod
    def of_arrays(
        cls,
        schema: int,
        zero_threshold: float,
        zero: F64,
        count: F64,
        total: F64,
        pos_lo: int,
        pos: F64,
        neg_lo: int,
        neg: F64,
    ) -> DenseBlock:
        """A block of computed rows (a bucket of 0 is an absent one, as :func:`materialize` drops it)."""
        block = cls.__new__(cls)
        block._weights = None
        block.schema, block.zero_threshold = schema, zero_threshold
        block.zero, block.count, block.sum = zero, count, total
        block.pos_lo, block.pos, block.neg_lo, block.neg = pos_lo, pos, neg_lo, neg
        block.has_pos = (pos != 0).any(axis=1) if pos.shape[1] else np.zeros(len(count), dtype=bool)
        block.has_neg = (neg != 0).any(axis=1) if neg.shape[1] else np.zeros(len(count), dtype=bool)
        return block

    def take(self, rows: npt.NDArray[np.intp]) -> DenseBlock:
        """The block of the given rows."""
        return DenseBlock.of_arrays(
            self.schema,
            self.zero_threshold,
            self.zero[rows],
            self.count[rows],
            self.sum[rows],
            self.pos_lo,
            self.pos[rows],
            self.neg_lo,
            self.neg[rows],
        )

    def materialize(self, hint: int) -> list[H]:
        """Every row as a (compacted) FloatHistogram with ``hint``."""
        return materialize(
            self.schema,
            self.zero_threshold,
            self.zero,
            self.count,
            self.sum,
            self.pos_lo,
            self.pos,
            self.neg_lo,
            self.neg,
            hint,
        )

    def weights(self) -> I64:
        """Each row's :meth:`FloatHistogram.sample_weight` as materialized (non-zero buckets, their
        runs); counted once per block (a query counts its nodes' results as they pass)."""
        if self._weights is None:
            spans_and_buckets = np.zeros(len(self.count), dtype=np.int64)
            for mat in (self.pos, self.neg):
                if mat.shape[1]:
                    nz = mat != 0
                    spans_and_buckets += np.count_nonzero(nz, axis=1) + nz[:, 0]
                    spans_and_buckets += np.count_nonzero(nz[:, 1:] > nz[:, :-1], axis=1)  # runs' starts
            self._weights = (176 + 8 * spans_and_buckets) // 16
        return self._weights

    @classmethod
    def of_sparse(cls, data: SparseHists) -> DenseBlock | None:
        """A block of a store's histogram columns (the same as :meth:`of` of their objects),
        when they share a standard schema and zero threshold, else None."""
        if not len(data):
            return None
        schema, zt = int(data.schema[0]), float(data.zero_threshold[0])
        if (
            schema == CUSTOM_BUCKETS_SCHEMA
            or (data.schema != schema).any()
            or (data.zero_threshold != zt).any()
        ):
            return None
        pos, neg = data.dense_side(True), data.dense_side(False)
        if pos is None or neg is None:
            return DenseBlock.of(data.objects().tolist())
        block = cls.__new__(cls)
        block._weights = None
        block.schema, block.zero_threshold = schema, zt
        (block.pos_lo, block.pos), (block.neg_lo, block.neg) = pos, neg
        block.has_pos = data.pos_buckets.lengths > 0
        block.has_neg = data.neg_buckets.lengths > 0
        block.zero, block.count, block.sum = data.zero_count, data.count, data.sum
        return block

    @staticmethod
    def of(hs: list[H]) -> DenseBlock | None:
        """A block of ``hs`` when they share a standard schema and zero threshold, else None."""
        if not hs:
            return None
        schema, zt = hs[0].schema, hs[0].zero_threshold
        if schema == CUSTOM_BUCKETS_SCHEMA or any(h.schema != schema or h.zero_threshold != zt for h in hs):
            return None
        return DenseBlock(hs)

    def ordered(self) -> tuple[F64, F64, F64]:
        """Every bucket in Go's AllBucketIterator order as columns: (counts, lower, upper) bounds
        clipped at the zero threshold, the zero bucket between the sides."""
        zt = self.zero_threshold
        n_neg, n_pos = self.neg.shape[1], self.pos.shape[1]
        neg_idx = np.arange(
            self.neg_lo + n_neg - 1, self.neg_lo - 1, -1, dtype=np.int64
        )  # most negative first
        pos_idx = np.arange(self.pos_lo, self.pos_lo + n_pos, dtype=np.int64)
        bounds = nh.bounds_exponential
        neg_lower = -bounds(neg_idx, self.schema) if n_neg else np.zeros(0)
        neg_upper = -bounds(neg_idx - 1, self.schema) if n_neg else np.zeros(0)
        pos_lower = bounds(pos_idx - 1, self.schema) if n_pos else np.zeros(0)
        pos_upper = bounds(pos_idx, self.schema) if n_pos else np.zeros(0)
        neg_upper = np.where((-zt < neg_upper) & (neg_upper < 0), -zt, neg_upper)
        pos_lower = np.where((pos_lower > 0) & (pos_lower < zt), zt, pos_lower)
        counts = np.concatenate([self.neg[:, ::-1], self.zero[:, None], self.pos], axis=1)
        lower = np.concatenate([neg_lower, [-zt], pos_lower])
        upper = np.concatenate([neg_upper, [zt], pos_upper])
        return counts, lower, upper


def _span_indices(spans: tuple[tuple[int, int], ...]) -> list[int]:
    out: list[int] = []
    at = 0
    for off, length in spans:
        at += off
        out.extend(range(at, at + length))
        at += length
    return out


def _dense_side(hs: list[H], positive: bool) -> tuple[int, F64]:
    """(lowest bucket index, counts as an n x width matrix) of one side of every histogram.

    Histograms sharing a span layout (the usual case: one series keeps its layout for long)
    are stacked as one matrix and placed with one assignment, not bucket by bucket.
    """
    groups: dict[tuple[tuple[int, int], ...], list[int]] = {}
    for r, h in enumerate(hs):
        spans = h.positive_spans if positive else h.negative_spans
        if spans:
            groups.setdefault(tuple(spans), []).append(r)
    if not groups:
        return 0, np.zeros((len(hs), 0))
    layouts = {spans: np.asarray(_span_indices(spans), dtype=np.int64) for spans in groups}
    lo = min(int(ix.min()) for ix in layouts.values() if len(ix))
    hi = max(int(ix.max()) for ix in layouts.values() if len(ix))
    mat = np.zeros((len(hs), hi - lo + 1))
    for spans, rows in groups.items():
        ix = layouts[spans]
        if not len(ix):
            continue
        flat = itertools.chain.from_iterable(
            (hs[r].positive_buckets if positive else hs[r].negative_buckets)[: len(ix)] for r in rows
        )
        counts = np.fromiter(flat, dtype=np.float64, count=len(rows) * len(ix)).reshape(len(rows), len(ix))
        mat[np.asarray(rows, dtype=np.intp)[:, None], (ix - lo)[None, :]] = counts
    return lo, mat


def dense_quantiles(q: F64, block: DenseBlock) -> tuple[F64, BOOL]:
    """Go's HistogramQuantile for every row of ``block`` at once (``q`` per row), and which rows it
    decided; the others (NaN sums, negative or non-finite counts, a rank above every bucket,
    q outside [0, 1] or NaN) are left to :func:`kernel_insight.kql.histogram.histogram_quantile`.

    The bucket search is numpy's; the interpolation is the same Python float arithmetic as
    kql.histogram's, so the results are the same bits.
    """
    counts, lower_b, upper_b = block.ordered()
    n, width = counts.shape
    total_count = block.count
    done = (
        ~np.isnan(block.sum)
        & (total_count != 0)
        & ~np.isnan(q)
        & (q >= 0)
        & (q <= 1)
        & np.isfinite(counts).all(axis=1)
        & (counts >= 0).all(axis=1)
    )
    out = np.full(n, np.nan)
    if width == 0 or not done.any():
        return out, np.zeros(n, dtype=bool)
    forward = q < 0.5
    rank = np.where(forward, q * total_count, (1 - q) * total_count)
    if forward.all():
        ordered = counts
    elif not forward.any():
        ordered = counts[:, ::-1]  # one quantile for all rows (the usual case): one view, no copy
    else:
        ordered = np.where(forward[:, None], counts, counts[:, ::-1])
    cum = np.cumsum(ordered, axis=1)
    hit = (cum >= rank[:, None]) & (ordered > 0)
    found = hit.any(axis=1)
    col = np.argmax(hit, axis=1)
    done &= found
    rows = np.flatnonzero(done)
    col_in_order = col[rows]
    fwd = forward[rows]
    cols = np.where(fwd, col_in_order, width - 1 - col_in_order)
    count = cum[rows, col_in_order]
    bcount = counts[rows, cols]
    lo = lower_b[cols]
    hi = upper_b[cols]
    # Elementwise IEEE arithmetic is the same in numpy as in Python; log2 and exp2 are ports of
    # Go's (go_log2_array, go_exp2_array: numpy's own differ in the last bit for some inputs).
    straddles = (lo < 0) & (hi > 0)
    only_pos = straddles & ~block.has_neg[rows] & block.has_pos[rows]
    only_neg = straddles & ~block.has_pos[rows] & block.has_neg[rows]
    lo = np.where(only_pos, 0.0, lo)
    hi = np.where(only_neg, 0.0, hi)
    count = np.minimum(count, total_count[rows])
    rk = rank[rows]
    above = count < rk  # the rank lies above every bucket: kql.histogram decides (and annotates)
    done[rows[above]] = False
    rk = np.where(fwd, rk - (count - bcount), count - rk)
    fraction = rk / bcount
    linear = (lo <= 0) & (hi >= 0)
    out[rows] = lo + (hi - lo) * fraction
    expo = np.flatnonzero(~linear & ~above)
    if len(expo):
        e_lo, e_hi, e_frac = lo[expo], hi[expo], fraction[expo]
        log_lower = nh.go_log2_array(np.abs(e_lo))
        log_upper = nh.go_log2_array(np.abs(e_hi))
        positive = e_lo > 0
        exponent = np.where(
            positive,
            log_lower + (log_upper - log_lower) * e_frac,
            log_upper + (log_lower - log_upper) * (1 - e_frac),
        )
        powered = nh.go_exp2_array(exponent)
        out[rows[expo]] = np.where(positive, powered, -powered)
    values = out
    return values, done


def dense_fractions(lower: F64, upper: F64, block: DenseBlock) -> tuple[F64, BOOL]:
    """Go's HistogramFraction for every row of ``block`` at once (``lower``, ``upper`` per row),
    and which rows it decided; the others (NaN sums, negative or non-finite counts, a block
    with an infinite or overlapping bucket bound, a bound above every bucket when the buckets
    hold fewer observations than the count) are left to :func:`kernel_insight.kql.histogram.histogram_fraction`.

    Go walks the stored buckets in order and takes, for each bound, the first bucket that ends
    above it (or starts at or above it). A block knows non-empty buckets only, not which empty
    ones a histogram stored; with ordered, disjoint, finite bounds the first non-empty such
    bucket gives the same rank (an empty bucket before it adds nothing), and one that lies
    around the bound is interpolated by kql.histogram's own function, so the results are the
    same bits.
    """
    counts, lower_b, upper_b = block.ordered()
    n = len(block.count)
    total = block.count
    out = np.full(n, np.nan)
    nan_result = (total == 0) | np.isnan(lower) | np.isnan(upper)
    empty = ~nan_result & (lower >= upper)
    out[empty] = 0.0
    done = nan_result | empty
    ordered_bounds = bool(
        np.isfinite(lower_b).all()
        and np.isfinite(upper_b).all()
        and (lower_b <= upper_b).all()
        and (lower_b[1:] >= upper_b[:-1]).all()
    )
    todo = ~done & ~np.isnan(block.sum) & np.isfinite(counts).all(axis=1) & (counts >= 0).all(axis=1)
    rows = np.flatnonzero(todo)
    if not ordered_bounds or not len(rows):
        return out, done
    c = counts[rows]
    count = total[rows]
    # Go's zero bucket rule: a bucket around 0 ends (starts) at 0 in a histogram without
    # negative (positive) buckets; its share is linear.
    straddle = (lower_b <= 0) & (upper_b >= 0)
    only_pos = (~block.has_neg[rows] & block.has_pos[rows])[:, None] & straddle[None, :]
    only_neg = (~block.has_pos[rows] & block.has_neg[rows])[:, None] & straddle[None, :]
    lo = np.where(only_pos, 0.0, lower_b[None, :])
    hi = np.where(only_neg, 0.0, upper_b[None, :])
    cum = np.cumsum(c, axis=1)
    before = np.zeros_like(cum)
    before[:, 1:] = cum[:, :-1]
    decided = np.ones(len(rows), dtype=bool)
    at = np.arange(len(rows))
    ranks = []
    for v in (lower[rows], upper[rows]):
        col_v = v[:, None]
        hit = (c > 0) & ((lo >= col_v) | ((lo < col_v) & (col_v < hi)))
        found = hit.any(axis=1)
        col = np.argmax(hit, axis=1)
        # Above every non-empty bucket: Go's rank is the count, or the buckets' total where an
        # empty bucket lies above (the same when the total is not below the count).
        decided &= found | (cum[:, -1] >= count)
        rank = np.where(found, before[at, col], count)
        for k in np.flatnonzero(found & (lo[at, col] < v)).tolist():
            j = int(col[k])
            rank[k] = nh.interpolate_rank(
                float(before[k, j]),
                float(lo[k, j]),
                float(hi[k, j]),
                float(c[k, j]),
                float(v[k]),
                bool(straddle[j]),
            )
        ranks.append(np.where(rank > count, count, rank))
    fractions = (ranks[1] - ranks[0]) / count
    out[rows[decided]] = fractions[decided]
    done[rows[decided]] = True
    return out, done


def _spans_of(mat: F64, lo: int) -> tuple[list[tuple[tuple[int, int], ...]], list[tuple[float, ...]]]:
    """Per row of a dense side: the spans and buckets of its non-zero counts (Compact(0)'s layout)."""
    n = mat.shape[0]
    spans: list[tuple[tuple[int, int], ...]] = [()] * n
    buckets: list[tuple[float, ...]] = [()] * n
    rows, cols = np.nonzero(mat)
    if not len(rows):
        return spans, buckets
    values = mat[rows, cols].tolist()
    idx = cols + lo
    new = np.ones(len(rows), dtype=bool)
    new[1:] = (rows[1:] != rows[:-1]) | (cols[1:] != cols[:-1] + 1)
    starts = np.flatnonzero(new)
    lengths = np.diff(np.append(starts, len(rows)))
    span_rows = rows[starts].tolist()
    span_first = idx[starts].tolist()
    row_first = np.ones(len(starts), dtype=bool)
    row_first[1:] = rows[starts][1:] != rows[starts][:-1]
    prev_end = 0
    current: list[tuple[int, int]] = []
    row_of_current = -1
    for r, first, length, head in zip(
        span_rows, span_first, lengths.tolist(), row_first.tolist(), strict=True
    ):
        if head:
            if row_of_current >= 0:
                spans[row_of_current] = tuple(current)
            current = [(first, length)]
            row_of_current = r
        else:
            current.append((first - prev_end, length))
        prev_end = first + length
    if row_of_current >= 0:
        spans[row_of_current] = tuple(current)
    # Buckets: the row's values in column order, one slice per row.
    bounds = np.searchsorted(rows, np.arange(n + 1))
    for r in np.unique(rows).tolist():
        buckets[r] = tuple(values[bounds[r] : bounds[r + 1]])
    return spans, buckets


def materialize(
    schema: int,
    zero_threshold: float,
    zero: F64,
    count: F64,
    total: F64,
    pos_lo: int,
    pos: F64,
    neg_lo: int,
    neg: F64,
    hint: int,
) -> list[H]:
    """FloatHistograms from dense rows, compacted (no empty buckets), all with one hint."""
    pspans, pbuckets = _spans_of(pos, pos_lo)
    nspans, nbuckets = _spans_of(neg, neg_lo)
    make = nh.FloatHistogram
    return [
        make(schema, zero_threshold, z, c, s, ps, pb, ns, nb, hint)
        for z, c, s, ps, pb, ns, nb in zip(
            zero.tolist(), count.tolist(), total.tolist(), pspans, pbuckets, nspans, nbuckets, strict=True
        )
    ]


class DenseHists:
    """Histogram cells held as dense blocks instead of objects (a form of
    :class:`kernel_insight.kql.histcells.Hists`).

    ``parts`` are ``(block, rows, steps, hint)``: block row ``k`` is the histogram of cell
    ``(rows[k], steps[k])``, with counter-reset hint ``hint``. rate/increase and sum/avg make
    them (:func:`dense_rate`, :func:`dense_sum`), sum/avg of one member per group and
    histogram_quantile read them as they are, and anything else asks for FloatHistograms
    (``Hists.objects``): a quantile over 240k histograms never builds 240k objects and their
    dense blocks again.
    """

    __slots__ = ("parts",)

    def __init__(self, parts: list[tuple[DenseBlock, I64, I64, int]]) -> None:
        self.parts = parts

    def __len__(self) -> int:
        return sum(len(rows) for _, rows, _, _ in self.parts)

    def coords(self) -> tuple[I64, I64]:
        if not self.parts:
            return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
        return np.concatenate([p[1] for p in self.parts]), np.concatenate([p[2] for p in self.parts])

    def fill(self, out: OBJ) -> None:
        """Put every cell's FloatHistogram into ``out``."""
        for block, rows, steps, hint in self.parts:
            holder = np.empty(len(rows), dtype=object)
            holder[:] = block.materialize(hint)
            out[rows, steps] = holder

    def weight(self) -> int:
        return sum(int(block.weights().sum()) for block, _, _, _ in self.parts)

    def regrouped(self, new_of_old: I64, rows: int = 0, drop: BOOL | None = None) -> DenseHists:
        """The cells moved to rows ``new_of_old[row]``; cells whose new row is -1 (or where
        ``drop[new row, step]``) are left out."""
        parts = []
        for block, old, steps, hint in self.parts:
            new = new_of_old[old]
            keep = new >= 0
            if drop is not None:
                keep[keep] = ~drop[new[keep], steps[keep]]
            if keep.all():
                parts.append((block, new, steps, hint))
            elif keep.any():
                parts.append((block.take(np.flatnonzero(keep)), new[keep], steps[keep], hint))
        return DenseHists(parts)

    def single(self, gid: npt.NDArray[np.intp], n: int, mixed: BOOL) -> DenseHists | None:
        """Each cell moved to its group's row, still dense."""
        rows, cols = self.coords()
        steps = mixed.shape[1]
        keep = ~mixed[gid[rows], cols]
        target = gid[rows[keep]] * steps + cols[keep]
        if len(target) and np.bincount(target, minlength=n * steps).max() > 1:  # (cheaper than a sort)
            return None
        return self.regrouped(np.asarray(gid, dtype=np.int64), n, drop=mixed)

    def summed(
        self, gid: npt.NDArray[np.intp], n: int, steps: int, mixed: BOOL, mean: bool
    ) -> tuple[DenseHists, bool] | None:
        return dense_sum_cells(self, gid, n, steps, mixed, mean)

    def floats(self, fn: Callable[[H], float], totals_fn: Callable[[Totals], F64] | None) -> F64:
        if not self.parts:
            return np.empty(0)
        if totals_fn is not None:
            return np.concatenate([totals_fn(block) for block, _, _, _ in self.parts])
        return np.array(
            [fn(h) for block, _, _, hint in self.parts for h in block.materialize(hint)], dtype=np.float64
        )

    def search(
        self,
        ctx: CallContext,
        values: F64,
        present: BOOL,
        dense_fn: Callable[[I64, DenseBlock], tuple[F64, BOOL]],
        one: Callable[[int, int, H], float],
    ) -> None:
        """Each block searched where it is; the rows it leaves become objects."""
        for block, rows, steps, hint in self.parts:
            found, done = dense_fn(steps, block)
            values[rows[done], steps[done]] = found[done]
            present[rows, steps] = True
            rest = np.flatnonzero(~done)
            if len(rest):
                for k, h in zip(rest.tolist(), block.take(rest).materialize(hint), strict=True):
                    i, j = int(rows[k]), int(steps[k])
                    values[i, j] = one(i, j, h)
            ctx.check()

    def scaled(self, op: str, factor: F64, swapped: bool) -> None:
        return None


def _zero_clean(block: DenseBlock) -> bool:
    """No bucket of the block lies (partly) inside its zero bucket, so comparing counts bucket by
    bucket is Prometheus' reset detection."""
    zt = block.zero_threshold
    bounds = nh.bounds_exponential
    for lo, mat in ((block.pos_lo, block.pos), (block.neg_lo, block.neg)):
        if mat.shape[1] and float(bounds(np.array([lo - 1], dtype=np.int64), block.schema)[0]) < zt:
            return False
    return True


#: Samples (or cells) per dense block: series of different kernels cover different bucket ranges,
#: so one block over all of them is as wide as their union; blocks of neighbouring series stay
#: narrow and bounded in memory.
DENSE_CHUNK = 4_096


def dense_rate(
    r: RangeInput, counter: bool, per_second: bool, candidates: BOOL
) -> tuple[DenseHists, BOOL] | None:
    """rate/increase of every candidate window at once, series chunk by series chunk (each a
    :class:`DenseBlock` when its histograms share a schema and zero threshold and hold no gauge
    histograms); also says which windows it decided. A window with a counter reset inside is
    left to :func:`histogram_rate` (Prometheus adds the reset back sample by sample), so every
    decided result is the per-window path's, bit for bit.
    """
    hr = r.hist
    if hr is None or not counter or len(hr.ts) < DENSE_MIN_CELLS:
        return None
    parts: list[tuple[DenseBlock, I64, I64, int]] = []
    decided = np.zeros(candidates.shape, dtype=bool)
    n = len(hr.offsets) - 1
    a = 0
    while a < n:
        base = int(hr.offsets[a])
        b = int(np.searchsorted(hr.offsets, base + DENSE_CHUNK, side="right")) - 1
        b = min(max(b, a + 1), n)
        end = int(hr.offsets[b])
        sub = HistRange(
            hr.ts[base:end],
            hr.hs[base:end] if hr.data is None else hr.data.rows(base, end),
            hr.offsets[a : b + 1] - base,
            hr.lo[a:b] - base,
            hr.hi[a:b] - base,
        )
        part = _dense_rate_chunk(r, sub, per_second, candidates[a:b])
        if part is not None:
            block, wi, wj, done = part
            if len(wi):
                parts.append((block, wi + a, wj, GAUGE))
            decided[a:b] = done
        a = b
        r.checkpoint()
    return DenseHists(parts), decided


def _dense_rate_chunk(
    r: RangeInput, hr: HistRange, per_second: bool, candidates: BOOL
) -> tuple[DenseBlock, I64, I64, BOOL] | None:
    """:func:`dense_rate` over the series of one chunk (``hr`` indexes the chunk's own samples)."""
    m = len(hr.ts)
    if m < DENSE_MIN_CELLS:
        return None
    data = hr.data
    # A bucket count below zero or NaN (not a counter's) leaves the block to the per-window
    # path: its arithmetic and reset rules (an absent bucket against a negative one) are Go's.
    if data is None:
        hs = hr.hs.tolist()
        hints = np.fromiter((h.counter_reset_hint for h in hs), dtype=np.int64, count=m)
        block = None if (hints == GAUGE).any() else DenseBlock.of(hs)
        if block is not None and not ((block.pos >= 0).all() and (block.neg >= 0).all()):
            return None
    else:
        # Straight from the store's columns. A pending row's hint is "reset if detect_reset
        # says so": left unknown here, the bucket comparison below decides it, which is
        # detect_reset's answer in a zero-clean block of one schema and threshold with no
        # count below zero or NaN (an absent bucket compares as 0, as Go's does).
        hints = data.hint
        if (hints == GAUGE).any() or not data.nonnegative():
            return None
        block = DenseBlock.of_sparse(data)
    if block is None or not _zero_clean(block):
        return None
    same = np.ones(m, dtype=bool)
    same[0] = False
    starts = hr.offsets[:-1]
    same[starts[starts < m]] = False
    reset = np.zeros(m, dtype=bool)
    prev = np.arange(m) - 1
    k = np.flatnonzero(same)
    p = prev[k]
    decreased = (block.count[k] < block.count[p]) | (block.zero[k] < block.zero[p])
    if block.pos.shape[1]:
        decreased |= (block.pos[k] < block.pos[p]).any(axis=1)
    if block.neg.shape[1]:
        decreased |= (block.neg[k] < block.neg[p]).any(axis=1)
    reset[k] = (hints[k] == COUNTER_RESET) | ((hints[k] != NOT_COUNTER_RESET) & decreased)
    resets_before = np.concatenate([[0], np.cumsum(reset)])
    lo, hi = hr.lo, hr.hi
    inner = resets_before[hi] - resets_before[np.minimum(lo + 1, hi)]
    decided = candidates & (hi - lo >= 2) & (inner == 0)
    wi, wj = np.nonzero(decided)
    first = lo[wi, wj]
    last = hi[wi, wj] - 1
    d_count = block.count[last] - block.count[first]
    d_sum = block.sum[last] - block.sum[first]
    d_zero = block.zero[last] - block.zero[first]
    d_pos = block.pos[last] - block.pos[first]
    d_neg = block.neg[last] - block.neg[first]
    # Prometheus' extrapolation (extrapolatedRate), the same operations as _extrapolation.
    first_t, last_t = hr.ts[first], hr.ts[last]
    end = r.end[wj]
    to_start = (first_t - (end - r.range_ms)) / 1000.0
    to_end = (end - last_t) / 1000.0
    sampled = (last_t - first_t) / 1000.0
    average = sampled / (last - first)
    threshold = average * 1.1
    to_start = np.where(to_start >= threshold, average / 2, to_start)
    first_count = block.count[first]
    with np.errstate(divide="ignore", invalid="ignore"):
        to_zero = sampled * (first_count / d_count)
    use_zero = (d_count > 0) & (first_count >= 0) & (to_zero < to_start)
    to_start = np.where(use_zero, to_zero, to_start)
    to_end = np.where(to_end >= threshold, average / 2, to_end)
    factor = np.where(sampled != 0, (sampled + to_start + to_end) / np.where(sampled != 0, sampled, 1.0), 1.0)
    if per_second:
        factor = factor / (r.range_ms / 1000.0)
    # The difference is compacted before the multiplication in Prometheus; 0 * f is 0, so the
    # buckets that stay non-zero are the same either way. Kept dense (DenseHists): objects
    # only if a later stage asks for them.
    out = DenseBlock.of_arrays(
        block.schema,
        block.zero_threshold,
        d_zero * factor,
        d_count * factor,
        d_sum * factor,
        block.pos_lo,
        np.where(d_pos != 0, d_pos * factor[:, None], 0.0),
        block.neg_lo,
        np.where(d_neg != 0, d_neg * factor[:, None], 0.0),
    )
    return out, wi.astype(np.int64), wj.astype(np.int64), decided


def single_members(hists: OBJ, gid: npt.NDArray[np.intp], n: int, mixed: BOOL) -> OBJ | None:
    """sum/avg where no (group, step) holds more than one histogram (``sum by (kernel)`` over one
    series per kernel): each result is its one member, compacted (x + 0 and x / 1 are x), so
    nothing is added; None when some group has several members."""
    steps = hists.shape[1]
    rows, cols = np.nonzero(hist_mask(hists))
    keep = ~mixed[gid[rows], cols]
    rows, cols = rows[keep], cols[keep]
    target = gid[rows] * steps + cols
    if len(np.unique(target)) != len(target):
        return None
    out: OBJ = np.full((n, steps), None, dtype=object)
    members = hists[rows, cols].tolist()
    holder = np.empty(len(members), dtype=object)
    holder[:] = [
        h if 0.0 not in h.positive_buckets and 0.0 not in h.negative_buckets else hcompact(h) for h in members
    ]
    out[gid[rows], cols] = holder
    return out


def sparse_sum(
    columns: SparseHists,
    rows: I64,
    cols: I64,
    gid: npt.NDArray[np.intp],
    n: int,
    steps: int,
    mixed: BOOL,
    mean: bool,
) -> tuple[DenseHists, bool] | None:
    """:func:`dense_sum` of a selector's columns (``sum(x)`` over many series; row ``k`` the
    cell ``(rows[k], cols[k])``): one block made straight from the columns, no object per
    sample; None as for :func:`dense_sum` (then objects decide)."""
    keep = np.flatnonzero(~mixed[gid[rows], cols])
    if len(keep) < DENSE_MIN_CELLS:
        return None
    order = keep[np.lexsort((rows[keep], cols[keep]))]  # step by step, input rows ascending
    data = columns.take(order)
    block = DenseBlock.of_sparse(data)
    if block is None:
        return None
    return _dense_sum_block(block, data.hints(), rows[order], cols[order], gid, n, steps, mean)


def dense_sum(
    hists: OBJ, gid: npt.NDArray[np.intp], n: int, mixed: BOOL, mean: bool
) -> tuple[DenseHists, bool] | None:
    """sum/avg of histogram cells per (group, step) in numpy, for cells sharing one layout family;
    the additions run in Prometheus' order (input rows ascending at each step), so the sums are
    kql.histogram's bit for bit. Also whether counter-reset hints collided in some group. None when
    the cells are too few or mixed in schema, zero threshold or custom buckets. The sums stay
    dense (:class:`DenseHists`)."""
    steps = hists.shape[1]
    rows, cols = np.nonzero(hist_mask(hists))
    keep = ~mixed[gid[rows], cols]
    rows, cols = rows[keep], cols[keep]
    if len(rows) < DENSE_MIN_CELLS:
        return None
    order = np.lexsort((rows, cols))  # step by step, input rows ascending
    rows, cols = rows[order], cols[order]
    hs = hists[rows, cols].tolist()
    block = DenseBlock.of(hs)
    if block is None:
        return None
    hints = np.fromiter((h.counter_reset_hint for h in hs), dtype=np.int64, count=len(hs))
    return _dense_sum_block(block, hints, rows, cols, gid, n, steps, mean)


def dense_sum_cells(
    dense: DenseHists, gid: npt.NDArray[np.intp], n: int, steps: int, mixed: BOOL, mean: bool
) -> tuple[DenseHists, bool] | None:
    """:func:`dense_sum` of cells already dense (rate's results): their blocks are laid side by
    side on the union of their bucket ranges, no object made; None when they differ in schema or
    zero threshold, or are too few."""
    blocks = [p[0] for p in dense.parts]
    if not blocks or any(
        b.schema != blocks[0].schema or b.zero_threshold != blocks[0].zero_threshold for b in blocks
    ):
        return None
    rows = np.concatenate([p[1] for p in dense.parts])
    cols = np.concatenate([p[2] for p in dense.parts])
    hints = np.concatenate([np.full(len(p[1]), p[3], dtype=np.int64) for p in dense.parts])
    keep = ~mixed[gid[rows], cols]
    if np.count_nonzero(keep) < DENSE_MIN_CELLS:
        return None
    order = np.lexsort((rows, cols))
    order = order[keep[order]]

    def side(pos: bool) -> tuple[int, F64]:
        mats = [(b.pos_lo, b.pos) if pos else (b.neg_lo, b.neg) for b in blocks]
        used = [(lo, m) for lo, m in mats if m.shape[1]]
        if not used:
            return 0, np.zeros((len(order), 0))
        lo = min(lo for lo, _ in used)
        hi = max(lo_ + m.shape[1] for lo_, m in used)
        out = np.zeros((len(rows), hi - lo))
        at = 0
        for lo_, m in mats:
            if m.shape[1]:
                out[at : at + len(m), lo_ - lo : lo_ - lo + m.shape[1]] = m
            at += len(m)
        return lo, out[order]

    pos_lo, pos = side(True)
    neg_lo, neg = side(False)
    block = DenseBlock.of_arrays(
        blocks[0].schema,
        blocks[0].zero_threshold,
        np.concatenate([b.zero for b in blocks])[order],
        np.concatenate([b.count for b in blocks])[order],
        np.concatenate([b.sum for b in blocks])[order],
        pos_lo,
        pos,
        neg_lo,
        neg,
    )
    return _dense_sum_block(block, hints[order], rows[order], cols[order], gid, n, steps, mean)


def _dense_sum_block(
    block: DenseBlock,
    hints: I64,
    rows: I64,
    cols: I64,
    gid: npt.NDArray[np.intp],
    n: int,
    steps: int,
    mean: bool,
) -> tuple[DenseHists, bool] | None:
    """dense_sum's arithmetic over ``block``, whose rows are the cells ``(rows, cols)`` ordered
    step by step, input rows ascending (Prometheus' order of additions)."""
    target = gid[rows] * steps + cols
    cells_n = n * steps

    # Each (group, step) adds its members in input order: rank k of every cell at once, with
    # Prometheus' Neumaier compensation (KahanAdd), the first member as the start value.
    by_target = np.argsort(target, kind="stable")
    starts = np.searchsorted(target[by_target], np.arange(cells_n))
    rank = np.empty(len(target), dtype=np.int64)
    rank[by_target] = np.arange(len(target)) - starts[target[by_target]]
    levels = [np.flatnonzero(rank == k) for k in range(int(rank.max()) + 1)]

    def summed(values: F64) -> tuple[F64, F64]:
        total_ = np.zeros((cells_n, *values.shape[1:]))
        comp_ = np.zeros_like(total_)
        for k, sel in enumerate(levels):
            tgt = target[sel]
            inc = values[sel]
            if k == 0:
                total_[tgt] = inc
                continue
            acc = total_[tgt]
            t = acc + inc
            c = comp_[tgt] + np.where(np.abs(acc) >= np.abs(inc), (acc - t) + inc, (inc - t) + acc)
            comp_[tgt] = np.where(np.isinf(t), 0.0, c)
            total_[tgt] = t
        return total_, comp_

    count, count_c = summed(block.count)
    total, total_c = summed(block.sum)
    zero, zero_c = summed(block.zero)
    pos, pos_c = summed(block.pos)
    neg, neg_c = summed(block.neg)
    if mean and not all(np.isfinite(x).all() for x in (count, total, zero, pos, neg)):
        # A running sum that overflowed: Go's avg goes on as an incremental mean from there
        # (kql.histogram's HistogramMean, on the per-histogram path).
        return None
    members = np.bincount(target, minlength=cells_n).astype(np.float64)
    seen = {hint: np.bincount(target[hints == hint], minlength=cells_n) > 0 for hint in (0, 1, 2, 3)}
    collision = bool((seen[COUNTER_RESET] & seen[NOT_COUNTER_RESET]).any())
    # Go's adjustCounterReset folded over a group: a gauge makes a gauge, one shared hint stays.
    kinds = sum(seen[h].astype(np.int64) for h in (0, 1, 2, 3))
    first_hint = np.zeros(cells_n, dtype=np.int64)
    first_hint[target[::-1]] = hints[::-1]
    hint = np.where(seen[GAUGE], GAUGE, np.where(kinds == 1, first_hint, UNKNOWN))
    filled = np.flatnonzero(members > 0)
    m = members[filled]

    def finished(v: F64, c: F64) -> F64:
        # kahan_total: the sum plus its compensation, each divided first for a mean.
        if not mean:
            out_: F64 = v[filled] + c[filled]
            return out_
        d = m if v.ndim == 1 else m[:, None]
        mean_: F64 = v[filled] / d + c[filled] / d
        return mean_

    count_f, total_f, zero_f = finished(count, count_c), finished(total, total_c), finished(zero, zero_c)
    pos_f, neg_f = finished(pos, pos_c), finished(neg, neg_c)
    parts: list[tuple[DenseBlock, I64, I64, int]] = []
    by_hint = hint[filled]
    for value in np.unique(by_hint).tolist():
        sel = np.flatnonzero(by_hint == value)
        made = DenseBlock.of_arrays(
            block.schema,
            block.zero_threshold,
            zero_f[sel],
            count_f[sel],
            total_f[sel],
            block.pos_lo,
            pos_f[sel],
            block.neg_lo,
            neg_f[sel],
        )
        cell = filled[sel].astype(np.int64)
        parts.append((made, cell // steps, cell % steps, int(value)))
    return DenseHists(parts), collision
