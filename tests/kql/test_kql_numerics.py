"""Vectorised numeric kernels equal Prometheus' own scalar algorithms bit for bit: quantiles of
row-sorted windows, and the Kahan step (its numpy and C forms against the scalar port,
``histogram.gomath.kahan_inc``, the one definition)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernel_insight.kql import _windows
from kernel_insight.kql.aggregation import quantiles_of_sorted_rows, sort_rows_nan_first
from kernel_insight.kql.engine import Engine
from kernel_insight.kql.histogram.gomath import kahan_inc, kahan_inc_array
from kernel_insight.kql.storage import MemoryStorage


def _prometheus_quantile(q: float, values: list[float]) -> float:
    """promql/quantile.go's quantile(): sort.Float64s (NaN first), then linear interpolation."""
    if not values or math.isnan(q):
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    ordered = [v for v in values if math.isnan(v)] + sorted(v for v in values if not math.isnan(v))
    rank = q * (len(ordered) - 1)
    lower = max(0, math.floor(rank))
    upper = min(len(ordered) - 1, lower + 1)
    weight = rank - math.floor(rank)
    return ordered[lower] * (1 - weight) + ordered[upper] * weight


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


values = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, 1.0, math.nan, math.inf, -math.inf]),
)
phis = st.one_of(st.floats(0, 1), st.sampled_from([0.0, 1.0, 0.5, -0.1, 1.5, math.nan]))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(phis, st.lists(values, max_size=12)), min_size=1, max_size=8))
def test_row_quantiles_equal_the_reference(rows):
    width = max(len(vs) for _, vs in rows) or 1
    matrix = np.zeros((len(rows), width))
    valid = np.zeros((len(rows), width), dtype=bool)
    for i, (_, vs) in enumerate(rows):
        matrix[i, : len(vs)] = vs
        valid[i, : len(vs)] = True
    counts = valid.sum(axis=1)
    phi = np.array([q for q, _ in rows])
    got = quantiles_of_sorted_rows(phi, sort_rows_nan_first(matrix, valid), counts)
    for i, (q, vs) in enumerate(rows):
        if vs:
            assert _same(float(got[i]), _prometheus_quantile(q, vs)), (q, vs, got[i])


def test_quantile_over_time_and_quantile_by_equal_the_reference_on_ragged_windows():
    rng = np.random.default_rng(4)
    store = MemoryStorage()
    series = []
    for s in range(6):
        ts = np.sort(rng.choice(np.arange(0, 3_600_000, 1000), size=int(rng.integers(5, 400)), replace=False))
        vs = rng.normal(0, 10, len(ts))
        vs[rng.random(len(ts)) < 0.05] = np.nan
        vs[rng.random(len(ts)) < 0.02] = np.inf
        store.add({"__name__": "x", "s": str(s), "g": str(s % 2)}, ts.tolist(), vs.tolist())
        series.append((ts, vs))
    engine = Engine(store)
    got = engine.range_query("quantile_over_time(0.37, x[3m])", 300_000, 3_500_000, 45_000).value
    assert len(got) == 6
    for out in got.series:
        ts, vs = series[int(dict(out.labels)["s"])]
        for t, v in zip(out.timestamps.tolist(), out.values.tolist(), strict=True):
            window = vs[(ts > t - 180_000) & (ts <= t)].tolist()
            assert _same(v, _prometheus_quantile(0.37, window))
    by = engine.range_query("quantile by (g) (0.8, x)", 300_000, 3_500_000, 45_000).value
    assert len(by) == 2


finite_or_not = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(min_value=-1e308, max_value=1e308),
    st.sampled_from([1.7e308, -1.7e308, 1e-308, 0.0, -0.0, math.inf, math.nan]),
)


def _same_pair(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return _same(a[0], b[0]) and _same(a[1], b[1])


def _kahan_fold(values: list[float]) -> tuple[float, float]:
    total, comp = 0.0, 0.0
    for v in values:
        total, comp = kahan_inc(v, total, comp)
    return total, comp


#: Sums that plain addition gets wrong or that reach infinities and NaN: (terms, total, compensation)
#: as Prometheus' kahansum.Inc leaves them (sum_over_time prints total + comp where total is finite).
ADVERSARIAL = [
    ([1e100, 1.0, -1e100], 0.0, 1.0),
    ([2.0, 8.0, 1e100, -1e100], 0.0, 10.0),
    ([1.0, 1e100, 1.0, -1e100], 0.0, 2.0),
    ([0.1] * 10, 0.9999999999999999, 1.6653345369377348e-16),
    ([1.7e308, 1.7e308, 5.0], math.inf, 0.0),
    ([1.7e308, 1.7e308, -1.7e308], math.inf, 0.0),
    ([math.inf, 1.0, 1e100], math.inf, 0.0),
    ([math.inf, -math.inf, 1.0], math.nan, math.nan),
    ([1.0, math.nan, 2.0], math.nan, math.nan),
    ([-0.0, -0.0], 0.0, 0.0),
    ([1e-308, -1e-308, 5e-324], 5e-324, 0.0),
]


@pytest.mark.parametrize(("terms", "total", "comp"), ADVERSARIAL)
def test_kahan_inc_keeps_what_cancellation_loses(terms, total, comp):
    got = _kahan_fold(terms)
    assert _same_pair(got, (total, comp)), got
    assert math.isnan(total) or math.copysign(1.0, got[0]) == math.copysign(1.0, total)


@settings(max_examples=2000, deadline=None)
@given(finite_or_not, finite_or_not, st.floats(min_value=-1e10, max_value=1e10))
def test_kahan_inc_array_equals_kahan_inc_bit_for_bit(inc, total, comp):
    with np.errstate(all="ignore"):
        t, c = kahan_inc_array(np.array([inc]), np.array([total]), np.array([comp]))
    want_t, want_c = kahan_inc(inc, total, comp)
    assert _same(float(t[0]), want_t)
    assert _same(float(c[0]), want_c)


def _c_window_sums(windows: list[list[float]], limit: int = 1 << 40) -> list[tuple[float, float]]:
    """kql/native/windowsmodule.c's kahan(): one Kahan sum per window, in C."""
    vs = np.array([v for w in windows for v in w], dtype=np.float64)
    cnt = np.array([len(w) for w in windows], dtype=np.int64)
    lo = np.concatenate([[0], np.cumsum(cnt)[:-1]]).astype(np.int64)
    total, comp = np.zeros(len(windows)), np.zeros(len(windows))
    _windows.kahan(vs, lo, cnt, limit, total, comp)
    return list(zip(total.tolist(), comp.tolist(), strict=True))


def test_c_kahan_step_gives_kahan_incs_bits_on_adversarial_sums():
    """The C port (windowsmodule.c kahan_step) and the Python definition are one contract."""
    windows = [terms for terms, _, _ in ADVERSARIAL]
    for got, terms in zip(_c_window_sums(windows), windows, strict=True):
        assert _same_pair(got, _kahan_fold(terms)), (terms, got)
    assert _c_window_sums([[1e100, 1.0, -1e100, 7.0]], limit=3) == [(0.0, 1.0)]


@settings(max_examples=500, deadline=None)
@given(st.lists(st.lists(finite_or_not, max_size=30), min_size=1, max_size=6))
def test_c_kahan_sums_equal_kahan_inc_folds_bit_for_bit(windows):
    for got, terms in zip(_c_window_sums(windows), windows, strict=True):
        assert _same_pair(got, _kahan_fold(terms)), (terms, got)


def _group_sums_reference(
    values: np.ndarray, present: np.ndarray, gid: np.ndarray, n: int
) -> tuple[list[list[float]], list[list[float]], list[list[int]]]:
    """Prometheus' sum of each group and step: kahansum.Inc over the group's rows in row order."""
    steps = values.shape[1]
    total = [[0.0] * steps for _ in range(n)]
    comp = [[0.0] * steps for _ in range(n)]
    count = [[0] * steps for _ in range(n)]
    for i, g in enumerate(gid.tolist()):
        for j in range(steps):
            if present[i, j]:
                total[g][j], comp[g][j] = kahan_inc(float(values[i, j]), total[g][j], comp[g][j])
                count[g][j] += 1
    return total, comp, count


def _check_group_sums(values: np.ndarray, present: np.ndarray, gid: np.ndarray, n: int) -> None:
    from kernel_insight.kql.aggregation import _group_counts, _kahan_totals

    with np.errstate(all="ignore"):
        got = _kahan_totals(values, present, gid, n)
    want = _group_sums_reference(values, present, gid, n)
    assert _group_counts(present, gid, n).tolist() == want[2]
    for a, b in zip(got, want, strict=True):
        assert a.shape == (n, values.shape[1])
        assert all(_same(float(x), float(y)) for x, y in zip(a.ravel(), np.array(b).ravel(), strict=True))


@settings(max_examples=300, deadline=None)
@given(
    st.integers(1, 40),
    st.integers(1, 6),
    st.integers(1, 5),
    st.lists(finite_or_not, min_size=1, max_size=240),
    st.randoms(use_true_random=False),
)
def test_group_sums_are_prometheus_kahan_sums_in_row_order(rows, steps, groups, pool, rnd):
    """sum/avg's group totals (in C) are kahansum.Inc over each group's rows in order, bit for bit;
    the group counts (count, and where any aggregation has a value) count the present rows."""
    values = np.array([[rnd.choice(pool) for _ in range(steps)] for _ in range(rows)], dtype=np.float64)
    present = np.array([[rnd.random() < 0.8 for _ in range(steps)] for _ in range(rows)])
    gid = np.array([rnd.randrange(groups) for _ in range(rows)], dtype=np.intp)
    _check_group_sums(values, present, gid, int(gid.max()) + 1)


def test_group_sums_of_large_groups_are_strictly_sequential():
    """A group of 1,000 rows is summed row after row too (numpy summed blocks of 256 before)."""
    rng = np.random.default_rng(7)
    values = rng.choice([1e16, 1.0, -1e16, 3.5, 1e-3, -2.25], size=(1000, 3)) * rng.random((1000, 3))
    present = rng.random((1000, 3)) < 0.9
    _check_group_sums(values, present, np.zeros(1000, dtype=np.intp), 1)
    _check_group_sums(values, present, (np.arange(1000) % 3).astype(np.intp), 3)


def test_group_sums_refuse_a_group_outside_the_output():
    total, comp, count = np.zeros((1, 2)), np.zeros((1, 2)), np.zeros((1, 2), dtype=np.int64)
    with pytest.raises(ValueError, match="group 1 outside"):
        _windows.group_kahan(
            np.ones((2, 2)), np.ones((2, 2), dtype=bool), np.array([0, 1]), total, comp, count
        )
    with pytest.raises(ValueError, match="n x steps"):
        _windows.group_kahan(
            np.ones((2, 2)), np.ones((2, 3), dtype=bool), np.array([0, 0]), total, comp, count
        )
    with pytest.raises(ValueError, match="group -1 outside"):
        _windows.group_kahan(None, np.ones((2, 2), dtype=bool), np.array([0, -1]), None, None, count)
    with pytest.raises(ValueError, match="all three or none"):
        _windows.group_kahan(
            np.ones((2, 2)), np.ones((2, 2), dtype=bool), np.array([0, 0]), None, comp, count
        )


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.lists(st.integers(-50, 50), max_size=12, unique=True), max_size=6),
    st.lists(st.integers(-60, 60), max_size=10),
    st.sampled_from(["left", "right"]),
)
def test_batched_searchsorted_equals_a_search_per_series(series, queries, side):
    """The counting search gives numpy's searchsorted within each series' slice, for any query order."""
    from kernel_insight.kql.engine import batched_searchsorted

    parts = [np.array(sorted(s), dtype=np.int64) for s in series]
    offsets = np.zeros(len(parts) + 1, dtype=np.int64)
    np.cumsum([len(p) for p in parts], out=offsets[1:])
    ts = np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)
    q = np.array(queries, dtype=np.int64)
    got = batched_searchsorted(ts, offsets, q, side)
    assert got.shape == (len(parts), len(q))
    for i, p in enumerate(parts):
        assert got[i].tolist() == (offsets[i] + np.searchsorted(p, q, side=side)).tolist()


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(0, 30), min_size=1, max_size=6),
    st.lists(finite_or_not, min_size=1, max_size=40),
    st.sampled_from(
        ["sum_over_time", "avg_over_time", "stddev_over_time", "stdvar_over_time", "deriv", "predict_linear"]
    ),
    st.sampled_from([256, 3]),
    st.randoms(use_true_random=False),
)
def test_native_dense_and_lock_step_window_sums_are_the_same_bits(lengths, pool, func, limit, rnd):
    """sum_over_time, avg_over_time, the variances, deriv and predict_linear give the same bits
    window by window in C (kql/native/windowsmodule.c), through whole arrays (_dense_kahan_totals
    for windows of nearly equal length, padded; the variance's and the regression's dense paths
    where every window is full) and through lock-step slices; with a lock step of 3 samples most
    windows are finished one by one after it."""
    import kernel_insight.kql.functions.range as range_functions

    store = MemoryStorage()
    for s, n in enumerate(lengths):
        if n:
            ts = sorted(rnd.sample(range(0, 600), n))
            store.add({"__name__": "x", "s": str(s)}, [t * 1000 for t in ts], [rnd.choice(pool) for _ in ts])
    results = []
    # Equal lengths too (every window full), where the variance's dense path applies.
    if rnd.random() < 0.5:
        store = MemoryStorage()
        for s in range(len(lengths)):
            store.add(
                {"__name__": "x", "s": str(s)},
                [t * 15_000 for t in range(41)],
                [rnd.choice(pool) for _ in range(41)],
            )
    query = f"{func}(x[5m], 120)" if func == "predict_linear" else f"{func}(x[5m])"
    # In C; every window through whole arrays; none.
    for native, fill, dense_variance in ((True, 0.0, True), (False, 0.0, True), (False, 2.0, False)):
        saved = (
            range_functions.NATIVE_WINDOWS,
            range_functions.DENSE_KAHAN_FILL,
            range_functions.DENSE_VARIANCE,
            range_functions.LOCKSTEP_LIMIT,
        )
        range_functions.NATIVE_WINDOWS = native
        range_functions.DENSE_KAHAN_FILL, range_functions.DENSE_VARIANCE = fill, dense_variance
        range_functions.LOCKSTEP_LIMIT = limit
        try:
            results.append(Engine(store).range_query(query, 300_000, 600_000, 30_000).value)
        finally:
            (
                range_functions.NATIVE_WINDOWS,
                range_functions.DENSE_KAHAN_FILL,
                range_functions.DENSE_VARIANCE,
                range_functions.LOCKSTEP_LIMIT,
            ) = saved
    native_result, dense, lockstep = results
    for other in (dense, lockstep):
        assert [s.labels for s in native_result.series] == [s.labels for s in other.series]
        for a, b in zip(native_result.series, other.series, strict=True):
            assert a.timestamps.tolist() == b.timestamps.tolist()
            for x, y in zip(a.values.tolist(), b.values.tolist(), strict=True):
                assert _same(x, y), (x, y)
                assert math.isnan(x) or math.copysign(1.0, x) == math.copysign(1.0, y), (x, y)


@pytest.mark.parametrize("func", ["stddev_over_time", "stdvar_over_time"])
def test_variance_of_a_long_window_past_the_float_range_is_inf(func: str) -> None:
    """A window longer than the lock step whose squares (or whose sum) leave the float range
    answers +Inf, as Prometheus' compensated sums do; it raised OverflowError (an HTTP 500)."""
    for scale in (1e154, 1e307):
        store = MemoryStorage()
        store.add(
            {"__name__": "x"}, [t * 1000 for t in range(400)], [scale * (1 + t % 7) for t in range(400)]
        )
        (sample,) = Engine(store).instant_query(f"{func}(x[10m])", 400_000).value.samples
        assert sample.value == math.inf
