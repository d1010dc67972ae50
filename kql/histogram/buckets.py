"""Buckets and spans: what FloatHistogram's iterators return and the span/bucket helpers its
arithmetic, validation, trimming and reset detection run on (model/histogram/generic.go,
float_histogram.go)."""

from __future__ import annotations

import math
import operator
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import compress
from typing import TYPE_CHECKING

from kernel_insight.kql.gocompat import go_float
from kernel_insight.kql.histogram.bounds import get_bound_exponential
from kernel_insight.kql.histogram.constants import _INF, HistogramError, Span
from kernel_insight.kql.histogram.gomath import go_log2, kahan_inc

if TYPE_CHECKING:
    from kernel_insight.kql.histogram.float_histogram import FloatHistogram


@dataclass(slots=True, frozen=True)
class Bucket:
    """One bucket as Prometheus' iterators return it (``histogram.Bucket[float64]``)."""

    lower: float
    upper: float
    lower_inclusive: bool
    upper_inclusive: bool
    count: float
    index: int = 0

    def __str__(self) -> str:
        lo = "[" if self.lower_inclusive else "("
        hi = "]" if self.upper_inclusive else ")"
        return f"{lo}{go_float(self.lower)},{go_float(self.upper)}{hi}:{go_float(self.count)}"


@dataclass(slots=True)
class OpResult:
    """What :meth:`FloatHistogram.add`/``sub`` return beside the histogram: Prometheus' warnings.

    ``counter_reset_collision``: one operand said CounterReset and the other NotCounterReset
    (PromQL warns "conflicting counter resets"); ``nhcb_bounds_reconciled``: custom-bucket bounds
    differed and were intersected (PromQL adds an info annotation).
    """

    histogram: FloatHistogram
    counter_reset_collision: bool = False
    nhcb_bounds_reconciled: bool = False


@dataclass(slots=True)
class KahanResult:
    """What :meth:`FloatHistogram.kahan_add` returns: the sum so far, its compensation and the warnings."""

    histogram: FloatHistogram
    compensation: FloatHistogram
    counter_reset_collision: bool = False
    nhcb_bounds_reconciled: bool = False


def _indices(spans: Sequence[Span]) -> list[int]:
    """Absolute bucket indexes of a span list (one ``range`` per span, no per-bucket Python work)."""
    out: list[int] = []
    i = 0
    for off, ln in spans:
        i += off
        out.extend(range(i, i + ln))
        i += ln
    return out


def _spans_from_indices(idx: Sequence[int]) -> tuple[Span, ...]:
    """Canonical spans (maximal runs) for strictly ascending absolute indexes."""
    n = len(idx)
    if n == 0:
        return ()
    if idx[-1] - idx[0] == n - 1:
        return ((idx[0], n),)  # one run, the common case
    spans: list[Span] = []
    it = iter(idx)
    start = next(it)
    prev_end = 0
    length = 1
    for i in it:
        if i == start + length:
            length += 1
            continue
        spans.append((start - prev_end, length))
        prev_end = start + length
        start, length = i, 1
    spans.append((start - prev_end, length))
    return tuple(spans)


def _index_at(spans: Sequence[Span], j: int) -> int:
    """The absolute index of the ``j``-th bucket described by ``spans``."""
    i = 0
    for off, ln in spans:
        i += off
        if j < ln:
            return i + j
        j -= ln
        i += ln
    raise IndexError(j)


def _floats_bits_equal(a: Sequence[float], b: Sequence[float]) -> bool:
    if len(a) != len(b):
        return False
    n = len(a)
    return struct.pack(f"<{n}d", *a) == struct.pack(f"<{n}d", *b)


def spans_match(s1: Sequence[Span], s2: Sequence[Span]) -> bool:
    """Go ``spansMatch``: equal layouts, zero-length spans folded into the next span's offset."""

    def norm(spans: Sequence[Span]) -> list[Span]:
        out: list[Span] = []
        carry = 0
        for off, ln in spans:
            if ln == 0:
                carry += off
                continue
            out.append((off + carry, ln))
            carry = 0
        return out

    return norm(s1) == norm(s2)


def _reduce(
    idx: Sequence[int], counts: Sequence[float], origin_schema: int, target_schema: int
) -> tuple[list[int], list[float]]:
    """Merge buckets into a lower-resolution schema, summing left to right as Go does."""
    shift = origin_schema - target_schema
    out_i: list[int] = []
    out_c: list[float] = []
    last = None
    for i, c in zip(idx, counts, strict=False):
        t = ((i - 1) >> shift) + 1
        if t == last:
            out_c[-1] += c
        else:
            out_i.append(t)
            out_c.append(c)
            last = t
    return out_i, out_c


def _above_threshold(
    idx: Sequence[int], counts: Sequence[float], schema: int, threshold: float
) -> tuple[Sequence[int], Sequence[float]]:
    """Drop the leading buckets whose upper bound is <= ``threshold`` (they lie in the zero bucket)."""
    k = 0
    while k < len(idx) and get_bound_exponential(idx[k], schema) <= threshold:
        k += 1
    return (idx[k:], counts[k:]) if k else (idx, counts)


def _merge(
    ai: Sequence[int], ac: Sequence[float], bi: Sequence[int], bc: Sequence[float], negative: bool
) -> tuple[list[int], list[float]]:
    """Bucket-wise ``a + b`` (or ``a - b``) over the union of present buckets, as Go ``addBuckets``."""
    d = dict(zip(ai, ac, strict=False))
    if negative:
        for i, v in zip(bi, bc, strict=False):
            d[i] = d[i] - v if i in d else -v
    else:
        for i, v in zip(bi, bc, strict=False):
            d[i] = d[i] + v if i in d else v
    idx = sorted(d)
    return idx, [d[i] for i in idx]


_SPANS_BUCKETS_MISMATCH = "histogram spans specify different number of buckets than provided"
_NEGATIVE_BUCKET_COUNT = "histogram has a bucket whose observation count is negative"
_NEGATIVE_OFFSET = "histogram has a span whose offset is negative"


def _trim_midpoint(lo: float, hi: float, positive: bool, linear: bool) -> float:
    """Go ``computeMidpoint``: where a (surviving part of a) bucket's observations are assumed to be."""
    if math.isinf(lo):
        if math.isinf(hi):
            return 0.0
        return hi / 2 if hi > 0 else hi
    if math.isinf(hi):
        return lo
    if linear:
        return (lo + hi) / 2
    geo = math.sqrt(abs(lo * hi))
    return geo if positive else -geo


def _infinity_bucket_trim(upper: bool, b: Bucket, rhs: float) -> tuple[float, float]:
    """Go ``handleInfinityBuckets``: (kept count, midpoint) of a bucket reaching ±Inf."""

    def finite_or_zero(x: float) -> float:
        return 0.0 if math.isinf(x) else x

    if b.lower == -_INF:
        if upper:
            if rhs >= b.upper:
                return b.count, 0.0
            if rhs > 0 and b.upper > 0 and not math.isinf(b.upper):
                return b.count * rhs / b.upper, rhs / 2
            if b.upper <= 0:
                return b.count, rhs
            return 0.0, finite_or_zero(b.upper)
        if rhs <= b.lower:
            return b.count, 0.0
        if rhs >= 0 and b.upper > rhs and not math.isinf(b.upper):
            return b.count * (1 - rhs / b.upper), (rhs + b.upper) / 2
        return 0.0, finite_or_zero(b.upper)
    if upper:
        return 0.0, finite_or_zero(b.lower)
    if rhs >= b.lower:
        return b.count, rhs
    return 0.0, finite_or_zero(b.lower)


def _bucket_trim(b: Bucket, rhs: float, upper: bool, positive: bool, linear: bool) -> tuple[float, float]:
    """Go ``computeBucketTrim``: (kept count, midpoint of the kept part) of a bucket the cut falls in."""
    if b.lower == -_INF or b.upper == _INF:
        return _infinity_bucket_trim(upper, b, rhs)
    if rhs <= b.lower:
        under = 0.0
    elif rhs >= b.upper:
        under = b.count
    else:
        under = b.count * _fraction_below(b.lower, b.upper, rhs, linear)
    if upper:
        return under, _trim_midpoint(b.lower, rhs, positive, linear)
    return b.count - under, _trim_midpoint(rhs, b.upper, positive, linear)


def _zero_bucket_trim(
    zb: Bucket, rhs: float, has_negative: bool, has_positive: bool, upper: bool
) -> tuple[float, float]:
    """Go ``computeZeroBucketTrim``: linear within the zero bucket, 0 as the bound of a one-signed histogram."""
    lo, hi = zb.lower, zb.upper
    if has_negative and not has_positive:
        hi = 0.0
    if has_positive and not has_negative:
        lo = 0.0
    if upper:
        if rhs <= lo:
            return 0.0, 0.0
        if rhs >= hi:
            return zb.count, (lo + hi) / 2
        return zb.count * ((rhs - lo) / (hi - lo)), (lo + rhs) / 2
    if rhs <= lo:
        return zb.count, (lo + hi) / 2
    if rhs >= hi:
        return 0.0, 0.0
    return zb.count * ((hi - rhs) / (hi - lo)), (rhs + hi) / 2


def _check_layout(spans: Sequence[Span], n_buckets: int) -> None:
    """Go ``checkHistogramSpans``."""
    needed = 0
    for n, (off, ln) in enumerate(spans):
        if n > 0 and off < 0:
            raise HistogramError(f"span number {n + 1} with offset {off}: {_NEGATIVE_OFFSET}")
        needed += ln
    if needed != n_buckets:
        raise HistogramError(
            f"spans need {needed} buckets, have {n_buckets} buckets: {_SPANS_BUCKETS_MISMATCH}"
        )


def _check_counts(prefix: str, buckets: Sequence[float]) -> None:
    """Go ``checkHistogramBuckets`` for absolute counts: none may be negative."""
    if min(buckets, default=0.0) < 0:
        k = next(k for k, c in enumerate(buckets) if c < 0)
        raise HistogramError(
            f"{prefix}bucket number {k + 1} has observation count of {go_float(buckets[k])}: {_NEGATIVE_BUCKET_COUNT}"
        )


def _check_custom_bounds(bounds: Sequence[float], spans: Sequence[Span], n_buckets: int) -> None:
    """Go ``checkHistogramCustomBounds``: strictly increasing finite bounds that cover the spans."""
    prev = -_INF
    for i, cur in enumerate(bounds):
        if math.isnan(cur):
            raise HistogramError("histogram custom bounds must not be NaN")
        if i > 0 and cur <= prev:
            raise HistogramError(
                f"previous bound is {prev:f} and current is {cur:f}: "
                "histogram custom bounds must be in strictly increasing order"
            )
        prev = cur
    if prev == _INF:
        raise HistogramError(
            "last +Inf bound must not be explicitly defined: histogram custom bounds must be finite"
        )
    needed = total = 0
    for n, (off, ln) in enumerate(spans):
        if off < 0:
            raise HistogramError(f"span number {n + 1} with offset {off}: {_NEGATIVE_OFFSET}")
        needed += ln
        total += ln + off
    if needed != n_buckets:
        raise HistogramError(
            f"spans need {needed} buckets, have {n_buckets} buckets: {_SPANS_BUCKETS_MISMATCH}"
        )
    if len(bounds) + 1 < total:
        raise HistogramError(
            f"only {len(bounds)} custom bounds defined which is insufficient to cover total span length of "
            f"{total}: histogram custom bounds are too few"
        )


def _check_spans(spans: Sequence[Span], n_buckets: int) -> None:
    """Go ``reduceResolution``'s layout checks, with its messages."""
    needed = 0
    for n, (off, ln) in enumerate(spans):
        if n > 0 and off < 0:
            raise HistogramError(
                f"span number {n + 1} with offset {off}: histogram has a span whose offset is negative"
            )
        needed += ln
        if needed > n_buckets:
            raise HistogramError(f"have {n_buckets} buckets but spans need more: {_SPANS_BUCKETS_MISMATCH}")
    if needed != n_buckets:
        raise HistogramError(
            f"spans need {needed} buckets, have {n_buckets} buckets: {_SPANS_BUCKETS_MISMATCH}"
        )


def _first_bounds_above(h: FloatHistogram, threshold: float) -> bool:
    """Whether the lowest bucket of each side ends above ``threshold`` (so no bucket is in the zero bucket)."""
    for spans in (h.positive_spans, h.negative_spans):
        if spans and spans[0][1] > 0 and get_bound_exponential(spans[0][0], h.schema) <= threshold:
            return False
        if spans and spans[0][1] == 0:
            return False
    return True


def _bucket_reset(ci: Sequence[int], cc: Sequence[float], pi: Sequence[int], pc: Sequence[float]) -> bool:
    """Go ``detectReset``: a populated previous bucket is gone, or a bucket count went down."""
    if list(ci) == list(pi):
        return any(map(operator.lt, cc, pc))
    current = dict(zip(ci, cc, strict=False))
    for i, p in zip(pi, pc, strict=False):
        c = current.get(i)
        if c is None:
            if p != 0:
                return True
        elif c < p:
            return True
    return False


def _reset_mismatched_custom(h: FloatHistogram, previous: FloatHistogram) -> bool:
    """Go ``detectResetWithMismatchedCustomBounds``: compare cumulative counts at the shared bounds."""
    shared = (*_intersect_bounds(h.custom_values, previous.custom_values), _INF)

    def rollups(x: FloatHistogram) -> list[float]:
        out = [0.0] * len(shared)
        j = 0
        for b in x.buckets(True):
            while j < len(shared) and b.upper > shared[j]:
                j += 1
            if j < len(shared):
                out[j] += b.count
        return out

    return any(a < b for a, b in zip(rollups(h), rollups(previous), strict=True))


def _compact_side(
    spans: tuple[Span, ...], buckets: tuple[float, ...], max_empty: int
) -> tuple[tuple[Span, ...], tuple[float, ...]]:
    if not spans:
        return ((), ()) if not buckets else (spans, buckets)
    offsets, lengths = zip(*spans, strict=True)
    if (
        0.0 not in buckets
        and min(lengths) > 0
        and (len(offsets) < 2 or min(offsets[1:]) > max_empty)
        and sum(lengths) == len(buckets)
    ):
        return spans, buckets  # nothing to do, as Go's fast path
    keep = list(map(bool, buckets))  # bool(c) is c != 0 (NaN stays, ±0 goes)
    idx = list(compress(_indices(spans), keep))
    counts = tuple(compress(buckets, keep))
    if not idx:
        return (), ()
    if max_empty > 0:
        filled_i: list[int] = [idx[0]]
        filled_c: list[float] = [counts[0]]
        for i, c in zip(idx[1:], counts[1:], strict=True):
            gap = i - filled_i[-1] - 1
            if 0 < gap <= max_empty:
                filled_i.extend(range(filled_i[-1] + 1, i))
                filled_c.extend([0.0] * gap)
            filled_i.append(i)
            filled_c.append(c)
        return _spans_from_indices(filled_i), tuple(filled_c)
    return _spans_from_indices(idx), counts


def _reduced_side(
    spans: Sequence[Span], buckets: Sequence[float], origin: int, target: int
) -> tuple[tuple[Span, ...], tuple[float, ...]]:
    i, c = _reduce(_indices(spans), buckets, origin, target)
    return _spans_from_indices(i), tuple(c)


def _add_side(
    a_spans: tuple[Span, ...],
    a_buckets: tuple[float, ...],
    b_spans: tuple[Span, ...],
    b_buckets: tuple[float, ...],
    negative: bool,
    threshold: tuple[int, float] | None,
) -> tuple[tuple[Span, ...], tuple[float, ...]]:
    """One side of Go ``addBuckets``; ``threshold`` (schema, zero threshold) drops b's buckets inside the zero bucket."""
    if not b_buckets:
        return a_spans, a_buckets
    if a_spans == b_spans and (
        threshold is None or get_bound_exponential(b_spans[0][0], threshold[0]) > threshold[1]
    ):
        # The common case (same layout): one C-level pass over the counts.
        return a_spans, tuple(map(operator.sub if negative else operator.add, a_buckets, b_buckets))
    bi: Sequence[int] = _indices(b_spans)
    bc: Sequence[float] = b_buckets
    if threshold is not None:
        bi, bc = _above_threshold(bi, bc, threshold[0], threshold[1])
    idx, counts = _merge(_indices(a_spans), a_buckets, bi, bc, negative)
    return _spans_from_indices(idx), tuple(counts)


def _kahan_compact(
    spans: Sequence[Span], buckets: Sequence[float], comp: Sequence[float]
) -> tuple[tuple[Span, ...], tuple[float, ...], tuple[float, ...]]:
    """Compact(0) of a histogram and its compensation: a bucket goes only when both are zero."""
    keep = [(i, b, c) for i, b, c in zip(_indices(spans), buckets, comp, strict=False) if b != 0 or c != 0]
    return _spans_from_indices([k[0] for k in keep]), tuple(k[1] for k in keep), tuple(k[2] for k in keep)


def _kahan_reduce(
    spans: Sequence[Span], buckets: Sequence[float], comp: Sequence[float], origin: int, target: int
) -> tuple[tuple[Span, ...], tuple[float, ...], tuple[float, ...]]:
    """Go ``kahanReduceResolution``: merged buckets and their compensations summed with Kahan."""
    shift = origin - target
    out_i: list[int] = []
    out_b: list[float] = []
    out_c: list[float] = []
    last = None
    for i, b, c in zip(_indices(spans), buckets, comp, strict=False):
        t = ((i - 1) >> shift) + 1
        if t == last:
            out_b[-1], out_c[-1] = kahan_inc(b, out_b[-1], out_c[-1])
            out_b[-1], out_c[-1] = kahan_inc(c, out_b[-1], out_c[-1])
        else:
            out_i.append(t)
            out_b.append(b)
            out_c.append(c)
            last = t
    return _spans_from_indices(out_i), tuple(out_b), tuple(out_c)


def _kahan_add_side(
    a_spans: tuple[Span, ...],
    a_buckets: tuple[float, ...],
    a_comp: tuple[float, ...],
    b_spans: tuple[Span, ...],
    b_buckets: tuple[float, ...],
    b_comp: tuple[float, ...] | None,
    threshold: tuple[int, float] | None,
) -> tuple[tuple[Span, ...], tuple[float, ...], tuple[float, ...]]:
    """One side of Go ``kahanAddBuckets``: b (and its compensation) Kahan-added into a."""
    if not b_buckets:
        return a_spans, a_buckets, a_comp
    if (
        b_comp is None
        and a_spans == b_spans
        and (threshold is None or get_bound_exponential(b_spans[0][0], threshold[0]) > threshold[1])
    ):
        # The common case (same layout): Neumaier's step inlined over the buckets.
        out_s: list[float] = []
        out_c: list[float] = []
        for total, comp, inc in zip(a_buckets, a_comp, b_buckets, strict=True):
            t = total + inc
            if t in (_INF, -_INF):
                comp = 0.0
            elif abs(total) >= abs(inc):
                comp += (total - t) + inc
            else:
                comp += (inc - t) + total
            out_s.append(t)
            out_c.append(comp)
        return a_spans, tuple(out_s), tuple(out_c)
    bi: Sequence[int] = _indices(b_spans)
    bb: Sequence[float] = b_buckets
    bc: Sequence[float] = b_comp if b_comp is not None else (0.0,) * len(b_buckets)
    if threshold is not None:
        k = len(bi) - len(_above_threshold(bi, bb, threshold[0], threshold[1])[0])
        bi, bb, bc = bi[k:], bb[k:], bc[k:]
    acc = {i: [v, c] for i, v, c in zip(_indices(a_spans), a_buckets, a_comp, strict=False)}
    for i, v, cv in zip(bi, bb, bc, strict=False):
        cell = acc.get(i)
        if cell is None:
            acc[i] = [v, cv]
            continue
        cell[0], cell[1] = kahan_inc(v, cell[0], cell[1])
        if cv != 0:
            cell[0], cell[1] = kahan_inc(cv, cell[0], cell[1])
    idx = sorted(acc)
    return _spans_from_indices(idx), tuple(acc[i][0] for i in idx), tuple(acc[i][1] for i in idx)


def _intersect_bounds(a: Sequence[float], b: Sequence[float]) -> tuple[float, ...]:
    sb = set(b)
    return tuple(x for x in a if x in sb)


def _add_custom_mismatched(
    spans_a: Sequence[Span],
    buckets_a: Sequence[float],
    bounds_a: Sequence[float],
    spans_b: Sequence[Span],
    buckets_b: Sequence[float],
    bounds_b: Sequence[float],
    bounds: Sequence[float],
    negative: bool,
    comp_a: Sequence[float] | None,
) -> tuple[tuple[Span, ...], tuple[float, ...], tuple[float, ...]]:
    """Go ``addCustomBucketsWithMismatches``: both mapped onto the shared bounds (Kahan sums), empties dropped.

    Returns spans, buckets and the Kahan compensation buckets.
    """
    n = len(bounds) + 1
    target = [0.0] * n
    comp = [0.0] * n

    def map_side(
        spans: Sequence[Span],
        buckets: Sequence[float],
        src_bounds: Sequence[float],
        neg: bool,
        c_buckets: Sequence[float] | None,
    ) -> None:
        k = 0
        for pos, (src, value) in enumerate(zip(_indices(spans), buckets, strict=False)):
            t = n - 1
            if src < len(src_bounds):
                sb = src_bounds[src]
                while k < len(bounds):
                    if bounds[k] >= sb:
                        t = k
                        break
                    k += 1
            target[t], comp[t] = kahan_inc(-value if neg else value, target[t], comp[t])
            if not neg and c_buckets is not None:
                target[t], comp[t] = kahan_inc(c_buckets[pos], target[t], comp[t])

    map_side(spans_a, buckets_a, bounds_a, False, comp_a)
    map_side(spans_b, buckets_b, bounds_b, negative, None)
    idx = [i for i in range(n) if target[i] != 0 or comp[i] != 0]
    return _spans_from_indices(idx), tuple(target[i] for i in idx), tuple(comp[i] for i in idx)


def _fraction_below(lower: float, upper: float, v: float, linear: bool) -> float:
    """Go ``Bucket.FractionBelow``: the share of the bucket at or below ``v`` (log scale unless linear)."""
    if linear:
        return (v - lower) / (upper - lower)
    log_lower = go_log2(abs(lower))
    log_upper = go_log2(abs(upper))
    log_v = go_log2(abs(v))
    if v > 0:
        return (log_v - log_lower) / (log_upper - log_lower)
    return 1 - ((log_v - log_upper) / (log_lower - log_upper))
