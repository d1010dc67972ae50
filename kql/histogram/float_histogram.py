"""Prometheus' native-histogram value (``FloatHistogram``) and its arithmetic, ported to Python.

A port of prometheus/prometheus ``model/histogram/float_histogram.go`` (the value type, add/sub
with schema and zero-bucket reconciliation, compact, reset detection, resolution reduction) and
of the sum/avg accumulators of ``promql/engine.go``. Spans are kept in the canonical form
(maximal runs of present buckets) after add/sub, which Prometheus' ``Equals`` treats the same as
its own layout except where Prometheus leaves two directly adjacent spans (offset 0) unmerged.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import accumulate

import numpy as np
import numpy.typing as npt

from kernel_insight.kql.gocompat import go_float
from kernel_insight.kql.histogram.bounds import get_bound
from kernel_insight.kql.histogram.buckets import (
    _NEGATIVE_BUCKET_COUNT,
    Bucket,
    KahanResult,
    OpResult,
    _above_threshold,
    _add_custom_mismatched,
    _add_side,
    _bucket_reset,
    _bucket_trim,
    _check_counts,
    _check_custom_bounds,
    _check_layout,
    _check_spans,
    _compact_side,
    _first_bounds_above,
    _floats_bits_equal,
    _indices,
    _intersect_bounds,
    _kahan_add_side,
    _kahan_compact,
    _kahan_reduce,
    _reduce,
    _reduced_side,
    _reset_mismatched_custom,
    _spans_from_indices,
    _trim_midpoint,
    _zero_bucket_trim,
    spans_match,
)
from kernel_insight.kql.histogram.constants import (
    _MIXED_SCHEMAS,
    COUNTER_RESET,
    CUSTOM_BUCKETS_SCHEMA,
    GAUGE_TYPE,
    NOT_COUNTER_RESET,
    UNKNOWN_COUNTER_RESET,
    HistogramError,
    Span,
    is_custom_buckets_schema,
    is_exponential_schema,
)
from kernel_insight.kql.histogram.exponential_bounds import EXPONENTIAL_BOUNDS
from kernel_insight.kql.histogram.gomath import go_div, kahan_inc


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
        zc, cnt, sm = (go_div(v, s) for v in (self.zero_count, self.count, self.sum))
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


# --- sum and avg of many histograms (promql/engine.go SUM/AVG, functions.go *_over_time) ----


class HistogramSum:
    """Prometheus' sum of histograms (``sum``, ``sum_over_time``): Kahan-compensated, in input order.

    ``add`` raises :class:`HistogramError` on a mix of exponential and custom buckets and
    returns whether custom bounds were reconciled (PromQL's info); ``result`` is the sum with
    its compensation added, not yet compacted (PromQL compacts ``sum``'s result).

    >>> from kernel_insight.kql.histogram import parse_histogram
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
