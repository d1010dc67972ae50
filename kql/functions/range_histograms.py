"""The histogram behaviour of the range functions of :mod:`kernel_insight.kql.functions.range`
(``rate``, ``increase``, ``delta``, ``irate``, ``idelta``, ``changes``, ``resets``, ``*_over_time``),
registered on their registry entries by :func:`histogram_behaviour`, as Prometheus'
``extrapolatedRate`` branches to ``histogramRate``; and the smoothed selector's histograms."""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Iterable
from typing import TYPE_CHECKING

import numpy as np

import kernel_insight.kql.functions.range  # noqa: F401  (registers the entries the behaviours below attach to)
from kernel_insight.kql import histogram as nh
from kernel_insight.kql.ast import PosRange, VectorSelector
from kernel_insight.kql.functions.registry import Impl, histogram_behaviour
from kernel_insight.kql.histcells import Hists, object_cells
from kernel_insight.kql.histdense import DenseHists, dense_rate
from kernel_insight.kql.histogram import COUNTER_RESET, NOT_COUNTER_RESET
from kernel_insight.kql.histogram import GAUGE_TYPE as GAUGE
from kernel_insight.kql.histogram import UNKNOWN_COUNTER_RESET as UNKNOWN
from kernel_insight.kql.histsamples import (
    BOOL,
    I64,
    EvalAnnotations,
    H,
    Incompatible,
    check_compatible,
    counter_reset_collision,
    detect_reset,
    floats_of,
    hadd,
    has_hist_windows,
    hcompact,
    hdiv,
    hequals,
    hist_windows,
    hmul,
    hsub,
    matrix_arg,
    metric_name,
    mixed_exponential_custom,
    mixed_floats_histograms,
    not_counter,
    not_gauge,
    reconciled_custom_buckets,
    uses_custom,
    warn_mixed_range,
    window,
    with_hint,
    without_histograms,
)
from kernel_insight.kql.values import (
    Annotator,
    Arg,
    CallContext,
    HistRange,
    RangeInput,
    StepVector,
    as_range,
    hist_mask,
    hist_weight,
    start_time_overlap_warning,
    start_time_overlaps,
    start_timestamp_resets,
)

if TYPE_CHECKING:
    from kernel_insight.kql.engine import _Evaluator as Evaluator
    from kernel_insight.kql.pushdown import SeriesColumns


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
    if dense is not None and not len(dense):
        dense = None
    cells = Hists.of((n, steps), objects=out_h if hists else None, dense=dense)
    if dense is not None and cells is not None:
        out_p &= ~cells.mask()
    names = r.drop_name.copy() if keep_name else np.ones(n, dtype=bool)
    return StepVector(list(r.labels), out_v, out_p, names, None, cells).compact()


def _rate(ctx: CallContext, impl: Impl, args: list[Arg], counter: bool, per_second: bool) -> StepVector:
    r = as_range(args[0])
    if r.anchored or r.smoothed:
        return _extended_rate(ctx, impl, r, counter, per_second)
    mixed = (r.counts > 0) & has_hist_windows(r)
    if mixed.any():
        warn_mixed_range(ctx, r, mixed)
    floats = floats_of(ctx, impl, [without_histograms(r)])
    hists: dict[tuple[int, int], H] = {}
    pos = matrix_arg(ctx).pos
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
    ctx: CallContext,
    points: list[H],
    counter: bool,
    name: str,
    pos: PosRange,
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


def _warn_overlaps(ctx: CallContext, ts: list[int], sts: list[int], name: str, pos: PosRange) -> None:
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


def _instant(ctx: CallContext, impl: Impl, args: list[Arg], is_rate: bool) -> StepVector:
    """irate/idelta where windows hold histograms: the last two samples of either kind."""
    r = as_range(args[0])
    touched = has_hist_windows(r)
    floats = floats_of(ctx, impl, [without_histograms(r)])
    hists: dict[tuple[int, int], H] = {}
    values: dict[tuple[int, int], float] = {}
    pos = matrix_arg(ctx).pos
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


def _anchored_windows(
    ctx: CallContext, r: RangeInput
) -> list[tuple[int, int, list[tuple[int, float, H | None]]]]:
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


def _changes_or_resets(ctx: CallContext, impl: Impl, args: list[Arg], resets: bool) -> StepVector:
    r = as_range(args[0])
    touched = has_hist_windows(r)
    floats = floats_of(ctx, impl, [without_histograms(r)])
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


def _sum_avg_over_time(ctx: CallContext, impl: Impl, args: list[Arg], mean: bool) -> StepVector:
    r = as_range(args[0])
    hw = has_hist_windows(r)
    mixed = (r.counts > 0) & hw
    if mixed.any():
        warn_mixed_range(ctx, r, mixed)
    floats = floats_of(ctx, impl, [without_histograms(r)])
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
                check_compatible(hs[0], h)
                if acc.add(h):
                    ctx.info(reconciled_custom_buckets("aggregation"), pos)
        except (Incompatible, nh.HistogramError):
            ctx.warn(mixed_exponential_custom(metric_name(r.labels[i])), pos)
            continue
        if reset_seen and not_reset_seen:
            ctx.warn(counter_reset_collision("aggregation"), pos)
        hists[i, j] = acc.result()
    return _combine(r, floats, hists, drop=mixed)


def _count_like(ctx: CallContext, impl: Impl, args: list[Arg], count: bool) -> StepVector:
    """count_over_time/present_over_time of windows holding histograms: samples of either kind
    counted from the windows' bounds, no histogram looked at."""
    r = as_range(args[0])
    floats = floats_of(ctx, impl, [without_histograms(r)])
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


def _first_last(ctx: CallContext, impl: Impl, args: list[Arg], last: bool, ts: bool) -> StepVector:
    """first/last_over_time (and their ts_of_) of windows holding histograms: the window's first
    or last sample of either kind found from the windows' bounds (a float wins a tie for first,
    a histogram for last, as a stable time sort of floats then histograms orders them), and an
    object made only for each histogram picked."""
    r = as_range(args[0])
    touched = has_hist_windows(r)
    floats = floats_of(ctx, impl, [without_histograms(r)])
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


def _absent_over_time(ctx: CallContext, impl: Impl, args: list[Arg]) -> StepVector:
    from dataclasses import replace

    r = as_range(args[0])
    assert r.hist is not None
    # A window with a histogram counts as a window with a sample: widen the float windows' counts.
    hi = np.where(has_hist_windows(r), np.maximum(r.hi, r.lo + 1), r.hi)
    padded = replace(r, hi=hi, vs=np.append(r.vs, 0.0), ts=np.append(r.ts, 0), hist=None)
    out: StepVector = floats_of(ctx, impl, [padded])
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


def _interpolate_hist(
    ctx: Annotator, h1: H, t1: int, h2: H, t2: int, t: int, counter: bool, pos: PosRange
) -> H:
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
    ctx: CallContext,
    hts: list[int],
    hs: list[H],
    start: int,
    end: int,
    r: RangeInput,
    counter: bool,
    per_second: bool,
    name: str,
    pos: PosRange,
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
    ctx: CallContext, impl: Impl, r: RangeInput, counter: bool, per_second: bool
) -> StepVector:
    """rate/increase/delta over anchored or smoothed ranges holding histograms."""
    floats = floats_of(ctx, impl, [without_histograms(r)])
    lookback = int(ctx.lookback_ms)
    pos = matrix_arg(ctx).pos
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


def smoothed_selector(
    ev: Evaluator, node: VectorSelector, floats: StepVector, cols: SeriesColumns, refs: I64
) -> StepVector:
    """A ``smoothed`` instant selector over series holding histograms (Prometheus' smoothSeries):
    each step's histogram interpolated between the samples around it, carried forward after the last."""
    import bisect

    hist = cols.hist
    assert hist is not None  # the engine calls it for series holding histograms
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
                ctx = EvalAnnotations(ev, node.pos)
                try:
                    hists[i, j] = _interpolate_hist(ctx, prev, hts[x - 1], nxt, hts[x], t, counter, node.pos)
                except Incompatible:
                    ev.annotate("warning", mixed_exponential_custom(name), node.pos)
            elif x > sa:
                hists[i, j] = with_hint(hs[x - 1], UNKNOWN)
    hp = hist_mask(hists)
    ev.count_samples(hist_weight(hists))
    return StepVector(
        list(cols.labels),
        values,
        present,
        np.zeros(n, dtype=bool),
        None,
        object_cells(hists if hp.any() else None),
    ).compact()
