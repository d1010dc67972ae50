"""Histogram samples in the evaluator: the wrappers over :mod:`kernel_insight.kql.histogram` that
meet its conventions in one place, Prometheus' annotation texts for histograms, and the cells and
windows of histograms that the operators, aggregations and functions read."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Protocol

import numpy as np
import numpy.typing as npt

from kernel_insight.kql import histogram as nh
from kernel_insight.kql.ast import PosRange
from kernel_insight.kql.histogram import CUSTOM_BUCKETS_SCHEMA
from kernel_insight.kql.lexical import go_quote
from kernel_insight.kql.storage import Labels
from kernel_insight.kql.values import (
    Arg,
    CallContext,
    RangeInput,
    StepVector,
    hist_mask,
)

if TYPE_CHECKING:
    from kernel_insight.kql.ast import Expr
    from kernel_insight.kql.engine import _Evaluator as Evaluator
    from kernel_insight.kql.functions.registry import Impl

F64 = npt.NDArray[np.float64]
BOOL = npt.NDArray[np.bool_]
OBJ = npt.NDArray[np.object_]
I64 = npt.NDArray[np.int64]
H = nh.FloatHistogram


class Incompatible(Exception):
    """Histograms with exponential and custom buckets met in one operation."""


def uses_custom(h: H) -> bool:
    return bool(h.schema == CUSTOM_BUCKETS_SCHEMA)


def check_compatible(a: H, b: H) -> None:
    """Raise :class:`Incompatible` for a histogram with custom buckets met by an exponential one."""
    if uses_custom(a) != uses_custom(b):
        raise Incompatible


def hadd(a: H, b: H) -> tuple[H, bool, bool]:
    """``a + b`` as a new histogram, whether counter-reset hints collided, whether custom buckets were reconciled."""
    check_compatible(a, b)
    try:
        res = a.add(b)
    except nh.HistogramError:
        raise Incompatible from None
    return res.histogram, bool(res.counter_reset_collision), bool(res.nhcb_bounds_reconciled)


def hsub(a: H, b: H) -> tuple[H, bool, bool]:
    """``a - b`` as a new histogram (same flags as :func:`hadd`)."""
    check_compatible(a, b)
    try:
        res = a.sub(b)
    except nh.HistogramError:
        raise Incompatible from None
    return res.histogram, bool(res.counter_reset_collision), bool(res.nhcb_bounds_reconciled)


def hkahan_add(acc: H, h: H, comp: H | None) -> tuple[H, H, bool, bool]:
    """``acc + h`` with Kahan-compensated counts (Prometheus' KahanAdd, as sum and avg add):
    (sum, compensation, counter-reset collision, custom buckets reconciled)."""
    check_compatible(acc, h)
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
    if vec.hists is not None:
        got = vec.hists.floats(fn, dense_fn)
        values[got.rows, got.steps] = got.values
        present[got.rows, got.steps] = True
    return StepVector(vec.labels, values, present, np.ones(len(vec), dtype=bool)).compact()


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


def fdiv(a: float, b: float) -> float:
    """Go's float division as the hardware does it: x/0 is ±Inf, 0/0 and NaN/0 the x86 default
    NaN (sign bit set, as numpy's arrays give it; :func:`kernel_insight.kql.histogram.go_div`
    answers Python's NaN)."""
    return float(np.float64(a) / np.float64(b))


def presence_proxy(vec: StepVector) -> StepVector:
    """The vector with every sample as a float (histograms as 0): for operators that only count samples."""
    hp = vec.hist_present()
    return StepVector(
        vec.labels, np.where(hp, 0.0, vec.values), vec.present | hp, vec.drop_name, vec.sample_ts
    )


def without_histograms(arg: Arg) -> Arg:
    if isinstance(arg, StepVector):
        return arg.floats_only()
    if isinstance(arg, RangeInput) and arg.hist is not None:
        from dataclasses import replace

        return replace(arg, hist=None)
    return arg


def floats_of(ctx: CallContext, impl: Impl, args: list[Arg]) -> StepVector:
    """What a function's float implementation answers for ``args`` (an instant vector: every
    function with a histogram behaviour returns one)."""
    out = impl(ctx, args)
    if not isinstance(out, StepVector):  # pragma: no cover - a registry entry's contract
        raise TypeError(f"{ctx.node.func}: the float implementation returned {type(out).__name__}")
    return out


def matrix_arg(ctx: CallContext) -> Expr:
    from kernel_insight.kql.ast import MatrixSelector, SubqueryExpr

    for arg in ctx.node.args:
        node = arg
        while hasattr(node, "expr") and not isinstance(node, MatrixSelector | SubqueryExpr):
            node = node.expr
        if isinstance(node, MatrixSelector | SubqueryExpr):
            return arg
    return ctx.node.args[0]


def info_mixed_range(ctx: CallContext, r: RangeInput) -> None:
    both = (r.counts > 0) & has_hist_windows(r)
    pos = ctx.node.args[0].pos
    for i in np.flatnonzero(both.any(axis=1)).tolist():
        ctx.info(ignored_in_mixed_range(metric_name(r.labels[i])), pos)


def warn_mixed_range(ctx: CallContext, r: RangeInput, mixed: BOOL) -> None:
    pos = matrix_arg(ctx).pos
    for i in np.flatnonzero(mixed.any(axis=1)).tolist():
        ctx.warn(mixed_floats_histograms(metric_name(r.labels[i])), pos)


def hstdvar(h: H) -> float:
    return float(nh.histogram_stdvar(h))


def hstddev(h: H) -> float:
    return float(nh.histogram_stddev(h))  # NaN when the variance is negative, as Go


def safe_divide(a: F64, b: F64) -> F64:
    """``histogram.go_div`` of every element: IEEE division, but 0/0 and NaN/0 the plain
    (positive) NaN Python's ``math.nan`` is, where the processor's 0/0 has the sign bit set."""
    with np.errstate(divide="ignore", invalid="ignore"):
        out: F64 = np.where((b == 0) & ((a == 0) | np.isnan(a)), math.nan, a / b)
    return out


class EvalAnnotations:
    """The ``warn``/``info`` of a call context, for code shared with selectors."""

    def __init__(self, ev: Evaluator, pos: PosRange) -> None:
        self.ev, self.pos = ev, pos

    def warn(self, message: str, pos: PosRange | None = None) -> None:
        self.ev.annotate("warning", message, pos or self.pos)

    def info(self, message: str, pos: PosRange | None = None) -> None:
        self.ev.annotate("info", message, pos or self.pos)


def holds_histograms(args: list[Arg]) -> bool:
    """Whether histogram samples are among a function's evaluated arguments."""
    return any(
        (isinstance(a, StepVector) and a.has_hists) or (isinstance(a, RangeInput) and a.hist is not None)
        for a in args
    )
