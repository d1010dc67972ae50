"""Histogram functions over classic ``le`` buckets: histogram_quantile(s) and histogram_fraction.

Native histograms are not stored by kql, so the functions that only read native histograms
(histogram_count, histogram_sum, ...) return nothing for float input, as in Prometheus.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import numpy as np
import numpy.typing as npt

from kernel_insight.kql import histogram as nh
from kernel_insight.kql.aggregation import bad_quantile_message
from kernel_insight.kql.ast import PosRange
from kernel_insight.kql.errors import KqlEvaluationError
from kernel_insight.kql.functions._common import F64, STR, S, V
from kernel_insight.kql.functions.registry import HistImpl, Impl, function, histogram_behaviour
from kernel_insight.kql.histcells import DenseFn, OneFn, object_cells
from kernel_insight.kql.histdense import (
    dense_avg,
    dense_fractions,
    dense_quantiles,
    dense_stddev,
    dense_stdvar,
)
from kernel_insight.kql.histsamples import (
    H,
    Totals,
    cells,
    fdiv,
    float_of_hists,
    floats_of,
    hstddev,
    hstdvar,
    metric_name,
)
from kernel_insight.kql.lexical import go_quote, is_valid_label_name
from kernel_insight.kql.storage import Labels
from kernel_insight.kql.values import (
    Arg,
    CallContext,
    StepVector,
    almost_equal,
    almost_equal_array,
    as_scalar,
    as_string,
    as_vector,
)
from kernel_insight.kql.vectors import consolidate

__all__ = ["bucket_fraction", "bucket_quantile"]

_SMALL_DELTA = 1e-12


def _coalesce(buckets: list[list[float]]) -> list[list[float]]:
    buckets.sort(key=lambda b: b[0])
    out: list[list[float]] = []
    for upper, count in buckets:
        if out and out[-1][0] == upper:
            out[-1][1] += count
        else:
            out.append([upper, count])
    return out


def _monotonic(buckets: list[list[float]]) -> bool:
    forced = False
    prev = buckets[0][1]
    for b in buckets[1:]:
        cur = b[1]
        if cur == prev:
            continue
        if almost_equal(prev, cur, _SMALL_DELTA):
            b[1] = prev
            continue
        if cur < prev:
            b[1] = prev
            forced = True
            continue
        prev = cur
    return forced


def bucket_quantile(q: float, buckets: list[list[float]]) -> tuple[float, bool]:
    """Prometheus' BucketQuantile over (upper bound, cumulative count) pairs; also says if monotonicity was forced."""
    if math.isnan(q):
        return math.nan, False
    if q < 0:
        return -math.inf, False
    if q > 1:
        return math.inf, False
    buckets = sorted(([u, c] for u, c in buckets), key=lambda b: b[0])
    if not buckets or not math.isinf(buckets[-1][0]) or buckets[-1][0] < 0:
        return math.nan, False
    buckets = _coalesce(buckets)
    forced = _monotonic(buckets)
    if len(buckets) < 2:
        return math.nan, forced
    observations = buckets[-1][1]
    if observations == 0:
        return math.nan, forced
    rank = q * observations
    b = next((i for i in range(len(buckets) - 1) if buckets[i][1] >= rank), len(buckets) - 1)
    if b == len(buckets) - 1:
        return buckets[-2][0], forced
    if b == 0 and buckets[0][0] <= 0:
        return buckets[0][0], forced
    start, end, count = 0.0, buckets[b][0], buckets[b][1]
    if b > 0:
        start = buckets[b - 1][0]
        count -= buckets[b - 1][1]
        rank -= buckets[b - 1][1]
    return start + (end - start) * (rank / count), forced


def bucket_fraction(lower: float, upper: float, buckets: list[list[float]]) -> float:
    """Fraction of observations between ``lower`` and ``upper``, interpolating linearly in buckets.

    The first bucket starts at 0 when its upper bound is positive; buckets of infinite width
    are taken to hold all their observations at the infinite end.
    """
    buckets = sorted(([u, c] for u, c in buckets), key=lambda b: b[0])
    if not buckets or not (math.isinf(buckets[-1][0]) and buckets[-1][0] > 0):
        return math.nan
    buckets = _coalesce(buckets)
    _monotonic(buckets)
    total = buckets[-1][1]
    if total == 0 or math.isnan(lower) or math.isnan(upper):
        return math.nan
    if lower >= upper:
        return 0.0
    # Go's lower bound of the first bucket: 0 where it ends above 0 (positive buckets only).
    lows = [0.0 if buckets[0][0] > 0 else -math.inf] + [ub for ub, _ in buckets[:-1]]
    walk = ((lb, ub, cum, True) for lb, (ub, cum) in zip(lows, buckets, strict=True))
    lower_rank, upper_rank = nh.fraction_ranks(lower, upper, walk, _classic_rank_at, total, cumulative=True)
    return (upper_rank - lower_rank) / total


def _classic_rank_at(below: float, lb: float, ub: float, count: float, v: float, linear: bool) -> float:
    """``BucketFraction``'s interpolation: linear, ``count * (v - lb) / (ub - lb)`` in Go's order;
    an infinite bucket holds all its observations at its infinite end."""
    if math.isinf(lb):
        return below + count  # no interpolation in an infinite bucket
    if math.isinf(ub):
        return below
    return below + count * (v - lb) / (ub - lb)


def _groups(ctx: CallContext, vec: StepVector, arg_index: int) -> dict[Labels, list[int]]:
    """Rows grouped by their labels without ``le`` (the name stays part of the key)."""
    groups: dict[Labels, list[int]] = {}
    for i, labels in enumerate(vec.labels):
        le = dict(labels).get("le")
        try:
            float(le.replace("Inf", "inf")) if le is not None else None
        except ValueError:
            le = None
        if le is None:
            lookup = dict(labels)
            ctx.warn(
                f"bucket label {go_quote('le')} is missing or has a malformed value of "
                f"{go_quote(lookup.get('le', ''))} for metric name {go_quote(lookup.get('__name__', ''))}",
                ctx.node.args[arg_index].pos,
            )
            continue
        key = tuple(p for p in labels if p[0] != "le")
        groups.setdefault(key, []).append(i)
    return groups


def _le(labels: Labels) -> float:
    return float(dict(labels)["le"])


_Index = npt.NDArray[np.intp]

#: Groups answered together (the buckets of a batch of groups x their steps in one array).
_BATCH_GROUPS = 256


def _quantiles(ctx: CallContext, vec: StepVector, qs: list[F64], arg_index: int) -> list[StepVector]:
    groups = _groups(ctx, vec, arg_index)
    steps = ctx.steps
    outs = []
    keys = list(groups)
    for q in qs:
        values = np.full((len(keys), steps), np.nan)
        present = np.zeros((len(keys), steps), dtype=bool)
        forced = np.zeros(len(keys), dtype=bool)
        # Groups by their bounds: the steps where a group holds every one of its buckets (distinct
        # bounds; the common case, a histogram's buckets are scraped together) are answered with
        # those of the other groups of the same bounds at once; the other steps one by one.
        together: dict[tuple[float, ...], list[tuple[int, _Index, _Index]]] = {}
        for g, key in enumerate(keys):
            ctx.check()  # a loop over every group: the deadline holds inside it
            rows = groups[key]
            bounds = [_le(vec.labels[r]) for r in rows]
            held = vec.present[rows]
            present[g] = held.any(axis=0)
            distinct = len(set(bounds)) == len(bounds) and not any(math.isnan(b) for b in bounds)
            whole = held.all(axis=0) if distinct else np.zeros(steps, dtype=bool)
            if whole.any():
                order = np.argsort(bounds, kind="stable")
                ordered = tuple(np.asarray(bounds)[order].tolist())
                together.setdefault(ordered, []).append((g, np.asarray(rows)[order], np.flatnonzero(whole)))
            for j in np.flatnonzero(present[g] & ~whole).tolist():
                buckets = [
                    [bounds[k], float(vec.values[r, j])] for k, r in enumerate(rows) if vec.present[r, j]
                ]
                values[g, j], forced_here = bucket_quantile(float(q[j]), buckets)
                forced[g] |= forced_here
        for ordered, members in together.items():
            for k in range(0, len(members), _BATCH_GROUPS):
                ctx.check()
                batch = members[k : k + _BATCH_GROUPS]
                counts = np.concatenate([vec.values[rows][:, cols] for _, rows, cols in batch], axis=1)
                answers, fixed = _vector_quantile(
                    np.concatenate([q[cols] for _, _, cols in batch]), np.asarray(ordered), counts
                )
                at = 0
                for g, _, cols in batch:
                    values[g, cols] = answers[at : at + len(cols)]
                    forced[g] |= bool(fixed[at : at + len(cols)].any())
                    at += len(cols)
        for g in np.flatnonzero(forced).tolist():
            ctx.info(
                "input to histogram_quantile needed to be fixed for monotonicity (see "
                "https://prometheus.io/docs/prometheus/latest/querying/functions/#histogram_quantile) "
                f"for metric name {go_quote(dict(keys[g]).get('__name__', ''))}",
                ctx.node.args[arg_index].pos,
            )
        labels = [tuple(p for p in key if p[0] != "__name__") for key in keys]
        outs.append(StepVector(labels, values, present, np.zeros(len(keys), dtype=bool)))
    return outs


def _vector_quantile(q: F64, bounds: F64, counts: F64) -> tuple[F64, npt.NDArray[np.bool_]]:
    """:func:`bucket_quantile` at many steps at once: ``bounds`` ascending and distinct (no NaN),
    ``counts`` (bucket x step) the cumulative counts, fixed for monotonicity in place; and per
    step whether the fix was forced. Bit for bit the scalar's answers (the same float operations
    in the same order), but for a division by a zero count, which is Go's NaN or infinity here
    where Python raises."""
    nb = len(bounds)
    out = np.full(q.shape, np.nan)
    forced = np.zeros(q.shape, dtype=bool)
    if nb >= 2 and math.isinf(bounds[-1]) and bounds[-1] > 0:
        prev = counts[0].copy()
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            for k in range(1, nb):
                cur = counts[k]
                same = cur == prev
                close = ~same & almost_equal_array(prev, cur, _SMALL_DELTA)
                lower = ~same & ~close & (cur < prev)
                keep = close | lower
                counts[k] = np.where(keep, prev, cur)
                forced |= lower
                prev = np.where(same | keep, prev, cur)
            # a q outside [0, 1] (or NaN) is answered before anything is fixed
            forced &= (q >= 0) & (q <= 1)
            observations = counts[-1]
            rank = q * observations
            reached = counts[:-1] >= rank
            b = np.where(reached.any(axis=0), reached.argmax(axis=0), nb - 1)
            cols = np.arange(len(q))
            end, count = bounds[b], counts[b, cols]
            below = np.where(b > 0, counts[np.maximum(b - 1, 0), cols], 0.0)
            start = np.where(b > 0, bounds[np.maximum(b - 1, 0)], 0.0)
            inside = start + (end - start) * ((rank - below) / (count - below))
            value = np.where(
                b == nb - 1, bounds[-2], np.where((b == 0) & (bounds[0] <= 0), bounds[0], inside)
            )
        out = np.where(observations == 0, np.nan, value)
    out = np.where(q > 1, math.inf, out)
    out = np.where(q < 0, -math.inf, out)
    return np.where(np.isnan(q), np.nan, out), forced


def _warn_quantile(ctx: CallContext, q: F64, arg_index: int) -> None:
    message = bad_quantile_message(q)
    if message is not None:
        ctx.warn(message, ctx.node.args[arg_index].pos)


@function("histogram_quantile", (S, V), V, histogram_reads="buckets", result_unit="bucket_unit")
def _histogram_quantile(ctx: CallContext, args: list[Arg]) -> StepVector:
    """The φ-quantile of a classic histogram (series with an ``le`` label), per label set without ``le``."""
    q, vec = as_scalar(args[0]), as_vector(args[1])
    _warn_quantile(ctx, q, 0)
    (out,) = _quantiles(ctx, vec, [q], 1)
    return consolidate(out.compact())


def _q_label(q: float) -> str:
    if math.isnan(q):
        return "NaN"
    if math.isinf(q):
        return "+Inf" if q > 0 else "-Inf"
    return repr(float(q))


@function("histogram_quantiles", (V, STR, S), V, variadic=-1, experimental=True, histogram_reads="buckets")
def _histogram_quantiles(ctx: CallContext, args: list[Arg]) -> StepVector:
    """Several quantiles at once, each output series labelled ``<label>="<φ>"``."""
    vec, label = as_vector(args[0]), as_string(args[1])
    qs = [as_scalar(a) for a in args[2:]]
    if not is_valid_label_name(label):
        raise KqlEvaluationError(f"invalid label name {go_quote(label)}")
    for k, q in enumerate(qs):
        _warn_quantile(ctx, q, 2 + k)
    outs = _quantiles(ctx, vec, qs, 0)
    labels: list[Labels] = []
    parts = []
    for q, out in zip(qs, outs, strict=True):
        text = _q_label(float(q[0])) if len(q) else ""
        labels += [tuple(sorted({**dict(lb), label: text}.items())) for lb in out.labels]
        parts.append(out)
    values = np.concatenate([p.values for p in parts]) if parts else np.zeros((0, ctx.steps))
    present = np.concatenate([p.present for p in parts]) if parts else np.zeros((0, ctx.steps), dtype=bool)
    merged = StepVector(labels, values, present, np.zeros(len(labels), dtype=bool))
    return consolidate(merged.compact())


@function("histogram_fraction", (S, S, V), V, histogram_reads="buckets", result_unit="ratio")
def _histogram_fraction(ctx: CallContext, args: list[Arg]) -> StepVector:
    """Estimated fraction of a classic histogram's observations between ``lower`` and ``upper``."""
    lower, upper, vec = as_scalar(args[0]), as_scalar(args[1]), as_vector(args[2])
    groups = _groups(ctx, vec, 2)
    keys = list(groups)
    values = np.full((len(keys), ctx.steps), np.nan)
    present = np.zeros((len(keys), ctx.steps), dtype=bool)
    for g, key in enumerate(keys):
        ctx.check()
        rows = groups[key]
        bounds = [_le(vec.labels[r]) for r in rows]
        for j in range(ctx.steps):
            buckets = [[bounds[k], float(vec.values[r, j])] for k, r in enumerate(rows) if vec.present[r, j]]
            if buckets:
                values[g, j] = bucket_fraction(float(lower[j]), float(upper[j]), buckets)
                present[g, j] = True
    labels = [tuple(p for p in key if p[0] != "__name__") for key in keys]
    return consolidate(StepVector(labels, values, present, np.zeros(len(keys), dtype=bool)).compact())


def _native_only(name: str, doc: str, reads: str, unit: str) -> None:
    def impl(ctx: CallContext, args: list[Arg]) -> StepVector:
        return StepVector.empty(ctx.steps)

    impl.__doc__ = doc
    function(name, (V,), V, histogram_reads=reads, result_unit=unit)(impl)


for _name, _doc, _reads, _unit in (
    (
        "histogram_count",
        "Observation count of native histograms (float samples are ignored).",
        "stats",
        "unitless",
    ),
    ("histogram_sum", "Sum of observations of native histograms (float samples are ignored).", "stats", ""),
    (
        "histogram_avg",
        "Mean observation of native histograms (float samples are ignored).",
        "stats",
        "bucket_unit",
    ),
    (
        "histogram_stddev",
        "Estimated standard deviation of native histograms (float samples are ignored).",
        "",
        "bucket_unit",
    ),
    (
        "histogram_stdvar",
        "Estimated variance of native histograms (float samples are ignored).",
        "",
        "bucket_unit",
    ),
):
    _native_only(_name, _doc, _reads, _unit)


# ------------------------------------------------------------------------------ native histograms


def _native_floats(fn: Callable[[H], float], dense_fn: Callable[[Totals], F64] | None = None) -> HistImpl:
    def handler(ctx: CallContext, impl: Impl, args: list[Arg]) -> StepVector:
        return float_of_hists(as_vector(args[0]), fn, dense_fn)

    return handler


histogram_behaviour("histogram_count")(_native_floats(lambda h: float(h.count), lambda b: b.count))


histogram_behaviour("histogram_sum")(_native_floats(lambda h: float(h.sum), lambda b: b.sum))


histogram_behaviour("histogram_avg")(_native_floats(lambda h: fdiv(float(h.sum), float(h.count)), dense_avg))


histogram_behaviour("histogram_stdvar")(_native_floats(hstdvar, dense_stdvar))


histogram_behaviour("histogram_stddev")(_native_floats(hstddev, dense_stddev))


def mixed_classic_native(name: str) -> str:
    base = "vector contains a mix of classic and native histograms"
    return f"{base} for metric name {go_quote(name)}" if name else base


def _split_classic_native(ctx: CallContext, vec: StepVector, arg_index: int) -> StepVector:
    """The float (classic bucket) part of ``vec``, less the buckets that collide with a native histogram
    of the same labels at the same step (both are dropped then, with Prometheus' warning)."""
    if not any(k == "le" for lb in vec.labels for k, _ in lb):
        return vec  # no classic bucket: nothing collides (dense histogram cells stay dense)
    objects = vec.hist_objects()
    assert objects is not None
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
    hists = objects.copy()
    for i, j, _ in cells(objects):
        rows = by_key.get(vec.labels[i])
        if rows and present[rows, j].any():
            ctx.warn(mixed_classic_native(metric_name(vec.labels[i])), ctx.node.args[arg_index].pos)
            present[rows, j] = False
            hists[i, j] = None
    return StepVector(vec.labels, vec.values, present, vec.drop_name, vec.sample_ts, object_cells(hists))


def _concat_vectors(a: StepVector, b: StepVector) -> StepVector:

    return consolidate(
        StepVector(
            a.labels + b.labels,
            np.concatenate([a.values, b.values]),
            np.concatenate([a.present, b.present]),
            np.concatenate([a.drop_name, b.drop_name]),
        )
    )


def _notes(ctx: CallContext, notes: Iterable[str], name: str, pos: PosRange) -> None:
    for note in notes:
        ctx.info(note + (f" for metric name {go_quote(name)}" if name else ""), pos)


def _quantile_of(ctx: CallContext, q: float, h: H, name: str, pos: PosRange) -> float:
    value, notes = nh.histogram_quantile(q, h)
    if notes:
        _notes(ctx, notes, name, pos)
    return float(value)


def _fraction_of(ctx: CallContext, lower: float, upper: float, h: H, name: str, pos: PosRange) -> float:
    value, notes = nh.histogram_fraction(lower, upper, h)
    if notes:
        _notes(ctx, notes, name, pos)
    return float(value)


def _native_histogram_quantile(ctx: CallContext, impl: Impl, args: list[Arg]) -> StepVector:
    q, vec = as_scalar(args[0]), as_vector(args[1])
    classic = _split_classic_native(ctx, vec, 1)
    floats = floats_of(ctx, impl, [q, classic.floats_only()])
    pos = ctx.node.args[1].pos
    return _concat_vectors(floats, _native_quantiles(ctx, q, classic, pos))


def _native_quantiles(ctx: CallContext, q: F64, vec: StepVector, pos: PosRange) -> StepVector:
    """histogram_quantile of every histogram cell: a dense block's numpy search where the cells
    share a layout (:func:`dense_quantiles`), kql.histogram per histogram for the rest."""
    qs = np.asarray(q, dtype=np.float64)
    return _native_cells(
        ctx,
        vec,
        lambda steps, block: dense_quantiles(qs[steps], block),
        lambda i, j, h: _quantile_of(ctx, float(q[j]), h, metric_name(vec.labels[i]), pos),
    )


def _native_cells(ctx: CallContext, vec: StepVector, dense_fn: DenseFn, one: OneFn) -> StepVector:
    """A float of every histogram cell: ``dense_fn`` over whole blocks (its steps' arguments,
    the block; the rows it leaves undecided go to ``one``, per histogram), wherever the cells
    are held (``Hists.search``: dense cells where they are, a selector's columns and objects in
    chunks of neighbouring series); objects are made only for the rows ``dense_fn`` leaves."""
    if vec.hists is None:
        return StepVector.empty(vec.values.shape[1])
    values, present = vec.hists.search(ctx, dense_fn, one)
    return StepVector(vec.labels, values, present, np.ones(len(vec), dtype=bool)).compact()


def _native_histogram_fraction(ctx: CallContext, impl: Impl, args: list[Arg]) -> StepVector:
    lower, upper, vec = as_scalar(args[0]), as_scalar(args[1]), as_vector(args[2])
    classic = _split_classic_native(ctx, vec, 2)
    floats = floats_of(ctx, impl, [lower, upper, classic.floats_only()])
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
    return _concat_vectors(floats, native)


def _native_histogram_quantiles(ctx: CallContext, impl: Impl, args: list[Arg]) -> StepVector:
    vec, label = as_vector(args[0]), as_string(args[1])
    qs = [as_scalar(a) for a in args[2:]]
    classic = _split_classic_native(ctx, vec, 0)
    out: StepVector = floats_of(ctx, impl, [classic.floats_only(), label, *qs])
    pos = ctx.node.args[0].pos
    for q in qs:
        text = _q_label(float(q[0])) if len(q) else ""
        native = _native_quantiles(ctx, q, classic, pos)
        native.labels = [tuple(sorted({**dict(lb), label: text}.items())) for lb in native.labels]
        out = _concat_vectors(out, native)
    return out


histogram_behaviour("histogram_quantile")(_native_histogram_quantile)


histogram_behaviour("histogram_fraction")(_native_histogram_fraction)


histogram_behaviour("histogram_quantiles")(_native_histogram_quantiles)
