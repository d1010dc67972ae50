"""Prometheus' native-histogram value (``FloatHistogram``) and its math, ported to Python.

A port of prometheus/prometheus ``model/histogram/float_histogram.go`` and ``generic.go``
(the value type, add/sub with schema and zero-bucket reconciliation, compact, reset detection,
resolution reduction), of ``promql/quantile.go`` (``histogram_quantile``, ``histogram_fraction``)
and ``promql/functions.go`` (stddev/stdvar/avg), plus the promqltest ``{{...}}`` notation
(``promql/parser``). Results are bit-exact with Prometheus (interpolations run ports of Go's
math.Log2/Exp2, which round differently from the C library's);
spans are kept in the canonical form (maximal runs of present buckets) after add/sub, which
Prometheus' ``Equals`` treats the same as its own layout except where Prometheus leaves two
directly adjacent spans (offset 0) unmerged.

>>> h = parse_histogram("{{schema:0 count:4 sum:5 buckets:[1 2 1]}}")
>>> str(h)
'{count:4, sum:5, (0.5,1]:1, (1,2]:2, (2,4]:1}'
>>> round(histogram_quantile(0.5, h)[0], 6)
1.414214
"""

from __future__ import annotations

import bisect
import math
import operator
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import accumulate, compress
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from kernel_insight.kql._nativehist_bounds import EXPONENTIAL_BOUNDS
from kernel_insight.kql.gocompat import go_float

__all__ = [
    "COUNTER_RESET",
    "CUSTOM_BUCKETS_SCHEMA",
    "GAUGE_TYPE",
    "HISTOGRAM_MIN_WEIGHT",
    "NOT_COUNTER_RESET",
    "UNKNOWN_COUNTER_RESET",
    "Bucket",
    "FloatHistogram",
    "HistogramError",
    "HistogramMean",
    "HistogramNotationError",
    "HistogramSeriesValue",
    "HistogramSum",
    "KahanResult",
    "OpResult",
    "expand_histogram_series",
    "get_bound",
    "go_exp2",
    "go_exp2_array",
    "go_float",
    "go_log2",
    "go_log2_array",
    "go_log10_array",
    "go_log_array",
    "histogram_avg",
    "histogram_fraction",
    "histogram_quantile",
    "histogram_stddev",
    "histogram_stdvar",
    "kahan_inc",
    "parse_histogram",
    "spans_match",
]

#: Counter-reset hints, Prometheus' ``CounterResetHint`` values.
UNKNOWN_COUNTER_RESET = 0
COUNTER_RESET = 1
NOT_COUNTER_RESET = 2
GAUGE_TYPE = 3

#: The fewest float samples one histogram counts as toward the sample limit (an empty one's
#: :meth:`FloatHistogram.sample_weight`): a storage read of histogram rows can stop at
#: ``max_samples // HISTOGRAM_MIN_WEIGHT`` rows.
HISTOGRAM_MIN_WEIGHT = 11

#: The schema of native histograms with custom buckets (NHCB).
CUSTOM_BUCKETS_SCHEMA = -53
EXPONENTIAL_SCHEMA_MIN = -4
EXPONENTIAL_SCHEMA_MAX = 8

_MAX_FLOAT = 1.7976931348623157e308
_INF = math.inf

Span = tuple[int, int]
_I64 = npt.NDArray[np.int64]
_F64 = npt.NDArray[np.float64]

# Info annotations, worded as Prometheus' promql/annotations (kql appends `for metric name "x"`
# and the position).
NAN_RESULT_INFO = "input to histogram_quantile has NaN observations, result is NaN"
NAN_SKEW_INFO = "input to histogram_quantile has NaN observations, result is skewed higher"
FRACTION_NAN_INFO = "input to histogram_fraction has NaN observations, which are excluded from all fractions"


class HistogramError(ValueError):
    """An operation Prometheus refuses (mixing exponential and custom-bucket schemas, bad resolution change)."""


_MIXED_SCHEMAS = (
    "cannot apply this operation on histograms with a mix of exponential and custom bucket schemas"
)


class HistogramNotationError(ValueError):
    """A promqltest ``{{...}}`` histogram literal that does not parse; the message says where."""


def is_custom_buckets_schema(schema: int) -> bool:
    return schema == CUSTOM_BUCKETS_SCHEMA


def is_exponential_schema(schema: int) -> bool:
    return EXPONENTIAL_SCHEMA_MIN <= schema <= EXPONENTIAL_SCHEMA_MAX


def _ldexp(frac: float, exp: int) -> float:
    """Go's ``math.Ldexp``: overflow gives +Inf (Python raises)."""
    try:
        return math.ldexp(frac, exp)
    except OverflowError:
        return _INF


def get_bound_exponential(idx: int, schema: int) -> float:
    """The upper bound of bucket ``idx`` in an exponential ``schema`` (Go ``getBoundExponential``)."""
    if schema < 0:
        exp = idx << -schema
        if exp == 1024:
            return _MAX_FLOAT  # the last bucket before the ±Inf bucket
        return _ldexp(1.0, exp)
    frac = EXPONENTIAL_BOUNDS[schema][idx & ((1 << schema) - 1)]
    exp = (idx >> schema) + 1
    if frac == 0.5 and exp == 1025:
        return _MAX_FLOAT
    return _ldexp(frac, exp)


def get_bound(idx: int, schema: int, custom_values: Sequence[float] = ()) -> float:
    """The upper bound of bucket ``idx`` (custom values for NHCB: -Inf at -1, +Inf past the last)."""
    if schema == CUSTOM_BUCKETS_SCHEMA:
        n = len(custom_values)
        if idx > n or idx < -1:
            raise HistogramError(f"index {idx} out of bounds for custom bounds of length {n}")
        if idx == n:
            return _INF
        if idx == -1:
            return -_INF
        return custom_values[idx]
    return get_bound_exponential(idx, schema)


def _bounds_exponential(idx: _I64, schema: int) -> _F64:
    """Vectorised :func:`get_bound_exponential` (same bits: one ``ldexp`` per bound)."""
    with np.errstate(over="ignore"):
        if schema < 0:
            exp = idx << -schema
            out = np.ldexp(1.0, exp.astype(np.int64))
            out[exp == 1024] = _MAX_FLOAT
            neg_schema: _F64 = out
            return neg_schema
        table = np.asarray(EXPONENTIAL_BOUNDS[schema])
        frac = table[idx & ((1 << schema) - 1)]
        exp = (idx >> schema) + 1
        out = np.ldexp(frac, exp.astype(np.int64))
        out[(frac == 0.5) & (exp == 1025)] = _MAX_FLOAT
        result: _F64 = out
        return result


def kahan_inc(inc: float, total: float, c: float) -> tuple[float, float]:
    """Neumaier-compensated ``total + inc`` (Prometheus ``util/kahansum.Inc``): (new total, new c)."""
    t = total + inc
    if math.isinf(t):
        c = 0.0
    elif abs(total) >= abs(inc):
        c += (total - t) + inc
    else:
        c += (inc - t) + total
    return t, c


# --- Go's math.Log2 and math.Exp2 (amd64), so interpolations match Prometheus to the bit ---------
# The C library's log2/exp2 are rounded differently (exp2(0.5) is 1.4142135623730951 in C,
# 1.414213562373095 in Go, which is what Prometheus prints for the median of its test histogram).

_LN2_HI = 6.93147180369123816490e-01
_LN2_LO = 1.90821492927058770002e-10
_LOG2_E = float("1.44269504088896340735992468100189214")  # Go's constant 1/Ln2, rounded once
_HALF_SQRT2 = float("7.07106781186547524401e-01")
_L1, _L2, _L3, _L4 = (
    6.666666666666735130e-01,
    3.999999999940941908e-01,
    2.857142874366239149e-01,
    2.222219843214978396e-01,
)
_L5, _L6, _L7 = 1.818357216161805012e-01, 1.531383769920937332e-01, 1.479819860511658591e-01
_P1, _P2, _P3 = 1.66666666666666657415e-01, -2.77777777770155933842e-03, 6.61375632143793436117e-05
_P4, _P5 = -1.65339022054652515390e-06, 4.13813679705723846039e-08
_FRAC_LOG2: dict[float, float] = {}


def _go_log(x: float) -> float:
    """Go's ``math.Log`` (FreeBSD's algorithm, as math/log.go and log_amd64.s compute it) for finite x > 0."""
    f1, ki = math.frexp(x)
    if f1 < _HALF_SQRT2:
        f1 *= 2
        ki -= 1
    return _go_log_reduced(f1 - 1, float(ki))


_Num = TypeVar("_Num", float, _F64)


def _go_log_reduced(f: _Num, k: _Num) -> _Num:
    """The end of Go's ``math.Log`` once ``x = (1 + f) * 2**k``: one definition for
    :func:`_go_log` (floats) and :func:`go_log2_array` (numpy's elementwise IEEE arithmetic in
    the same order gives the same bits)."""
    s = f / (2 + f)
    s2 = s * s
    s4 = s2 * s2
    t1 = s2 * (_L1 + s4 * (_L3 + s4 * (_L5 + s4 * _L7)))
    t2 = s4 * (_L2 + s4 * (_L4 + s4 * _L6))
    r = t1 + t2
    hfsq = 0.5 * f * f
    return k * _LN2_HI - ((hfsq - (s * (hfsq + r) + k * _LN2_LO)) - f)


def go_log2(x: float) -> float:
    """Go's ``math.Log2``: exact for powers of two, ``Log(frac)*(1/Ln2) + exp`` otherwise."""
    if x != x or x == _INF:
        return x
    if x < 0:
        return math.nan
    if x == 0:
        return -_INF
    frac, exp = math.frexp(x)
    if frac == 0.5:
        return float(exp - 1)
    t = _FRAC_LOG2.get(frac)
    if t is None:
        t = _go_log(frac) * _LOG2_E
        if len(_FRAC_LOG2) < 4096:  # bucket bounds repeat: their fracs are one table
            _FRAC_LOG2[frac] = t
    return t + float(exp)


def go_log2_array(x: _F64) -> _F64:
    """:func:`go_log2` of every element, the same bits (numpy's elementwise IEEE arithmetic in
    the same order); elements outside (0, inf) go through :func:`go_log2` one by one."""
    x = np.asarray(x, dtype=np.float64)
    out = np.empty_like(x)
    ok = np.isfinite(x) & (x > 0)
    frac, exp = np.frexp(x[ok])
    expf = exp.astype(np.float64)
    # _go_log(frac) * _LOG2_E + exp; frac is in [0.5, 1)
    f1, ki = frac, exp * 0
    low = f1 < _HALF_SQRT2
    f1 = np.where(low, f1 * 2, f1)
    k = np.where(low, ki - 1, ki).astype(np.float64)
    log = _go_log_reduced(f1 - 1, k)
    out[ok] = np.where(frac == 0.5, expf - 1, log * _LOG2_E + expf)
    for i in np.flatnonzero(~ok).tolist():
        out.flat[i] = go_log2(float(x.flat[i]))
    return out


def go_log_array(x: _F64) -> _F64:
    """Go's ``math.Log`` of every element (PromQL's ``ln``), the same bits as Prometheus on amd64:
    ``x = (1 + f) * 2**k`` with ``1 + f`` in [sqrt(2)/2, sqrt(2)), then :func:`_go_log_reduced`;
    Go's special cases (NaN and +Inf as they are, 0 -> -Inf, below 0 -> NaN)."""
    x = np.asarray(x, dtype=np.float64)
    out = np.empty_like(x)
    ok = np.isfinite(x) & (x > 0)
    # log_amd64.s splits the bits as they are (a subnormal is read as 2**-1022 times its
    # mantissa with an implicit leading 1, so ln(5e-324) is -709.09 there, as Prometheus answers);
    # for normal numbers this is frexp.
    bits = x[ok].view(np.uint64)
    exp = ((bits >> np.uint64(52)) & np.uint64(0x7FF)).astype(np.int64) - 0x3FE
    frac = ((bits & np.uint64(0x000FFFFFFFFFFFFF)) | np.uint64(0x3FE0000000000000)).view(np.float64)
    low = frac < _HALF_SQRT2
    f1 = np.where(low, frac * 2, frac)
    k = np.where(low, exp - 1, exp).astype(np.float64)
    out[ok] = _go_log_reduced(f1 - 1, k)
    bad = x[~ok]
    with np.errstate(invalid="ignore"):
        out[~ok] = np.where(bad == 0, -_INF, np.where(bad < 0, math.nan, bad))
    return out


#: Go's constant ``1/Ln10`` rounded once (math.Log10 is ``Log(x) * (1/Ln10)``).
_INV_LN10 = 0.4342944819032518


def go_log10_array(x: _F64) -> _F64:
    """Go's ``math.Log10`` of every element (PromQL's ``log10``): ``Log(x) * (1/Ln10)``."""
    out: _F64 = go_log_array(x) * _INV_LN10
    return out


def go_exp2_array(x: _F64) -> _F64:
    """:func:`go_exp2` of every element, the same bits; elements whose result is not a normal
    float (or is 0 or inf) go through :func:`go_exp2` one by one."""
    x = np.asarray(x, dtype=np.float64)
    out = np.empty_like(x)
    ok = np.isfinite(x) & (x > -1020.0) & (x < 1020.0)
    v = x[ok]
    k = np.where(v > 0, np.trunc(v + 0.5), np.where(v < 0, np.trunc(v - 0.5), 0.0))
    t = v - k
    hi = t * _LN2_HI
    lo = -t * _LN2_LO
    r = hi - lo
    tt = r * r
    c = r - tt * (_P1 + tt * (_P2 + tt * (_P3 + tt * (_P4 + tt * _P5))))
    y = 1 - ((lo - (r * c) / (2 - c)) - hi)
    out[ok] = np.ldexp(y, k.astype(np.int64))
    for i in np.flatnonzero(~ok).tolist():
        out.flat[i] = go_exp2(float(x.flat[i]))
    return out


def go_exp2(x: float) -> float:
    """Go's ``math.Exp2`` (the pure-Go ``exp2``/``expmulti`` that amd64 runs)."""
    if x != x or x == _INF:
        return x
    if x == -_INF or x < -1.0740e03:
        return 0.0
    if x > 1.0239999999999999e03:
        return _INF
    k = int(x + 0.5) if x > 0 else int(x - 0.5) if x < 0 else 0
    t = x - float(k)
    hi = t * _LN2_HI
    lo = -t * _LN2_LO
    r = hi - lo
    tt = r * r
    c = r - tt * (_P1 + tt * (_P2 + tt * (_P3 + tt * (_P4 + tt * _P5))))
    y = 1 - ((lo - (r * c) / (2 - c)) - hi)
    return _ldexp(y, k)


#: The name kql's histeval used before go_exp2 was public.
_exp2 = go_exp2


# --- the value type --------------------------------------------------------------------------


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


@dataclass(slots=True)
class FloatHistogram:
    """A native histogram with float counts; bucket counts are ABSOLUTE (not deltas).

    Fields follow Prometheus' ``FloatHistogram``; spans are ``(offset, length)`` pairs. Methods
    return new histograms (the receiver is never changed), so samples may be shared freely.

    >>> a = FloatHistogram(schema=0, count=2, sum=3, positive_spans=((0, 2),), positive_buckets=(1, 1))
    >>> str(a.mul(2))
    '{count:4, sum:6, (0.5,1]:2, (1,2]:2}'
    """

    schema: int = 0
    zero_threshold: float = 0.0
    zero_count: float = 0.0
    count: float = 0.0
    sum: float = 0.0
    positive_spans: tuple[Span, ...] = ()
    positive_buckets: tuple[float, ...] = ()
    negative_spans: tuple[Span, ...] = ()
    negative_buckets: tuple[float, ...] = ()
    counter_reset_hint: int = UNKNOWN_COUNTER_RESET
    custom_values: tuple[float, ...] = field(default=())

    # --- construction -----------------------------------------------------------------------

    @classmethod
    def from_deltas(
        cls,
        schema: int,
        zero_threshold: float,
        zero_count: float,
        count: float,
        sum: float,
        pos_spans: Sequence[Span],
        pos_deltas: Sequence[int],
        neg_spans: Sequence[Span],
        neg_deltas: Sequence[int],
        hint: int = UNKNOWN_COUNTER_RESET,
        custom_values: Sequence[float] = (),
    ) -> FloatHistogram:
        """An integer histogram (buckets as deltas, as remote_write and the agent send them) as floats."""
        return cls(
            schema=schema,
            zero_threshold=float(zero_threshold),
            zero_count=float(zero_count),
            count=float(count),
            sum=float(sum),
            positive_spans=tuple((int(o), int(n)) for o, n in pos_spans),
            positive_buckets=tuple(float(x) for x in accumulate(int(d) for d in pos_deltas)),
            negative_spans=tuple((int(o), int(n)) for o, n in neg_spans),
            negative_buckets=tuple(float(x) for x in accumulate(int(d) for d in neg_deltas)),
            counter_reset_hint=hint,
            custom_values=tuple(float(v) for v in custom_values),
        )

    @classmethod
    def from_observations(
        cls, values: npt.ArrayLike, schema: int = 3, zero_threshold: float = 2.0**-128
    ) -> FloatHistogram:
        """A histogram of raw observations, bucketed as Prometheus' client libraries bucket them.

        Bucket ``i`` holds ``bound(i-1) < |v| <= bound(i)`` (client_golang's frexp + bounds-table
        search), ``|v| <= zero_threshold`` goes to the zero bucket, ±Inf to the bucket past the
        last finite one, NaN only into ``count`` (and makes ``sum`` NaN). Vectorised with numpy, so
        tests and benchmarks can build histograms of millions of observations.
        """
        if not is_exponential_schema(schema):
            raise HistogramError(f"from_observations needs an exponential schema (-4..8), got {schema}")
        v = np.asarray(values, dtype=np.float64).ravel()
        finite_or_inf = v[~np.isnan(v)]
        absv = np.abs(finite_or_inf)
        in_zero = absv <= zero_threshold
        inf_idx = ((1024 << schema) if schema >= 0 else (1024 >> -schema)) + 1

        def side(sel: npt.NDArray[np.bool_]) -> tuple[tuple[Span, ...], tuple[float, ...]]:
            a = absv[sel]
            if len(a) == 0:
                return (), ()
            frac, exp = np.frexp(a)
            exp = exp.astype(np.int64)
            if schema > 0:
                table = np.asarray(EXPONENTIAL_BOUNDS[schema])
                key = np.searchsorted(table, frac, side="left").astype(np.int64) + (exp - 1) * len(table)
            else:
                key = exp - (frac == 0.5)
                key = (key + ((1 << -schema) - 1)) >> -schema
            key[np.isinf(a)] = inf_idx
            idx, counts = np.unique(key, return_counts=True)
            return _spans_from_indices(idx.tolist()), tuple(counts.astype(np.float64).tolist())

        ps, pb = side((finite_or_inf > 0) & ~in_zero)
        ns, nb = side((finite_or_inf < 0) & ~in_zero)
        with np.errstate(invalid="ignore"):
            total = float(np.sum(v)) if len(v) else 0.0
        return cls(
            schema=schema,
            zero_threshold=zero_threshold,
            zero_count=float(np.count_nonzero(in_zero)),
            count=float(len(v)),
            sum=total,
            positive_spans=ps,
            positive_buckets=pb,
            negative_spans=ns,
            negative_buckets=nb,
        )

    def uses_custom_buckets(self) -> bool:
        return self.schema == CUSTOM_BUCKETS_SCHEMA

    def size(self) -> int:
        """Bytes Prometheus' ``FloatHistogram.Size()`` gives this histogram on a 64-bit machine:
        a 168-byte struct plus 8 bytes per span, bucket and custom bound."""
        return 168 + 8 * (
            len(self.positive_spans)
            + len(self.negative_spans)
            + len(self.positive_buckets)
            + len(self.negative_buckets)
            + len(self.custom_values)
        )

    def sample_weight(self) -> int:
        """Float samples this histogram counts as toward the query sample limit: Prometheus'
        ``HPoint.size()``, ``(Size() + 8) / 16`` (a float sample is 16 bytes), so a query over
        wide histograms reaches ``max_samples`` as soon as Prometheus' would."""
        # (168 + 8 * n + 8) // 16 in one expression: it runs once per histogram a query loads.
        return (
            176
            + 8
            * (
                len(self.positive_spans)
                + len(self.negative_spans)
                + len(self.positive_buckets)
                + len(self.negative_buckets)
                + len(self.custom_values)
            )
        ) >> 4

    def copy(self, **changes: object) -> FloatHistogram:
        """A copy with some fields replaced (tuples are immutable, so nothing deep to copy)."""
        h = FloatHistogram(
            self.schema,
            self.zero_threshold,
            self.zero_count,
            self.count,
            self.sum,
            self.positive_spans,
            self.positive_buckets,
            self.negative_spans,
            self.negative_buckets,
            self.counter_reset_hint,
            self.custom_values,
        )
        for k, v in changes.items():
            setattr(h, k, v)
        return h

    def _side(self, positive: bool) -> tuple[list[int], tuple[float, ...]]:
        if positive:
            return _indices(self.positive_spans), self.positive_buckets
        return _indices(self.negative_spans), self.negative_buckets

    # --- printing and comparing -------------------------------------------------------------

    def buckets(self, positive: bool = True) -> list[Bucket]:
        """Positive buckets ascending, or negative buckets descending from zero (Go's iterators)."""
        spans = self.positive_spans if positive else self.negative_spans
        counts = self.positive_buckets if positive else self.negative_buckets
        cv = self.custom_values
        out: list[Bucket] = []
        custom = self.uses_custom_buckets()
        for i, c in zip(_indices(spans), counts, strict=False):
            if positive:
                lo, hi = get_bound(i - 1, self.schema, cv), get_bound(i, self.schema, cv)
            else:
                lo, hi = -get_bound(i, self.schema, cv), -get_bound(i - 1, self.schema, cv)
            if custom:
                out.append(Bucket(lo, hi, i == 0, True, c, i))
            else:
                out.append(Bucket(lo, hi, lo < 0, hi > 0, c, i))
        return out

    def zero_bucket(self) -> Bucket:
        if self.uses_custom_buckets():
            raise HistogramError("histograms with custom buckets have no zero bucket")
        return Bucket(-self.zero_threshold, self.zero_threshold, True, True, self.zero_count)

    def all_buckets(self) -> list[Bucket]:
        """Every bucket ascending (Go ``AllBucketIterator``), bounds clipped at the zero threshold."""
        zt = self.zero_threshold
        out: list[Bucket] = []
        for b in reversed(self.buckets(False)):
            if -zt < b.upper < 0:
                b = Bucket(b.lower, -zt, b.lower_inclusive, b.upper_inclusive, b.count, b.index)
            elif 0 < b.lower < zt:
                b = Bucket(zt, b.upper, b.lower_inclusive, b.upper_inclusive, b.count, b.index)
            out.append(b)
        if self.zero_count > 0:
            out.append(self.zero_bucket())
        for b in self.buckets(True):
            if 0 < b.lower < zt:
                b = Bucket(zt, b.upper, b.lower_inclusive, b.upper_inclusive, b.count, b.index)
            elif -zt < b.upper < 0:
                b = Bucket(b.lower, -zt, b.lower_inclusive, b.upper_inclusive, b.count, b.index)
            out.append(b)
        return out

    def __str__(self) -> str:
        """Prometheus' ``FloatHistogram.String()``: count, sum, then every populated bucket."""
        parts = [f"{{count:{go_float(self.count)}, sum:{go_float(self.sum)}"]
        parts.extend(str(b) for b in reversed(self.buckets(False)) if b.count != 0)
        if self.zero_count != 0:
            parts.append(str(self.zero_bucket()))
        parts.extend(str(b) for b in self.buckets(True) if b.count != 0)
        return ", ".join(parts) + "}"

    def test_expression(self) -> str:
        """The promqltest ``{{...}}`` form of this histogram (Go ``TestExpression``)."""
        m = self.compact(2**31)
        res: list[str] = []
        if m.schema != 0:
            res.append(f"schema:{m.schema}")
        if m.count != 0:
            res.append(f"count:{go_float(m.count)}")
        if m.sum != 0:
            res.append(f"sum:{go_float(m.sum)}")
        if m.zero_count != 0:
            res.append(f"z_bucket:{go_float(m.zero_count)}")
        if m.zero_threshold != 0:
            res.append(f"z_bucket_w:{go_float(m.zero_threshold)}")
        if m.uses_custom_buckets():
            res.append("custom_values:[" + " ".join(go_float(v) for v in m.custom_values) + "]")
        hint = {COUNTER_RESET: "reset", NOT_COUNTER_RESET: "not_reset", GAUGE_TYPE: "gauge"}
        if m.counter_reset_hint in hint:
            res.append(f"counter_reset_hint:{hint[m.counter_reset_hint]}")
        for spans, buckets, bkey, okey in (
            (m.positive_spans, m.positive_buckets, "buckets", "offset"),
            (m.negative_spans, m.negative_buckets, "n_buckets", "n_offset"),
        ):
            if spans and spans[0][0] != 0:
                res.append(f"{okey}:{spans[0][0]}")
            if buckets:
                res.append(f"{bkey}:[" + " ".join(go_float(b) for b in buckets) + "]")
        return "{{" + " ".join(res) + "}}"

    def equals(self, other: FloatHistogram | None) -> bool:
        """Prometheus ``Equals``: same layout and bit-identical counts (so NaN equals NaN)."""
        if other is None:
            return False
        h, h2 = self, other
        if h.schema != h2.schema or not _floats_bits_equal((h.count, h.sum), (h2.count, h2.sum)):
            return False
        if h.uses_custom_buckets() and tuple(h.custom_values) != tuple(h2.custom_values):
            return False
        if h.zero_threshold != h2.zero_threshold or not _floats_bits_equal((h.zero_count,), (h2.zero_count,)):
            return False
        return (
            spans_match(h.negative_spans, h2.negative_spans)
            and _floats_bits_equal(h.negative_buckets, h2.negative_buckets)
            and spans_match(h.positive_spans, h2.positive_spans)
            and _floats_bits_equal(h.positive_buckets, h2.positive_buckets)
        )

    # --- scalar arithmetic ------------------------------------------------------------------

    def mul(self, factor: float) -> FloatHistogram:
        """Every count and the sum times ``factor``; a negative factor makes it a gauge."""
        f = float(factor)
        return self.copy(
            zero_count=self.zero_count * f,
            count=self.count * f,
            sum=self.sum * f,
            positive_buckets=tuple(map(f.__mul__, self.positive_buckets)),  # f*x is x*f in IEEE
            negative_buckets=tuple(map(f.__mul__, self.negative_buckets)),
            counter_reset_hint=GAUGE_TYPE if f < 0 else self.counter_reset_hint,
        )

    def div(self, scalar: float) -> FloatHistogram:
        """Every count and the sum divided by ``scalar``; dividing by zero drops every bucket."""
        s = float(scalar)
        zc, cnt, sm = (_safe_div(v, s) for v in (self.zero_count, self.count, self.sum))
        if s == 0:
            return self.copy(
                zero_count=zc,
                count=cnt,
                sum=sm,
                positive_buckets=(),
                negative_buckets=(),
                positive_spans=(),
                negative_spans=(),
            )
        return self.copy(
            zero_count=zc,
            count=cnt,
            sum=sm,
            positive_buckets=tuple(map(s.__rtruediv__, self.positive_buckets)),  # x / s
            negative_buckets=tuple(map(s.__rtruediv__, self.negative_buckets)),
            counter_reset_hint=GAUGE_TYPE if s < 0 else self.counter_reset_hint,
        )

    # --- layout -----------------------------------------------------------------------------

    def compact(self, max_empty_buckets: int = 0) -> FloatHistogram:
        """Drop empty buckets at span edges, split at runs of more than ``max_empty_buckets`` empty ones, merge spans that close.

        Same result as Go ``Compact``: the populated buckets, with gaps of at most
        ``max_empty_buckets`` filled by explicit zeros.
        """
        ps, pb = _compact_side(self.positive_spans, self.positive_buckets, max_empty_buckets)
        ns, nb = _compact_side(self.negative_spans, self.negative_buckets, max_empty_buckets)
        return self.copy(positive_spans=ps, positive_buckets=pb, negative_spans=ns, negative_buckets=nb)

    def reduce_resolution(self, target_schema: int) -> FloatHistogram:
        """This histogram in the lower ``target_schema`` (buckets merged; Go ``ReduceResolution``)."""
        if self.uses_custom_buckets():
            raise HistogramError("cannot reduce resolution when there are custom buckets")
        if is_custom_buckets_schema(target_schema):
            raise HistogramError("cannot reduce resolution to custom buckets schema")
        if target_schema >= self.schema:
            raise HistogramError(f"cannot reduce resolution from schema {self.schema} to {target_schema}")
        _check_spans(self.positive_spans, len(self.positive_buckets))
        _check_spans(self.negative_spans, len(self.negative_buckets))
        return self._reduced(target_schema)

    def _reduced(self, target_schema: int) -> FloatHistogram:
        pi, pc = _reduce(*self._side(True), self.schema, target_schema)
        ni, nc = _reduce(*self._side(False), self.schema, target_schema)
        return self.copy(
            schema=target_schema,
            positive_spans=_spans_from_indices(pi),
            positive_buckets=tuple(pc),
            negative_spans=_spans_from_indices(ni),
            negative_buckets=tuple(nc),
        )

    def copy_to_schema(self, target_schema: int) -> FloatHistogram:
        """A copy in ``target_schema`` (<= this schema); the hint resets to unknown as in Go ``CopyToSchema``."""
        if target_schema == self.schema:
            return self.copy()
        if self.uses_custom_buckets():
            raise HistogramError(f"cannot reduce resolution to {target_schema} when there are custom buckets")
        if is_custom_buckets_schema(target_schema):
            raise HistogramError("cannot reduce resolution to custom buckets schema")
        if target_schema > self.schema:
            raise HistogramError(f"cannot copy from schema {self.schema} to {target_schema}")
        return self._reduced(target_schema).copy(counter_reset_hint=UNKNOWN_COUNTER_RESET)

    # --- histogram + histogram --------------------------------------------------------------

    def add(self, other: FloatHistogram) -> OpResult:
        """``self + other`` (Go ``Add``): lower schema wins, zero buckets widen to cover both.

        Raises :class:`HistogramError` when one is exponential and the other uses custom buckets.
        """
        return self._add(other, negative=False)

    def sub(self, other: FloatHistogram) -> OpResult:
        """``self - other`` (Go ``Sub``). PromQL's ``-`` operator then marks the result a gauge."""
        return self._add(other, negative=True)

    def _add(self, other: FloatHistogram, negative: bool) -> OpResult:
        if self.uses_custom_buckets() != other.uses_custom_buckets():
            raise HistogramError(_MIXED_SCHEMAS)
        h = self.copy()
        collision = h._adjust_counter_reset(other)
        if not h.uses_custom_buckets():
            other_zero, _ = h._reconcile_zero_buckets(other)
            h.zero_count = h.zero_count - other_zero if negative else h.zero_count + other_zero
        h.count = h.count - other.count if negative else h.count + other.count
        h.sum = h.sum - other.sum if negative else h.sum + other.sum

        if h.uses_custom_buckets():
            if tuple(h.custom_values) == tuple(other.custom_values):
                h.positive_spans, h.positive_buckets = _add_side(
                    h.positive_spans,
                    h.positive_buckets,
                    other.positive_spans,
                    other.positive_buckets,
                    negative,
                    None,
                )
                return OpResult(h, collision, False)
            bounds = _intersect_bounds(h.custom_values, other.custom_values)
            h.positive_spans, h.positive_buckets, _ = _add_custom_mismatched(
                h.positive_spans,
                h.positive_buckets,
                h.custom_values,
                other.positive_spans,
                other.positive_buckets,
                other.custom_values,
                bounds,
                negative,
                None,
            )
            h.custom_values = bounds
            return OpResult(h, collision, True)

        ps, pb, ns, nb = h.positive_spans, h.positive_buckets, h.negative_spans, h.negative_buckets
        ops, opb, ons, onb = (
            other.positive_spans,
            other.positive_buckets,
            other.negative_spans,
            other.negative_buckets,
        )
        if other.schema < h.schema:
            ps, pb = _reduced_side(ps, pb, h.schema, other.schema)
            ns, nb = _reduced_side(ns, nb, h.schema, other.schema)
            h.schema = other.schema
        elif other.schema > h.schema:
            ops, opb = _reduced_side(ops, opb, other.schema, h.schema)
            ons, onb = _reduced_side(ons, onb, other.schema, h.schema)
        threshold = (h.schema, h.zero_threshold)
        h.positive_spans, h.positive_buckets = _add_side(ps, pb, ops, opb, negative, threshold)
        h.negative_spans, h.negative_buckets = _add_side(ns, nb, ons, onb, negative, threshold)
        return OpResult(h, collision, False)

    def _adjust_counter_reset(self, other: FloatHistogram) -> bool:
        """Go ``adjustCounterReset``: the hint of a sum; True on a CounterReset/NotCounterReset clash."""
        a, b = self.counter_reset_hint, other.counter_reset_hint
        if a in (b, GAUGE_TYPE):
            return False
        if b == GAUGE_TYPE:
            self.counter_reset_hint = GAUGE_TYPE
            return False
        if a == UNKNOWN_COUNTER_RESET:
            return False
        self.counter_reset_hint = UNKNOWN_COUNTER_RESET
        return b != UNKNOWN_COUNTER_RESET

    def _zero_count_for_larger_threshold(
        self, larger: float, c: FloatHistogram | None = None
    ) -> tuple[float, float, float]:
        """Go ``zeroCountForLargerThreshold``: (zero count, threshold, its Kahan compensation) at width ``larger``.

        A threshold that falls inside a populated bucket moves up to that bucket's upper bound.
        ``c`` is the Kahan compensation histogram of this one (same layout), as in ``KahanAdd``.
        """
        czc = c.zero_count if c is not None else 0.0
        if larger == self.zero_threshold:
            return self.zero_count, larger, czc
        if larger < self.zero_threshold:
            raise HistogramError(f"new threshold {larger} is less than old threshold {self.zero_threshold}")
        pos = self.buckets(True)
        neg = self.buckets(False)
        while True:
            zc = self.zero_count
            for k, b in enumerate(pos):
                if b.lower >= larger:
                    break
                zc, czc = kahan_inc(b.count, zc, czc)
                if c is not None:
                    zc, czc = kahan_inc(c.positive_buckets[k], zc, czc)
                if b.upper > larger:
                    if b.count != 0:
                        larger = b.upper
                    break
            restart = False
            for k, b in enumerate(neg):
                if b.upper <= -larger:
                    break
                zc, czc = kahan_inc(b.count, zc, czc)
                if c is not None:
                    zc, czc = kahan_inc(c.negative_buckets[k], zc, czc)
                if b.lower < -larger:
                    if b.count != 0:
                        larger = -b.lower
                        restart = True  # Go's "continue outer" (the compensation is not reset)
                    break
            if not restart:
                return zc, larger, czc

    def _trim_buckets_in_zero_bucket(self, c: FloatHistogram | None = None) -> None:
        """Zero the buckets now inside the zero bucket, then compact (as Go does, ``Compact(0)``)."""
        pos = list(self.positive_buckets)
        cpos = list(c.positive_buckets) if c is not None else None
        for k, b in enumerate(self.buckets(True)):
            if b.lower >= self.zero_threshold:
                break
            pos[k] = 0.0
            if cpos is not None:
                cpos[k] = 0.0
        neg = list(self.negative_buckets)
        cneg = list(c.negative_buckets) if c is not None else None
        for k, b in enumerate(self.buckets(False)):
            if b.upper <= -self.zero_threshold:
                break
            neg[k] = 0.0
            if cneg is not None:
                cneg[k] = 0.0
        if c is None or cpos is None or cneg is None:
            self.positive_buckets, self.negative_buckets = tuple(pos), tuple(neg)
            compacted = self.compact(0)
            self.positive_spans, self.positive_buckets = compacted.positive_spans, compacted.positive_buckets
            self.negative_spans, self.negative_buckets = compacted.negative_spans, compacted.negative_buckets
            return
        self.positive_spans, self.positive_buckets, c.positive_buckets = _kahan_compact(
            self.positive_spans, pos, cpos
        )
        self.negative_spans, self.negative_buckets, c.negative_buckets = _kahan_compact(
            self.negative_spans, neg, cneg
        )
        c.positive_spans, c.negative_spans = self.positive_spans, self.negative_spans

    def _reconcile_zero_buckets(
        self, other: FloatHistogram, c: FloatHistogram | None = None
    ) -> tuple[float, float]:
        """Widen this zero bucket to cover ``other``'s; ``other``'s zero count at that width and its compensation."""
        other_zc = other.zero_count
        other_zt = other.zero_threshold
        other_czc = 0.0
        while other_zt != self.zero_threshold:
            if self.zero_threshold > other_zt:
                other_zc, other_zt, other_czc = other._zero_count_for_larger_threshold(self.zero_threshold)
            if other_zt > self.zero_threshold:
                self.zero_count, self.zero_threshold, czc = self._zero_count_for_larger_threshold(other_zt, c)
                if c is not None:
                    c.zero_count = czc
                    c.zero_threshold = self.zero_threshold
                self._trim_buckets_in_zero_bucket(c)
        return other_zc, other_czc

    # --- Kahan summation (sum/avg aggregation, sum_over_time) -----------------------------

    def new_compensation(self) -> FloatHistogram:
        """An all-zero Kahan compensation histogram with this layout (Go ``newCompensationHistogram``)."""
        return FloatHistogram(
            schema=self.schema,
            zero_threshold=self.zero_threshold,
            positive_spans=self.positive_spans,
            positive_buckets=(0.0,) * len(self.positive_buckets),
            negative_spans=self.negative_spans if not self.uses_custom_buckets() else (),
            negative_buckets=(0.0,) * len(self.negative_buckets) if not self.uses_custom_buckets() else (),
            counter_reset_hint=self.counter_reset_hint,
            custom_values=self.custom_values,
        )

    def kahan_add(self, other: FloatHistogram, c: FloatHistogram | None = None) -> KahanResult:
        """``self + other`` with Kahan-compensated counts (Go ``KahanAdd``), as PromQL's ``sum`` adds.

        ``c`` is the running compensation (None at the start); the result carries the new one.
        The final value of a sum is ``result.histogram.add(result.compensation).histogram``.
        """
        if self.uses_custom_buckets() != other.uses_custom_buckets():
            raise HistogramError(_MIXED_SCHEMAS)
        h = self.copy()
        collision = h._adjust_counter_reset(other)
        c = h.new_compensation() if c is None else c.copy()
        if not h.uses_custom_buckets():
            other_zc, other_czc = h._reconcile_zero_buckets(other, c)
            h.zero_count, c.zero_count = kahan_inc(other_zc, h.zero_count, c.zero_count)
            h.zero_count, c.zero_count = kahan_inc(other_czc, h.zero_count, c.zero_count)
        h.count, c.count = kahan_inc(other.count, h.count, c.count)
        h.sum, c.sum = kahan_inc(other.sum, h.sum, c.sum)

        if h.uses_custom_buckets():
            reconciled = tuple(h.custom_values) != tuple(other.custom_values)
            if not reconciled:
                h.positive_spans, h.positive_buckets, c.positive_buckets = _kahan_add_side(
                    h.positive_spans,
                    h.positive_buckets,
                    c.positive_buckets,
                    other.positive_spans,
                    other.positive_buckets,
                    None,
                    None,
                )
            else:
                bounds = _intersect_bounds(h.custom_values, other.custom_values)
                h.positive_spans, h.positive_buckets, c.positive_buckets = _add_custom_mismatched(
                    h.positive_spans,
                    h.positive_buckets,
                    h.custom_values,
                    other.positive_spans,
                    other.positive_buckets,
                    other.custom_values,
                    bounds,
                    False,
                    c.positive_buckets,
                )
                h.custom_values = c.custom_values = bounds
            c.positive_spans = h.positive_spans
            return KahanResult(h, c, collision, reconciled)

        hp = (h.positive_spans, h.positive_buckets, c.positive_buckets)
        hn = (h.negative_spans, h.negative_buckets, c.negative_buckets)
        op: tuple[tuple[Span, ...], tuple[float, ...], tuple[float, ...] | None] = (
            other.positive_spans,
            other.positive_buckets,
            None,
        )
        on: tuple[tuple[Span, ...], tuple[float, ...], tuple[float, ...] | None] = (
            other.negative_spans,
            other.negative_buckets,
            None,
        )
        if other.schema < h.schema:
            hp = _kahan_reduce(*hp, h.schema, other.schema)
            hn = _kahan_reduce(*hn, h.schema, other.schema)
            h.schema = other.schema
        elif other.schema > h.schema:
            if op[1]:
                op = _kahan_reduce(op[0], op[1], (0.0,) * len(op[1]), other.schema, h.schema)
            if on[1]:
                on = _kahan_reduce(on[0], on[1], (0.0,) * len(on[1]), other.schema, h.schema)
        threshold = (h.schema, h.zero_threshold)
        h.positive_spans, h.positive_buckets, c.positive_buckets = _kahan_add_side(*hp, *op, threshold)
        h.negative_spans, h.negative_buckets, c.negative_buckets = _kahan_add_side(*hn, *on, threshold)
        c.schema, c.zero_threshold = h.schema, h.zero_threshold
        c.positive_spans, c.negative_spans = h.positive_spans, h.negative_spans
        return KahanResult(h, c, collision, False)

    def validate(self) -> None:
        """Raise :class:`HistogramError` with Prometheus' message if this histogram is inconsistent (Go ``Validate``).

        Checks span/bucket agreement, negative counts, custom bounds and the fields a schema must
        not use; ``count`` is not compared with the bucket total (float rounding, NaN observations).
        """
        if self.uses_custom_buckets():
            try:
                _check_custom_bounds(self.custom_values, self.positive_spans, len(self.positive_buckets))
            except HistogramError as exc:
                raise HistogramError(f"custom buckets: {exc}") from None
            if self.zero_count != 0:
                raise HistogramError("custom buckets: must have zero count of 0")
            if self.zero_threshold != 0:
                raise HistogramError("custom buckets: must have zero threshold of 0")
            if self.negative_spans:
                raise HistogramError("custom buckets: must not have negative spans")
            if self.negative_buckets:
                raise HistogramError("custom buckets: must not have negative buckets")
        elif is_exponential_schema(self.schema):
            for side, spans, buckets in (
                ("positive", self.positive_spans, self.positive_buckets),
                ("negative", self.negative_spans, self.negative_buckets),
            ):
                try:
                    _check_layout(spans, len(buckets))
                except HistogramError as exc:
                    raise HistogramError(f"{side} side: {exc}") from None
            _check_counts("negative side: ", self.negative_buckets)
            if self.zero_count < 0:
                raise HistogramError(
                    f"zero bucket has observation count of {go_float(self.zero_count)}: {_NEGATIVE_BUCKET_COUNT}"
                )
            if self.custom_values:
                raise HistogramError("histogram with exponential schema must not have custom bounds")
        else:
            raise HistogramError(
                "histogram has an invalid schema, which must be between -4 and 8 for exponential buckets, "
                f"or -53 for custom buckets, got schema {self.schema}"
            )
        if self.count < 0:
            raise HistogramError(
                f"observation count is  {go_float(self.count)}: histogram's observation count is negative"
            )
        _check_counts("positive side: ", self.positive_buckets)

    def trim_buckets(self, rhs: float, upper: bool) -> FloatHistogram:
        """The observations below (``upper``: PromQL ``h </ rhs``) or above (``h >/ rhs``) ``rhs`` (Go ``TrimBuckets``).

        A bucket the cut falls in keeps its interpolated share (exponential in standard
        buckets, linear in custom ones and the zero bucket); count and sum are recomputed from
        bucket midpoints only when something was trimmed, then the result is compacted.
        """
        h = self.copy()
        custom = h.uses_custom_buckets()
        new_count = new_sum = 0.0
        trimmed = False
        seen = {True: False, False: False}
        for positive in (True, False):
            counts = list(h.positive_buckets if positive else h.negative_buckets)
            for k, b in enumerate(h.buckets(positive)):
                if b.count == 0:
                    continue
                seen[positive] = True
                whole = b.upper <= rhs if upper else b.lower >= rhs
                partial = b.lower < rhs if upper else b.upper > rhs
                if whole:
                    new_count += b.count
                    new_sum += _trim_midpoint(b.lower, b.upper, positive, custom) * b.count
                elif partial:
                    keep, mid = _bucket_trim(b, rhs, upper, positive, custom)
                    new_count += keep
                    new_sum += mid * keep
                    if counts[k] != keep:
                        counts[k] = keep
                        trimmed = True
                else:
                    counts[k] = 0.0
                    trimmed = True
            if positive:
                h.positive_buckets = tuple(counts)
            else:
                h.negative_buckets = tuple(counts)
        if h.zero_count > 0:
            keep, mid = _zero_bucket_trim(h.zero_bucket(), rhs, seen[False], seen[True], upper)
            if h.zero_count != keep:
                h.zero_count = keep
                trimmed = True
            new_sum += mid * keep
            new_count += keep
        if not trimmed:
            return h
        h.count, h.sum = new_count, new_sum
        return h.compact(0)

    def has_overflow(self) -> bool:
        """Whether a count, the sum or a custom bound is infinite (Go ``HasOverflow``), e.g. after a big sum."""
        return (
            math.isinf(self.zero_count)
            or math.isinf(self.count)
            or math.isinf(self.sum)
            or any(map(math.isinf, self.positive_buckets))
            or any(map(math.isinf, self.negative_buckets))
            or any(map(math.isinf, self.custom_values))
        )

    # --- counter resets ---------------------------------------------------------------------

    def detect_reset(self, previous: FloatHistogram) -> bool:
        """Whether this histogram, following ``previous``, starts a new counter (Go ``DetectReset``)."""
        if self.counter_reset_hint == COUNTER_RESET:
            return True
        if self.counter_reset_hint == NOT_COUNTER_RESET:
            return False
        if self.count < previous.count:
            return True
        if self.uses_custom_buckets():
            if not previous.uses_custom_buckets():
                return True
            if tuple(self.custom_values) != tuple(previous.custom_values):
                return _reset_mismatched_custom(self, previous)
        if self.schema > previous.schema:
            return True
        if self.zero_threshold < previous.zero_threshold:
            return True
        prev_zc, new_threshold, _ = previous._zero_count_for_larger_threshold(self.zero_threshold)
        if new_threshold != self.zero_threshold:
            return True
        if self.zero_count < prev_zc:
            return True
        custom = self.uses_custom_buckets()
        if (
            self.schema == previous.schema
            and self.positive_spans == previous.positive_spans
            and self.negative_spans == previous.negative_spans
            and (custom or _first_bounds_above(self, self.zero_threshold))
        ):
            # Same layout, nothing inside the zero bucket: compare the counts directly.
            return any(map(operator.lt, self.positive_buckets, previous.positive_buckets)) or any(
                map(operator.lt, self.negative_buckets, previous.negative_buckets)
            )
        for positive in (True, False):
            ci: Sequence[int]
            cc: Sequence[float]
            pi: Sequence[int]
            pc: Sequence[float]
            ci, cc = self._side(positive)
            pi, pc = previous._side(positive)
            if not custom and previous.schema != self.schema:
                pi, pc = _reduce(pi, pc, previous.schema, self.schema)
            if not custom and self.zero_threshold != 0:
                ci, cc = _above_threshold(ci, cc, self.schema, self.zero_threshold)
                pi, pc = _above_threshold(pi, pc, self.schema, self.zero_threshold)
            if _bucket_reset(ci, cc, pi, pc):
                return True
        return False


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


# --- sum and avg of many histograms (promql/engine.go SUM/AVG, functions.go *_over_time) ----


class HistogramSum:
    """Prometheus' sum of histograms (``sum``, ``sum_over_time``): Kahan-compensated, in input order.

    ``add`` raises :class:`HistogramError` on a mix of exponential and custom buckets and
    returns whether custom bounds were reconciled (PromQL's info); ``result`` is the sum with
    its compensation added, not yet compacted (PromQL compacts ``sum``'s result).

    >>> acc = HistogramSum(parse_histogram("{{count:1 sum:1e100}}"))
    >>> _ = acc.add(parse_histogram("{{count:1 sum:1}}")); _ = acc.add(parse_histogram("{{count:1 sum:-1e100}}"))
    >>> acc.result().sum
    1.0
    """

    __slots__ = ("_comp", "_value")

    def __init__(self, first: FloatHistogram) -> None:
        self._value = first
        self._comp: FloatHistogram | None = None

    def add(self, h: FloatHistogram) -> bool:
        r = self._value.kahan_add(h, self._comp)
        self._value, self._comp = r.histogram, r.compensation
        return r.nhcb_bounds_reconciled

    def result(self) -> FloatHistogram:
        return self._value if self._comp is None else self._value.add(self._comp).histogram


class HistogramMean:
    """Prometheus' mean of histograms (``avg``, ``avg_over_time``): a Kahan sum divided at the end,
    switching to an incremental mean once the sum would overflow, step for step as Go does."""

    __slots__ = ("_comp", "_count", "_incremental", "_mean", "_sum")

    def __init__(self, first: FloatHistogram) -> None:
        self._sum = first
        self._comp: FloatHistogram | None = None
        self._count = 1.0
        self._incremental = False
        self._mean = first

    def add(self, h: FloatHistogram) -> bool:
        """Add one histogram; raises :class:`HistogramError` on mixed schemas, returns bounds-reconciled."""
        self._count += 1.0
        count = self._count
        reconciled = False
        if not self._incremental:
            r = self._sum.kahan_add(h, self._comp)
            reconciled = r.nhcb_bounds_reconciled
            if not r.histogram.has_overflow():
                self._sum, self._comp = r.histogram, r.compensation
                return reconciled
            self._incremental = True
            self._mean = self._sum.div(count - 1)
            if self._comp is not None:
                self._comp = self._comp.div(count - 1)
        q = (count - 1) / count
        if self._comp is not None:
            self._comp = self._comp.mul(q)
        r = self._mean.mul(q).kahan_add(h.div(count), self._comp)
        self._mean, self._comp = r.histogram, r.compensation
        return reconciled or r.nhcb_bounds_reconciled

    def result(self) -> FloatHistogram:
        if self._incremental:
            return self._mean if self._comp is None else self._mean.add(self._comp).histogram
        total = self._sum.div(self._count)
        if self._comp is None:
            return total
        return total.add(self._comp.div(self._count)).histogram


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


def _interpolate(rank: float, lo: float, hi: float, count: float, v: float, linear: bool) -> float:
    """The rank at ``v`` inside one bucket; a bucket reaching -Inf contributes its whole count (Go)."""
    if linear and lo == -_INF:
        return count
    return rank + count * _fraction_below(lo, hi, v, linear)


def histogram_fraction(lower: float, upper: float, h: FloatHistogram) -> tuple[float, list[str]]:
    """The estimated share of observations between ``lower`` and ``upper`` (Go ``HistogramFraction``)."""
    if h.count == 0 or math.isnan(lower) or math.isnan(upper):
        return math.nan, []
    if lower >= upper:
        return 0.0, []
    counts = _ordered(h, reverse=False)
    custom = h.uses_custom_buckets()
    rank = lower_rank = upper_rank = 0.0
    lower_set = upper_set = False
    count = 0.0
    consumed = 0
    for consumed, c in enumerate(counts, start=1):
        b_lo, b_hi = _bucket_of(h, consumed - 1, False)
        count += c
        zero_bucket = False
        if b_lo <= 0 and b_hi >= 0:
            zero_bucket = True
            if not h.negative_buckets and h.positive_buckets:
                b_lo = 0.0
            elif not h.positive_buckets and h.negative_buckets:
                b_hi = 0.0
        linear = custom or zero_bucket

        if not lower_set and b_lo >= lower:
            lower_rank, lower_set = rank, True
        if not upper_set and b_lo >= upper:
            upper_rank, upper_set = rank, True
        if lower_set and upper_set:
            break
        if not lower_set and b_lo < lower < b_hi:
            lower_rank, lower_set = _interpolate(rank, b_lo, b_hi, c, lower, linear), True
        if not upper_set and b_lo < upper < b_hi:
            upper_rank, upper_set = _interpolate(rank, b_lo, b_hi, c, upper, linear), True
        if lower_set and upper_set:
            break
        rank += c
    annos: list[str] = []
    if math.isnan(h.sum):
        for c in counts[consumed:]:
            count += c
        if count < h.count:
            annos.append(FRACTION_NAN_INFO)
    else:
        count = h.count
    if not lower_set or lower_rank > count:
        lower_rank = count
    if not upper_set or upper_rank > count:
        upper_rank = count
    return (upper_rank - lower_rank) / h.count, annos


def _side_bounds(h: FloatHistogram, positive: bool) -> tuple[_F64, _F64]:
    """(lower, upper) arrays of one side's buckets in storage order, clipped at the zero threshold."""
    idx = np.asarray(_indices(h.positive_spans if positive else h.negative_spans), dtype=np.int64)
    if h.uses_custom_buckets():
        ext = np.concatenate(([-_INF], np.asarray(h.custom_values, dtype=np.float64), [_INF]))
        up, below = ext[idx + 1], ext[idx]
    else:
        up, below = _bounds_exponential(idx, h.schema), _bounds_exponential(idx - 1, h.schema)
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
    mean = _safe_div(h.sum, h.count)
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
    return _safe_div(variance, h.count)


def _safe_div(a: float, b: float) -> float:
    """IEEE division (Go's): x/0 is ±Inf or NaN rather than an exception."""
    if b == 0:
        if a == 0 or a != a:
            return math.nan
        return math.copysign(_INF, a) * math.copysign(1.0, b)
    return a / b


def histogram_stdvar(h: FloatHistogram) -> float:
    """The estimated variance of the observations (``histogram_stdvar``)."""
    return _variance(h)


def histogram_stddev(h: FloatHistogram) -> float:
    """The estimated standard deviation of the observations (``histogram_stddev``)."""
    v = _variance(h)
    return math.sqrt(v) if v >= 0 else math.nan


def histogram_avg(h: FloatHistogram) -> float:
    """``sum / count`` (``histogram_avg``), IEEE semantics for an empty histogram."""
    return _safe_div(h.sum, h.count)


# --- promqltest notation (promql/parser: histogram_series_value) ----------------------------

_HINTS = {
    "unknown": UNKNOWN_COUNTER_RESET,
    "reset": COUNTER_RESET,
    "not_reset": NOT_COUNTER_RESET,
    "gauge": GAUGE_TYPE,
}
_NUM_KEYS = {"sum", "count", "z_bucket", "z_bucket_w"}
_INT_KEYS = {"schema", "offset", "n_offset"}
_LIST_KEYS = {"buckets", "n_buckets", "custom_values"}
_ITEM = re.compile(r"\s*([A-Za-z_]+)\s*:\s*(\[[^\]]*\]|[^\s\]}]+)")


def _number(text: str) -> float:
    """A PromQL number: decimal, hex/octal integer, Inf/NaN in any case, with an optional sign."""
    t = text.strip()
    sign = 1.0
    if t[:1] in "+-":
        sign = -1.0 if t[0] == "-" else 1.0
        t = t[1:]
    low = t.lower()
    if low in ("inf", "infinity"):
        return sign * _INF
    if low == "nan":
        return math.nan
    try:
        return sign * float(int(t, 0))
    except ValueError:
        pass
    try:
        return sign * float(t)
    except ValueError:
        raise HistogramNotationError(f"error parsing number: {text!r}") from None


def _int(text: str, key: str) -> int:
    try:
        return int(text.strip(), 0)
    except ValueError:
        raise HistogramNotationError(f"error parsing {key} number: {text!r}") from None


@dataclass(slots=True)
class HistogramSeriesValue:
    """One loaded histogram sample and whether its literal set ``counter_reset_hint`` explicitly."""

    histogram: FloatHistogram
    hint_set: bool


def _parse_one(text: str) -> HistogramSeriesValue:
    t = text.strip()
    if not (t.startswith("{{") and t.endswith("}}")):
        raise HistogramNotationError(f"a histogram literal is written {{{{...}}}}, got {text!r}")
    body = t[2:-2]
    desc: dict[str, object] = {}
    pos = 0
    while pos < len(body):
        if body[pos:].strip() == "":
            break
        m = _ITEM.match(body, pos)
        if not m:
            raise HistogramNotationError(
                f"unexpected {body[pos:].strip()[:20]!r} in histogram description, "
                "expected a key such as buckets:[5 10 7]"
            )
        key, raw = m.group(1).lower(), m.group(2)
        if key in desc:
            raise HistogramNotationError(f'duplicate key "{key}" in histogram')
        if key in _INT_KEYS:
            desc[key] = _int(raw, key)
        elif key in _NUM_KEYS:
            desc[key] = _number(raw)
        elif key in _LIST_KEYS:
            if not (raw.startswith("[") and raw.endswith("]")):
                raise HistogramNotationError(f"error parsing {key} float array: {raw!r}")
            items = raw[1:-1].split()
            if not items:
                raise HistogramNotationError(f"error parsing {key} float array: empty")
            desc[key] = tuple(_number(x) for x in items)
        elif key == "counter_reset_hint":
            if raw.lower() not in _HINTS:
                raise HistogramNotationError(f"error parsing counter_reset_hint: unknown value {raw!r}")
            desc[key] = _HINTS[raw.lower()]
        else:
            raise HistogramNotationError(f"unknown histogram description key {key!r}")
        pos = m.end()

    def spans(bkey: str, okey: str) -> tuple[tuple[Span, ...], tuple[float, ...]]:
        b = desc.get(bkey, ())
        assert isinstance(b, tuple)
        off = desc.get(okey, 0)
        assert isinstance(off, int)
        return (((off, len(b)),) if b else ()), b

    ps, pb = spans("buckets", "offset")
    ns, nb = spans("n_buckets", "n_offset")
    h = FloatHistogram(
        schema=int(desc.get("schema", 0)),  # type: ignore[call-overload]
        zero_threshold=float(desc.get("z_bucket_w", 0.0)),  # type: ignore[arg-type]
        zero_count=float(desc.get("z_bucket", 0.0)),  # type: ignore[arg-type]
        count=float(desc.get("count", 0.0)),  # type: ignore[arg-type]
        sum=float(desc.get("sum", 0.0)),  # type: ignore[arg-type]
        positive_spans=ps,
        positive_buckets=pb,
        negative_spans=ns,
        negative_buckets=nb,
        counter_reset_hint=int(desc.get("counter_reset_hint", UNKNOWN_COUNTER_RESET)),  # type: ignore[call-overload]
        custom_values=desc.get("custom_values", ()),  # type: ignore[arg-type]
    )
    return HistogramSeriesValue(h, "counter_reset_hint" in desc)


def parse_histogram(text: str) -> FloatHistogram:
    """One ``{{schema:0 sum:5 count:4 buckets:[1 2 1]}}`` literal as a :class:`FloatHistogram`."""
    return _parse_one(text).histogram


def _split_literal(token: str, start: int) -> int:
    """The index just past the ``}}`` closing the literal that opens at ``start``."""
    end = token.find("}}", start + 2)
    if end < 0:
        raise HistogramNotationError(f"unterminated histogram literal in {token!r}")
    return end + 2


def expand_histogram_series(token: str) -> list[HistogramSeriesValue]:
    """One promqltest series item holding histograms, expanded to its samples.

    ``{{...}}`` is one sample, ``{{...}}xN`` is N+1 copies, ``{{a}}+{{b}}xN`` is a, a+b, ...
    (N additions) and ``{{a}}-{{b}}xN`` the same with subtraction, as promqltest loads them.
    """
    t = token.strip()
    if not t.startswith("{{"):
        raise HistogramNotationError(f"expected a histogram literal, got {token!r}")
    end = _split_literal(t, 0)
    base = _parse_one(t[:end])
    rest = t[end:]
    if not rest:
        return [base]
    m = re.fullmatch(r"x([0-9]+)", rest)
    if m:
        return [base] * (int(m.group(1)) + 1)
    if rest[0] in "+-" and rest[1:].startswith("{{"):
        inc_end = _split_literal(rest, 1)
        inc = _parse_one(rest[1:inc_end])
        m = re.fullmatch(r"x([0-9]+)", rest[inc_end:])
        if not m:
            raise HistogramNotationError(f"expected xN after {rest[:inc_end]!r} in {token!r}")
        times = int(m.group(1))
        out = [HistogramSeriesValue(base.histogram, inc.hint_set)]
        cur = base.histogram
        for _ in range(times):
            if cur.schema > inc.histogram.schema:
                raise HistogramNotationError(
                    f"error combining histograms: cannot merge from schema {inc.histogram.schema} to {cur.schema}"
                )
            try:
                r = cur.add(inc.histogram) if rest[0] == "+" else cur.sub(inc.histogram)
            except HistogramError as exc:
                raise HistogramNotationError(str(exc)) from None
            cur = r.histogram
            out.append(HistogramSeriesValue(cur, inc.hint_set))
        return out
    raise HistogramNotationError(f"unexpected {rest!r} after a histogram literal in {token!r}")
