"""Native histograms in the evaluator: Prometheus' per-sample rules for histogram samples.

The engine's float path is columnar (numpy over series x steps). Histogram samples live beside
it (:attr:`StepVector.hists`, :attr:`RangeInput.hist`) and the operations that touch them are
here, one Python step per histogram cell, following ``promql/engine.go`` and
``promql/functions.go`` line for line: binary operators, aggregations, the range functions that
read histograms and the annotations Prometheus raises for mixed float/histogram input. The
histogram arithmetic itself is :mod:`kernel_insight.kql.histogram`'s; only the wrappers at the
top of this module call it, so its conventions are met in one place.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from kernel_insight.kql import histogram as nh
from kernel_insight.kql.aggregators import AGGREGATORS
from kernel_insight.kql.binary import ARITHMETIC
from kernel_insight.kql.functions import FUNCTIONS  # noqa: F401  (registered before their histogram behaviour)
from kernel_insight.kql.functions.registry import FunctionSpec, histogram_behaviour
from kernel_insight.kql.histogram import COUNTER_RESET, CUSTOM_BUCKETS_SCHEMA, NOT_COUNTER_RESET
from kernel_insight.kql.histogram import GAUGE_TYPE as GAUGE
from kernel_insight.kql.histogram import UNKNOWN_COUNTER_RESET as UNKNOWN
from kernel_insight.kql.lexical import go_quote
from kernel_insight.kql.operators import OPERATORS
from kernel_insight.kql.parser import COMPARISON_OPS, SET_OPS, TRIM_OPS
from kernel_insight.kql.sparsehists import Ragged, SparseCells, SparseHists, bucket_indices, renumbering
from kernel_insight.kql.storage import Labels
from kernel_insight.kql.values import (
    HistRange,
    RangeInput,
    StepVector,
    hist_mask,
    hist_weight,
    keep_hists,
    start_time_overlap_warning,
    start_time_overlaps,
    start_timestamp_resets,
)

__all__ = [
    "CUSTOM_BUCKETS_SCHEMA",
    "Incompatible",
    "hadd",
    "hsub",
    "metric_name",
]

F64 = npt.NDArray[np.float64]
BOOL = npt.NDArray[np.bool_]
OBJ = npt.NDArray[np.object_]
I64 = npt.NDArray[np.int64]
H = nh.FloatHistogram


# ------------------------------------------------------------------------------ kql.histogram calls


class Incompatible(Exception):
    """Histograms with exponential and custom buckets met in one operation."""


def uses_custom(h: H) -> bool:
    return bool(h.schema == CUSTOM_BUCKETS_SCHEMA)


def _checked(a: H, b: H) -> None:
    if uses_custom(a) != uses_custom(b):
        raise Incompatible


def hadd(a: H, b: H) -> tuple[H, bool, bool]:
    """``a + b`` as a new histogram, whether counter-reset hints collided, whether custom buckets were reconciled."""
    _checked(a, b)
    try:
        res = a.add(b)
    except nh.HistogramError:
        raise Incompatible from None
    return res.histogram, bool(res.counter_reset_collision), bool(res.nhcb_bounds_reconciled)


def hsub(a: H, b: H) -> tuple[H, bool, bool]:
    """``a - b`` as a new histogram (same flags as :func:`hadd`)."""
    _checked(a, b)
    try:
        res = a.sub(b)
    except nh.HistogramError:
        raise Incompatible from None
    return res.histogram, bool(res.counter_reset_collision), bool(res.nhcb_bounds_reconciled)


def hkahan_add(acc: H, h: H, comp: H | None) -> tuple[H, H, bool, bool]:
    """``acc + h`` with Kahan-compensated counts (Prometheus' KahanAdd, as sum and avg add):
    (sum, compensation, counter-reset collision, custom buckets reconciled)."""
    _checked(acc, h)
    try:
        res = acc.kahan_add(h, comp)
    except nh.HistogramError:
        raise Incompatible from None
    return (
        res.histogram,
        res.compensation,
        bool(res.counter_reset_collision),
        bool(res.nhcb_bounds_reconciled),
    )


def kahan_total(total: H, comp: H | None, divisor: float | None = None) -> H:
    """A compensated sum's value: ``total + comp`` (each divided by ``divisor`` first, as avg does)."""
    if divisor is not None:
        total = total.div(divisor)
        comp = None if comp is None else comp.div(divisor)
    return total if comp is None else total.add(comp).histogram


def hmul(h: H, f: float) -> H:
    """``h * f`` as a new histogram."""
    return h.mul(f)


def hdiv(h: H, f: float) -> H:
    """``h / f`` as a new histogram."""
    return h.div(f)


def hcompact(h: H) -> H:
    """``h`` without empty buckets (Prometheus' ``Compact(0)``), as a new histogram."""
    return h.compact(0)


def hequals(a: H, b: H) -> bool:
    return bool(a.equals(b))


def detect_reset(cur: H, prev: H) -> bool:
    return bool(cur.detect_reset(prev))


def with_hint(h: H, hint: int) -> H:
    return h.copy(counter_reset_hint=hint)


def hstr(h: H) -> str:
    return str(h)


# ------------------------------------------------------------------------------ annotations


def metric_name(labels: Labels) -> str:
    return dict(labels).get("__name__", "")


def mixed_floats_histograms(name: str) -> str:
    return f"encountered a mix of histograms and floats for metric name {go_quote(name)}"


MIXED_FLOATS_HISTOGRAMS_AGG = "encountered a mix of histograms and floats for aggregation"


def not_counter(name: str) -> str:
    return f"this native histogram metric is not a counter: {go_quote(name)}"


def not_gauge(name: str) -> str:
    return f"this native histogram metric is not a gauge: {go_quote(name)}"


def mixed_exponential_custom(name: str) -> str:
    return (
        "vector contains a mix of histograms with exponential and custom buckets schemas for metric name "
        f"{go_quote(name)}"
    )


def incompatible_types(lhs: str, op: str, rhs: str) -> str:
    return f"incompatible sample types encountered for binary operator {go_quote(op)}: {lhs} {op} {rhs}"


def ignored_in_aggregation(op: str) -> str:
    return f"ignored histogram in {op} aggregation"


def ignored_in_mixed_range(name: str) -> str:
    return f"ignored histograms in a range containing both floats and histograms for metric name {go_quote(name)}"


def counter_reset_collision(operation: str) -> str:
    return f"conflicting counter resets during histogram {operation}"


def reconciled_custom_buckets(operation: str) -> str:
    return f"mismatched custom buckets were reconciled during {operation}"


def incompatible_bucket_layout(op: str) -> str:
    return f"incompatible bucket layout encountered for binary operator {op}"


# ------------------------------------------------------------------------------ cells


def cells(hists: OBJ) -> Iterator[tuple[int, int, H]]:
    """(row, step, histogram) of every histogram cell, row-major (Prometheus' input order per step)."""
    rows, steps = np.nonzero(hist_mask(hists))
    for i, j in zip(rows.tolist(), steps.tolist(), strict=True):
        yield i, j, hists[i, j]


def empty_hists(rows: int, steps: int) -> OBJ:
    return np.full((rows, steps), None, dtype=object)


class Totals(Protocol):
    """Count and sum per row: a :class:`DenseBlock`'s, or a :class:`SparseHists`'."""

    count: F64
    sum: F64


def float_of_hists(
    vec: StepVector, fn: Callable[[H], float], dense_fn: Callable[[Totals], F64] | None = None
) -> StepVector:
    """A float per histogram cell (floats dropped), the metric name dropped: histogram_count and
    friends. ``dense_fn`` gives the same floats from the counts and sums of a whole dense block
    (rate's results) or of a selector's columns, so those cells never become objects."""
    values = np.zeros(vec.values.shape)
    present = np.zeros(vec.present.shape, dtype=bool)
    objs = vec.hists if dense_fn is None or (vec.dense is None and vec.sparse is None) else vec.hist_objs
    if dense_fn is not None and vec.dense is not None:
        for block, rows, steps, _ in vec.dense.parts:
            values[rows, steps] = dense_fn(block)
            present[rows, steps] = True
    if dense_fn is not None and vec.sparse is not None:
        held = vec.sparse
        values[held.rows, held.steps] = dense_fn(held.data)
        present[held.rows, held.steps] = True
    if objs is not None:
        for i, j, h in cells(objs):
            values[i, j] = fn(h)
            present[i, j] = True
    return StepVector(vec.labels, values, present, np.ones(len(vec), dtype=bool)).compact()


# ------------------------------------------------------------------------------ ranges


def window(r: RangeInput, i: int, j: int) -> tuple[list[int], list[H]]:
    """The histogram samples (timestamps, histograms) of series ``i``'s window at step ``j``."""
    hr = r.hist
    if hr is None:
        return [], []
    lo, hi = int(hr.lo[i, j]), int(hr.hi[i, j])
    return hr.ts[lo:hi].tolist(), list(hr.hs[lo:hi])


def hist_windows(
    r: RangeInput, skip: BOOL | None = None, last: int | None = None
) -> Iterator[tuple[int, int, list[int], list[H], int]]:
    """(series, step, hist timestamps, histograms, float count) of every window holding a
    histogram, except those in ``skip``; with ``last``, only each window's last ``last``
    histograms (columns become objects for those samples alone: irate's two)."""
    hr = r.hist
    if hr is None:
        return
    counts = hr.hi - hr.lo
    wanted = counts > 0 if skip is None else (counts > 0) & ~skip
    rows, steps = np.nonzero(wanted)
    if not len(rows):  # every window decided already (rate's dense path): no column becomes an object
        return
    fcounts = r.hi - r.lo
    if last is None:
        objs = hr.objects_at(_in_windows(hr.lo[rows, steps], hr.hi[rows, steps], len(hr.ts)))
    else:
        his, los = hr.hi[rows, steps], hr.lo[rows, steps]
        ends = [his - k for k in range(1, last + 1)]
        objs = hr.objects_at(np.unique(np.concatenate([e[e >= los] for e in ends])))
    for n, (i, j) in enumerate(zip(rows.tolist(), steps.tolist(), strict=True)):
        if n % 1024 == 1023:
            r.checkpoint()
        lo, hi = int(hr.lo[i, j]), int(hr.hi[i, j])
        if last is not None:
            lo = max(lo, hi - last)
        yield i, j, hr.ts[lo:hi].tolist(), list(objs[lo:hi]), int(fcounts[i, j])


def _in_windows(los: I64, his: I64, n: int) -> I64:
    """The sample indices inside any of the windows ``[los[k], his[k])`` of ``n`` samples: windows
    overlap (a 5m range at a 15 s step holds each sample in 20), so each is listed once."""
    edges = np.bincount(los, minlength=n + 1) - np.bincount(his, minlength=n + 1)
    return np.flatnonzero(np.cumsum(edges[:n]) > 0)


def has_hist_windows(r: RangeInput) -> BOOL:
    """Which (series, step) windows hold at least one histogram."""
    if r.hist is None:
        return np.zeros(r.lo.shape, dtype=bool)
    mask: BOOL = (r.hist.hi - r.hist.lo) > 0
    return mask


def quantile_nan(x: float) -> bool:
    return math.isnan(x)


# ------------------------------------------------------------------------------ binary operators


def fdiv(a: float, b: float) -> float:
    """Go's float division as the hardware does it: x/0 is ±Inf, 0/0 and NaN/0 the x86 default
    NaN (sign bit set, as numpy's arrays give it; :func:`kernel_insight.kql.histogram.go_div`
    answers Python's NaN)."""
    return float(np.float64(a) / np.float64(b))


def _arith(op: str, a: float, b: float) -> float:
    return float(ARITHMETIC[op](np.float64(a), np.float64(b)))


class ElemResult:
    """What one pair of samples gives under a binary operator (Prometheus' vectorElemBinop)."""

    __slots__ = ("f", "h", "info", "keep", "warn")

    def __init__(
        self, f: float, h: H | None, keep: bool, info: str | None = None, warn: str | None = None
    ) -> None:
        self.f, self.h, self.keep, self.info, self.warn = f, h, keep, info, warn


def elem_binop(op: str, lf: float, rf: float, lh: H | None, rh: H | None) -> ElemResult:
    """One pair: floats, float and histogram, or two histograms; ``keep`` False drops the pair.

    Raises :class:`Incompatible` for exponential and custom-bucket histograms added or subtracted.
    """
    if lh is None and rh is None:
        compare = OPERATORS[op].compare
        if compare is not None:
            return ElemResult(lf, None, compare(lf, rf))
        if op in TRIM_OPS:
            return ElemResult(0.0, None, False, info=incompatible_types("float", op, "float"))
        return ElemResult(_arith(op, lf, rf), None, True)
    if lh is None:
        assert rh is not None
        if op == "*":
            return ElemResult(0.0, hcompact(hmul(rh, lf)), True)
        return ElemResult(0.0, None, False, info=incompatible_types("float", op, "histogram"))
    if rh is None:
        if op == "*":
            return ElemResult(0.0, hcompact(hmul(lh, rf)), True)
        if op == "/":
            return ElemResult(0.0, hcompact(hdiv(lh, rf)), True)
        if op in TRIM_OPS:
            return ElemResult(0.0, lh.trim_buckets(rf, upper=op == "</"), True)
        return ElemResult(0.0, None, False, info=incompatible_types("histogram", op, "float"))
    if op == "+":
        res, collision, reconciled = hadd(lh, rh)
        return ElemResult(
            0.0,
            hcompact(res),
            True,
            info=reconciled_custom_buckets("addition") if reconciled else None,
            warn=counter_reset_collision("addition") if collision else None,
        )
    if op == "-":
        res, collision, reconciled = hsub(lh, rh)
        res.counter_reset_hint = GAUGE
        return ElemResult(
            0.0,
            hcompact(res),
            True,
            info=reconciled_custom_buckets("subtraction") if reconciled else None,
            warn=counter_reset_collision("subtraction") if collision else None,
        )
    if op == "==":
        return ElemResult(0.0, lh, hequals(lh, rh))
    if op == "!=":
        return ElemResult(0.0, lh, not hequals(lh, rh))
    return ElemResult(0.0, None, False, info=incompatible_types("histogram", op, "histogram"))


def _annotate_elem(ev: Any, res: ElemResult, pos: Any) -> None:
    if res.info is not None:
        ev.annotate("info", res.info, pos)
    if res.warn is not None:
        ev.annotate("warning", res.warn, pos)


class _Builder:
    """Output rows of a histogram-bearing operation, keyed by labels, filled cell by cell."""

    def __init__(self, steps: int) -> None:
        self.steps = steps
        self.rows: dict[Labels, int] = {}
        self.labels: list[Labels] = []
        self.values: list[F64] = []
        self.present: list[BOOL] = []
        self.hists: list[OBJ] = []
        self.drop: list[bool] = []
        self.any_hist = False

    def row(self, labels: Labels, drop: bool) -> int:
        r = self.rows.get(labels)
        if r is None:
            r = self.rows[labels] = len(self.labels)
            self.labels.append(labels)
            self.values.append(np.zeros(self.steps))
            self.present.append(np.zeros(self.steps, dtype=bool))
            self.hists.append(np.full(self.steps, None, dtype=object))
            self.drop.append(drop)
        elif drop:
            self.drop[r] = True
        return r

    def filled(self, labels: Labels, j: int) -> bool:
        r = self.rows.get(labels)
        return r is not None and (bool(self.present[r][j]) or self.hists[r][j] is not None)

    def put(self, labels: Labels, j: int, f: float, h: H | None, drop: bool) -> None:
        r = self.row(labels, drop)
        if h is None:
            self.values[r][j] = f
            self.present[r][j] = True
        else:
            self.hists[r][j] = h
            self.any_hist = True

    def vector(self) -> StepVector:
        n = len(self.labels)
        if n == 0:
            return StepVector.empty(self.steps)
        return StepVector(
            self.labels,
            np.array(self.values).reshape(n, self.steps),
            np.array(self.present, dtype=bool).reshape(n, self.steps),
            np.array(self.drop, dtype=bool),
            None,
            np.array(self.hists, dtype=object).reshape(n, self.steps) if self.any_hist else None,
        )


def vector_scalar(ev: Any, node: Any, vec: StepVector, scalar: F64, swapped: bool) -> StepVector:
    """``vec op scalar`` (or ``scalar op vec``) where ``vec`` holds histograms: Prometheus' VectorscalarBinop."""
    op = node.op
    columns = None if node.return_bool else sparse_times_scalar(vec, op, scalar, swapped)
    if columns is not None:
        return columns
    comparison = op in COMPARISON_OPS
    changes_schema = not comparison and op not in TRIM_OPS
    out = _Builder(vec.values.shape[1])
    hists = vec.hists
    for j in range(vec.values.shape[1]):
        s = float(scalar[j])
        for i in range(len(vec)):
            h = hists[i, j] if hists is not None else None
            if h is None and not vec.present[i, j]:
                continue
            f = float(vec.values[i, j])
            lf, rf, lh, rh = (s, f, None, h) if swapped else (f, s, h, None)
            res = elem_binop(op, lf, rf, lh, rh)
            if res.info is not None or res.warn is not None:
                _annotate_elem(ev, res, node.pos)
                if not res.keep and (lh is not None or rh is not None):
                    continue
            value, hist = res.f, res.h
            if comparison and swapped:
                value, hist = rf, rh
            keep = res.keep
            if node.return_bool:
                value, hist, keep = (1.0 if res.keep else 0.0), None, True
            if keep:
                drop = bool(vec.drop_name[i]) or changes_schema or node.return_bool
                out.put(vec.labels[i], j, value, hist, drop)
    return out.vector()


def sparse_times_scalar(vec: StepVector, op: str, scalar: F64, swapped: bool) -> StepVector | None:
    """``x * s``, ``s * x`` and ``x / s`` of a vector holding only a selector's columns, still
    columns: every count and the sum scaled as ``FloatHistogram.mul``/``div`` do it (the same
    operand order, a negative scalar making a gauge, ``_safe_div``'s NaN), then ``Compact(0)`` of
    every row, as ``elem_binop`` does; no annotations arise. None (the per-cell path) for float
    samples, other cells, another operator, or a division by 0 (which drops every bucket)."""
    cells = vec.sparse
    if (
        cells is None
        or vec.hist_objs is not None
        or vec.dense is not None
        or vec.present.any()
        or not (op == "*" or (op == "/" and not swapped))
    ):
        return None
    data = cells.data
    f = np.asarray(scalar, dtype=np.float64)[cells.steps]
    if op == "/" and (f == 0).any():
        return None

    def scaled(x: F64, per_row: F64) -> F64:
        if op == "*":
            out: F64 = x * per_row
            return out
        return _safe_divide(x, per_row)

    def bucket_scaled(buckets: Ragged) -> Ragged:
        per = np.repeat(f, buckets.lengths)
        flat = per * buckets.flat if op == "*" else buckets.flat / per  # f*x as mul, x/s as div
        return Ragged(buckets.off, flat)

    hint = np.where(f < 0, GAUGE, data.hints())
    out = SparseHists(
        data.schema,
        data.zero_threshold,
        scaled(data.zero_count, f),
        scaled(data.count, f),
        scaled(data.sum, f),
        hint,
        np.zeros(len(data), dtype=bool),
        data.pos_spans,
        bucket_scaled(data.pos_buckets),
        data.neg_spans,
        bucket_scaled(data.neg_buckets),
        data.custom,
    )
    out._hints = hint
    compact = out.compacted(every_row=True)
    if compact is None:
        return None
    shape = vec.values.shape
    return StepVector(
        vec.labels,
        np.zeros(shape),
        np.zeros(shape, dtype=bool),
        np.ones(len(vec), dtype=bool),
        None,
        None,
        None,
        SparseCells(compact, cells.rows, cells.steps),
    ).compact()


def set_op(op: str, lhs: StepVector, rhs: StepVector, matching: Any) -> StepVector:
    """``and``/``or``/``unless`` over vectors of either sample kind (presence is what counts)."""
    from kernel_insight.kql.binary import signature_fn

    sig = signature_fn(matching)
    steps = lhs.values.shape[1] if len(lhs) else rhs.values.shape[1]
    none = np.zeros(steps, dtype=bool)
    l_all, r_all = lhs.any_present(), rhs.any_present()

    def by_sig(vec: StepVector, present: BOOL) -> dict[Labels, BOOL]:
        acc: dict[Labels, BOOL] = {}
        for lb, p in zip(vec.labels, present, strict=True):
            key = sig(lb)
            acc[key] = p.copy() if key not in acc else acc[key] | p
        return acc

    def masked(vec: StepVector, keep: BOOL) -> StepVector:
        hists = None if vec.hists is None else keep_hists(vec.hists, keep)
        return StepVector(vec.labels, vec.values, vec.present & keep, vec.drop_name, vec.sample_ts, hists)

    if op == "or":
        l_any = by_sig(lhs, l_all)
        keep = np.array([~l_any.get(sig(lb), none) for lb in rhs.labels], dtype=bool).reshape(r_all.shape)
        right = masked(rhs, keep).compact()
        lh = lhs.hists if lhs.hists is not None else np.full(lhs.values.shape, None, dtype=object)
        rh = right.hists if right.hists is not None else np.full(right.values.shape, None, dtype=object)
        return StepVector(
            lhs.labels + right.labels,
            np.concatenate([lhs.values, right.values]),
            np.concatenate([lhs.present, right.present]),
            np.concatenate([lhs.drop_name, right.drop_name]),
            None,
            np.concatenate([lh, rh]),
        )
    r_any = by_sig(rhs, r_all)
    if op == "and":
        keep = np.array([r_any.get(sig(lb), none) for lb in lhs.labels], dtype=bool)
    else:
        keep = np.array([~r_any.get(sig(lb), none) for lb in lhs.labels], dtype=bool)
    return masked(lhs, keep.reshape(l_all.shape)).compact()


def vector_vector(ev: Any, node: Any, lhs: StepVector, rhs: StepVector, matching: Any) -> StepVector:
    """Arithmetic or comparison between vectors holding histograms: Prometheus' VectorBinop, step by step."""
    from kernel_insight.kql.binary import _result_labels, signature_fn
    from kernel_insight.kql.errors import KqlEvaluationError
    from kernel_insight.kql.values import labels_to_str

    op = node.op
    comparison = op in COMPARISON_OPS
    keeps_name = (comparison or op in TRIM_OPS) and not node.return_bool
    swapped = matching.card == "one-to-many"
    many, one = (rhs, lhs) if swapped else (lhs, rhs)
    one_to_one = matching.card == "one-to-one"
    include = frozenset(matching.include)
    sig = signature_fn(matching)
    steps = lhs.values.shape[1] if len(lhs) else rhs.values.shape[1]
    m_all, o_all = many.any_present(), one.any_present()
    many_sigs = [sig(lb) for lb in many.labels]
    one_sigs = [sig(lb) for lb in one.labels]
    out = _Builder(steps)
    cache: dict[tuple[Labels, Labels], Labels] = {}

    def sample(vec: StepVector, i: int, j: int) -> tuple[float, H | None]:
        h = vec.hists[i, j] if vec.hists is not None else None
        return float(vec.values[i, j]), h

    for j in range(steps):
        right: dict[Labels, int] = {}
        for r in np.flatnonzero(o_all[:, j]).tolist():
            s = one_sigs[r]
            if s in right:
                a, b = sorted((one.labels[r], one.labels[right[s]]))
                side = "left" if swapped else "right"
                raise KqlEvaluationError(
                    f"found duplicate series for the match group {labels_to_str(s)} on the {side} hand-side of "
                    f"the operation: [{labels_to_str(a)}, {labels_to_str(b)}];many-to-many matching not allowed: "
                    "matching labels must be unique on one side"
                )
            right[s] = r
        matched_one: set[Labels] = set()
        matched_many: dict[Labels, set[Labels]] = {}
        for i in np.flatnonzero(m_all[:, j]).tolist():
            s = many_sigs[i]
            found = right.get(s)
            if found is None:
                continue
            k = found
            mf, mh = sample(many, i, j)
            of, oh = sample(one, k, j)
            lf, rf, lh, rh = (of, mf, oh, mh) if swapped else (mf, of, mh, oh)
            try:
                res = elem_binop(op, lf, rf, lh, rh)
            except Incompatible:
                ev.annotate("warning", incompatible_bucket_layout(op), node.pos)
                continue
            if res.info is not None or res.warn is not None:
                _annotate_elem(ev, res, node.pos)
                # An incompatible pair and a counter-reset collision drop the pair (Prometheus
                # returns them as the pair's error); reconciled custom buckets keep it.
                if res.warn is not None or not res.keep:
                    continue
            value, hist = res.f, res.h
            if node.return_bool:
                value, hist = (1.0 if res.keep else 0.0), None
            many_labels, one_labels = many.labels[i], one.labels[k]
            if not one_to_one and not include:
                metric = many_labels
            else:
                key = (many_labels, one_labels)
                metric = cache.get(key) or cache.setdefault(
                    key, _result_labels(many_labels, one_labels, matching, one_to_one, include)
                )
            if one_to_one:
                if s in matched_one:
                    raise KqlEvaluationError(
                        "multiple matches for labels: many-to-one matching must be explicit (group_left/group_right)"
                    )
                matched_one.add(s)
            else:
                seen = matched_many.setdefault(s, set())
                if metric in seen:
                    raise KqlEvaluationError(
                        "multiple matches for labels: grouping labels must ensure unique matches"
                    )
                seen.add(metric)
            if not res.keep and not node.return_bool:
                continue
            drop = bool(many.drop_name[i]) if keeps_name else True
            out.put(metric, j, value, hist, drop)
    return out.vector()


def binary(ev: Any, node: Any, lhs: Any, rhs: Any) -> Any:
    """``binary_op`` for operands of which at least one vector holds histogram samples."""
    from kernel_insight.kql.ast import VectorMatching

    l_vec, r_vec = isinstance(lhs, StepVector), isinstance(rhs, StepVector)
    if l_vec and r_vec:
        matching = node.matching or VectorMatching()
        if node.op in SET_OPS:
            return set_op(node.op, lhs, rhs, matching)
        return vector_vector(ev, node, lhs, rhs, matching)
    if l_vec:
        return vector_scalar(ev, node, lhs, rhs, swapped=False)
    return vector_scalar(ev, node, rhs, lhs, swapped=True)


# ------------------------------------------------------------------------------ aggregation


def _proxy(vec: StepVector) -> StepVector:
    """The vector with every sample as a float (histograms as 0): for operators that only count samples."""
    hp = vec.hist_present()
    return StepVector(
        vec.labels, np.where(hp, 0.0, vec.values), vec.present | hp, vec.drop_name, vec.sample_ts
    )


def aggregate(ev: Any, node: Any, vec: StepVector, param: Any) -> StepVector:
    """An aggregation over a vector holding histograms (Prometheus' aggregation and aggregationK)."""
    from kernel_insight.kql.aggregation import _grouping_key
    from kernel_insight.kql.aggregation import aggregate as float_aggregate
    from kernel_insight.kql.vectors import group_rows

    op = node.op
    kind = AGGREGATORS[op].histograms
    if kind == "presence":
        return float_aggregate(ev, node, _proxy(vec), param)
    if kind in ("ignored", "ignored_whole"):
        if vec.hist_present().any():
            ev.annotate(
                "info", ignored_in_aggregation(op), node.pos if kind == "ignored_whole" else node.expr.pos
            )
        return float_aggregate(ev, node, vec.floats_only(), param)
    if kind not in ("sum", "mean"):
        return float_aggregate(ev, node, vec, param)  # limitk, limit_ratio, count_values read histograms
    mean = kind == "mean"
    steps = vec.values.shape[1]
    keys = [_grouping_key(lb, node) for lb in vec.labels]
    gid, n = group_rows(keys)
    group_labels: list[Labels] = [()] * n
    for i, g in enumerate(gid.tolist()):
        group_labels[g] = keys[i]
    has_float = np.zeros((n, steps), dtype=bool)
    np.logical_or.at(has_float, gid, vec.present)
    hp = vec.hist_present()
    has_hist = np.zeros((n, steps), dtype=bool)
    np.logical_or.at(has_hist, gid, hp)
    mixed = has_float & has_hist
    if mixed.any():
        ev.annotate("warning", MIXED_FLOATS_HISTOGRAMS_AGG, node.expr.pos)
    summed = None
    if vec.dense is not None:
        moved = _single_dense(vec, gid, n, mixed)
        if moved is not None:
            return _aggregated(ev, node, vec, param, gid, n, group_labels, mixed, *moved)
        if vec.hist_objs is None:
            summed = dense_sum_cells(vec.dense, gid, n, steps, mixed, mean)
    elif vec.sparse is not None and vec.hist_objs is None:
        # A selector's columns: one member a group (sum by (kernel) (x)) moved as columns, each
        # member holding a bucket of 0 compacted as the sum's Compact(0) does; several (sum(x))
        # summed from the columns.
        columns = _single_sparse(vec.sparse, gid, mixed, steps)
        if columns is None:
            summed = sparse_sum(vec.sparse, gid, n, steps, mixed, mean)
        else:
            compact = columns.data.compacted()
            if compact is not None:
                members = SparseCells(compact, columns.rows, columns.steps)
                return _aggregated(ev, node, vec, param, gid, n, group_labels, mixed, None, None, members)
    if summed is None:
        assert vec.hists is not None
        single = _single_members(vec.hists, gid, n, mixed)
        if single is not None:
            return _aggregated(ev, node, vec, param, gid, n, group_labels, mixed, single)
        summed = dense_sum(vec.hists, gid, n, mixed, mean)
    if summed is not None:
        dense_totals, collision = summed
        if collision:
            ev.annotate("warning", counter_reset_collision("aggregation"), node.expr.pos)
        return _aggregated(ev, node, vec, param, gid, n, group_labels, mixed, None, dense_totals)
    assert vec.hists is not None
    totals: OBJ = np.full((n, steps), None, dtype=object)
    comps: OBJ = np.full((n, steps), None, dtype=object)
    means: OBJ = np.full((n, steps), None, dtype=object)  # avg: Go's mean, incremental past overflow
    counts = np.zeros((n, steps), dtype=np.int64)
    bad = np.zeros((n, steps), dtype=bool)
    reset_seen = np.zeros((n, steps), dtype=bool)
    not_reset_seen = np.zeros((n, steps), dtype=bool)
    for k, (i, j, h) in enumerate(cells(vec.hists)):
        if k % 1024 == 1023:
            ev.checkpoint()
        g = int(gid[i])
        if mixed[g, j] or bad[g, j]:
            continue
        if h.counter_reset_hint == COUNTER_RESET:
            reset_seen[g, j] = True
        elif h.counter_reset_hint == NOT_COUNTER_RESET:
            not_reset_seen[g, j] = True
        counts[g, j] += 1
        acc = totals[g, j]
        if acc is None:
            totals[g, j] = h.copy()
            if mean:
                means[g, j] = nh.HistogramMean(totals[g, j])
            continue
        try:
            if mean:
                _checked(acc, h)
                reconciled = means[g, j].add(h)
            else:
                res, comp, _, reconciled = hkahan_add(acc, h, comps[g, j])
                totals[g, j], comps[g, j] = res, comp
        except (Incompatible, nh.HistogramError):
            ev.annotate("warning", mixed_exponential_custom(metric_name(vec.labels[i])), node.expr.pos)
            bad[g, j] = True
            totals[g, j] = None
            continue
        if reconciled:
            ev.annotate("info", reconciled_custom_buckets("aggregation"), node.expr.pos)
    if (reset_seen & not_reset_seen).any():
        ev.annotate("warning", counter_reset_collision("aggregation"), node.expr.pos)
    for g, j in zip(*np.nonzero(hist_mask(totals)), strict=True):
        avg = means[g, j]
        totals[g, j] = hcompact(avg.result() if avg is not None else kahan_total(totals[g, j], comps[g, j]))
    return _aggregated(ev, node, vec, param, gid, n, group_labels, mixed, totals)


def _aggregated(
    ev: Any,
    node: Any,
    vec: StepVector,
    param: Any,
    gid: Any,
    n: int,
    group_labels: list[Labels],
    mixed: BOOL,
    totals: OBJ | None,
    dense: DenseHists | None = None,
    sparse: SparseCells | None = None,
) -> StepVector:
    """sum/avg's result: the groups' histograms (``totals``, or still dense or columns), and the
    float aggregation of the float samples (less the groups that held both kinds at a step)."""
    from kernel_insight.kql.aggregation import aggregate as float_aggregate

    steps = vec.values.shape[1]
    drop = np.zeros(n, dtype=bool)
    if any(k == "__name__" for k in node.grouping) and not node.without:
        np.logical_or.at(drop, gid, vec.drop_name)
    floats = float_aggregate(ev, node, vec.floats_only(), param)
    row_of = {lb: r for r, lb in enumerate(floats.labels)}
    values = np.zeros((n, steps))
    present = np.zeros((n, steps), dtype=bool)
    for g, lb in enumerate(group_labels):
        r = row_of.get(lb)
        if r is not None:
            values[g] = floats.values[r]
            present[g] = floats.present[r] & ~mixed[g]
    return StepVector(group_labels, values, present, drop, None, totals, dense, sparse).compact()


# ------------------------------------------------------------------------------ functions


def _strip(arg: Any) -> Any:
    if isinstance(arg, StepVector):
        return arg.floats_only()
    if isinstance(arg, RangeInput) and arg.hist is not None:
        from dataclasses import replace

        return replace(arg, hist=None)
    return arg


def call(ctx: Any, spec: FunctionSpec, args: list[Any]) -> Any:
    """A function call with histogram samples among its arguments."""
    impl = spec.impl
    if spec.histogram_impl is not None:
        return spec.histogram_impl(ctx, impl, args)
    if spec.histogram_samples == "pass_through":
        return impl(ctx, args)
    if spec.histogram_samples == "presence":
        return impl(ctx, [_proxy(a) if isinstance(a, StepVector) else a for a in args])
    out = impl(ctx, [_strip(a) for a in args])
    if spec.histogram_samples == "mixed_range_info":
        for a in args:
            if isinstance(a, RangeInput):
                _info_mixed(ctx, a)
    return out


def _matrix_arg(ctx: Any) -> Any:
    from kernel_insight.kql.ast import MatrixSelector, SubqueryExpr

    for arg in ctx.node.args:
        node = arg
        while hasattr(node, "expr") and not isinstance(node, MatrixSelector | SubqueryExpr):
            node = node.expr
        if isinstance(node, MatrixSelector | SubqueryExpr):
            return arg
    return ctx.node.args[0]


def _info_mixed(ctx: Any, r: RangeInput) -> None:
    both = (r.counts > 0) & has_hist_windows(r)
    pos = ctx.node.args[0].pos
    for i in np.flatnonzero(both.any(axis=1)).tolist():
        ctx.info(ignored_in_mixed_range(metric_name(r.labels[i])), pos)


def _mixed_warn(ctx: Any, r: RangeInput, mixed: BOOL) -> None:
    pos = _matrix_arg(ctx).pos
    for i in np.flatnonzero(mixed.any(axis=1)).tolist():
        ctx.warn(mixed_floats_histograms(metric_name(r.labels[i])), pos)


def _combine(
    r: RangeInput,
    floats: StepVector,
    hists: dict[tuple[int, int], H],
    values: dict[tuple[int, int], float] | None = None,
    drop: BOOL | None = None,
    keep_name: bool = False,
    dense: DenseHists | None = None,
) -> StepVector:
    """A range function's result: the float implementation's, less the windows in ``drop``, with
    the histogram (``hists``, ``dense``) and float (``values``) results of the windows computed here."""
    n, steps = r.lo.shape
    out_v = np.zeros((n, steps))
    out_p = np.zeros((n, steps), dtype=bool)
    out_h = np.full((n, steps), None, dtype=object)
    row_of = {lb: i for i, lb in enumerate(r.labels)}
    for k, lb in enumerate(floats.labels):
        i = row_of.get(lb)
        if i is not None:
            out_v[i] = floats.values[k]
            out_p[i] = floats.present[k]
    if drop is not None:
        out_p &= ~drop
    for (i, j), f in (values or {}).items():
        out_v[i, j] = f
        out_p[i, j] = True
    if hists:
        keys = np.array(list(hists.keys()), dtype=np.intp).reshape(-1, 2)
        holder = np.empty(len(hists), dtype=object)
        holder[:] = list(hists.values())
        out_h[keys[:, 0], keys[:, 1]] = holder
        out_p[keys[:, 0], keys[:, 1]] = False
    if dense is not None and not dense.parts:
        dense = None
    if dense is not None:
        for _, rows, steps, _ in dense.parts:
            out_p[rows, steps] = False
    names = r.drop_name.copy() if keep_name else np.ones(n, dtype=bool)
    return StepVector(list(r.labels), out_v, out_p, names, None, out_h if hists else None, dense).compact()


def _rate(
    ctx: Any, impl: Callable[[Any, list[Any]], Any], args: list[Any], counter: bool, per_second: bool
) -> StepVector:
    r: RangeInput = args[0]
    if r.anchored or r.smoothed:
        return _extended_rate(ctx, impl, r, counter, per_second)
    mixed = (r.counts > 0) & has_hist_windows(r)
    if mixed.any():
        _mixed_warn(ctx, r, mixed)
    floats = impl(ctx, [_strip(r)])
    hists: dict[tuple[int, int], H] = {}
    pos = _matrix_arg(ctx).pos
    hr = r.hist
    st = None if hr is None or not counter else hr.st
    # Windows holding start timestamps take the per-window path, which reads them.
    with_st = np.zeros(r.lo.shape, dtype=bool) if hr is None or st is None else _any_in_windows(hr, st != 0)
    fast = dense_rate(r, counter, per_second, has_hist_windows(r) & ~mixed & ~with_st)
    dense = None
    # Windows with a float or under two histograms have no histogram rate (but for one whose
    # first start timestamp lies in the range): skipped before their histograms are read
    # (columns read by a store become objects only if some window needs them).
    skip = (r.counts > 0) | (has_hist_windows(r) if hr is None else (hr.counts < 2) & ~with_st)
    if fast is not None:
        dense, decided = fast
        skip |= decided
    for i, j, ts, hs, _ in hist_windows(r, skip):
        name = metric_name(r.labels[i])
        end = int(r.end[j])
        sts = None if st is None or hr is None else st[int(hr.lo[i, j]) : int(hr.hi[i, j])].tolist()
        zero_from = _start_in_range(sts, ts, end - r.range_ms)
        if len(hs) == 1:
            if zero_from is None:
                continue
            h = hs[0].copy()
        else:
            made = histogram_rate(ctx, hs, counter, name, pos, ts, sts)
            if made is None:
                continue
            h = made
            if zero_from is not None:
                try:
                    h, _, reconciled = hadd(h, hs[0])
                except Incompatible:
                    ctx.warn(mixed_exponential_custom(name), pos)
                    continue
                if reconciled:
                    ctx.info(reconciled_custom_buckets("addition"), pos)
        factor = _extrapolation(ts, hs, h, end - r.range_ms, end, counter, zero_from)
        if per_second:
            factor /= r.range_ms / 1000.0
        hists[i, j] = hmul(h, factor)
    return _combine(r, floats, hists, drop=mixed, dense=dense)


def _any_in_windows(hr: HistRange, flags: BOOL) -> BOOL:
    """Per window of ``hr``: whether any of its samples has its flag set."""
    before = np.concatenate([[0], np.cumsum(flags)])
    out: BOOL = before[hr.hi] > before[hr.lo]
    return out


def _start_in_range(sts: list[int] | None, ts: list[int], range_start: int) -> int | None:
    """The first sample's start timestamp where it lies inside the range and before the sample
    (rate then counts from a zero there, Prometheus' extrapolatedRate), else None."""
    if not sts or not ts:
        return None
    st0 = sts[0]
    return st0 if st0 != 0 and range_start < st0 < ts[0] else None


def _extrapolation(
    ts: list[int],
    hs: list[H],
    result: H,
    range_start: int,
    range_end: int,
    counter: bool,
    zero_from: int | None = None,
) -> float:
    """Prometheus' extrapolatedRate factor for a histogram window; ``zero_from``: the first
    sample's start timestamp inside the range, from which the window counts instead."""
    first_t, last_t = ts[0], ts[-1]
    to_start = (first_t - range_start) / 1000.0
    to_end = (range_end - last_t) / 1000.0
    sampled = (last_t - first_t) / 1000.0
    average = sampled / (len(ts) - 1) if len(ts) > 1 else 0.0
    threshold = average * 1.1
    if zero_from is not None:
        to_start = 0.0
        sampled = (last_t - zero_from) / 1000.0
    elif to_start >= threshold:
        to_start = average / 2
    if zero_from is None and counter and result.count > 0 and hs[0].count >= 0:
        to_zero = sampled * (hs[0].count / result.count)
        if to_zero < to_start:
            to_start = to_zero
    if to_end >= threshold:
        to_end = average / 2
    return (sampled + to_start + to_end) / sampled if sampled != 0 else 1.0


def histogram_rate(
    ctx: Any,
    points: list[H],
    counter: bool,
    name: str,
    pos: Any,
    ts: list[int] | None = None,
    sts: list[int] | None = None,
) -> H | None:
    """Prometheus' histogramRate: last minus first, counter resets added back, as a gauge histogram.

    ``sts`` (with ``ts``): the samples' start timestamps, a reset where one says so."""
    prev = points[0]
    last = points[-1]
    custom = uses_custom(prev)
    st_reset = _start_resets(ts, sts) if counter else None
    if counter and (prev.counter_reset_hint == GAUGE or last.counter_reset_hint == GAUGE):
        ctx.warn(not_counter(name), pos)
    if (
        counter
        and len(points) > 1
        and ((st_reset is not None and st_reset[1]) or detect_reset(points[1], prev))
    ):
        prev = _empty_like(points[1])
        custom = uses_custom(points[1])
    if uses_custom(last) != custom:
        ctx.warn(mixed_exponential_custom(name), pos)
        return None
    min_schema = min(last.schema, prev.schema)
    for cur in points[1:-1]:
        if not counter:
            continue
        if cur.counter_reset_hint == GAUGE:
            ctx.warn(not_counter(name), pos)
        min_schema = min(min_schema, cur.schema)
        if uses_custom(cur) != custom:
            ctx.warn(mixed_exponential_custom(name), pos)
            return None
    h = last.copy_to_schema(min_schema) if min_schema != last.schema else last.copy()
    try:
        h, _, reconciled = hsub(h, prev)
    except Incompatible:
        ctx.warn(mixed_exponential_custom(name), pos)
        return None
    if reconciled:
        ctx.info(reconciled_custom_buckets("subtraction"), pos)
    if counter:
        if ts is not None and sts is not None:
            _warn_overlaps(ctx, ts, sts, name, pos)
        for k, cur in enumerate(points[1:], 1):
            if (st_reset is not None and st_reset[k]) or detect_reset(cur, prev):
                try:
                    h, _, reconciled = hadd(h, prev)
                except Incompatible:
                    ctx.warn(mixed_exponential_custom(name), pos)
                    return None
                if reconciled:
                    ctx.info(reconciled_custom_buckets("addition"), pos)
            prev = cur
    elif points[0].counter_reset_hint != GAUGE or points[-1].counter_reset_hint != GAUGE:
        ctx.warn(not_gauge(name), pos)
    h = h.copy()
    h.counter_reset_hint = GAUGE
    return hcompact(h)


def _start_resets(ts: list[int] | None, sts: list[int] | None) -> list[bool] | None:
    """Per sample of a window: whether its start timestamp says the counter restarted after the
    previous one (``start_timestamp_resets``; the first sample's entry is False)."""
    if ts is None or sts is None or len(ts) < 2:
        return None
    t, st = np.asarray(ts, np.int64), np.asarray(sts, np.int64)
    return [False, *start_timestamp_resets(st[:-1], t[:-1], st[1:], t[1:]).tolist()]


def _warn_overlaps(ctx: Any, ts: list[int], sts: list[int], name: str, pos: Any) -> None:
    """Prometheus' start-time overlap warning for a window of histograms (as for floats)."""
    t, st = np.asarray(ts, np.int64), np.asarray(sts, np.int64)
    if len(t) > 1 and start_time_overlaps(st[:-1], t[:-1], st[1:]).any():
        ctx.warn(start_time_overlap_warning(name), pos)


def _empty_like(h: H) -> H:
    """An empty histogram with ``h``'s schema and custom bounds (a counter reset's zero point)."""
    out = nh.FloatHistogram(
        schema=h.schema,
        zero_threshold=0.0,
        zero_count=0.0,
        count=0.0,
        sum=0.0,
        positive_spans=(),
        positive_buckets=(),
        negative_spans=(),
        negative_buckets=(),
        custom_values=h.custom_values,
    )
    return out


def _instant(ctx: Any, impl: Callable[[Any, list[Any]], Any], args: list[Any], is_rate: bool) -> StepVector:
    """irate/idelta where windows hold histograms: the last two samples of either kind."""
    r: RangeInput = args[0]
    touched = has_hist_windows(r)
    floats = impl(ctx, [_strip(r)])
    hists: dict[tuple[int, int], H] = {}
    values: dict[tuple[int, int], float] = {}
    pos = _matrix_arg(ctx).pos
    hr = r.hist
    for i, j, hts, hs, _ in hist_windows(r, last=2):
        lo, hi = int(r.lo[i, j]), int(r.hi[i, j])
        hhi = 0 if hr is None else int(hr.hi[i, j])
        fst = [0] * (hi - lo) if r.st is None or not is_rate else r.st[lo:hi].tolist()
        hst = (
            [0] * len(hs)
            if hr is None or hr.st is None or not is_rate
            else hr.st[hhi - len(hs) : hhi].tolist()
        )
        samples: list[tuple[int, float, H | None, int]] = [
            (int(t), float(v), None, st)
            for t, v, st in zip(r.ts[lo:hi][-2:], r.vs[lo:hi][-2:], fst[-2:], strict=True)
        ]
        samples += [(t, 0.0, h, st) for t, h, st in zip(hts[-2:], hs[-2:], hst[-2:], strict=True)]
        samples.sort(key=lambda x: x[0])
        if len(samples) < 2:
            continue
        (t0, f0, h0, st0), (t1, f1, h1, st1) = samples[-2], samples[-1]
        interval = t1 - t0
        if interval == 0:
            continue
        name = metric_name(r.labels[i])
        st_reset = bool(st1) and bool(
            start_timestamp_resets(np.array([st0]), np.array([t0]), np.array([st1]), np.array([t1]))[0]
        )
        if h0 is None and h1 is None:
            result = f1 - f0
            if is_rate and (f1 < f0 or st_reset):
                result = f1
            values[i, j] = result / (interval / 1000.0) if is_rate else result
            continue
        if h0 is None or h1 is None:
            ctx.warn(mixed_floats_histograms(name), pos)
            continue
        if is_rate and (h1.counter_reset_hint == GAUGE or h0.counter_reset_hint == GAUGE):
            ctx.warn(not_counter(name), pos)
        if not is_rate and (h1.counter_reset_hint != GAUGE or h0.counter_reset_hint != GAUGE):
            ctx.warn(not_gauge(name), pos)
        res = h1.copy()
        if not is_rate or not (st_reset or detect_reset(h1, h0)):
            try:
                res, _, reconciled = hsub(h1, h0)
            except Incompatible:
                ctx.warn(mixed_exponential_custom(name), pos)
                continue
            if reconciled:
                ctx.info(reconciled_custom_buckets("subtraction"), pos)
        res = res.copy()
        res.counter_reset_hint = GAUGE
        res = hcompact(res)
        if is_rate:
            res = hdiv(res, interval / 1000.0)
        hists[i, j] = res
    return _combine(r, floats, hists, values, drop=touched)


def _merged(r: RangeInput, i: int, j: int) -> list[tuple[int, float, H | None]]:
    """Every sample of a window, floats and histograms, in time order."""
    lo, hi = int(r.lo[i, j]), int(r.hi[i, j])
    out: list[tuple[int, float, H | None]] = [
        (int(t), float(v), None) for t, v in zip(r.ts[lo:hi].tolist(), r.vs[lo:hi].tolist(), strict=True)
    ]
    hts, hs = window(r, i, j)
    out += [(t, 0.0, h) for t, h in zip(hts, hs, strict=True)]
    out.sort(key=lambda x: x[0])
    return out


def _merged_starts(r: RangeInput, i: int, j: int) -> list[int]:
    """The start timestamps of :func:`_merged`'s samples, in its order (0 where unset)."""
    lo, hi = int(r.lo[i, j]), int(r.hi[i, j])
    pairs = list(
        zip(r.ts[lo:hi].tolist(), [0] * (hi - lo) if r.st is None else r.st[lo:hi].tolist(), strict=True)
    )
    hr = r.hist
    if hr is not None:
        hlo, hhi = int(hr.lo[i, j]), int(hr.hi[i, j])
        hst = [0] * (hhi - hlo) if hr.st is None else hr.st[hlo:hhi].tolist()
        pairs += list(zip(hr.ts[hlo:hhi].tolist(), hst, strict=True))
    pairs.sort(key=lambda x: x[0])
    return [st for _, st in pairs]


def _anchored_windows(ctx: Any, r: RangeInput) -> list[tuple[int, int, list[tuple[int, float, H | None]]]]:
    """For every step of every series holding histograms: the window's samples of both kinds after
    the anchor, the latest sample at or before the range start within the lookback (Prometheus'
    pickFirstSampleIndices); an empty list where no sample lies inside the range."""
    import bisect

    assert r.hist is not None
    lookback = int(ctx.lookback_ms)
    out: list[tuple[int, int, list[tuple[int, float, H | None]]]] = []
    for i in np.flatnonzero(np.diff(r.hist.offsets) > 0).tolist():
        fts, fvs, hts, hs = _series_slices(r, i)
        merged: list[tuple[int, float, H | None]] = [(t, v, None) for t, v in zip(fts, fvs, strict=True)]
        merged += [(t, 0.0, h) for t, h in zip(hts, hs, strict=True)]
        merged.sort(key=lambda x: x[0])
        stamps = [m[0] for m in merged]
        for j in range(r.steps):
            end = int(r.end[j])
            start = end - r.range_ms
            first = bisect.bisect_right(stamps, start)
            last = bisect.bisect_right(stamps, end)
            if last <= first:
                out.append((i, j, []))
                continue
            anchor = first - 1 if first > 0 and stamps[first - 1] > start - lookback else first
            out.append((i, j, merged[anchor:last]))
    return out


def _changes_or_resets(
    ctx: Any, impl: Callable[[Any, list[Any]], Any], args: list[Any], resets: bool
) -> StepVector:
    r: RangeInput = args[0]
    touched = has_hist_windows(r)
    floats = impl(ctx, [_strip(r)])
    values: dict[tuple[int, int], float] = {}
    windows: Iterable[tuple[int, int, list[tuple[int, float, H | None]]]]
    if r.anchored:
        windows = _anchored_windows(ctx, r)
        touched = np.zeros(r.lo.shape, dtype=bool)
        for i, j, _ in windows:
            touched[i, j] = True
    else:
        windows = ((i, j, _merged(r, i, j)) for i, j, _, _, _ in hist_windows(r))
    with_st = (
        resets and not r.anchored and (r.st is not None or (r.hist is not None and r.hist.st is not None))
    )
    for i, j, samples in windows:
        if not samples:
            continue
        st_reset = [False] * len(samples)
        if with_st:
            st_reset = _start_resets([t for t, _, _ in samples], _merged_starts(r, i, j)) or st_reset
        count = 0
        for k, ((_, pf, ph), (_, cf, ch)) in enumerate(itertools.pairwise(samples), 1):
            if ph is None and ch is None:
                hit = (
                    (cf < pf or st_reset[k])
                    if resets
                    else (cf != pf and not (math.isnan(cf) and math.isnan(pf)))
                )
            elif ph is None or ch is None:
                hit = True
            else:
                hit = (st_reset[k] or detect_reset(ch, ph)) if resets else not hequals(ch, ph)
            count += hit
        values[i, j] = float(count)
    return _combine(r, floats, {}, values, drop=touched)


def _sum_avg_over_time(
    ctx: Any, impl: Callable[[Any, list[Any]], Any], args: list[Any], mean: bool
) -> StepVector:
    r: RangeInput = args[0]
    hw = has_hist_windows(r)
    mixed = (r.counts > 0) & hw
    if mixed.any():
        _mixed_warn(ctx, r, mixed)
    floats = impl(ctx, [_strip(r)])
    hists: dict[tuple[int, int], H] = {}
    pos = ctx.node.args[0].pos
    for i, j, _, hs, nfloat in hist_windows(r):
        if nfloat:
            continue
        reset_seen = any(h.counter_reset_hint == COUNTER_RESET for h in hs)
        not_reset_seen = any(h.counter_reset_hint == NOT_COUNTER_RESET for h in hs)
        acc = nh.HistogramMean(hs[0].copy()) if mean else nh.HistogramSum(hs[0].copy())
        try:
            for h in hs[1:]:
                _checked(hs[0], h)
                if acc.add(h):
                    ctx.info(reconciled_custom_buckets("aggregation"), pos)
        except (Incompatible, nh.HistogramError):
            ctx.warn(mixed_exponential_custom(metric_name(r.labels[i])), pos)
            continue
        if reset_seen and not_reset_seen:
            ctx.warn(counter_reset_collision("aggregation"), pos)
        hists[i, j] = acc.result()
    return _combine(r, floats, hists, drop=mixed)


def _count_like(ctx: Any, impl: Callable[[Any, list[Any]], Any], args: list[Any], count: bool) -> StepVector:
    """count_over_time/present_over_time of windows holding histograms: samples of either kind
    counted from the windows' bounds, no histogram looked at."""
    r: RangeInput = args[0]
    floats = impl(ctx, [_strip(r)])
    rows, steps = np.nonzero(has_hist_windows(r))
    assert r.hist is not None or not len(rows)
    found = (
        ((r.hist.hi - r.hist.lo) + (r.hi - r.lo))[rows, steps].astype(np.float64).tolist()
        if count and r.hist is not None
        else [1.0] * len(rows)
    )
    return _combine(
        r, floats, {}, dict(zip(zip(rows.tolist(), steps.tolist(), strict=True), found, strict=True))
    )


def _first_last(
    ctx: Any, impl: Callable[[Any, list[Any]], Any], args: list[Any], last: bool, ts: bool
) -> StepVector:
    """first/last_over_time (and their ts_of_) of windows holding histograms: the window's first
    or last sample of either kind found from the windows' bounds (a float wins a tie for first,
    a histogram for last, as a stable time sort of floats then histograms orders them), and an
    object made only for each histogram picked."""
    r: RangeInput = args[0]
    touched = has_hist_windows(r)
    floats = impl(ctx, [_strip(r)])
    hists: dict[tuple[int, int], H] = {}
    values: dict[tuple[int, int], float] = {}
    hr = r.hist
    rows, steps = np.nonzero(touched)
    if hr is not None and len(rows):
        hpos = (hr.hi - 1 if last else hr.lo)[rows, steps]
        fpos = (r.hi - 1 if last else r.lo)[rows, steps]
        has_float = (r.hi > r.lo)[rows, steps]
        ft = r.ts[np.where(has_float, fpos, 0)] if len(r.ts) else np.zeros(len(rows), dtype=np.int64)
        ht = hr.ts[hpos]
        use_float = has_float & ((ft > ht) if last else (ft <= ht))
        cells = list(zip(rows.tolist(), steps.tolist(), strict=True))
        if ts:
            values = dict(zip(cells, (np.where(use_float, ft, ht) / 1000.0).tolist(), strict=True))
        else:
            fsel, hsel = np.flatnonzero(use_float), np.flatnonzero(~use_float)
            values = {cells[k]: v for k, v in zip(fsel.tolist(), r.vs[fpos[fsel]].tolist(), strict=True)}
            objs = hr.objects_at(np.unique(hpos[hsel]))
            hists = {cells[k]: objs[p] for k, p in zip(hsel.tolist(), hpos[hsel].tolist(), strict=True)}
    return _combine(r, floats, hists, values, drop=touched, keep_name=not ts)


def _absent_over_time(ctx: Any, impl: Callable[[Any, list[Any]], Any], args: list[Any]) -> StepVector:
    from dataclasses import replace

    r: RangeInput = args[0]
    assert r.hist is not None
    # A window with a histogram counts as a window with a sample: widen the float windows' counts.
    hi = np.where(has_hist_windows(r), np.maximum(r.hi, r.lo + 1), r.hi)
    padded = replace(r, hi=hi, vs=np.append(r.vs, 0.0), ts=np.append(r.ts, 0), hist=None)
    out: StepVector = impl(ctx, [padded])
    return out


def _native_floats(
    fn: Callable[[H], float], dense_fn: Callable[[Totals], F64] | None = None
) -> Callable[[Any, Callable[[Any, list[Any]], Any], list[Any]], Any]:
    def handler(ctx: Any, impl: Callable[[Any, list[Any]], Any], args: list[Any]) -> StepVector:
        return float_of_hists(args[0], fn, dense_fn)

    return handler


def _dense_avg(block: Totals) -> F64:
    """histogram_avg of every row: IEEE division as :func:`fdiv` does it (x/0 is +-Inf, 0/0 NaN)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        avg: F64 = block.sum / block.count
    return avg


def _histogram_stdvar(h: H) -> float:
    return float(nh.histogram_stdvar(h))


def _histogram_stddev(h: H) -> float:
    return float(nh.histogram_stddev(h))  # NaN when the variance is negative, as Go


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
        out[others] = [_histogram_stdvar(h) for h in data.select(others).objects().tolist()]
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
        mean = _safe_divide(total, count)
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
        from kernel_insight.kql.aggregation import kahan_add

        # A row's terms in columns 0..len-1, then +0.0: adding it leaves the sum and its
        # compensation as they are (the sum is never -0.0: it starts at +0.0).
        mat = np.zeros((width, n))
        mat[rank, rows] = terms
        variance = np.zeros(n)
        comp = np.zeros(n)
        t, bb = np.empty(n), np.empty(n)
        for inc in mat:
            kahan_add(variance, comp, inc, t, bb)
        out = _safe_divide(variance + comp, count)
    return out


def _safe_divide(a: F64, b: F64) -> F64:
    """``histogram.go_div`` of every element: IEEE division, but 0/0 and NaN/0 the plain
    (positive) NaN Python's ``math.nan`` is, where the processor's 0/0 has the sign bit set."""
    with np.errstate(divide="ignore", invalid="ignore"):
        out: F64 = np.where((b == 0) & ((a == 0) | np.isnan(a)), math.nan, a / b)
    return out


histogram_behaviour("rate")(functools.partial(_rate, counter=True, per_second=True))
histogram_behaviour("increase")(functools.partial(_rate, counter=True, per_second=False))
histogram_behaviour("delta")(functools.partial(_rate, counter=False, per_second=False))
histogram_behaviour("irate")(functools.partial(_instant, is_rate=True))
histogram_behaviour("idelta")(functools.partial(_instant, is_rate=False))
histogram_behaviour("changes")(functools.partial(_changes_or_resets, resets=False))
histogram_behaviour("resets")(functools.partial(_changes_or_resets, resets=True))
histogram_behaviour("sum_over_time")(functools.partial(_sum_avg_over_time, mean=False))
histogram_behaviour("avg_over_time")(functools.partial(_sum_avg_over_time, mean=True))
histogram_behaviour("count_over_time")(functools.partial(_count_like, count=True))
histogram_behaviour("present_over_time")(functools.partial(_count_like, count=False))
histogram_behaviour("last_over_time")(functools.partial(_first_last, last=True, ts=False))
histogram_behaviour("first_over_time")(functools.partial(_first_last, last=False, ts=False))
histogram_behaviour("ts_of_last_over_time")(functools.partial(_first_last, last=True, ts=True))


histogram_behaviour("ts_of_first_over_time")(functools.partial(_first_last, last=False, ts=True))


histogram_behaviour("absent_over_time")(_absent_over_time)


histogram_behaviour("histogram_count")(_native_floats(lambda h: float(h.count), lambda b: b.count))


histogram_behaviour("histogram_sum")(_native_floats(lambda h: float(h.sum), lambda b: b.sum))


histogram_behaviour("histogram_avg")(_native_floats(lambda h: fdiv(float(h.sum), float(h.count)), _dense_avg))


histogram_behaviour("histogram_stdvar")(_native_floats(_histogram_stdvar, dense_stdvar))


histogram_behaviour("histogram_stddev")(_native_floats(_histogram_stddev, dense_stddev))


# ------------------------------------------------------------------------------ histogram_quantile & co


def mixed_classic_native(name: str) -> str:
    base = "vector contains a mix of classic and native histograms"
    return f"{base} for metric name {go_quote(name)}" if name else base


def _split_classic_native(ctx: Any, vec: StepVector, arg_index: int) -> StepVector:
    """The float (classic bucket) part of ``vec``, less the buckets that collide with a native histogram
    of the same labels at the same step (both are dropped then, with Prometheus' warning)."""
    if not any(k == "le" for lb in vec.labels for k, _ in lb):
        return vec  # no classic bucket: nothing collides (dense histogram cells stay dense)
    assert vec.hists is not None
    by_key: dict[Labels, list[int]] = {}
    for i, lb in enumerate(vec.labels):
        le = dict(lb).get("le")
        if le is None:
            continue
        try:
            float(le.replace("Inf", "inf"))
        except ValueError:
            continue
        by_key.setdefault(tuple(p for p in lb if p[0] != "le"), []).append(i)
    present = vec.present.copy()
    hists = vec.hists.copy()
    for i, j, _ in cells(vec.hists):
        rows = by_key.get(vec.labels[i])
        if rows and present[rows, j].any():
            ctx.warn(mixed_classic_native(metric_name(vec.labels[i])), ctx.node.args[arg_index].pos)
            present[rows, j] = False
            hists[i, j] = None
    return StepVector(vec.labels, vec.values, present, vec.drop_name, vec.sample_ts, hists)


def _concat(a: StepVector, b: StepVector) -> StepVector:
    from kernel_insight.kql.vectors import consolidate

    return consolidate(
        StepVector(
            a.labels + b.labels,
            np.concatenate([a.values, b.values]),
            np.concatenate([a.present, b.present]),
            np.concatenate([a.drop_name, b.drop_name]),
        )
    )


def _notes(ctx: Any, notes: Iterable[str], name: str, pos: Any) -> None:
    for note in notes:
        ctx.info(note + (f" for metric name {go_quote(name)}" if name else ""), pos)


def _quantile_of(ctx: Any, q: float, h: H, name: str, pos: Any) -> float:
    value, notes = nh.histogram_quantile(q, h)
    if notes:
        _notes(ctx, notes, name, pos)
    return float(value)


def _fraction_of(ctx: Any, lower: float, upper: float, h: H, name: str, pos: Any) -> float:
    value, notes = nh.histogram_fraction(lower, upper, h)
    if notes:
        _notes(ctx, notes, name, pos)
    return float(value)


def _histogram_quantile(ctx: Any, impl: Callable[[Any, list[Any]], Any], args: list[Any]) -> StepVector:
    q, vec = args
    classic = _split_classic_native(ctx, vec, 1)
    floats = impl(ctx, [q, classic.floats_only()])
    pos = ctx.node.args[1].pos
    return _concat(floats, _native_quantiles(ctx, q, classic, pos))


def _native_quantiles(ctx: Any, q: F64, vec: StepVector, pos: Any) -> StepVector:
    """histogram_quantile of every histogram cell: a dense block's numpy search where the cells
    share a layout (:func:`dense_quantiles`), kql.histogram per histogram for the rest."""
    qs = np.asarray(q, dtype=np.float64)
    return _native_cells(
        ctx,
        vec,
        lambda steps, block: dense_quantiles(qs[steps], block),
        lambda i, j, h: _quantile_of(ctx, float(q[j]), h, metric_name(vec.labels[i]), pos),
    )


def _native_cells(
    ctx: Any,
    vec: StepVector,
    dense_fn: Callable[[I64, DenseBlock], tuple[F64, BOOL]],
    one: Callable[[int, int, H], float],
) -> StepVector:
    """A float of every histogram cell: ``dense_fn`` over whole blocks (its steps' arguments,
    the block; the rows it leaves undecided go to ``one``, per histogram). Cells still dense
    (rate's results) are searched where they are, a selector's columns (``vec.sparse``) and
    objects in chunks of neighbouring series (narrow blocks); objects are made only for the
    rows ``dense_fn`` leaves."""
    values = np.zeros(vec.values.shape)
    present = np.zeros(vec.values.shape, dtype=bool)
    if vec.dense is not None:
        for block, rows, steps, hint in vec.dense.parts:
            found, done = dense_fn(steps, block)
            values[rows[done], steps[done]] = found[done]
            present[rows, steps] = True
            rest = np.flatnonzero(~done)
            if len(rest):
                for k, h in zip(rest.tolist(), block.take(rest).materialize(hint), strict=True):
                    i, j = int(rows[k]), int(steps[k])
                    values[i, j] = one(i, j, h)
            ctx.check()
    if vec.sparse is not None:
        cells = vec.sparse
        order = np.lexsort((cells.steps, cells.rows))  # row by row, as the objects' cells come
        data = cells.data.take(order)
        _chunked_cells(
            ctx,
            cells.rows[order],
            cells.steps[order],
            values,
            present,
            dense_fn,
            one,
            lambda a, b: DenseBlock.of_sparse(data.rows(a, b)),
            lambda rest: list(data.take(rest).objects()),
        )
    if vec.hist_objs is not None:
        rows, steps = np.nonzero(hist_mask(vec.hist_objs))
        hs = vec.hist_objs[rows, steps].tolist()
        _chunked_cells(
            ctx,
            rows,
            steps,
            values,
            present,
            dense_fn,
            one,
            lambda a, b: DenseBlock.of(hs[a:b]),
            lambda rest: [hs[k] for k in rest.tolist()],
        )
    return StepVector(vec.labels, values, present, np.ones(len(vec), dtype=bool)).compact()


def _chunked_cells(
    ctx: Any,
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


def _histogram_fraction(ctx: Any, impl: Callable[[Any, list[Any]], Any], args: list[Any]) -> StepVector:
    lower, upper, vec = args
    classic = _split_classic_native(ctx, vec, 2)
    floats = impl(ctx, [lower, upper, classic.floats_only()])
    pos = ctx.node.args[2].pos
    lo, hi = np.asarray(lower, dtype=np.float64), np.asarray(upper, dtype=np.float64)
    native = _native_cells(
        ctx,
        classic,
        lambda steps, block: dense_fractions(lo[steps], hi[steps], block),
        lambda i, j, h: _fraction_of(
            ctx, float(lower[j]), float(upper[j]), h, metric_name(vec.labels[i]), pos
        ),
    )
    return _concat(floats, native)


def _histogram_quantiles(ctx: Any, impl: Callable[[Any, list[Any]], Any], args: list[Any]) -> StepVector:
    from kernel_insight.kql.functions.histogram import _q_label

    vec, label, *qs = args
    classic = _split_classic_native(ctx, vec, 0)
    out: StepVector = impl(ctx, [classic.floats_only(), label, *qs])
    pos = ctx.node.args[0].pos
    for q in qs:
        text = _q_label(float(q[0])) if len(q) else ""
        native = _native_quantiles(ctx, q, classic, pos)
        native.labels = [tuple(sorted({**dict(lb), label: text}.items())) for lb in native.labels]
        out = _concat(out, native)
    return out


histogram_behaviour("histogram_quantile")(_histogram_quantile)
histogram_behaviour("histogram_fraction")(_histogram_fraction)
histogram_behaviour("histogram_quantiles")(_histogram_quantiles)


# ------------------------------------------------------------------------------ anchored / smoothed


def _series_slices(r: RangeInput, i: int) -> tuple[list[int], list[float], list[int], list[H]]:
    a, z = int(r.offsets[i]), int(r.offsets[i + 1])
    fts, fvs = r.ts[a:z].tolist(), r.vs[a:z].tolist()
    if r.hist is None:
        return fts, fvs, [], []
    ha, hz = int(r.hist.offsets[i]), int(r.hist.offsets[i + 1])
    return fts, fvs, r.hist.ts[ha:hz].tolist(), list(r.hist.hs[ha:hz])


def _extended_window(r: RangeInput, ts: list[int], j: int, lookback: int) -> tuple[int, int]:
    """[a, b) of the samples an anchored or smoothed window at step ``j`` reads: after the range
    start minus the lookback, up to the range end (plus the lookback when smoothed)."""
    import bisect

    end = int(r.end[j])
    start = end - r.range_ms
    a = bisect.bisect_right(ts, start - lookback)
    b = bisect.bisect_right(ts, end + (lookback if r.smoothed else 0))
    return a, b


def _interpolate_hist(ctx: Any, h1: H, t1: int, h2: H, t2: int, t: int, counter: bool, pos: Any) -> H:
    if t == t1:
        return h1.copy()
    if t == t2:
        return h2.copy()
    fraction = (t - t1) / (t2 - t1)
    if counter and detect_reset(h2, h1):
        return hmul(h2, fraction)
    res, _, reconciled = hsub(h2, h1)
    if reconciled:
        ctx.info(reconciled_custom_buckets("subtraction"), pos)
    res = hmul(res, fraction)
    res, _, reconciled = hadd(res, h1)
    if reconciled:
        ctx.info(reconciled_custom_buckets("addition"), pos)
    return res


def extended_histogram_rate(
    ctx: Any,
    hts: list[int],
    hs: list[H],
    start: int,
    end: int,
    r: RangeInput,
    counter: bool,
    per_second: bool,
    name: str,
    pos: Any,
) -> H | None:
    """Prometheus' extendedHistogramRate: rate/increase/delta of an anchored or smoothed range."""
    import bisect

    last = len(hs) - 1
    first = max(0, bisect.bisect_right(hts, start, 0, last) - 1)
    if r.smoothed:
        last = bisect.bisect_left(hts, end, 0, last)
    if hts[last] <= start:
        return None
    if r.smoothed and hts[first] > end:
        return None
    custom = uses_custom(hs[first])
    for h in hs[first : last + 1]:
        if uses_custom(h) != custom:
            ctx.warn(mixed_exponential_custom(name), pos)
            return None
        if counter and h.counter_reset_hint == GAUGE:
            ctx.warn(not_counter(name), pos)
    try:
        if r.smoothed and hts[first] < start:
            left = _interpolate_hist(
                ctx, hs[first], hts[first], hs[first + 1], hts[first + 1], start, counter, pos
            )
        else:
            left = hs[first].copy()
        if r.smoothed and last > 0 and hts[last] > end:
            right = _interpolate_hist(
                ctx, hs[last - 1], hts[last - 1], hs[last], hts[last], end, counter, pos
            )
        else:
            right = hs[last].copy()
        if not counter and (left.counter_reset_hint != GAUGE or right.counter_reset_hint != GAUGE):
            ctx.warn(not_gauge(name), pos)
        result, _, reconciled = hsub(right, left)
        if reconciled:
            ctx.info(reconciled_custom_buckets("subtraction"), pos)
        if counter:
            correction = _reset_correction(hts, hs, first, last, left, right, start, r.smoothed)
            if correction is not None:
                result, _, reconciled = hadd(result, correction)
                if reconciled:
                    ctx.info(reconciled_custom_buckets("addition"), pos)
    except Incompatible:
        ctx.warn(mixed_exponential_custom(name), pos)
        return None
    if per_second:
        result = hdiv(result, r.range_ms / 1000.0)
    result = result.copy()
    result.counter_reset_hint = GAUGE
    return hcompact(result)


def _reset_correction(
    hts: list[int],
    hs: list[H],
    first_index: int,
    last_index: int,
    left: H,
    right: H,
    start: int,
    smoothed: bool,
) -> H | None:
    """Prometheus' correctForCounterResetsHistogram."""
    first = first_index + 1
    prev = left
    if smoothed and hts[first_index] < start and detect_reset(hs[first_index + 1], hs[first_index]):
        prev = hs[first_index + 1]
        first += 1
    last = last_index - 1
    if first > last + 1:
        return None
    correction: H | None = None

    def add(h: H) -> None:
        nonlocal correction
        correction = h.copy() if correction is None else hadd(correction, h)[0]

    for h in hs[first : last + 1]:
        if detect_reset(h, prev):
            add(prev)
        prev = h
    if detect_reset(right, prev):
        add(prev)
    return correction


def _extended_rate(
    ctx: Any, impl: Callable[[Any, list[Any]], Any], r: RangeInput, counter: bool, per_second: bool
) -> StepVector:
    """rate/increase/delta over anchored or smoothed ranges holding histograms."""
    floats = impl(ctx, [_strip(r)])
    lookback = int(ctx.lookback_ms)
    pos = _matrix_arg(ctx).pos
    hists: dict[tuple[int, int], H] = {}
    drop = np.zeros(r.lo.shape, dtype=bool)
    assert r.hist is not None
    for i in np.flatnonzero(np.diff(r.hist.offsets) > 0).tolist():
        r.checkpoint()
        fts, _, hts, hs = _series_slices(r, i)
        name = metric_name(r.labels[i])
        for j in range(r.steps):
            ha, hb = _extended_window(r, hts, j, lookback)
            if hb <= ha:
                continue
            drop[i, j] = True
            fa, fb = _extended_window(r, fts, j, lookback)
            if fb > fa:
                ctx.warn(mixed_floats_histograms(name), pos)
                continue
            end = int(r.end[j])
            h = extended_histogram_rate(
                ctx, hts[ha:hb], hs[ha:hb], end - r.range_ms, end, r, counter, per_second, name, pos
            )
            if h is not None:
                hists[i, j] = h
    return _combine(r, floats, hists, drop=drop)


def smoothed_selector(ev: Any, node: Any, floats: StepVector, cols: Any, refs: Any) -> StepVector:
    """A ``smoothed`` instant selector over series holding histograms (Prometheus' smoothSeries):
    each step's histogram interpolated between the samples around it, carried forward after the last."""
    import bisect

    hist = cols.hist
    lookback = int(ev.limits.lookback_ms)
    n, steps = len(cols), len(refs)
    values = np.zeros((n, steps))
    present = np.zeros((n, steps), dtype=bool)
    hists = np.full((n, steps), None, dtype=object)
    row_of = {lb: k for k, lb in enumerate(floats.labels)}
    touched = np.diff(hist.offsets) > 0
    for i, lb in enumerate(cols.labels):
        k = row_of.get(lb)
        if k is not None and not touched[i]:
            values[i], present[i] = floats.values[k], floats.present[k]
    for i in np.flatnonzero(touched).tolist():
        ev.checkpoint()
        a, z = int(cols.offsets[i]), int(cols.offsets[i + 1])
        fts, fvs = cols.ts[a:z].tolist(), cols.vs[a:z].tolist()
        ha, hz = int(hist.offsets[i]), int(hist.offsets[i + 1])
        hts, hs = hist.ts[ha:hz].tolist(), list(hist.hs[ha:hz])
        name = metric_name(cols.labels[i])
        for j in range(steps):
            t = int(refs[j])
            fa, fb = bisect.bisect_right(fts, t - lookback), bisect.bisect_right(fts, t + lookback)
            sa, sb = bisect.bisect_right(hts, t - lookback), bisect.bisect_right(hts, t + lookback)
            if fb <= fa and sb <= sa:
                continue
            if fb > fa and sb > sa:
                ev.annotate("warning", mixed_floats_histograms(name), node.pos)
                continue
            if fb > fa:
                x = bisect.bisect_left(fts, t, fa, fb)
                if x < fb and fts[x] == t:
                    values[i, j], present[i, j] = fvs[x], True
                elif fa < x < fb:
                    t1, t2, v1, v2 = fts[x - 1], fts[x], fvs[x - 1], fvs[x]
                    values[i, j], present[i, j] = v1 + (v2 - v1) * (t - t1) / (t2 - t1), True
                elif x > fa:
                    values[i, j], present[i, j] = fvs[x - 1], True
                continue
            x = bisect.bisect_left(hts, t, sa, sb)
            if x < sb and hts[x] == t:
                hists[i, j] = hs[x].copy()
            elif sa < x < sb:
                prev, nxt = hs[x - 1], hs[x]
                if uses_custom(prev) != uses_custom(nxt):
                    ev.annotate("warning", mixed_exponential_custom(name), node.pos)
                    continue
                counter = prev.counter_reset_hint != GAUGE or nxt.counter_reset_hint != GAUGE
                ctx = _EvalAnnotations(ev, node.pos)
                try:
                    hists[i, j] = _interpolate_hist(ctx, prev, hts[x - 1], nxt, hts[x], t, counter, node.pos)
                except Incompatible:
                    ev.annotate("warning", mixed_exponential_custom(name), node.pos)
            elif x > sa:
                hists[i, j] = with_hint(hs[x - 1], UNKNOWN)
    hp = hist_mask(hists)
    ev.count_samples(hist_weight(hists))
    return StepVector(
        list(cols.labels), values, present, np.zeros(n, dtype=bool), None, hists if hp.any() else None
    ).compact()


class _EvalAnnotations:
    """The ``warn``/``info`` of a call context, for code shared with selectors."""

    def __init__(self, ev: Any, pos: Any) -> None:
        self.ev, self.pos = ev, pos

    def warn(self, message: str, pos: Any = None) -> None:
        self.ev.annotate("warning", message, pos or self.pos)

    def info(self, message: str, pos: Any = None) -> None:
        self.ev.annotate("info", message, pos or self.pos)


# ------------------------------------------------------------------------------ dense fast paths

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
    """Histogram cells of a :class:`StepVector` held as dense blocks instead of objects.

    ``parts`` are ``(block, rows, steps, hint)``: block row ``k`` is the histogram of cell
    ``(rows[k], steps[k])``, with counter-reset hint ``hint``. rate/increase and sum/avg make
    them (:func:`dense_rate`, :func:`dense_sum`), sum/avg of one member per group and
    histogram_quantile read them as they are, and anything else gets FloatHistograms through
    ``StepVector.hists``: a quantile over 240k histograms never builds 240k objects and their
    dense blocks again.
    """

    __slots__ = ("parts",)

    def __init__(self, parts: list[tuple[DenseBlock, I64, I64, int]]) -> None:
        self.parts = parts

    def mark(self, mask: BOOL) -> None:
        """Set ``mask`` True at every cell held here."""
        for _, rows, steps, _ in self.parts:
            mask[rows, steps] = True

    def fill(self, out: OBJ) -> None:
        """Put every cell's FloatHistogram into ``out``."""
        for block, rows, steps, hint in self.parts:
            holder = np.empty(len(rows), dtype=object)
            holder[:] = block.materialize(hint)
            out[rows, steps] = holder

    def weight(self) -> int:
        return sum(int(block.weights().sum()) for block, _, _, _ in self.parts)

    def take(self, idx: npt.NDArray[np.intp], n: int) -> DenseHists | None:
        """The cells of rows ``idx`` (of ``n``), renumbered as ``StepVector.take`` does; None when
        a row is taken twice (then the caller takes objects)."""
        new_of_old = renumbering(idx, n)
        return None if new_of_old is None else self.regrouped(new_of_old)

    def regrouped(self, new_of_old: I64, drop: BOOL | None = None) -> DenseHists:
        """The cells moved to rows ``new_of_old[row]``; cells whose new row is -1 (or where
        ``drop[new row, step]``) are left out."""
        parts = []
        for block, rows, steps, hint in self.parts:
            new = new_of_old[rows]
            keep = new >= 0
            if drop is not None:
                keep[keep] = ~drop[new[keep], steps[keep]]
            if keep.all():
                parts.append((block, new, steps, hint))
            elif keep.any():
                parts.append((block.take(np.flatnonzero(keep)), new[keep], steps[keep], hint))
        return DenseHists(parts)


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


def _single_dense(vec: StepVector, gid: Any, n: int, mixed: BOOL) -> tuple[OBJ | None, DenseHists] | None:
    """:func:`_single_members` of a vector with dense cells: each moved to its group's row (the
    dense ones without becoming objects); None when some group has several members."""
    dense = vec.dense
    assert dense is not None
    steps = vec.values.shape[1]
    parts = [(r, c) for _, r, c, _ in dense.parts]
    if vec.hist_objs is not None:
        orows, ocols = np.nonzero(hist_mask(vec.hist_objs))
        parts.append((orows.astype(np.int64), ocols.astype(np.int64)))
    rows = np.concatenate([r for r, _ in parts])
    cols = np.concatenate([c for _, c in parts])
    keep = ~mixed[gid[rows], cols]
    target = gid[rows[keep]] * steps + cols[keep]
    if len(target) and np.bincount(target, minlength=n * steps).max() > 1:  # (a sort was 5x slower)
        return None
    objs = None if vec.hist_objs is None else _single_members(vec.hist_objs, gid, n, mixed)
    return objs, dense.regrouped(np.asarray(gid, dtype=np.int64), drop=mixed)


def _single_members(hists: OBJ, gid: Any, n: int, mixed: BOOL) -> OBJ | None:
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


def _single_sparse(cells: SparseCells, gid: Any, mixed: BOOL, steps: int) -> SparseCells | None:
    """:func:`_single_members` of a selector's columns: each cell moved to its group's row, still
    columns (not yet compacted: :meth:`SparseHists.compacted`); None when some group has several members at a step."""
    data = cells.data
    keep = ~mixed[gid[cells.rows], cells.steps]
    rows = np.asarray(gid, dtype=np.int64)[cells.rows]
    target = rows[keep] * steps + cells.steps[keep]
    if len(target) and np.bincount(target).max() > 1:
        return None
    if keep.all():
        return SparseCells(data, rows, cells.steps)
    idx = np.flatnonzero(keep)
    return SparseCells(data.take(idx), rows[idx], cells.steps[idx])


def sparse_sum(
    cells: SparseCells, gid: Any, n: int, steps: int, mixed: BOOL, mean: bool
) -> tuple[DenseHists, bool] | None:
    """:func:`dense_sum` of a selector's columns (``sum(x)`` over many series): one block made
    straight from the columns, no object per sample; None as for :func:`dense_sum` (then
    objects decide)."""
    rows, cols = cells.rows, cells.steps
    keep = np.flatnonzero(~mixed[gid[rows], cols])
    if len(keep) < DENSE_MIN_CELLS:
        return None
    order = keep[np.lexsort((rows[keep], cols[keep]))]  # step by step, input rows ascending
    data = cells.data.take(order)
    block = DenseBlock.of_sparse(data)
    if block is None:
        return None
    return _dense_sum_block(block, data.hints(), rows[order], cols[order], gid, n, steps, mean)


def dense_sum(hists: OBJ, gid: Any, n: int, mixed: BOOL, mean: bool) -> tuple[DenseHists, bool] | None:
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
    dense: DenseHists, gid: Any, n: int, steps: int, mixed: BOOL, mean: bool
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
    block: DenseBlock, hints: I64, rows: Any, cols: Any, gid: Any, n: int, steps: int, mean: bool
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
