"""histogram_quantile, histogram_fraction and the histogram statistics (promql/quantile.go, functions.go)."""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterable, Iterator
from itertools import accumulate

import numpy as np

from kernel_insight.kql.histogram.bounds import bounds_exponential, get_bound
from kernel_insight.kql.histogram.buckets import _fraction_below, _index_at, _indices
from kernel_insight.kql.histogram.constants import (
    _F64,
    _INF,
    FRACTION_NAN_INFO,
    NAN_RESULT_INFO,
    NAN_SKEW_INFO,
)
from kernel_insight.kql.histogram.float_histogram import FloatHistogram
from kernel_insight.kql.histogram.gomath import go_div, go_exp2, go_log2, kahan_inc

# --- promql/quantile.go ----------------------------------------------------------------------


def _ordered(h: FloatHistogram, reverse: bool) -> tuple[float, ...]:
    """Counts of every bucket in Go's ``AllBucketIterator`` order (or ``AllReverseBucketIterator``'s).

    Negative buckets from the lowest up, the zero bucket (only when populated, as in Go), then the
    positive buckets; tuple slicing keeps this out of per-bucket Python.
    """
    zero = (h.zero_count,) if h.zero_count > 0 else ()
    if reverse:
        return h.positive_buckets[::-1] + zero + h.negative_buckets
    return h.negative_buckets[::-1] + zero + h.positive_buckets


def _bucket_of(h: FloatHistogram, k: int, reverse: bool) -> tuple[float, float]:
    """(lower, upper) of the ``k``-th bucket of :func:`_ordered`, clipped at the zero threshold as Go does."""
    n_neg, n_pos = len(h.negative_buckets), len(h.positive_buckets)
    has_zero = 1 if h.zero_count > 0 else 0
    first, n_first = (n_pos, True) if reverse else (n_neg, False)
    zt = h.zero_threshold
    if k < first:
        positive, j = n_first, first - 1 - k
    elif has_zero and k == first:
        return -zt, zt
    else:
        positive, j = (not n_first), k - first - has_zero
    cv = h.custom_values
    if positive:
        i = _index_at(h.positive_spans, j)
        lo, hi = get_bound(i - 1, h.schema, cv), get_bound(i, h.schema, cv)
    else:
        i = _index_at(h.negative_spans, j)
        lo, hi = -get_bound(i, h.schema, cv), -get_bound(i - 1, h.schema, cv)
    if 0 < lo < zt:
        lo = zt
    elif -zt < hi < 0:
        hi = -zt
    return lo, hi


def histogram_quantile(q: float, h: FloatHistogram) -> tuple[float, list[str]]:
    """The φ-quantile of a native histogram and its info annotations (Go ``HistogramQuantile``).

    Exponential interpolation inside standard buckets, linear in the zero bucket and in
    custom buckets; 0 is the natural bound of a one-signed histogram's zero bucket.
    """
    if q < 0:
        return -_INF, []
    if q > 1:
        return _INF, []
    if h.count == 0 or math.isnan(q):
        return math.nan, []
    annos: list[str] = []
    nan_sum = math.isnan(h.sum)
    forward = nan_sum or q < 0.5
    counts = _ordered(h, reverse=not forward)
    rank = q * h.count if forward else (1 - q) * h.count
    if not counts:
        # No buckets at all: Go ends on its zero Bucket{} with count 0.
        if rank > 0.0:
            return (math.nan, [NAN_RESULT_INFO]) if nan_sum else (0.0, annos)
        if nan_sum and h.count > 0.0:
            annos.append(NAN_SKEW_INFO)
        return math.nan, annos  # 0 + 0 * (0/0)
    cum = list(accumulate(counts))
    total = cum[-1]
    if min(counts) >= 0 and not math.isnan(total):
        k = bisect.bisect_left(cum, rank)
        while k < len(counts) and counts[k] == 0:
            k += 1
        if k >= len(counts):
            k = len(counts) - 1
        count = cum[k]
    else:
        count = 0.0
        k = len(counts) - 1
        for j, c in enumerate(counts):
            if c == 0:
                continue
            count += c
            if count >= rank:
                k = j
                break
    bcount = counts[k]
    lower, upper = _bucket_of(h, k, not forward)
    custom = h.uses_custom_buckets()
    if not custom and lower < 0 < upper:
        if not h.negative_buckets and h.positive_buckets:
            lower = 0.0
        elif not h.positive_buckets and h.negative_buckets:
            upper = 0.0
    elif custom:
        if lower == -_INF:
            if upper <= 0:
                return upper, annos
            lower = 0.0
        elif upper == _INF:
            return lower, annos
    if count > h.count:
        count = h.count
    if count < rank:
        if nan_sum:
            return math.nan, [NAN_RESULT_INFO]
        return upper, annos
    if forward:
        rank -= count - bcount
    else:
        rank = count - rank
    if nan_sum and total < h.count:
        annos.append(NAN_SKEW_INFO)
    fraction = rank / bcount if bcount != 0 else (math.nan if rank == 0 else math.copysign(_INF, rank))
    if custom or (lower <= 0 <= upper):
        return lower + (upper - lower) * fraction, annos
    log_lower = go_log2(abs(lower))
    log_upper = go_log2(abs(upper))
    if lower > 0:
        return go_exp2(log_lower + (log_upper - log_lower) * fraction), annos
    return -go_exp2(log_upper + (log_lower - log_upper) * (1 - fraction)), annos


def interpolate_rank(rank: float, lo: float, hi: float, count: float, v: float, linear: bool) -> float:
    """The rank at ``v`` inside one bucket; a bucket reaching -Inf contributes its whole count (Go)."""
    if linear and lo == -_INF:
        return count
    return rank + count * _fraction_below(lo, hi, v, linear)


#: ``rank_at(rank, lower, upper, count, v, linear)``: the rank at ``v`` inside the bucket
#: (``lower``, ``upper``] that holds ``count`` observations above ``rank`` ones.
RankAt = Callable[[float, float, float, float, float, bool], float]


def fraction_ranks(
    lower: float,
    upper: float,
    buckets: Iterable[tuple[float, float, float, bool]],
    rank_at: RankAt,
    total: float,
    cumulative: bool = False,
) -> tuple[float, float]:
    """The ranks of ``lower`` and ``upper`` among ``buckets``, each at most ``total``: the walk that
    Prometheus' ``HistogramFraction`` and ``BucketFraction`` (promql/quantile.go) both run.

    ``buckets`` are (lower bound, upper bound, count, linear) in ascending order, the count
    cumulative where ``cumulative`` is set (classic buckets, as Go's ``Buckets``: the rank then
    becomes that count, not a sum of differences). A value at or below a bucket's lower bound
    has the rank below that bucket; one inside it is interpolated by ``rank_at``, which is where
    the two Go functions differ (linear with classic operation order, or ``Bucket.FractionBelow``);
    a value above every bucket has the rank ``total``. The walk stops once both are found.
    """
    rank = lower_rank = upper_rank = 0.0
    lower_set = upper_set = False
    for lo, hi, c, linear in buckets:
        count = c - rank if cumulative else c
        if not lower_set and lo >= lower:
            lower_rank, lower_set = rank, True
        if not upper_set and lo >= upper:
            upper_rank, upper_set = rank, True
        if lower_set and upper_set:
            break
        if not lower_set and lo < lower < hi:
            lower_rank, lower_set = rank_at(rank, lo, hi, count, lower, linear), True
        if not upper_set and lo < upper < hi:
            upper_rank, upper_set = rank_at(rank, lo, hi, count, upper, linear), True
        if lower_set and upper_set:
            break
        rank = c if cumulative else rank + c
    if not lower_set or lower_rank > total:
        lower_rank = total
    if not upper_set or upper_rank > total:
        upper_rank = total
    return lower_rank, upper_rank


def _fraction_buckets(
    h: FloatHistogram, counts: tuple[float, ...]
) -> Iterator[tuple[float, float, float, bool]]:
    """:func:`fraction_ranks`' buckets of ``h``: Go's ``AllBucketIterator`` with its zero bucket rule
    (ending or starting at 0 when the other side has no buckets; linear, as custom buckets are)."""
    custom = h.uses_custom_buckets()
    for k, c in enumerate(counts):
        b_lo, b_hi = _bucket_of(h, k, False)
        zero_bucket = b_lo <= 0 <= b_hi
        if zero_bucket:
            if not h.negative_buckets and h.positive_buckets:
                b_lo = 0.0
            elif not h.positive_buckets and h.negative_buckets:
                b_hi = 0.0
        yield b_lo, b_hi, c, custom or zero_bucket


def histogram_fraction(lower: float, upper: float, h: FloatHistogram) -> tuple[float, list[str]]:
    """The estimated share of observations between ``lower`` and ``upper`` (Go ``HistogramFraction``)."""
    if h.count == 0 or math.isnan(lower) or math.isnan(upper):
        return math.nan, []
    if lower >= upper:
        return 0.0, []
    counts = _ordered(h, reverse=False)
    annos: list[str] = []
    count = h.count
    if math.isnan(h.sum):
        # NaN observations may be in the count but in no bucket: the ranks stop at the buckets' total.
        count = 0.0
        for c in counts:
            count += c
        if count < h.count:
            annos.append(FRACTION_NAN_INFO)
    lower_rank, upper_rank = fraction_ranks(
        lower, upper, _fraction_buckets(h, counts), interpolate_rank, count
    )
    return (upper_rank - lower_rank) / h.count, annos


def _side_bounds(h: FloatHistogram, positive: bool) -> tuple[_F64, _F64]:
    """(lower, upper) arrays of one side's buckets in storage order, clipped at the zero threshold."""
    idx = np.asarray(_indices(h.positive_spans if positive else h.negative_spans), dtype=np.int64)
    if h.uses_custom_buckets():
        ext = np.concatenate(([-_INF], np.asarray(h.custom_values, dtype=np.float64), [_INF]))
        up, below = ext[idx + 1], ext[idx]
    else:
        up, below = bounds_exponential(idx, h.schema), bounds_exponential(idx - 1, h.schema)
    lo, hi = (below, up) if positive else (-up, -below)
    zt = h.zero_threshold
    if zt > 0:
        lo = np.where((lo > 0) & (lo < zt), zt, lo)
        hi = np.where((hi < 0) & (hi > -zt), -zt, hi)
    return lo, hi


def _variance(h: FloatHistogram) -> float:
    """Go ``histogramVariance``: geometric bucket means (arithmetic for NHCB, 0 in the zero bucket), Kahan sum.

    Bucket means and terms are numpy element-wise (same IEEE operations as Go's loop); only
    the compensated sum runs in bucket order in Python, as its result depends on the order.
    """
    mean = go_div(h.sum, h.count)
    custom = h.uses_custom_buckets()
    parts: list[_F64] = []
    for positive in (False, True):
        counts = np.asarray(h.positive_buckets if positive else h.negative_buckets, dtype=np.float64)
        if len(counts) == 0:
            if positive is False and h.zero_count > 0:
                parts.append(np.asarray([h.zero_count * (0.0 - mean) * (0.0 - mean)]))
            continue
        lo, hi = _side_bounds(h, positive)
        with np.errstate(invalid="ignore", over="ignore"):
            if custom:
                val = (hi + lo) / 2.0
            else:
                val = np.sqrt(hi * lo)
                val = np.where(hi < 0, -val, val)
                val = np.where((lo <= 0) & (hi >= 0), 0.0, val)
            delta = val - mean
            terms = counts * delta * delta
        terms = terms[counts != 0]
        if not positive:
            parts.append(terms[::-1])
            if h.zero_count > 0:
                parts.append(np.asarray([h.zero_count * (0.0 - mean) * (0.0 - mean)]))
        else:
            parts.append(terms)
    variance = c_var = 0.0
    for part in parts:
        for term in part.tolist():
            variance, c_var = kahan_inc(term, variance, c_var)
    variance += c_var
    return go_div(variance, h.count)


def histogram_stdvar(h: FloatHistogram) -> float:
    """The estimated variance of the observations (``histogram_stdvar``)."""
    return _variance(h)


def histogram_stddev(h: FloatHistogram) -> float:
    """The estimated standard deviation of the observations (``histogram_stddev``)."""
    v = _variance(h)
    return math.sqrt(v) if v >= 0 else math.nan


def histogram_avg(h: FloatHistogram) -> float:
    """``sum / count`` (``histogram_avg``), IEEE semantics for an empty histogram."""
    return go_div(h.sum, h.count)
