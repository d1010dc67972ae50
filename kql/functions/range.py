"""Functions over range vectors: rate and friends, the *_over_time family, regression and smoothing.

Every function sees all windows of all series at once (a :class:`RangeInput`). Sequential
algorithms (Kahan sums, Welford variance, regression) advance every window one sample at a
time in lock step, so the Python loop runs as many times as the longest window has samples.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Iterator
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from kernel_insight.kql import _windows
from kernel_insight.kql.aggregation import bad_quantile_message, quantiles_of_sorted_rows, sort_rows_nan_first
from kernel_insight.kql.ast import MatrixSelector
from kernel_insight.kql.errors import KqlEvaluationError
from kernel_insight.kql.functions._common import F64, M, S, V, labels_from_equal_matchers, range_result
from kernel_insight.kql.functions.registry import GridPushdown, function
from kernel_insight.kql.histogram.gomath import kahan_inc, kahan_inc_array, kahan_inc_into, two_sum_into
from kernel_insight.kql.values import (
    Arg,
    CallContext,
    RangeInput,
    StepVector,
    as_range,
    as_scalar,
    start_time_overlap_warning,
    start_time_overlaps,
    start_timestamp_resets,
)

__all__: list[str] = []

I64 = npt.NDArray[np.int64]
#: Any numpy element type: the helpers that only move values keep theirs.
_G = TypeVar("_G", bound=np.generic)


#: Windows with more samples than this (dense data, long ranges) are computed one window at a
#: time with numpy over the window instead of in lock step, which loops once per sample.
LOCKSTEP_LIMIT = 256

#: Values per matrix when windows are sorted side by side (``_Windows.sorted_chunks``): 32 MB.
SORT_CHUNK_VALUES = 4_000_000


class _Windows:
    """The (series, step) windows of a range input, flattened to 1-D.

    For lock-step algorithms the windows are ordered longest first, so the windows that still
    have a k-th sample are always a prefix: per-window state lives in arrays in that order
    (``sorted``), is updated through slices (views, no gather/scatter), and ``restore`` puts
    the results back in (series, step) order. Lock step stops at ``LOCKSTEP_LIMIT`` samples;
    the windows longer than that (``long()``, also a prefix) are then finished one at a time.
    """

    def __init__(self, r: RangeInput) -> None:
        self.r = r
        self.shape = r.lo.shape
        self.lo = r.lo.ravel()
        self.hi = r.hi.ravel()
        self.cnt = self.hi - self.lo
        self.n = len(self.lo)
        self.order = np.argsort(-self.cnt, kind="stable")
        self.sorted_lo = self.lo[self.order]
        self.sorted_cnt = self.cnt[self.order]

    def reshape(self, values: F64) -> F64:
        """Per-window values in (series, step) order as a (series, steps) array."""
        return values.reshape(self.shape)

    def sorted(self, values: npt.NDArray[_G]) -> npt.NDArray[_G]:
        """Per-window values in (series, step) order, rearranged into lock-step order."""
        return values[self.order]

    def restore(self, values: F64) -> F64:
        """Lock-step-ordered results as a (series, steps) array."""
        out = np.empty_like(values)
        out[self.order] = values
        return out.reshape(self.shape)

    def lockstep(self) -> Iterator[tuple[int, slice, I64]]:
        """Yield (k, the windows that have a k-th sample, that sample's flat index), k = 0, 1, ...

        The windows are a slice of the lock-step order; k stops below ``LOCKSTEP_LIMIT``.
        """
        longest = min(int(self.sorted_cnt[0]) if self.n else 0, LOCKSTEP_LIMIT)
        negative = -self.sorted_cnt
        for k in range(longest):
            if k % 32 == 31:
                self.r.checkpoint()
            m = int(np.searchsorted(negative, -k, side="left"))
            yield k, slice(0, m), self.sorted_lo[:m] + k

    def long(self) -> Iterator[tuple[int, F64, I64]]:
        """(lock-step position, values, timestamps) of every window lock step did not finish."""
        n_long = int(np.searchsorted(-self.sorted_cnt, -LOCKSTEP_LIMIT, side="left"))
        for j in range(n_long):
            self.r.checkpoint()
            a = int(self.sorted_lo[j])
            b = a + int(self.sorted_cnt[j])
            yield j, self.r.vs[a:b], self.r.ts[a:b]

    def sorted_chunks(self) -> Iterator[tuple[I64, F64, I64]]:
        """(flat window indices, their values sorted as Prometheus sorts them, counts), chunk by chunk.

        Each chunk's windows are the rows of one matrix (``sort_rows_nan_first``). Windows come
        longest first, so a chunk is padded to about its own windows' length, and a chunk holds
        at most ``SORT_CHUNK_VALUES`` values.
        """
        nonempty = int(np.count_nonzero(self.sorted_cnt))
        start = 0
        while start < nonempty:
            width = int(self.sorted_cnt[start])
            stop = min(nonempty, start + max(1, SORT_CHUNK_VALUES // width))
            windows = self.order[start:stop]
            counts = self.cnt[windows]
            cols = np.arange(width)
            valid = cols[None, :] < counts[:, None]
            values = self.r.vs[np.where(valid, self.lo[windows][:, None] + cols[None, :], 0)]
            yield windows, sort_rows_nan_first(values, valid), counts
            start = stop
            self.r.checkpoint()

    def per_window(self) -> Iterator[tuple[int, F64]]:
        """Yield (flat window index, its values) for every non-empty window (Python loop)."""
        vs = self.r.vs
        for i, w in enumerate(np.flatnonzero(self.cnt > 0)):
            if i % 1024 == 1023:
                self.r.checkpoint()
            yield int(w), vs[self.lo[w] : self.hi[w]]


def _f64(values: F64) -> F64:
    """``values`` as the C loops read them: contiguous float64 (usually already so: no copy)."""
    return np.ascontiguousarray(values, dtype=np.float64)


def _i64(values: I64) -> I64:
    return np.ascontiguousarray(values, dtype=np.int64)


def _reduce(r: RangeInput, ufunc: np.ufunc) -> F64:
    """``ufunc.reduce`` over every window via reduceat on (lo, hi) pairs."""
    w = _Windows(r)
    out = np.full(w.n, np.nan)
    nonempty = np.flatnonzero(w.cnt > 0)
    if len(nonempty):
        padded = np.append(r.vs, np.nan)
        pairs = np.empty(2 * len(nonempty), dtype=np.intp)
        pairs[0::2] = w.lo[nonempty]
        pairs[1::2] = w.hi[nonempty]
        out[nonempty] = ufunc.reduceat(padded, pairs)[0::2]
    return w.reshape(out)


def _present(r: RangeInput, minimum: int = 1) -> npt.NDArray[np.bool_]:
    present: npt.NDArray[np.bool_] = r.counts >= minimum
    return present


def _exact_sum(values: F64) -> float:
    """Correctly rounded sum of a long window (Kahan is exact to about the same degree)."""
    if not np.isfinite(values).all():
        return float(np.sum(values))  # inf, -inf or NaN, as the compensated sum gives
    try:
        return math.fsum(values)
    except OverflowError:
        return float(np.sum(values))


#: Variances of windows that all reach the lock step's length go through whole arrays (_variance).
DENSE_VARIANCE = True

#: Kahan sums, variances and regression sums run window by window in C (kql/native/windowsmodule.c:
#: the same operations in the same order, the same bits) instead of numpy's lock step, whose
#: dozen ufuncs per sample each have a fixed cost a call (``make bench-kql``). False: the numpy paths (the tests compare the two).
NATIVE_WINDOWS = True

#: Windows at least this full (samples over windows x the longest one) are summed side by side
#: as one padded matrix (_dense_kahan_totals) rather than through lock-step slices.
DENSE_KAHAN_FILL = 0.9


def _kahan_totals(w: _Windows) -> tuple[F64, F64]:
    """Kahan-Neumaier sum and compensation of every window, in lock-step order.

    The compensation is meaningless where the sum ended infinite or NaN (the callers take the
    sum there, as Prometheus does).
    """
    total = np.zeros(w.n)
    comp = np.zeros(w.n)
    longest = min(int(w.sorted_cnt[0]) if w.n else 0, LOCKSTEP_LIMIT)
    filled = int(np.minimum(w.sorted_cnt, longest).sum())
    if NATIVE_WINDOWS:
        _windows.kahan(_f64(w.r.vs), _i64(w.sorted_lo), _i64(w.sorted_cnt), LOCKSTEP_LIMIT, total, comp)
    elif longest and w.n * longest <= SORT_CHUNK_VALUES and filled >= DENSE_KAHAN_FILL * w.n * longest:
        _dense_kahan_totals(w, longest, total, comp)
    else:
        t_buf, b_buf = np.empty(w.n), np.empty(w.n)
        for _k, active, idx in w.lockstep():
            m = len(idx)
            kahan_inc_into(total[active], comp[active], w.r.vs[idx], t_buf[:m], b_buf[:m])
    for j, values, _ in w.long():
        total[j], comp[j] = _exact_sum(values), 0.0
    return total, comp


def _dense_kahan_totals(w: _Windows, longest: int, total: F64, comp: F64) -> None:
    """:func:`_kahan_totals`' lock step over windows of (nearly) equal length, as regular scrapes give.

    The first ``longest`` samples of every window are laid out as one (sample, window) matrix
    padded with +0.0, which leaves a Kahan sum and its compensation as they were (a sum that
    starts at +0.0 is never -0.0); each step is then seven ufuncs on whole rows, no slicing,
    gathering or copying back (half the numpy calls of ``kahan_inc_into`` through slices: an
    instant ``avg_over_time(x[1h])`` of 200 series loops 240 times). The compensation is not
    reset where the sum turns infinite: from there the sum stays infinite or NaN, and the
    callers take the sum alone.
    """
    cols = np.arange(longest)
    valid = cols[:, None] < w.sorted_cnt[None, :]
    values = np.where(valid, w.r.vs[np.where(valid, w.sorted_lo[None, :] + cols[:, None], 0)], 0.0)
    s, t = total, np.empty(w.n)
    bb = np.empty(w.n)
    for k in range(longest):
        if k % 32 == 31:
            w.r.checkpoint()
        two_sum_into(s, values[k], t, bb)  # the row is our own matrix's: overwritten as scratch
        np.add(comp, bb, out=comp)
        s, t = t, s
    if s is not total:
        total[...] = s


def _kahan_sum(r: RangeInput) -> F64:
    w = _Windows(r)
    total, comp = _kahan_totals(w)
    return w.restore(np.where(np.isinf(total), total, total + comp))


def _kahan_mean(r: RangeInput) -> F64:
    """Prometheus' avg_over_time: direct Kahan mean, incremental once the sum would overflow."""
    w = _Windows(r)
    longest = int(w.sorted_cnt[0]) if w.n else 0
    if len(r.vs) == 0 or (np.isfinite(r.vs).all() and float(np.abs(r.vs).max()) * longest < 1e307):
        # No running sum can overflow, so Prometheus never switches to the incremental mean.
        total, comp = _kahan_totals(w)
        count = np.maximum(w.sorted_cnt, 1).astype(np.float64)
        return w.restore(total / count + comp / count)
    total = np.zeros(w.n)
    comp = np.zeros(w.n)
    mean = np.zeros(w.n)
    incremental = np.zeros(w.n, dtype=bool)
    for k, active, idx in w.lockstep():
        f = r.vs[idx]
        if k == 0:
            total[active] = f
            continue
        count = k + 1.0
        t, c, m, inc = total[active], comp[active], mean[active], incremental[active]
        new_t, new_c = kahan_inc_array(f, t, c)
        overflow = ~inc & np.isinf(new_t)
        direct = ~inc & ~overflow
        m = np.where(overflow, t / (count - 1), m)
        c_inc = np.where(overflow, c / (count - 1), c)
        q = (count - 1) / count
        im, ic = kahan_inc_array(f / count, q * m, q * c_inc)
        total[active] = np.where(direct, new_t, t)
        comp[active] = np.where(direct, new_c, ic)
        mean[active] = np.where(direct, m, im)
        incremental[active] = inc | overflow
    count = np.maximum(w.sorted_cnt, 1).astype(np.float64)
    result = np.where(incremental, mean + comp, total / count + comp / count)
    for j, values, _ in w.long():
        result[j] = _sequential_mean(values)
    return w.restore(result)


def _sequential_mean(values: F64) -> float:
    """Prometheus' avg_over_time for one window, step by step (only for sums that may overflow)."""
    total, comp, mean, incremental = float(values[0]), 0.0, 0.0, False
    for i, f in enumerate(values[1:].tolist(), start=2):
        count = float(i)
        if not incremental:
            new_t, new_c = kahan_inc(f, total, comp)
            if not math.isinf(new_t):
                total, comp = new_t, new_c
                continue
            incremental = True
            mean, comp = total / (count - 1), comp / (count - 1)
        q = (count - 1) / count
        mean, comp = kahan_inc(f / count, q * mean, q * comp)
    return mean + comp if incremental else total / len(values) + comp / len(values)


def _variance(r: RangeInput) -> F64:
    w = _Windows(r)
    mean = np.zeros(w.n)
    c_mean = np.zeros(w.n)
    aux = np.zeros(w.n)
    c_aux = np.zeros(w.n)
    # Scratch space reused by every step (the active windows are always a prefix).
    f_buf, d_buf, x_buf, t_buf, b_buf = (np.empty(w.n) for _ in range(5))
    longest = min(int(w.sorted_cnt[0]) if w.n else 0, LOCKSTEP_LIMIT)
    result = None
    if NATIVE_WINDOWS:
        result = np.empty(w.n)
        _windows.variance(_f64(r.vs), _i64(w.sorted_lo), _i64(w.sorted_cnt), LOCKSTEP_LIMIT, result)
        lock_step: Iterable[tuple[int, slice, I64]] = ()
    elif (
        DENSE_VARIANCE and longest and int(w.sorted_cnt[-1]) >= longest and w.n * longest <= SORT_CHUNK_VALUES
    ):
        # Every window has a sample at each step of the lock step (regular scrapes): the same
        # operations on whole arrays, the samples gathered once as a (step, window) matrix
        # instead of a take and a dozen slices per step (a large part of an instant query).
        steps = r.vs[w.sorted_lo[None, :] + np.arange(longest)[:, None]]
        for k in range(longest):
            if k % 32 == 31:
                w.r.checkpoint()
            f = steps[k]
            np.add(mean, c_mean, out=d_buf)
            np.subtract(f, d_buf, out=d_buf)
            np.divide(d_buf, k + 1.0, out=x_buf)
            kahan_inc_into(mean, c_mean, x_buf, t_buf, b_buf)
            np.add(mean, c_mean, out=x_buf)
            np.subtract(f, x_buf, out=x_buf)
            np.multiply(d_buf, x_buf, out=x_buf)
            kahan_inc_into(aux, c_aux, x_buf, t_buf, b_buf)
        lock_step = ()
    else:
        lock_step = w.lockstep()
    for k, active, idx in lock_step:
        m = len(idx)
        f = np.take(r.vs, idx, out=f_buf[:m])
        delta, x = d_buf[:m], x_buf[:m]
        np.add(mean[active], c_mean[active], out=delta)
        np.subtract(f, delta, out=delta)
        np.divide(delta, k + 1.0, out=x)
        kahan_inc_into(mean[active], c_mean[active], x, t_buf[:m], b_buf[:m])
        np.add(mean[active], c_mean[active], out=x)
        np.subtract(f, x, out=x)
        np.multiply(delta, x, out=x)
        kahan_inc_into(aux[active], c_aux[active], x, t_buf[:m], b_buf[:m])
    if result is None:
        result = (aux + c_aux) / np.maximum(w.sorted_cnt, 1)
    for j, values, _ in w.long():
        result[j] = _long_variance(values)
    return w.restore(result)


def _long_variance(values: F64) -> float:
    """The population variance of a window past the lock step, from correctly rounded sums.

    Squares past the float range make the variance +Inf, as Prometheus' compensated sum of them
    gives, instead of fsum's OverflowError (which was a 500 for a query over ~1e154 values).
    """
    if not np.isfinite(values).all():
        return math.nan
    try:
        center = math.fsum(values) / len(values)
    except OverflowError:  # the sum leaves the range, the mean does not: Prometheus' running mean
        center = _sequential_mean(values)
    with np.errstate(over="ignore"):
        squares = (values - center) ** 2
    return _exact_sum(squares) / len(values)


def _window_values(r: RangeInput) -> tuple[F64, F64, I64, I64]:
    """First and last value and timestamp of every window (garbage where empty)."""
    lo = np.minimum(r.lo, max(len(r.vs) - 1, 0))
    last = np.maximum(r.hi - 1, 0)
    if len(r.vs) == 0:
        zeros = np.zeros(r.lo.shape)
        return zeros, zeros, r.lo * 0, r.lo * 0
    return r.vs[lo], r.vs[last], r.ts[lo], r.ts[last]


def _prefix(values: F64) -> F64:
    out = np.zeros(len(values) + 1)
    np.cumsum(values, out=out[1:])
    return out


def _same_series_prev(r: RangeInput) -> npt.NDArray[np.bool_]:
    """For every flat sample: whether the previous flat sample belongs to the same series."""
    same = np.ones(len(r.vs), dtype=bool)
    starts = r.offsets[:-1]
    same[starts[starts < len(r.vs)]] = False
    if len(same):
        same[0] = False
    return same


def _previous(values: npt.NDArray[_G]) -> npt.NDArray[_G]:
    """Each flat sample's predecessor's value (garbage, 0, for a series' first sample)."""
    return np.concatenate([np.zeros(1, values.dtype), values[:-1]]) if len(values) else values


def _resets_at(r: RangeInput, same: npt.NDArray[np.bool_]) -> npt.NDArray[np.bool_]:
    """Per flat sample: whether the counter reset between its series' previous sample and it, by
    the value going down or, where the samples carry them, by the start timestamp."""
    prev = _previous(r.vs)
    hit: npt.NDArray[np.bool_] = same & (r.vs < prev)
    if r.st is not None:
        hit |= same & start_timestamp_resets(_previous(r.st), _previous(r.ts), r.st, r.ts)
    return hit


def _in_window_count(r: RangeInput, hits: npt.NDArray[np.bool_] | F64) -> F64:
    """Per window: the sum of ``hits`` over its samples but the first (pairs inside the window)."""
    pre = _prefix(np.asarray(hits, dtype=np.float64))
    inner_lo = np.minimum(r.lo + 1, r.hi)
    result: F64 = pre[r.hi] - pre[inner_lo]
    return result


def _reset_corrections(r: RangeInput) -> F64:
    """Sum, per window, of the values before each counter reset inside the window."""
    return _in_window_count(r, np.where(_resets_at(r, _same_series_prev(r)), _previous(r.vs), 0.0))


def _warn_start_time_overlaps(ctx: CallContext, r: RangeInput) -> None:
    """Prometheus' warning, once per series, for a start timestamp inside the previous sample's
    span in a window (neither a delta's nor a cumulative's): rate and increase only."""
    if r.st is None:
        return
    same = _same_series_prev(r)
    overlaps = same & start_time_overlaps(_previous(r.st), _previous(r.ts), r.st)
    if not overlaps.any():
        return
    hit = _in_window_count(r, overlaps) > 0
    for i in np.flatnonzero(hit.any(axis=1)).tolist():
        ctx.warn(start_time_overlap_warning(dict(r.labels[i]).get("__name__", "")), ctx.node.args[0].pos)


def _extrapolated(ctx: CallContext, r: RangeInput, counter: bool, per_second: bool) -> StepVector:
    if r.anchored or r.smoothed:
        return _anchored_or_smoothed(ctx, r, counter, per_second)
    present = _present(r, 2)
    first_v, last_v, first_t, last_t = _window_values(r)
    result = last_v - first_v
    if counter:
        result = result + _reset_corrections(r)
        _warn_start_time_overlaps(ctx, r)
    range_start = (r.end - r.range_ms)[None, :]
    range_end = r.end[None, :]
    to_start = (first_t - range_start) / 1000.0
    to_end = (range_end - last_t) / 1000.0
    sampled = (last_t - first_t) / 1000.0
    average = sampled / np.maximum(r.counts - 1, 1)
    threshold = average * 1.1
    to_start = np.where(to_start >= threshold, average / 2, to_start)
    if counter:
        zero_point = np.where(result != 0, sampled * (first_v / np.where(result != 0, result, 1)), np.inf)
        use_zero = (result > 0) & (first_v >= 0) & (zero_point < to_start)
        to_start = np.where(use_zero, zero_point, to_start)
        from_start = _starts_in_range(r, first_t, range_start) if r.st is not None else None
        if from_start is not None:
            # Prometheus: a first sample whose start timestamp lies inside the range counts from a
            # zero at that time instead of extrapolating left (one sample is then enough).
            st0, use = from_start
            present = present | use
            result = np.where(use, result + first_v, result)
            to_start = np.where(use, 0.0, to_start)
            sampled = np.where(use, (last_t - st0) / 1000.0, sampled)
    to_end = np.where(to_end >= threshold, average / 2, to_end)
    factor = (sampled + to_start + to_end) / np.where(sampled != 0, sampled, 1.0)
    factor = np.where(sampled != 0, factor, 1.0)
    if per_second:
        factor = factor / (r.range_ms / 1000.0)
    return range_result(r, result * factor, present)


def _starts_in_range(
    r: RangeInput, first_t: I64, range_start: I64
) -> tuple[I64, npt.NDArray[np.bool_]] | None:
    """Per window: its first sample's start timestamp, and whether it lies inside the range and
    before the sample (then rate counts from zero there); None when no window's does."""
    assert r.st is not None
    st0 = r.st[np.minimum(r.lo, len(r.st) - 1)] if len(r.st) else np.zeros(r.lo.shape, np.int64)
    use: npt.NDArray[np.bool_] = (r.counts > 0) & (st0 != 0) & (st0 > range_start) & (st0 < first_t)
    return (st0, use) if use.any() else None


@function(
    "rate",
    (M,),
    V,
    pushdown=GridPushdown(),
    anchored=True,
    smoothed=True,
    start_timestamps=True,
    result_unit="per_second",
)
def _rate(ctx: CallContext, args: list[Arg]) -> StepVector:
    """Per-second increase of a counter over the range, extrapolated to the range boundaries."""
    return _extrapolated(ctx, as_range(args[0]), counter=True, per_second=True)


@function(
    "increase",
    (M,),
    V,
    pushdown=GridPushdown(),
    anchored=True,
    smoothed=True,
    start_timestamps=True,
)
def _increase(ctx: CallContext, args: list[Arg]) -> StepVector:
    """Increase of a counter over the range, extrapolated to the range boundaries."""
    return _extrapolated(ctx, as_range(args[0]), counter=True, per_second=False)


@function("delta", (M,), V, pushdown=GridPushdown(), anchored=True, smoothed=True)
def _delta(ctx: CallContext, args: list[Arg]) -> StepVector:
    """Difference between first and last value of a gauge, extrapolated to the range boundaries."""
    return _extrapolated(ctx, as_range(args[0]), counter=False, per_second=False)


def _instant(r: RangeInput, is_rate: bool) -> StepVector:
    present = _present(r, 2)
    last = np.maximum(r.hi - 1, 0)
    prev = np.maximum(r.hi - 2, 0)
    if len(r.vs) == 0:
        return StepVector.empty(r.steps)
    lv, pv = r.vs[last], r.vs[prev]
    result = lv - pv
    if is_rate:
        reset = lv < pv
        if r.st is not None:
            reset |= start_timestamp_resets(r.st[prev], r.ts[prev], r.st[last], r.ts[last])
        result = np.where(reset, lv, result)
        interval = (r.ts[last] - r.ts[prev]).astype(np.float64)
        present = present & (interval != 0)
        result = result / np.where(interval != 0, interval, 1.0) * 1000.0
    return range_result(r, result, present)


@function("irate", (M,), V, pushdown=GridPushdown(), start_timestamps=True, result_unit="per_second")
def _irate(ctx: CallContext, args: list[Arg]) -> StepVector:
    """Per-second rate from the last two samples of the range (counter resets handled)."""
    return _instant(as_range(args[0]), is_rate=True)


@function("idelta", (M,), V, pushdown=GridPushdown())
def _idelta(ctx: CallContext, args: list[Arg]) -> StepVector:
    """Difference between the last two samples of the range."""
    return _instant(as_range(args[0]), is_rate=False)


def _regression(r: RangeInput, intercept_ms: I64 | None) -> tuple[F64, F64]:
    """Least-squares slope and intercept per window (Kahan sums, as Prometheus).

    The intercept is taken at ``intercept_ms`` per step, or at each window's first sample.
    """
    w = _Windows(r)
    if intercept_ms is None:
        t0 = r.ts[np.minimum(w.lo, max(len(r.ts) - 1, 0))] if len(r.ts) else np.zeros(w.n, dtype=np.int64)
    else:
        t0 = np.broadcast_to(intercept_ms[None, :], w.shape).ravel()
    t0 = w.sorted(t0)
    # The four sums (x, y, xy, x2) as the rows of one array: one Kahan step adds a sample to all
    # four (elementwise the same arithmetic as four steps, a quarter of the numpy calls).
    total, comp = np.zeros((4, w.n)), np.zeros((4, w.n))
    first_y = np.zeros(w.n)
    const_y = np.ones(w.n, dtype=bool)
    inc, t_buf, b_buf = np.empty((4, w.n)), np.empty((4, w.n)), np.empty((4, w.n))
    longest = min(int(w.sorted_cnt[0]) if w.n else 0, LOCKSTEP_LIMIT)
    lock_step: Iterable[tuple[int, slice, I64]] = w.lockstep()
    if NATIVE_WINDOWS:
        const = np.empty(w.n, dtype=np.uint8)
        _windows.regression(
            _f64(r.vs),
            _i64(r.ts),
            _i64(w.sorted_lo),
            _i64(w.sorted_cnt),
            _i64(t0),
            LOCKSTEP_LIMIT,
            total,
            comp,
            first_y,
            const,
        )
        const_y = const.astype(bool)
        lock_step = ()
    elif (
        DENSE_VARIANCE
        and longest
        and int(w.sorted_cnt[-1]) >= longest
        and 4 * w.n * longest <= SORT_CHUNK_VALUES
    ):
        # Every window has a sample at each step (regular scrapes): x, y, xy and x2 of all steps
        # at once, then only the Kahan steps, on whole arrays (the same arithmetic, the same bits).
        where = w.sorted_lo[None, :] + np.arange(longest)[:, None]
        steps = np.empty((longest, 4, w.n))
        steps[:, 1] = r.vs[where]
        steps[:, 0] = (r.ts[where] - t0[None, :]) / 1000.0
        np.multiply(steps[:, 0], steps[:, 1], out=steps[:, 2])
        np.multiply(steps[:, 0], steps[:, 0], out=steps[:, 3])
        first_y[:] = steps[0, 1]
        const_y &= (steps[:, 1] == first_y[None, :]).all(axis=0)
        for k in range(longest):
            if k % 32 == 31:
                w.r.checkpoint()
            kahan_inc_into(total, comp, steps[k], t_buf, b_buf)
        lock_step = ()
    for k, active, idx in lock_step:
        m = len(idx)
        y = r.vs[idx]
        x = (r.ts[idx] - t0[active]) / 1000.0
        if k == 0:
            first_y[active] = y
        else:
            const_y[active] &= y == first_y[active]
        step = inc[:, :m]
        step[0], step[1] = x, y
        np.multiply(x, y, out=step[2])
        np.multiply(x, x, out=step[3])
        kahan_inc_into(total[:, active], comp[:, active], step, t_buf[:, :m], b_buf[:, :m])
    for j, values, stamps in w.long():
        x = (stamps - t0[j]) / 1000.0
        first_y[j] = values[0]
        const_y[j] = bool((values == values[0]).all())
        for row, value in enumerate((x, values, x * values, x * x)):
            total[row, j], comp[row, j] = _exact_sum(value), 0.0
    n = w.sorted_cnt.astype(np.float64)
    sx, sy, sxy, sx2 = total + comp
    safe_n = np.maximum(n, 1)
    cov = sxy - sx * sy / safe_n
    var = sx2 - sx * sx / safe_n
    slope = cov / var
    intercept = sy / safe_n - slope * sx / safe_n
    inf_y = np.isinf(first_y)
    slope = np.where(const_y, np.where(inf_y, np.nan, 0.0), slope)
    intercept = np.where(const_y, np.where(inf_y, np.nan, first_y), intercept)
    return w.restore(slope), w.restore(intercept)


@function(
    "deriv",
    (M,),
    V,
    pushdown=GridPushdown(),
    histogram_samples="mixed_range_info",
    result_unit="per_second",
)
def _deriv(ctx: CallContext, args: list[Arg]) -> StepVector:
    """Per-second derivative of a gauge by simple linear regression."""
    r = as_range(args[0])
    slope, _ = _regression(r, None)
    return range_result(r, slope, _present(r, 2))


@function("predict_linear", (M, S), V, time_dependent=True, histogram_samples="mixed_range_info")
def _predict_linear(ctx: CallContext, args: list[Arg]) -> StepVector:
    """Value of a gauge ``t`` seconds from now, by simple linear regression."""
    r, horizon = as_range(args[0]), as_scalar(args[1])
    slope, intercept = _regression(r, ctx.times)
    return range_result(r, slope * horizon[None, :] + intercept, _present(r, 2))


def _count_changes(r: RangeInput, resets: bool) -> StepVector:
    same = _same_series_prev(r)
    prev = _previous(r.vs)
    hit = _resets_at(r, same) if resets else same & (r.vs != prev) & ~(np.isnan(r.vs) & np.isnan(prev))
    counts = _in_window_count(r, hit)
    if r.anchored:
        counts = counts + _anchored_first_change(r, resets)
    return range_result(r, counts, _present(r, 1))


def _anchored_first_change(r: RangeInput, resets: bool) -> F64:
    """With `anchored`, the window also compares its first sample with the one before it."""
    has_prev = (r.lo > r.offsets[:-1, None]) & (r.hi > r.lo)
    prev_idx = np.maximum(r.lo - 1, 0)
    if len(r.vs) == 0:
        return np.zeros(r.lo.shape)
    prev_v, first_v = r.vs[prev_idx], r.vs[np.minimum(r.lo, len(r.vs) - 1)]
    in_lookback = r.ts[prev_idx] > (r.end[None, :] - r.range_ms - 300_000)
    change = first_v < prev_v if resets else (first_v != prev_v) & ~(np.isnan(first_v) & np.isnan(prev_v))
    result: F64 = (has_prev & in_lookback & change).astype(np.float64)
    return result


@function("changes", (M,), V, pushdown=GridPushdown(), anchored=True, result_unit="unitless")
def _changes(ctx: CallContext, args: list[Arg]) -> StepVector:
    """Number of times the value changed within the range."""
    return _count_changes(as_range(args[0]), resets=False)


@function(
    "resets", (M,), V, pushdown=GridPushdown(), anchored=True, start_timestamps=True, result_unit="unitless"
)
def _resets(ctx: CallContext, args: list[Arg]) -> StepVector:
    """Number of counter resets (decreases) within the range."""
    return _count_changes(as_range(args[0]), resets=True)


@function("sum_over_time", (M,), V, pushdown=GridPushdown())
def _sum_over_time(ctx: CallContext, args: list[Arg]) -> StepVector:
    """Sum of all samples in the range (Kahan summation)."""
    r = as_range(args[0])
    return range_result(r, _kahan_sum(r), _present(r))


@function("avg_over_time", (M,), V, pushdown=GridPushdown())
def _avg_over_time(ctx: CallContext, args: list[Arg]) -> StepVector:
    """Mean of all samples in the range."""
    r = as_range(args[0])
    return range_result(r, _kahan_mean(r), _present(r))


@function("count_over_time", (M,), V, pushdown=GridPushdown(), result_unit="unitless")
def _count_over_time(ctx: CallContext, args: list[Arg]) -> StepVector:
    """Number of samples in the range."""
    r = as_range(args[0])
    return range_result(r, r.counts.astype(np.float64), _present(r))


@function(
    "min_over_time",
    (M,),
    V,
    pushdown=GridPushdown(),
    histogram_samples="mixed_range_info",
)
def _min_over_time(ctx: CallContext, args: list[Arg]) -> StepVector:
    """Smallest sample in the range (NaN only if all are NaN)."""
    r = as_range(args[0])
    return range_result(r, _reduce(r, np.fmin), _present(r))


@function(
    "max_over_time",
    (M,),
    V,
    pushdown=GridPushdown(),
    histogram_samples="mixed_range_info",
)
def _max_over_time(ctx: CallContext, args: list[Arg]) -> StepVector:
    """Largest sample in the range (NaN only if all are NaN)."""
    r = as_range(args[0])
    return range_result(r, _reduce(r, np.fmax), _present(r))


@function("last_over_time", (M,), V, pushdown=GridPushdown(keeps_name=True))
def _last_over_time(ctx: CallContext, args: list[Arg]) -> StepVector:
    """Most recent sample in the range; keeps the metric name."""
    r = as_range(args[0])
    _, last_v, _, _ = _window_values(r)
    return range_result(r, last_v, _present(r), keep_name=True)


@function("first_over_time", (M,), V)
def _first_over_time(ctx: CallContext, args: list[Arg]) -> StepVector:
    """Oldest sample in the range; keeps the metric name."""
    r = as_range(args[0])
    first_v, _, _, _ = _window_values(r)
    return range_result(r, first_v, _present(r), keep_name=True)


@function("ts_of_last_over_time", (M,), V, experimental=True)
def _ts_of_last(ctx: CallContext, args: list[Arg]) -> StepVector:
    """Timestamp (seconds) of the most recent sample in the range."""
    r = as_range(args[0])
    _, _, _, last_t = _window_values(r)
    return range_result(r, last_t / 1000.0, _present(r))


@function("ts_of_first_over_time", (M,), V, experimental=True)
def _ts_of_first(ctx: CallContext, args: list[Arg]) -> StepVector:
    """Timestamp (seconds) of the oldest sample in the range."""
    r = as_range(args[0])
    _, _, first_t, _ = _window_values(r)
    return range_result(r, first_t / 1000.0, _present(r))


def _ts_of_extreme(r: RangeInput, largest: bool) -> StepVector:
    w = _Windows(r)
    best = np.full(w.n, np.nan)
    best_t = np.zeros(w.n)
    for k, active, idx in w.lockstep():
        f = r.vs[idx]
        cur = best[active]
        better = (f >= cur if largest else f <= cur) | np.isnan(cur) | (k == 0)
        best[active] = np.where(better, f, cur)
        best_t[active] = np.where(better, r.ts[idx] / 1000.0, best_t[active])
    for j, values, stamps in w.long():
        # What the comparison above ends with: the last occurrence of the extreme non-NaN
        # value, or the last sample when all are NaN.
        finite = ~np.isnan(values)
        extreme = (values.max() if largest else values.min()) if finite.all() else None
        if extreme is None and finite.any():
            extreme = values[finite].max() if largest else values[finite].min()
        hits = np.flatnonzero(values == extreme) if extreme is not None else [len(values) - 1]
        best_t[j] = stamps[hits[-1]] / 1000.0
    return range_result(r, w.restore(best_t), _present(r))


@function("ts_of_max_over_time", (M,), V, experimental=True, histogram_samples="mixed_range_info")
def _ts_of_max(ctx: CallContext, args: list[Arg]) -> StepVector:
    """Timestamp (seconds) of the largest sample in the range (the last one on ties)."""
    return _ts_of_extreme(as_range(args[0]), largest=True)


@function("ts_of_min_over_time", (M,), V, experimental=True, histogram_samples="mixed_range_info")
def _ts_of_min(ctx: CallContext, args: list[Arg]) -> StepVector:
    """Timestamp (seconds) of the smallest sample in the range (the last one on ties)."""
    return _ts_of_extreme(as_range(args[0]), largest=False)


@function("stddev_over_time", (M,), V, histogram_samples="mixed_range_info")
def _stddev_over_time(ctx: CallContext, args: list[Arg]) -> StepVector:
    """Population standard deviation of the samples in the range."""
    r = as_range(args[0])
    return range_result(r, np.sqrt(_variance(r)), _present(r))


@function("stdvar_over_time", (M,), V, histogram_samples="mixed_range_info")
def _stdvar_over_time(ctx: CallContext, args: list[Arg]) -> StepVector:
    """Population variance of the samples in the range."""
    r = as_range(args[0])
    return range_result(r, _variance(r), _present(r))


@function("quantile_over_time", (S, M), V, histogram_samples="mixed_range_info")
def _quantile_over_time(ctx: CallContext, args: list[Arg]) -> StepVector:
    """The φ-quantile (0 ≤ φ ≤ 1) of the samples in the range."""
    q, r = as_scalar(args[0]), as_range(args[1])
    present = _present(r)
    # Prometheus warns per series it answers: only at steps where some window holds floats.
    message = bad_quantile_message(np.asarray(q, dtype=np.float64)[present.any(axis=0)])
    if message is not None:
        ctx.warn(message, ctx.node.args[0].pos)
    w = _Windows(r)
    out = np.full(w.n, np.nan)
    steps = r.steps
    for windows, ordered, counts in w.sorted_chunks():
        phi = np.asarray(q, dtype=np.float64)[windows % steps]
        out[windows] = quantiles_of_sorted_rows(phi, ordered, counts)
    return range_result(r, w.reshape(out), present)


@function("mad_over_time", (M,), V, experimental=True, histogram_samples="mixed_range_info")
def _mad_over_time(ctx: CallContext, args: list[Arg]) -> StepVector:
    """Median absolute deviation of the samples in the range (NaN if any sample is NaN)."""
    r = as_range(args[0])
    w = _Windows(r)
    out = np.full(w.n, np.nan)
    for i, values in w.per_window():
        if np.isnan(values).any():
            continue
        median = float(np.median(values))
        out[i] = float(np.median(np.abs(values - median)))
    return range_result(r, w.reshape(out), _present(r))


@function("present_over_time", (M,), V, result_unit="unitless")
def _present_over_time(ctx: CallContext, args: list[Arg]) -> StepVector:
    """1 for every series that has a sample in the range."""
    r = as_range(args[0])
    return range_result(r, np.ones(r.lo.shape), _present(r))


@function("absent_over_time", (M,), V, result_unit="unitless")
def _absent_over_time(ctx: CallContext, args: list[Arg]) -> StepVector:
    """1, with the selector's equality labels, at steps where no series has a sample in the range."""
    r = as_range(args[0])
    arg = ctx.node.args[0]
    labels = labels_from_equal_matchers(arg.vector.all_matchers()) if isinstance(arg, MatrixSelector) else ()
    empty = ~(r.counts > 0).any(axis=0) if len(r) else np.ones(ctx.steps, dtype=bool)
    out = StepVector([labels], np.ones((1, ctx.steps)), empty.reshape(1, -1), np.zeros(1, dtype=bool))
    return out.compact()


@function(
    "double_exponential_smoothing", (M, S, S), V, experimental=True, histogram_samples="mixed_range_info"
)
def _double_exponential_smoothing(ctx: CallContext, args: list[Arg]) -> StepVector:
    """Holt's double exponential smoothing with smoothing factor ``sf`` and trend factor ``tf``."""
    r, sf_arr, tf_arr = as_range(args[0]), as_scalar(args[1]), as_scalar(args[2])
    for name, arr in (("smoothing", sf_arr), ("trend", tf_arr)):
        bad = arr[~((arr > 0) & (arr < 1))]
        if len(bad):
            short = "sf" if name == "smoothing" else "tf"
            raise KqlEvaluationError(f"invalid {name} factor. Expected: 0 < {short} < 1, got: {bad[0]:f}")
    w = _Windows(r)
    steps = r.steps
    sf = w.sorted(np.broadcast_to(sf_arr[None, :], w.shape).ravel())
    tf = w.sorted(np.broadcast_to(tf_arr[None, :], w.shape).ravel())
    s0 = np.zeros(w.n)
    s1 = np.zeros(w.n)
    b = np.zeros(w.n)
    first = np.zeros(w.n)
    del steps
    for k, active, idx in w.lockstep():
        y = r.vs[idx]
        if k == 0:
            s1[active] = y
            first[active] = y
            continue
        if k == 1:
            b[active] = y - first[active]
        else:
            b[active] = tf[active] * (s1[active] - s0[active]) + (1 - tf[active]) * b[active]
        x = sf[active] * y
        smoothed = (1 - sf[active]) * (s1[active] + b[active])
        s0[active], s1[active] = s1[active], x + smoothed
    for j, values, _ in w.long():
        s1[j] = _smooth(values.tolist(), float(sf[j]), float(tf[j]))
    return range_result(r, w.restore(s1), _present(r, 2))


def _smooth(values: list[float], sf: float, tf: float) -> float:
    """Holt's double exponential smoothing of one window, as Prometheus computes it."""
    s0, s1, b = 0.0, values[0], values[1] - values[0]
    for i in range(1, len(values)):
        if i > 1:
            b = tf * (s1 - s0) + (1 - tf) * b
        s0, s1 = s1, sf * values[i] + (1 - sf) * (s1 + b)
    return s1


def _anchored_or_smoothed(ctx: CallContext, r: RangeInput, counter: bool, per_second: bool) -> StepVector:
    """rate/increase/delta over ``anchored`` or ``smoothed`` ranges (no extrapolation).

    anchored: the value just before the window (within the lookback) stands in for the
    window's start; smoothed: both boundaries are interpolated linearly from their neighbours.
    """
    steps = r.steps
    n = len(r)
    values = np.zeros((n, steps))
    present = np.zeros((n, steps), dtype=bool)
    for i in range(n):
        r.checkpoint()  # a Python loop over every step of every series: the deadline holds inside it
        a, z = int(r.offsets[i]), int(r.offsets[i + 1])
        ts, vs = r.ts[a:z], r.vs[a:z]
        for j in range(steps):
            end = int(r.end[j])
            start = end - r.range_ms
            result = _boundary_increase(ts, vs, start, end, counter, r.smoothed)
            if result is not None:
                values[i, j] = result / (r.range_ms / 1000.0) if per_second else result
                present[i, j] = True
    return range_result(r, values, present)


def _boundary_increase(ts: I64, vs: F64, start: int, end: int, counter: bool, smoothed: bool) -> float | None:
    lookback = 300_000
    inside = np.flatnonzero((ts > start) & (ts <= end))
    before = np.flatnonzero((ts <= start) & (ts > start - lookback))
    if smoothed:
        after = np.flatnonzero((ts > end) & (ts <= end + lookback))
        if len(inside) == 0 and not (len(before) and len(after)):
            return None  # data only before or only after the range
        points_t = list(ts[inside])
        points_v = list(vs[inside])
        # Left boundary.
        if len(before):
            b = before[-1]
            if len(inside):
                nxt = inside[0]
                left = _interpolate(ts[b], vs[b], ts[nxt], vs[nxt], start, counter)
            elif len(after):
                nxt = after[0]
                left = _interpolate(ts[b], vs[b], ts[nxt], vs[nxt], start, counter)
            else:
                left = float(vs[b])
            points_t.insert(0, start)
            points_v.insert(0, left)
        elif len(inside) == 0:
            return None
        # Right boundary.
        last_idx = inside[-1] if len(inside) else (before[-1] if len(before) else None)
        if last_idx is None:
            return None
        if len(after):
            nxt = after[0]
            right = _interpolate(ts[last_idx], vs[last_idx], ts[nxt], vs[nxt], end, counter)
        else:
            right = float(vs[last_idx])
        points_t.append(end)
        points_v.append(right)
        if len(points_v) < 2:
            return None
        return _total_change(np.asarray(points_v), counter)
    # anchored
    if len(inside) == 0:
        return None
    seq = vs[inside]
    # The sample before the window anchors its start; without one the first sample does.
    seq = np.concatenate([[vs[before[-1]] if len(before) else seq[0]], seq])
    return _total_change(seq, counter)


def _interpolate(t1: int, v1: float, t2: int, v2: float, at: int, counter: bool) -> float:
    if counter and v2 < v1:
        # A reset between the two samples: the counter restarted from zero.
        v1 = 0.0
    if t2 == t1:
        return float(v2)
    return float(v1 + (v2 - v1) * (at - t1) / (t2 - t1))


def _total_change(seq: F64, counter: bool) -> float:
    if not counter:
        return float(seq[-1] - seq[0])
    total = float(seq[-1] - seq[0])
    for prev, cur in itertools.pairwise(seq):
        if cur < prev:
            total += float(prev)
    return total


_ = math  # math is used by doctests in extensions
