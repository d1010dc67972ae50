"""histogram_quantile over classic ``le`` buckets: the steps of a group answered at once
(kql/functions/histogram.py ``_vector_quantile``) give the scalar ``bucket_quantile``'s answers
bit for bit, where the scalar one answers at all."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernel_insight.kql import Engine, MemoryStorage
from kernel_insight.kql.functions.histogram import _vector_quantile, bucket_quantile

# Counts that exercise each branch: zeros, equal neighbours, deltas inside and just outside the
# 1e-12 tolerance (monotonicity fixed quietly or forced), decreases, NaN and infinities.
_COUNTS = st.one_of(
    st.sampled_from([0.0, 1.0, 1.0 + 1e-13, 1.0 + 1e-11, 2.0, 10.0, math.nan, math.inf]),
    st.floats(min_value=0, max_value=1e6, allow_nan=False),
)
_Q = st.one_of(
    st.sampled_from([0.0, 0.5, 0.99, 1.0, -0.1, 1.1, math.nan]),
    st.floats(min_value=0, max_value=1),
)
_BOUND = st.one_of(st.sampled_from([-1.0, 0.0, 1e-6, 0.1, 1.0, 10.0]), st.floats(-1e3, 1e3, allow_nan=False))


@st.composite
def _groups(draw: st.DrawFn) -> tuple[list[float], list[list[float]], list[float]]:
    bounds = draw(st.lists(_BOUND, min_size=0, max_size=8, unique=True))
    if draw(st.booleans()):
        bounds.append(math.inf)
    steps = draw(st.integers(1, 6))
    counts = [draw(st.lists(_COUNTS, min_size=steps, max_size=steps)) for _ in bounds]
    qs = draw(st.lists(_Q, min_size=steps, max_size=steps))
    return bounds, counts, qs


def _scalar(q: float, bounds: list[float], counts: list[float]) -> tuple[float, bool] | None:
    try:
        return bucket_quantile(q, [[b, c] for b, c in zip(bounds, counts, strict=True)])
    except ZeroDivisionError:  # Python's, where Go (and the vector form) divides to NaN or infinity
        return None


@settings(max_examples=400, deadline=None)
@given(_groups())
def test_the_vector_form_answers_as_the_scalar_one(
    group: tuple[list[float], list[list[float]], list[float]],
) -> None:
    bounds, counts, qs = group
    if not bounds:
        return
    order = np.argsort(bounds, kind="stable")
    matrix = np.asarray(counts, dtype=np.float64)[order]
    got, forced = _vector_quantile(np.asarray(qs), np.asarray(bounds)[order], matrix.copy())
    for j, q in enumerate(qs):
        want = _scalar(q, bounds, [c[j] for c in counts])
        if want is None:  # (and what it would have said of monotonicity is unknown)
            assert math.isnan(got[j]) or math.isinf(got[j])
            continue
        assert np.array_equal(np.float64(want[0]), got[j], equal_nan=True), (q, bounds, j, want, got[j])
        if not math.isnan(want[0]) or math.isnan(got[j]):
            assert math.copysign(1, want[0]) == math.copysign(1, got[j])
        assert bool(forced[j]) == want[1], (q, bounds, j)


def _engine(buckets: dict[str, list[float]], steps: int, step_ms: int = 15_000) -> Engine:
    s = MemoryStorage()
    ts = np.arange(steps, dtype=np.int64) * step_ms
    for le, values in buckets.items():
        present = ~np.isnan(values)
        s.add({"__name__": "x_bucket", "le": le}, ts[present], np.asarray(values)[present])
    return Engine(s)


def test_quantile_zero_with_an_empty_first_bucket_is_nan_not_an_error() -> None:
    """``rank / count`` with both zero: Go's NaN (Python raised ZeroDivisionError, a 500)."""
    engine = _engine({"0.1": [0, 0], "1": [1, 2], "+Inf": [2, 3]}, 2)
    result = engine.range_query("histogram_quantile(0, x_bucket)", 0, 15_000, 15_000)
    (series,) = result.value.series
    assert len(series.values) == 2
    assert np.isnan(series.values).all()


def test_steps_missing_a_bucket_are_answered_over_the_buckets_they_have() -> None:
    """A step where a bucket is absent (a failed scrape of one series) takes the scalar path over the
    buckets present; the other steps the vector path: each step as Prometheus answers it alone."""
    nan = math.nan
    buckets = {"0.1": [1, 2, nan, 4], "1": [3, nan, 6, 8], "+Inf": [4, 8, 8, 10]}
    engine = _engine(buckets, 4, 600_000)  # 10 min apart: past the 5 min lookback, a gap stays a gap
    result = engine.range_query("histogram_quantile(0.5, x_bucket)", 0, 1_800_000, 600_000)
    (series,) = result.value.series
    want = []
    for j in range(4):
        pairs = [[float(le), v[j]] for le, v in buckets.items() if not math.isnan(v[j])]
        want.append(bucket_quantile(0.5, pairs)[0])
    assert np.array_equal(series.values, np.asarray(want), equal_nan=True)


def test_a_forced_monotonicity_fix_is_reported_once() -> None:
    engine = _engine({"0.1": [5, 5], "1": [3, 3], "+Inf": [6, 6]}, 2)
    result = engine.range_query("histogram_quantile(0.5, x_bucket)", 0, 15_000, 15_000)
    assert [i for i in result.infos if "monotonicity" in i] == [
        "PromQL info: input to histogram_quantile needed to be fixed for monotonicity (see "
        "https://prometheus.io/docs/prometheus/latest/querying/functions/#histogram_quantile) "
        'for metric name "x_bucket" (1:25)'
    ]


@pytest.mark.parametrize("q", [0.5, 0.99])
def test_a_large_fleet_of_groups_matches_the_scalar_answer(q: float) -> None:
    rng = np.random.default_rng(3)
    les = ["0.001", "0.01", "0.1", "1", "+Inf"]
    s = MemoryStorage()
    ts = np.arange(20, dtype=np.int64) * 15_000
    expected: dict[str, list[float]] = {}
    for k in range(30):
        cum = np.cumsum(rng.integers(0, 5, size=(20, len(les))), axis=1).astype(np.float64)
        for i, le in enumerate(les):
            s.add({"__name__": "x_bucket", "le": le, "k": str(k)}, ts, cum[:, i])
        expected[str(k)] = [
            bucket_quantile(q, [[float(le), cum[j, i]] for i, le in enumerate(les)])[0] for j in range(20)
        ]
    result = Engine(s).range_query(f"histogram_quantile({q}, x_bucket)", 0, 19 * 15_000, 15_000)
    got = {dict(x.labels)["k"]: x.values for x in result.value.series}
    assert got.keys() == expected.keys()
    for k, values in got.items():
        assert np.array_equal(values, np.asarray(expected[k]), equal_nan=True), k
