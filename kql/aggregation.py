"""Aggregation operators (sum, avg, topk, quantile, ...) over all steps at once.

Sums and means use Kahan-Neumaier compensation in input order, as Prometheus does, so
``sum`` of 2, 8, 1e100, -1e100 is 10.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, TypeAlias

import numpy as np
import numpy.typing as npt

from kernel_insight.kql import _windows
from kernel_insight.kql import histogram as nh
from kernel_insight.kql.aggregators import AGGREGATORS, aggregator
from kernel_insight.kql.ast import AggregateExpr, ValueType
from kernel_insight.kql.errors import KqlEvaluationError
from kernel_insight.kql.histcells import Hists, object_cells
from kernel_insight.kql.histogram import COUNTER_RESET, NOT_COUNTER_RESET
from kernel_insight.kql.histogram.gomath import kahan_inc_array
from kernel_insight.kql.histsamples import (
    MIXED_FLOATS_HISTOGRAMS_AGG,
    OBJ,
    Incompatible,
    cells,
    check_compatible,
    counter_reset_collision,
    hcompact,
    hkahan_add,
    ignored_in_aggregation,
    kahan_total,
    metric_name,
    mixed_exponential_custom,
    presence_proxy,
    reconciled_custom_buckets,
)
from kernel_insight.kql.lexical import go_quote, is_valid_label_name
from kernel_insight.kql.storage import Labels
from kernel_insight.kql.values import Param, StepVector, format_sample_value, hist_mask
from kernel_insight.kql.vectors import LabelsMemo, group_rows

if TYPE_CHECKING:
    from kernel_insight.kql.engine import _Evaluator as Evaluator

__all__ = [
    "aggregate",
    "bad_quantile_message",
    "quantiles_of_sorted_rows",
    "sort_rows_nan_first",
    "xxhash64",
]

F64 = npt.NDArray[np.float64]
BOOL = npt.NDArray[np.bool_]


def _grouping_key(labels: Labels, node: AggregateExpr) -> Labels:
    return _grouping_keys([labels], node)[0]


#: (grouping labels, without) -> {id(label set): (label set, its group's labels)}. Dashboards and
#: rules group the same series the same way on every evaluation, and storage hands out the same
#: label-set objects for the same series (the head's, the labels cache's): found by identity, a
#: lookup costs no hash of the nested tuple (most of a grouping over a fleet's series otherwise).
#: The entry holds its label set, so the id stays that object's while it is remembered.
_GROUP_KEYS: dict[tuple[tuple[str, ...], bool], dict[int, tuple[Labels, Labels]]] = {}
#: Label sets remembered per grouping (then forgotten at once).
_GROUP_KEYS_MAX = 1_000_000


def _grouping_keys(labels: list[Labels], node: AggregateExpr) -> list[Labels]:
    """The group labels of every row: ``by`` keeps the named labels, ``without`` drops them and the metric name."""
    memo = _GROUP_KEYS.setdefault((node.grouping, node.without), {})
    if len(memo) > _GROUP_KEYS_MAX:
        memo.clear()
    without = node.without
    names = frozenset(node.grouping) | ({"__name__", "__type__", "__unit__"} if without else set())
    out = []
    for lb in labels:
        hit = memo.get(id(lb))
        if hit is not None and hit[0] is lb:
            key = hit[1]
        else:
            key = tuple(p for p in lb if (p[0] in names) != without)
            memo[id(lb)] = (lb, key)
        out.append(key)
    return out


#: (grouping, without) and the rows' labels -> (group id of each row, groups, the groups' labels).
_GROUPS: LabelsMemo[tuple[npt.NDArray[np.intp], int, list[Labels]]] = LabelsMemo()


def _groups(labels: list[Labels], node: AggregateExpr) -> tuple[npt.NDArray[np.intp], int, list[Labels]]:
    """Each row's group id (numbered in order of first appearance), the number of groups and each
    group's labels (not to be changed: they are remembered, :class:`LabelsMemo`)."""
    spec = (node.grouping, node.without)
    hit = _GROUPS.get(spec, labels)
    if hit is not None:
        return hit
    keys = _grouping_keys(labels, node)
    gid, n = group_rows(keys)
    group_labels: list[Labels] = [()] * n
    for i, g in enumerate(gid.tolist()):
        group_labels[g] = keys[i]
    return _GROUPS.put(spec, (labels,), (gid, n, group_labels))


def _ranks(gid: npt.NDArray[np.intp], n_groups: int) -> tuple[npt.NDArray[np.intp], int]:
    """Position of each row within its group (in row order) and the largest group size."""
    rank = np.empty(len(gid), dtype=np.intp)
    if len(gid) == 0:
        return rank, 0
    order = np.argsort(gid, kind="stable")
    starts = np.searchsorted(gid[order], np.arange(n_groups))
    rank[order] = np.arange(len(gid)) - starts[gid[order]]
    return rank, int(rank.max()) + 1


def _by_rank(gid: npt.NDArray[np.intp], rank: npt.NDArray[np.intp], depth: int) -> list[npt.NDArray[np.intp]]:
    order = np.argsort(rank, kind="stable")
    bounds = np.searchsorted(rank[order], np.arange(depth + 1))
    return [order[bounds[k] : bounds[k + 1]] for k in range(depth)]


def _group_counts(present: BOOL, gid: npt.NDArray[np.intp], n: int) -> npt.NDArray[np.int64]:
    """How many rows of each group are present at each step, in C (``_windows.group_kahan`` counting
    only): ``np.add.at`` over (rows, steps) is slow, a visible part of a range aggregation."""
    count = np.zeros((n, present.shape[1]), dtype=np.int64)
    _windows.group_kahan(
        None,
        np.ascontiguousarray(present, dtype=np.bool_),
        np.ascontiguousarray(gid, dtype=np.int64),
        None,
        None,
        count,
    )
    return count


def _kahan_totals(
    values: F64, present: BOOL, gid: npt.NDArray[np.intp], n: int
) -> tuple[F64, F64, npt.NDArray[np.int64]]:
    """Kahan-Neumaier sum, compensation and count of the present values of every group and step.

    In C (``_windows.group_kahan``), row by row in order with the arithmetic of
    ``histogram.gomath.kahan_inc_into``, as Prometheus adds a group's series: numpy needed a
    gather, a Kahan step and a scatter per rank within the groups (a range ``sum(rate(...))`` over n series: n such steps, and ``np.add.at``
    for the counts; ``make bench-kql``).
    """
    steps = values.shape[1]
    total = np.zeros((n, steps))
    comp = np.zeros((n, steps))
    count = np.zeros((n, steps), dtype=np.int64)
    _windows.group_kahan(
        np.ascontiguousarray(values, dtype=np.float64),
        np.ascontiguousarray(present, dtype=np.bool_),
        np.ascontiguousarray(gid, dtype=np.int64),
        total,
        comp,
        count,
    )
    return total, comp, count


def _sum_avg(
    vec: StepVector, gid: npt.NDArray[np.intp], n: int, mean: bool
) -> tuple[F64, npt.NDArray[np.int64]]:
    """Prometheus' float sum (Kahan) or mean (direct Kahan mean, switching to incremental on overflow)."""
    present_values = vec.values[vec.present]
    safe_sum = np.isfinite(present_values).all() and (
        len(present_values) == 0 or float(np.abs(present_values).max()) * len(vec) < 1e307
    )
    if not mean or safe_sum:
        total, comp, count = _kahan_totals(vec.values, vec.present, gid, n)
        if mean:
            denominator = np.maximum(count, 1)
            return total / denominator + comp / denominator, count
        return np.where(np.isinf(total), total, total + comp), count
    return _overflowing_mean(vec, gid, n)


def _overflowing_mean(
    vec: StepVector, gid: npt.NDArray[np.intp], n: int
) -> tuple[F64, npt.NDArray[np.int64]]:
    """The mean where a running sum may overflow (or hold infinities): Prometheus' steps exactly.

    Direct Kahan mean until the sum would overflow, incremental mean from there on.
    """
    steps = vec.values.shape[1]
    total = np.zeros((n, steps))
    comp = np.zeros((n, steps))
    avg = np.zeros((n, steps))
    count = np.zeros((n, steps), dtype=np.int64)
    incremental = np.zeros((n, steps), dtype=bool)
    rank, depth = _ranks(gid, n)
    for rows in _by_rank(gid, rank, depth):
        g = gid[rows]
        p = vec.present[rows]
        f = vec.values[rows]
        first = p & (count[g] == 0)
        later = p & ~first
        cnt = count[g] + p
        t, c = total[g], comp[g]
        inc_mode = incremental[g]
        new_t, new_c = kahan_inc_array(f, t, c)
        overflow = later & ~inc_mode & np.isinf(new_t)
        direct = later & ~inc_mode & ~overflow
        prev = np.maximum(cnt - 1, 1)
        m = np.where(overflow, t / prev, avg[g])
        cm = np.where(overflow, c / prev, c)
        inc_now = later & (inc_mode | overflow)
        q = (cnt - 1) / np.maximum(cnt, 1)
        im, ic = kahan_inc_array(f / np.maximum(cnt, 1), q * m, q * cm)
        total[g] = np.where(first, f, np.where(direct, new_t, t))
        comp[g] = np.where(first, 0.0, np.where(direct, new_c, np.where(inc_now, ic, c)))
        avg[g] = np.where(inc_now, im, m)
        incremental[g] = inc_mode | overflow
        count[g] = cnt
    denominator = np.maximum(count, 1)
    return np.where(incremental, avg + comp, total / denominator + comp / denominator), count


def sort_rows_nan_first(values: F64, valid: npt.NDArray[np.bool_]) -> F64:
    """Each row's valid values in the order Prometheus' quantiles use (NaN first, then ascending),
    followed by +inf padding where the row had invalid places (never read: see ``counts``).

    One numpy sort along the rows instead of a Python-level sort per row; NaN sorts with -inf
    here and the first n_nan places of each row are then its NaNs.
    """
    nan = np.isnan(values) & valid
    ordered = np.where(valid, np.where(nan, -np.inf, values), np.inf)
    ordered.sort(axis=1)
    ordered[np.arange(values.shape[1])[None, :] < nan.sum(axis=1)[:, None]] = np.nan
    return ordered


def quantiles_of_sorted_rows(phi: F64, ordered: F64, counts: npt.NDArray[np.int64]) -> F64:
    """Prometheus' φ-quantile, linear interpolation, of each row's first ``counts[i]`` sorted values.

    ``phi`` per row; NaN φ gives NaN, φ < 0 gives -Inf, φ > 1 gives +Inf. Rows with a count
    of 0 hold garbage: the caller leaves them out.
    """
    bad = np.isnan(phi) | (phi < 0) | (phi > 1)
    rank = np.where(bad, 0.0, phi) * (counts - 1).astype(np.float64)
    floor = np.floor(rank)
    lower = np.maximum(floor.astype(np.int64), 0)
    upper = np.clip(lower + 1, 0, np.maximum(counts - 1, 0))
    weight = rank - floor
    rows = np.arange(len(counts))
    with np.errstate(invalid="ignore", over="ignore"):  # inf * 0 is NaN, as in Go
        result: F64 = ordered[rows, lower] * (1 - weight) + ordered[rows, upper] * weight
    result = np.where(phi < 0, -np.inf, np.where(phi > 1, np.inf, result))
    out: F64 = np.where(np.isnan(phi), np.nan, result)
    return out


def bad_quantile_message(q: F64) -> str | None:
    """The warning for quantile parameters outside [0, 1] (or NaN) at any step, else None."""
    bad = q[np.isnan(q) | (q < 0) | (q > 1)]
    if not len(bad):
        return None
    return f"quantile value should be between 0 and 1, got {format_sample_value(float(bad[0]))}"


def _k_values(param: F64, node: AggregateExpr) -> npt.NDArray[np.int64]:
    if np.isnan(param).any():
        raise KqlEvaluationError("Parameter value is NaN")
    clipped = np.clip(param, -(2.0**62), 2.0**62)
    return np.trunc(clipped).astype(np.int64)


def aggregate(ev: Evaluator, node: AggregateExpr, vec: StepVector, param: Param) -> StepVector:
    """Evaluate one aggregation over a step vector (``param`` already evaluated)."""
    spec = AGGREGATORS.get(node.op)
    if spec is None:  # pragma: no cover - the parser only accepts registered aggregations
        raise KqlEvaluationError(f"unknown aggregation {node.op!r}")
    if vec.has_hists:
        return _histogram_aggregate(ev, node, vec, param)
    result: StepVector = spec.impl(ev, node, vec, param)
    return result


#: A per-group reduction: (evaluator, node, vector, group id of each row, group count, parameter)
#: -> values of shape (groups, steps); rows absent at a step are masked by ``vec.present``.
Reduce: TypeAlias = "Callable[[Evaluator, AggregateExpr, StepVector, npt.NDArray[np.intp], int, Param], F64]"


def _grouped(reduce: Reduce) -> Callable[[Evaluator, AggregateExpr, StepVector, Param], StepVector]:
    """An aggregation that reduces the rows of each ``by``/``without`` group to one row."""

    def impl(ev: Evaluator, node: AggregateExpr, vec: StepVector, param: Param) -> StepVector:
        gid, n, groups = _groups(vec.labels, node)
        group_labels = list(groups)
        present = _group_counts(vec.present, gid, n) > 0
        drop = np.zeros(n, dtype=bool)
        if any(k == "__name__" for k in node.grouping) and not node.without:
            np.logical_or.at(drop, gid, vec.drop_name)
        values = reduce(ev, node, vec, gid, n, param)
        return StepVector(group_labels, values, present, drop).compact()

    impl.__doc__ = reduce.__doc__
    return impl


@aggregator("sum", histograms="sum")
@_grouped
def _sum(
    ev: Evaluator, node: AggregateExpr, vec: StepVector, gid: npt.NDArray[np.intp], n: int, param: Param
) -> F64:
    """Sum of each group (Kahan-Neumaier compensated)."""
    return _sum_avg(vec, gid, n, mean=False)[0]


@aggregator("avg", histograms="mean")
@_grouped
def _avg(
    ev: Evaluator, node: AggregateExpr, vec: StepVector, gid: npt.NDArray[np.intp], n: int, param: Param
) -> F64:
    """Mean of each group (Kahan-Neumaier compensated, incremental past an overflow)."""
    return _sum_avg(vec, gid, n, mean=True)[0]


@aggregator("stddev", histograms="ignored")
@_grouped
def _stddev(
    ev: Evaluator, node: AggregateExpr, vec: StepVector, gid: npt.NDArray[np.intp], n: int, param: Param
) -> F64:
    """Population standard deviation of each group."""
    return _variance(vec, gid, n, sqrt=True)


@aggregator("stdvar", histograms="ignored")
@_grouped
def _stdvar(
    ev: Evaluator, node: AggregateExpr, vec: StepVector, gid: npt.NDArray[np.intp], n: int, param: Param
) -> F64:
    """Population variance of each group."""
    return _variance(vec, gid, n, sqrt=False)


@aggregator("count", histograms="presence", result_unit="unitless")
@_grouped
def _count(
    ev: Evaluator, node: AggregateExpr, vec: StepVector, gid: npt.NDArray[np.intp], n: int, param: Param
) -> F64:
    """Number of series in each group."""
    return _group_counts(vec.present, gid, n).astype(np.float64)


@aggregator("group", histograms="presence", result_unit="unitless")
@_grouped
def _group(
    ev: Evaluator, node: AggregateExpr, vec: StepVector, gid: npt.NDArray[np.intp], n: int, param: Param
) -> F64:
    """1 for every group."""
    return np.ones((n, vec.values.shape[1]))


def _extreme(vec: StepVector, gid: npt.NDArray[np.intp], n: int, ufunc: np.ufunc) -> F64:
    acc = np.full((n, vec.values.shape[1]), np.nan)
    ufunc.at(acc, gid, np.where(vec.present, vec.values, np.nan))
    return acc


@aggregator("min", histograms="ignored")
@_grouped
def _min(
    ev: Evaluator, node: AggregateExpr, vec: StepVector, gid: npt.NDArray[np.intp], n: int, param: Param
) -> F64:
    """Smallest value of each group (NaN only when all are NaN)."""
    return _extreme(vec, gid, n, np.fmin)


@aggregator("max", histograms="ignored")
@_grouped
def _max(
    ev: Evaluator, node: AggregateExpr, vec: StepVector, gid: npt.NDArray[np.intp], n: int, param: Param
) -> F64:
    """Largest value of each group (NaN only when all are NaN)."""
    return _extreme(vec, gid, n, np.fmax)


@aggregator("quantile", ValueType.SCALAR, histograms="ignored")
@_grouped
def _quantile(
    ev: Evaluator, node: AggregateExpr, vec: StepVector, gid: npt.NDArray[np.intp], n: int, param: Param
) -> F64:
    """The phi-quantile of each group."""
    steps = vec.values.shape[1]
    values = np.zeros((n, steps))
    masked = np.where(vec.present, vec.values, np.nan)
    q = np.asarray(param, dtype=np.float64)
    message = bad_quantile_message(q)
    if message is not None:
        ev.annotate("warning", message, node.param.pos if node.param is not None else node.pos)
    order = np.argsort(gid, kind="stable")
    bounds = np.searchsorted(gid[order], np.arange(n + 1))
    for g in range(n):
        if g % 1024 == 1023:
            ev.checkpoint()
        rows = order[bounds[g] : bounds[g + 1]]
        # One row per step: the group's present values at that step.
        valid = vec.present[rows].T
        counts = valid.sum(axis=1)
        result = quantiles_of_sorted_rows(q, sort_rows_nan_first(masked[rows].T, valid), counts)
        values[g] = np.where(counts > 0, result, values[g])
    return values


def _variance(vec: StepVector, gid: npt.NDArray[np.intp], n: int, sqrt: bool) -> F64:
    steps = vec.values.shape[1]
    mean = np.zeros((n, steps))
    acc = np.zeros((n, steps))
    count = np.zeros((n, steps))
    rank, depth = _ranks(gid, n)
    for rows in _by_rank(gid, rank, depth):
        g = gid[rows]
        p = vec.present[rows]
        f = vec.values[rows]
        cnt = count[g] + p
        first = p & (count[g] == 0)
        delta = f - mean[g]
        new_mean = mean[g] + delta / np.maximum(cnt, 1)
        new_acc = acc[g] + delta * (f - new_mean)
        mean[g] = np.where(first, f, np.where(p, new_mean, mean[g]))
        # As upstream, a group that starts with NaN or ±Inf has an undefined deviation.
        acc[g] = np.where(first, np.where(np.isfinite(f), 0.0, np.nan), np.where(p, new_acc, acc[g]))
        count[g] = cnt
    var = acc / np.maximum(count, 1)
    return np.sqrt(var) if sqrt else var


@aggregator("count_values", ValueType.STRING, result_unit="unitless")
def _count_values(ev: Evaluator, node: AggregateExpr, vec: StepVector, param: Param) -> StepVector:
    """Number of series per distinct value, the value in the label the parameter names."""
    label = str(param)
    if not is_valid_label_name(label):
        raise KqlEvaluationError(f"invalid label name {go_quote(label)}")
    steps = vec.values.shape[1]
    cells: dict[Labels, npt.NDArray[np.float64]] = {}
    base = _grouping_keys(vec.labels, node)
    hists = vec.hist_objects()
    present = vec.any_present()
    for i, key in enumerate(base):
        ev.checkpoint()
        for j in np.flatnonzero(present[i]):
            h = None if hists is None else hists[i, j]
            # A histogram counts under its text, Prometheus' FloatHistogram.String().
            text = format_sample_value(float(vec.values[i, j])) if h is None else str(h)
            out = tuple(sorted({**dict(key), label: text}.items()))
            row = cells.get(out)
            if row is None:
                # Every distinct value is a new dense row of the output: bound it before it grows.
                ev.dense(len(cells) + 1, steps)
                row = cells[out] = np.zeros(steps)
            row[j] += 1
    labels = list(cells)
    values = np.array([cells[k] for k in labels]).reshape(len(labels), steps)
    return StepVector(labels, values, values > 0, np.zeros(len(labels), dtype=bool))


@aggregator("topk", ValueType.SCALAR, histograms="ignored_whole")
@aggregator("bottomk", ValueType.SCALAR, histograms="ignored_whole")
@aggregator("limitk", ValueType.SCALAR)
@aggregator("limit_ratio", ValueType.SCALAR)
def _select_series(ev: Evaluator, node: AggregateExpr, vec: StepVector, param: Param) -> StepVector:
    """Series of each group chosen by value (topk, bottomk), by order (limitk) or by label hash (limit_ratio)."""
    values = np.asarray(param, dtype=np.float64)
    op = node.op
    steps = vec.values.shape[1]
    gid, groups, _ = _groups(vec.labels, node)
    keep = np.zeros_like(vec.present)
    if op == "limit_ratio":
        if np.isnan(values).any():
            raise KqlEvaluationError("Ratio value is NaN")
        outside = values[(values < -1) | (values > 1)]
        if len(outside):
            got, capped = float(outside[0]), float(np.clip(outside[0], -1, 1))
            ev.annotate(
                "warning",
                f"ratio value should be between -1 and 1, got {format_sample_value(got)}, "
                f"capping to {format_sample_value(capped)}",
                node.param.pos if node.param is not None else node.pos,
            )
        ratio = np.clip(values, -1, 1)
        offsets = np.array([_ratio_offset(lb) for lb in vec.labels])
        for j in range(steps):
            r = ratio[j]
            keep[:, j] = (offsets < r) if r >= 0 else (offsets >= 1 + r)
        keep &= vec.any_present()
        return vec.where(keep).compact()
    k = _k_values(values, node)
    # All steps at once: one sort of every column by (group, absent last, NaN last, value), the
    # rank of a cell within its group its position less the group's first. Rows of a group are
    # the same at every step, so each group starts at the same position of every sorted column.
    # (A sort per step was most of a range topk's time.)
    n = len(vec)
    # limitk keeps histogram samples too; topk/bottomk only see floats (the engine drops the rest).
    present = vec.any_present() if op == "limitk" else vec.present
    group_of = np.broadcast_to(gid[:, None], (n, steps))
    if op == "limitk":
        # The first k series of each group (the sort is stable: row order among equals).
        order = np.lexsort((~present, group_of), axis=0)
    else:
        # topk: largest first; bottomk: smallest first; NaN always last.
        vals = vec.values
        nan = np.isnan(vals)
        key = np.where(nan, 0.0, -vals if op == "topk" else vals)
        order = np.lexsort((key, nan, ~present, group_of), axis=0)
    sizes = np.bincount(gid, minlength=groups)
    first = np.cumsum(sizes) - sizes
    within = np.arange(n)[:, None] - first[gid[order]]
    chosen = (within < k[None, :]) & np.take_along_axis(present, order, axis=0)
    keep = np.empty_like(vec.present)
    np.put_along_axis(keep, order, chosen, axis=0)  # each column's order is a permutation
    out = vec.where(keep)
    if steps == 1:
        # An instant topk/bottomk lists each group's series best first.
        return out.take(order[:, 0][chosen[:, 0]])
    return out.compact()


def _ratio_offset(labels: Labels) -> float:
    return xxhash64(_labels_bytes(labels)) / 2.0**64


def _labels_bytes(labels: Labels) -> bytes:
    sep = b"\xff"
    out = bytearray()
    for k, v in labels:
        out += k.encode("utf-8", "surrogateescape") + sep + v.encode("utf-8", "surrogateescape") + sep
    return bytes(out)


_P1 = 11400714785074694791
_P2 = 14029467366897019727
_P3 = 1609587929392839161
_P4 = 9650029242287828579
_P5 = 2870177450012600261
_M = (1 << 64) - 1


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (64 - r))) & _M


def _round(acc: int, lane: int) -> int:
    acc = (acc + lane * _P2) & _M
    return (_rotl(acc, 31) * _P1) & _M


def _merge(acc: int, val: int) -> int:
    acc ^= _round(0, val)
    return (acc * _P1 + _P4) & _M


def xxhash64(data: bytes, seed: int = 0) -> int:
    """XXH64 (the hash Prometheus uses for label sets), in pure Python."""
    n = len(data)
    i = 0
    if n >= 32:
        v1 = (seed + _P1 + _P2) & _M
        v2 = (seed + _P2) & _M
        v3 = seed & _M
        v4 = (seed - _P1) & _M
        while i + 32 <= n:
            v1 = _round(v1, int.from_bytes(data[i : i + 8], "little"))
            v2 = _round(v2, int.from_bytes(data[i + 8 : i + 16], "little"))
            v3 = _round(v3, int.from_bytes(data[i + 16 : i + 24], "little"))
            v4 = _round(v4, int.from_bytes(data[i + 24 : i + 32], "little"))
            i += 32
        h = (_rotl(v1, 1) + _rotl(v2, 7) + _rotl(v3, 12) + _rotl(v4, 18)) & _M
        h = _merge(h, v1)
        h = _merge(h, v2)
        h = _merge(h, v3)
        h = _merge(h, v4)
    else:
        h = (seed + _P5) & _M
    h = (h + n) & _M
    while i + 8 <= n:
        h ^= _round(0, int.from_bytes(data[i : i + 8], "little"))
        h = (_rotl(h, 27) * _P1 + _P4) & _M
        i += 8
    if i + 4 <= n:
        h ^= (int.from_bytes(data[i : i + 4], "little") * _P1) & _M
        h = (_rotl(h, 23) * _P2 + _P3) & _M
        i += 4
    while i < n:
        h ^= (data[i] * _P5) & _M
        h = (_rotl(h, 11) * _P1) & _M
        i += 1
    h ^= h >> 33
    h = (h * _P2) & _M
    h ^= h >> 29
    h = (h * _P3) & _M
    h ^= h >> 32
    return h


# ------------------------------------------------------------------------------ native histograms
# What each aggregator does with histogram samples is its AggregatorSpec.histograms.


def _impl(ev: Evaluator, node: AggregateExpr, vec: StepVector, param: Param) -> StepVector:
    """The aggregator's implementation as registered (histogram cells handed over as they are)."""
    result: StepVector = AGGREGATORS[node.op].impl(ev, node, vec, param)
    return result


def _histogram_aggregate(ev: Evaluator, node: AggregateExpr, vec: StepVector, param: Param) -> StepVector:
    """An aggregation over a vector holding histograms (Prometheus' aggregation and aggregationK)."""

    op = node.op
    kind = AGGREGATORS[op].histograms
    if kind == "presence":
        return _impl(ev, node, presence_proxy(vec), param)
    if kind in ("ignored", "ignored_whole"):
        if vec.hist_present().any():
            ev.annotate(
                "info", ignored_in_aggregation(op), node.pos if kind == "ignored_whole" else node.expr.pos
            )
        return _impl(ev, node, vec.floats_only(), param)
    if kind not in ("sum", "mean"):
        return _impl(ev, node, vec, param)  # limitk, limit_ratio, count_values read histograms
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
    hists = vec.hists
    assert hists is not None
    # One member a group (sum by (kernel) (x)): each moved to its group's row, where it is.
    moved = hists.single(gid, n, mixed)
    if moved is not None:
        return _histogram_aggregated(ev, node, vec, param, gid, n, group_labels, mixed, moved)
    summed = hists.summed(gid, n, mixed, mean)
    if summed is not None:
        sums, collision = summed
        if collision:
            ev.annotate("warning", counter_reset_collision("aggregation"), node.expr.pos)
        return _histogram_aggregated(ev, node, vec, param, gid, n, group_labels, mixed, sums)
    objects = hists.objects()
    totals: OBJ = np.full((n, steps), None, dtype=object)
    comps: OBJ = np.full((n, steps), None, dtype=object)
    means: OBJ = np.full((n, steps), None, dtype=object)  # avg: Go's mean, incremental past overflow
    counts = np.zeros((n, steps), dtype=np.int64)
    bad = np.zeros((n, steps), dtype=bool)
    reset_seen = np.zeros((n, steps), dtype=bool)
    not_reset_seen = np.zeros((n, steps), dtype=bool)
    for k, (i, j, h) in enumerate(cells(objects)):
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
                check_compatible(acc, h)
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
    return _histogram_aggregated(ev, node, vec, param, gid, n, group_labels, mixed, object_cells(totals))


def _histogram_aggregated(
    ev: Evaluator,
    node: AggregateExpr,
    vec: StepVector,
    param: Param,
    gid: npt.NDArray[np.intp],
    n: int,
    group_labels: list[Labels],
    mixed: BOOL,
    hists: Hists | None,
) -> StepVector:
    """sum/avg's result: the groups' histograms (``hists``, in whatever form), and the
    float aggregation of the float samples (less the groups that held both kinds at a step)."""

    steps = vec.values.shape[1]
    drop = np.zeros(n, dtype=bool)
    if any(k == "__name__" for k in node.grouping) and not node.without:
        np.logical_or.at(drop, gid, vec.drop_name)
    floats = _impl(ev, node, vec.floats_only(), param)
    row_of = {lb: r for r, lb in enumerate(floats.labels)}
    values = np.zeros((n, steps))
    present = np.zeros((n, steps), dtype=bool)
    for g, lb in enumerate(group_labels):
        r = row_of.get(lb)
        if r is not None:
            values[g] = floats.values[r]
            present[g] = floats.present[r] & ~mixed[g]
    return StepVector(group_labels, values, present, drop, None, hists).compact()
