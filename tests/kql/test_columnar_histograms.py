"""Histograms read as columns (SparseHists, as the ClickHouse back end hands them over) give the
object path's results bit for bit: the promqltest scripts, random histogram series through kql
(counter resets, schema and zero-threshold changes, zero and negative buckets, stale markers,
gauges, floats between histograms) over a columnar MemoryStorage and a real EmbeddedStore."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from columnar_memory import ColumnarMemory
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernel_insight.kql import FUNCTIONS, Engine, Matrix
from kernel_insight.kql.histdense import DenseBlock
from kernel_insight.kql.histogram import FloatHistogram
from kernel_insight.kql.promqltest import default_dir, run_file
from kernel_insight.kql.sparsehists import SparseHists, tsdb_pending
from kernel_insight.kql.storage import STALE_NAN, MemoryStorage, tsdb_hints


def _spans(idx: list[int]) -> tuple[tuple[int, int], ...]:
    spans: list[tuple[int, int]] = []
    end = 0
    for i in idx:
        if spans and i == end:
            spans[-1] = (spans[-1][0], spans[-1][1] + 1)
        else:
            spans.append((i if not spans else i - end, 1))
        end = i + 1
    return tuple(spans)


def _side(
    rng: np.random.Generator, counts: np.ndarray, lo: int
) -> tuple[tuple[tuple[int, int], ...], tuple[float, ...]]:
    """The buckets of ``counts`` (bucket ``lo + k`` in ``counts[k]``) that are non-zero, plus some
    explicit zero buckets (a layout Prometheus keeps after a compaction leaves them)."""
    keep = (counts != 0) | (rng.random(len(counts)) < 0.15)
    idx = np.flatnonzero(keep)
    return _spans([int(lo + k) for k in idx]), tuple(float(counts[k]) for k in idx)


def _series(rng: np.random.Generator, samples: int, *, odd_counts: bool) -> list[tuple[int, Any]]:
    """(t, FloatHistogram | float | "stale") samples of one series every 15 s."""
    out: list[tuple[int, Any]] = []
    width = int(rng.integers(1, 9))
    pos = np.zeros(width)
    neg = np.zeros(width)
    zero = 0.0
    schema = int(rng.choice([0, 1, 3]))
    zt = float(rng.choice([0.0, 1e-3, 2.0**-128]))
    lo = int(rng.integers(-6, 4))
    with_neg = rng.random() < 0.4
    for k in range(samples):
        t = k * 15_000
        u = rng.random()
        if u < 0.05:
            out.append((t, float(rng.integers(0, 100))))  # the series turns float for a sample
            continue
        if u < 0.08:
            out.append((t, "stale"))
            continue
        if rng.random() < 0.05:
            pos, neg, zero = np.zeros(width), np.zeros(width), 0.0  # a restart: a counter reset
        if rng.random() < 0.03:
            schema = int(rng.choice([0, 1, 3]))  # a schema change (a reset or not, as DetectReset says)
        if rng.random() < 0.02:
            zt = float(rng.choice([0.0, 1e-3, 2.0**-128]))
        pos = pos + rng.integers(0, 4, width) * (rng.random(width) < 0.6)
        if with_neg:
            neg = neg + rng.integers(0, 3, width) * (rng.random(width) < 0.5)
        zero += float(rng.integers(0, 2))
        ps, pb = _side(rng, pos, lo)
        ns, nb = _side(rng, neg, lo) if with_neg else ((), ())
        count = zero + float(sum(pb)) + float(sum(nb))
        if odd_counts and rng.random() < 0.2:
            # A bucket of its own with a negative or NaN count, above the others: DetectReset
            # compares it by its own rules (present only here, or gone in the next sample).
            top = lo + width + 1
            gap = top - sum(o + n for o, n in ps)
            ps, pb = (*ps, (gap, 1)) if ps else ((top, 1),), (*pb, float(rng.choice([-1.0, math.nan])))
        hint = int(rng.choice([0, 0, 0, 0, 0, 0, 1, 2, 3]))
        out.append(
            (
                t,
                FloatHistogram(
                    schema=schema,
                    zero_threshold=zt,
                    zero_count=zero,
                    count=count,
                    sum=count * 0.37,
                    positive_spans=ps,
                    positive_buckets=pb,
                    negative_spans=ns,
                    negative_buckets=nb,
                    counter_reset_hint=hint,
                ),
            )
        )
    return out


def _fill(stores: list[Any], seed: int, name: str, *, odd_counts: bool = False) -> None:
    rng = np.random.default_rng(seed)
    for i in range(int(rng.integers(1, 6))):
        labels = {"__name__": name, "i": str(i), "g": str(i % 2)}
        samples = _series(rng, int(rng.integers(2, 40)), odd_counts=odd_counts)
        for store in stores:
            for t, v in samples:
                if isinstance(v, FloatHistogram):
                    store.add_histograms(labels, [t], [v])
                elif v == "stale":
                    store.add_histograms(labels, [t], [FloatHistogram(sum=STALE_NAN)])
                else:
                    store.add(labels, [t], [v])


QUERIES = [
    "{m}",
    "rate({m}[1m])",
    "increase({m}[2m])",
    "sum by (g) (rate({m}[1m]))",
    "histogram_quantile(0.9, sum by (g) (rate({m}[1m])))",
    "histogram_quantile(0.5, rate({m}[45s]))",
    "histogram_count(increase({m}[1m]))",
    "histogram_avg(rate({m}[1m]))",
    "histogram_sum(sum by (g) (rate({m}[1m])))",
    "histogram_fraction(0, 1, rate({m}[1m]))",
    "histogram_fraction(-Inf, 0.5, rate({m}[2m]))",
    "histogram_quantile(0.9, {m})",
    "histogram_quantile(0.2, {m} offset 20s)",
    "histogram_fraction(0, 1, {m})",
    "histogram_fraction(-Inf, 0.25, {m})",
    "histogram_fraction(-2, +Inf, {m})",
    "histogram_fraction(0.5, 0.5, {m})",
    "histogram_count({m})",
    "irate({m}[1m])",
    "idelta({m}[45s])",
    "histogram_avg({m} offset 15s)",
    "histogram_sum({m}) / histogram_count({m})",
    "histogram_stddev({m})",
    "histogram_stdvar({m} offset 30s)",
    "histogram_stddev(rate({m}[1m]))",
    "histogram_stdvar(sum by (g) (rate({m}[2m])))",
    "sum by (g) ({m})",
    "sum({m})",
    "avg by (g) ({m})",
    "sum by (i) ({m})",
    "avg without (g) ({m})",
    "histogram_quantile(0.9, sum by (g) ({m}))",
    "{m} * 2",
    "{m} / -4",
    "0.5 * {m} offset 15s",
    "resets({m}[2m])",
    "delta({m}[1m])",
]


def _plain(result: Any) -> Any:
    value = result.value
    assert isinstance(value, Matrix)
    out = []
    for s in value.series:
        hs = [
            (str(h), h.counter_reset_hint, h.count, h.sum, h.zero_count, h.positive_spans, h.negative_spans)
            for h in s.histograms
        ]
        out.append((s.labels, s.timestamps.tolist(), s.values.tobytes(), s.hist_timestamps.tolist(), hs))
    return out, sorted(str(a) for a in result.annotations), result.stats.samples


def _results(storage: Any, name: str) -> Iterator[tuple[str, Any]]:
    for q in QUERIES:
        query = q.format(m=name)
        try:
            yield query, _plain(Engine(storage).range_query(query, 0, 600_000, 15_000))
        except Exception as exc:  # the same error either way is the same answer
            yield query, f"{type(exc).__name__}: {exc}"


@pytest.fixture
def dense_everywhere(monkeypatch: pytest.MonkeyPatch) -> None:
    """The dense paths for any number of cells, in blocks of a few series."""
    from kernel_insight.kql import histdense

    monkeypatch.setattr(histdense, "DENSE_MIN_CELLS", 1)
    monkeypatch.setattr(histdense, "DENSE_CHUNK", 40)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), odd=st.booleans())
def test_columns_give_the_object_paths_results(seed: int, odd: bool, dense_everywhere: None) -> None:
    memory, columnar = MemoryStorage(), ColumnarMemory()
    _fill([memory, columnar], seed, "h", odd_counts=odd)
    from kernel_insight.kql import histdense

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(histdense, "DENSE_MIN_CELLS", 10**9)  # the reference: one histogram at a time
        want = dict(_results(memory, "h"))
    got = dict(_results(columnar, "h"))
    dense_objects = dict(_results(memory, "h"))
    for query, expected in want.items():
        assert got[query] == expected, query
        assert dense_objects[query] == expected, query


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), odd=st.booleans())
def test_pending_hints_decide_as_tsdb_hints(seed: int, odd: bool) -> None:
    """tsdb_pending plus SparseHists.hints() give every row the hint tsdb_hints gives it."""
    rng = np.random.default_rng(seed)
    samples = _series(rng, 60, odd_counts=odd)
    hts = np.asarray([t for t, v in samples if not isinstance(v, float)], dtype=np.int64)
    hs = [
        FloatHistogram(sum=STALE_NAN) if v == "stale" else v for t, v in samples if not isinstance(v, float)
    ]
    fts = np.asarray([t for t, v in samples if isinstance(v, float)], dtype=np.int64)
    want = [h.counter_reset_hint for h in tsdb_hints(hs, hts, fts)]
    data = tsdb_pending(
        SparseHists.of_objects(hs),
        hts,
        np.asarray([0, len(hs)], dtype=np.int64),
        fts,
        np.asarray([0, len(fts)], dtype=np.int64),
    )
    assert data.hints().tolist() == want
    assert [h.counter_reset_hint for h in data.objects()] == want
    # Two series side by side, one taken before the other (as the store orders series by labels).
    both = SparseHists.of_objects(hs + hs)
    moved = both.take_ranges(
        np.asarray([len(hs), 0], dtype=np.int64), np.asarray([len(hs), len(hs)], dtype=np.int64)
    )
    assert [str(h) for h in moved.objects()] == [str(h) for h in hs + hs]


def test_dense_block_of_columns_is_the_block_of_objects() -> None:
    from kernel_insight.kql.histdense import DenseBlock

    rng = np.random.default_rng(7)
    hs = [v for _, v in _series(rng, 200, odd_counts=False) if isinstance(v, FloatHistogram)]
    same = [dataclasses.replace(h, schema=1, zero_threshold=1e-3) for h in hs]
    a = DenseBlock.of(same)
    b = DenseBlock.of_sparse(SparseHists.of_objects(same))
    assert a is not None
    assert b is not None
    for field in ("schema", "zero_threshold", "pos_lo", "neg_lo"):
        assert getattr(a, field) == getattr(b, field)
    for field in ("pos", "neg", "zero", "count", "sum", "has_pos", "has_neg"):
        assert np.array_equal(getattr(a, field), getattr(b, field), equal_nan=True), field


SELECTOR_SUMS = [
    "sum by (i) ({m})",
    "avg by (i) ({m})",
    "sum by (g) ({m})",
    "avg by (g) ({m})",
    "sum({m})",
    "avg({m})",
    "histogram_quantile(0.9, sum by (g) ({m}))",
    "histogram_count(sum({m}))",
]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(0, 2**32 - 1), odd=st.booleans(), one_schema=st.booleans(), stored_compact=st.booleans()
)
def test_selector_sums_over_columns_give_the_object_paths_results(
    seed: int,
    odd: bool,
    one_schema: bool,
    stored_compact: bool,
    dense_everywhere: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """sum/avg of a selector moves (one member a group, compacted where it holds a bucket of 0)
    or sums (several) the store's columns without an object per sample: bit for bit the
    per-histogram path, on histograms of one layout family (the columns' path runs) or of mixed
    schemas and zero thresholds (it declines)."""
    from kernel_insight.kql import histcells, histdense

    rng = np.random.default_rng(seed)
    memory, columnar = MemoryStorage(), ColumnarMemory()
    series = int(rng.integers(1, 6))
    zeros = False  # whether some stored histogram holds a bucket of 0
    for i in range(series):
        labels = {"__name__": "h", "i": str(i), "g": str(i % 2)}
        for t, v in _series(rng, int(rng.integers(2, 40)), odd_counts=odd):
            for store in (memory, columnar):
                if isinstance(v, FloatHistogram):
                    h = dataclasses.replace(v, schema=3, zero_threshold=1e-3) if one_schema else v
                    stored = h.compact(0) if stored_compact else h
                    store.add_histograms(labels, [t], [stored])
                    zeros |= 0.0 in stored.positive_buckets or 0.0 in stored.negative_buckets
                elif v == "stale":
                    store.add_histograms(labels, [t], [FloatHistogram(sum=STALE_NAN)])
                else:
                    store.add(labels, [t], [v])
    ran: list[str] = []
    for owner, name, said in (
        (histcells.SparseCells, "single", "single_sparse"),
        (histcells, "sparse_sum", "sparse_sum"),
    ):
        real = getattr(owner, name)

        def spy(*args: Any, _real: Any = real, _said: str = said) -> Any:
            out = _real(*args)
            if out is not None:
                ran.append(_said)
            return out

        monkeypatch.setattr(owner, name, spy)
    real_compacted = SparseHists.compacted

    def compacted(self: SparseHists) -> SparseHists | None:
        out = real_compacted(self)
        ran.append("compacted" if out is not None and out is not self else "as it is")
        return out

    monkeypatch.setattr(SparseHists, "compacted", compacted)
    for q in SELECTOR_SUMS:
        query = q.format(m="h")
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(histdense, "DENSE_MIN_CELLS", 10**9)  # the reference: one histogram at a time
            want = _plain(Engine(memory).range_query(query, 0, 600_000, 15_000))
        assert _plain(Engine(columnar).range_query(query, 0, 600_000, 15_000)) == want, query
    if one_schema:
        assert "single_sparse" in ran  # sum by (i): one member a group
        assert "sparse_sum" in ran or series == 1  # sum(h) over several series
        assert ("compacted" if zeros else "as it is") in ran


OVER_TIME = [
    "count_over_time({m}[1m])",
    "present_over_time({m}[45s])",
    "last_over_time({m}[1m])",
    "first_over_time({m}[2m])",
    "ts_of_last_over_time({m}[1m])",
    "ts_of_first_over_time({m}[45s])",
    "last_over_time({m}[1m] offset 20s)",
    "histogram_count(last_over_time({m}[2m]))",
]


def _per_window(ctx: Any, impl: Any, args: list[Any], kind: str) -> Any:
    """The per-window reference these functions had (every sample of every window merged in
    time order, each histogram an object), kept here to test the bounds-based paths against."""
    from kernel_insight.kql import histsamples
    from kernel_insight.kql.functions import range_histograms

    r = args[0]
    touched = histsamples.has_hist_windows(r)
    floats = impl(ctx, [histsamples.without_histograms(r)])
    hists: dict[tuple[int, int], Any] = {}
    values: dict[tuple[int, int], float] = {}
    for i, j, _, hs, nfloat in histsamples.hist_windows(r):
        if kind in ("count", "present"):
            values[i, j] = float(len(hs) + nfloat) if kind == "count" else 1.0
            continue
        samples = range_histograms._merged(r, i, j)
        t, f, h = samples[-1] if "last" in kind else samples[0]
        if kind.startswith("ts_of"):
            values[i, j] = t / 1000.0
        elif h is None:
            values[i, j] = f
        else:
            hists[i, j] = h
    if kind in ("count", "present"):
        return range_histograms._combine(r, floats, {}, values)
    return range_histograms._combine(
        r, floats, hists, values, drop=touched, keep_name=not kind.startswith("ts_of")
    )


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), odd=st.booleans())
def test_over_time_from_window_bounds_give_the_per_window_results(seed: int, odd: bool) -> None:
    """count/present/first/last_over_time (and ts_of_) of histogram windows, found from the windows'
    bounds with an object only for a histogram picked, equal the per-window path bit for bit,
    over objects and over columns (random series: floats between histograms, stale markers, resets)."""

    memory, columnar = MemoryStorage(), ColumnarMemory()
    _fill([memory, columnar], seed, "h", odd_counts=odd)
    kinds = {
        "count_over_time": "count",
        "present_over_time": "present",
        "last_over_time": "last",
        "first_over_time": "first",
        "ts_of_last_over_time": "ts_of_last",
        "ts_of_first_over_time": "ts_of_first",
    }
    for q in OVER_TIME:
        query = q.format(m="h")
        with pytest.MonkeyPatch.context() as mp:
            for name, kind in kinds.items():
                per_window = dataclasses.replace(
                    FUNCTIONS[name],
                    histogram_impl=lambda ctx, impl, args, _k=kind: _per_window(ctx, impl, args, _k),
                )
                mp.setitem(FUNCTIONS, name, per_window)
            want = _plain(Engine(memory).range_query(query, 0, 600_000, 15_000))
        for storage in (memory, columnar):
            assert _plain(Engine(storage).range_query(query, 0, 600_000, 15_000)) == want, query


@pytest.fixture(scope="module")
def embedded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from kernel_insight.collector.clickhouse.store import EmbeddedStore

    store = EmbeddedStore(tmp_path_factory.mktemp("columnar") / "data")
    yield store
    store.close()


class _Recorder(MemoryStorage):
    """Both a MemoryStorage and the rows an EmbeddedStore gets of the same samples."""

    def __init__(self, base: int) -> None:
        super().__init__()
        from kernel_insight.collector.rows import HistogramBuilder, SampleBuilder

        self.base = base
        self.h, self.s = HistogramBuilder(), SampleBuilder()

    def add_histograms(self, labels: Any, timestamps: Any, histograms: Any) -> None:
        super().add_histograms(labels, timestamps, histograms)
        for t, h in zip(timestamps, histograms, strict=True):
            self.h.add_histogram(labels, self.base + t, h)

    def add(self, labels: Any, timestamps: Any, values: Any) -> None:
        super().add(labels, timestamps, values)
        self.s.add_series(labels, [self.base + t for t in timestamps], list(values))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1))
def test_the_embedded_store_reads_what_memory_storage_holds(
    seed: int, embedded: Any, dense_everywhere: None
) -> None:
    """Through chDB: the histograms table's rows, read as columns, give MemoryStorage's answers."""
    import time

    base = (int(time.time() * 1000) // 3_600_000 - 3) * 3_600_000
    name = f"h{seed}"
    recorder = _Recorder(0)
    shifted = _Recorder(base)
    _fill([recorder, shifted], seed, name)
    embedded.insert_batch(f"h:{seed}", samples=shifted.s.build(), histograms=shifted.h.build())
    storage = embedded.storage(use_cache=False)
    for q in QUERIES:
        query = q.format(m=name)
        try:
            want = _plain(Engine(recorder).range_query(query, 0, 600_000, 15_000))
        except Exception as exc:
            want = f"{type(exc).__name__}: {exc}"
        try:
            got = _plain(Engine(storage).range_query(query, base, base + 600_000, 15_000))
            # Same samples, timestamps shifted by ``base``.
            got = (
                [
                    (lb, [t - base for t in ts], v, [t - base for t in hts], hs)
                    for lb, ts, v, hts, hs in got[0]
                ],
                *got[1:],
            )
        except Exception as exc:
            got = f"{type(exc).__name__}: {exc}"
        assert got == want, query


@pytest.fixture(scope="module")
def promqltest_reports() -> dict[str, Any]:
    return {f.name: run_file(f) for f in sorted(default_dir().glob("*.test"))}


def test_promqltest_cases_pass_alike_through_columns(
    promqltest_reports: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every promqltest case passes or fails through the columnar read as it does over objects,
    with the dense paths taken wherever they can be (one cell up)."""
    from kernel_insight.kql import histdense

    monkeypatch.setattr(histdense, "DENSE_MIN_CELLS", 1)
    native = 0
    for name, want in promqltest_reports.items():
        got = run_file(default_dir() / name, storage_type=ColumnarMemory)
        assert [(r.case.id, r.passed, r.reason) for r in got.results] == [
            (r.case.id, r.passed, r.reason) for r in want.results
        ], name
        native += got.count("native-histogram", True)
    assert native >= 782  # the native-histogram cases that pass over objects (all 782 today)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), odd=st.booleans())
def test_dense_fractions_are_nativehists_bit_for_bit(seed: int, odd: bool) -> None:
    """dense_fractions over a block gives histogram_fraction's float for every row it decides
    (bounds inside buckets, on bucket edges, in the zero bucket, +-Inf, lower >= upper, NaN), and
    decides most rows of ordinary histograms."""
    from kernel_insight.kql import histogram as nh
    from kernel_insight.kql.histdense import DenseBlock, dense_fractions

    rng = np.random.default_rng(seed)
    hs = [v for _, v in _series(rng, 80, odd_counts=odd) if isinstance(v, FloatHistogram)]
    skewed = rng.random() < 0.3
    if skewed:  # buckets holding fewer observations than the count, or more
        hs = [dataclasses.replace(h, count=h.count * float(rng.choice([0.5, 2.0]))) for h in hs]
    zt = float(rng.choice([0.0, 1e-3, 0.3]))  # 0.3: buckets inside the zero bucket (left to kql.histogram)
    block_hs = [dataclasses.replace(h, schema=1, zero_threshold=zt) for h in hs]
    block = DenseBlock.of(block_hs)
    if block is None:
        return
    edges = [-math.inf, math.inf, math.nan, 0.0, -0.0, 1.0, -1.0, 2**-0.5, 2.0, zt, -zt, 0.5, 7.0, -3.0]
    pick = lambda: float(rng.choice(edges)) if rng.random() < 0.5 else float(rng.normal(0, 4))  # noqa: E731
    lower = np.asarray([pick() for _ in block_hs])
    upper = np.asarray([pick() for _ in block_hs])
    got, done = dense_fractions(lower, upper, block)
    for k, h in enumerate(block_hs):
        if done[k]:
            want, _ = nh.histogram_fraction(float(lower[k]), float(upper[k]), h)
            assert np.float64(want).tobytes() == np.float64(got[k]).tobytes(), (k, lower[k], upper[k], str(h))
    if not odd and not skewed and zt < 0.3:
        assert done.mean() > 0.9


def _bits(h: FloatHistogram) -> tuple[Any, ...]:
    """Everything of ``h``, floats as their bit patterns (-0.0 and NaN told apart)."""

    def b(xs: Any) -> bytes:
        return np.asarray(xs, dtype=np.float64).tobytes()

    return (
        h.schema,
        h.counter_reset_hint,
        b([h.zero_threshold, h.zero_count, h.count, h.sum]),
        h.positive_spans,
        b(h.positive_buckets),
        h.negative_spans,
        b(h.negative_buckets),
        b(h.custom_values),
    )


@st.composite
def _loose_side(draw: Any) -> tuple[tuple[tuple[int, int], ...], tuple[float, ...]]:
    """Spans as a store may hold them (zero-length spans, spans that touch: offset 0 after the
    first) and buckets with zeros of both signs, NaN and negative counts."""
    spans = draw(
        st.lists(st.tuples(st.integers(-4, 4), st.integers(0, 4)), max_size=4).map(
            lambda ss: [(o if k == 0 else abs(o), n) for k, (o, n) in enumerate(ss)]
        )
    )
    value = st.sampled_from([0.0, -0.0, 1.0, 2.5, -1.0, math.nan, 0.0, 3.0])
    buckets = draw(st.lists(value, min_size=sum(n for _, n in spans), max_size=sum(n for _, n in spans)))
    return tuple(spans), tuple(buckets)


@settings(max_examples=200, deadline=None)
@given(
    rows=st.lists(
        st.tuples(_loose_side(), _loose_side(), st.booleans(), st.integers(0, 3)), min_size=1, max_size=8
    )
)
def test_compacted_columns_are_compact_0_bit_for_bit(rows: list[Any]) -> None:
    """SparseHists.compacted gives, row for row, what sum/avg's single-member path makes of the
    objects (``compact(0)`` of a histogram holding a bucket of 0, any other as it is), on spans
    and buckets in any valid layout, exponential and custom (NHCB) schemas."""
    hs = []
    for (ps, pb), (ns, nb), custom, hint in rows:
        if custom:
            top = sum(o + n for o, n in ps)
            hs.append(
                FloatHistogram(
                    schema=-53,
                    count=5.0,
                    sum=1.5,
                    positive_spans=ps,
                    positive_buckets=pb,
                    counter_reset_hint=hint,
                    custom_values=tuple(float(k) for k in range(max(top, 0) + 1)),
                )
            )
        else:
            hs.append(
                FloatHistogram(
                    schema=2,
                    zero_threshold=1e-3,
                    zero_count=1.0,
                    count=7.0,
                    sum=-0.0,
                    positive_spans=ps,
                    positive_buckets=pb,
                    negative_spans=ns,
                    negative_buckets=nb,
                    counter_reset_hint=hint,
                )
            )
    out = SparseHists.of_objects(hs).compacted()
    assert out is not None
    want = [
        h if 0.0 not in h.positive_buckets and 0.0 not in h.negative_buckets else h.compact(0) for h in hs
    ]
    assert [_bits(h) for h in out.objects()] == [_bits(h) for h in want]


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), odd=st.booleans(), integers=st.booleans())
def test_dense_stdvar_is_the_objects_bit_for_bit(seed: int, odd: bool, integers: bool) -> None:
    """histogram_stdvar/stddev of a selector's columns and of a dense block give each object's
    float bit for bit: mixed schemas and zero thresholds, explicit zero, negative and NaN
    buckets, counter resets, integer or fractional counts, custom buckets (left to the objects)."""
    from kernel_insight.kql import histdense, histsamples

    rng = np.random.default_rng(seed)
    hs = [v for _, v in _series(rng, 60, odd_counts=odd) if isinstance(v, FloatHistogram)]
    if not integers:
        hs = [
            dataclasses.replace(
                h,
                count=h.count * 0.7,
                sum=h.sum * 1.3,
                positive_buckets=tuple(b * 0.7 for b in h.positive_buckets),
                negative_buckets=tuple(b * 0.7 for b in h.negative_buckets),
            )
            for h in hs
        ]
    nhcb = FloatHistogram(
        schema=-53,
        count=6.0,
        sum=4.5,
        positive_spans=((0, 2), (1, 1)),
        positive_buckets=(1.0, 0.0, 5.0),
        custom_values=(0.5, 1.0, 2.5),
    )
    if rng.random() < 0.5:
        hs.insert(int(rng.integers(0, len(hs) + 1)), nhcb)
    if not hs:
        return
    stdvar = [np.float64(histsamples.hstdvar(h)).tobytes() for h in hs]
    stddev = [np.float64(histsamples.hstddev(h)).tobytes() for h in hs]
    data = SparseHists.of_objects(hs)
    data._objects = None  # the fallback rows made from the columns, as a store's read
    assert [x.tobytes() for x in histdense.dense_stdvar(data)] == stdvar
    assert [x.tobytes() for x in histdense.dense_stddev(data)] == stddev
    one = [dataclasses.replace(h, schema=1, zero_threshold=1e-3) for h in hs if h.schema != -53]
    block = DenseBlock.of([h.compact(0) for h in one])
    if block is not None:
        want = [np.float64(histsamples.hstdvar(h)).tobytes() for h in block.materialize(0)]
        assert [x.tobytes() for x in histdense.dense_stdvar(block)] == want


SCALAR_OPS = [
    "{m} * 2",
    "{m} * -0.5",
    "-3 * {m}",
    "{m} / 4",
    "{m} / -0.25",
    "{m} / 0",
    "0 * {m}",
    "{m} / (time() - 300)",
    "histogram_count({m} * 3)",
    "{m} * 2 > bool 0",
]


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), odd=st.booleans(), stored_compact=st.booleans())
def test_histograms_times_scalars_over_columns_give_the_object_paths_results(
    seed: int, odd: bool, stored_compact: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``x * s``, ``s * x`` and ``x / s`` of a selector's columns stay columns (scaled, every
    row compacted) and give the per-cell path's results bit for bit: negative scalars (gauges),
    0, a scalar changing by step, zero and NaN buckets, mixed schemas; the columns'
    path checked to run where the vector holds histograms only."""
    from kernel_insight.kql import binary

    rng = np.random.default_rng(seed)
    memory, columnar = MemoryStorage(), ColumnarMemory()
    for i in range(int(rng.integers(1, 5))):
        labels = {"__name__": "h", "i": str(i)}
        for t, v in _series(rng, int(rng.integers(2, 40)), odd_counts=odd):
            for store in (memory, columnar):
                if isinstance(v, FloatHistogram):
                    store.add_histograms(labels, [t], [v.compact(0) if stored_compact else v])
                elif v == "stale":
                    store.add_histograms(labels, [t], [FloatHistogram(sum=STALE_NAN)])
    ran: list[bool] = []
    real = binary.sparse_times_scalar

    def spy(*args: Any) -> Any:
        out = real(*args)
        ran.append(out is not None)
        return out

    monkeypatch.setattr(binary, "sparse_times_scalar", spy)
    for q in SCALAR_OPS:
        query = q.format(m="h")
        want = _plain(Engine(memory).range_query(query, 0, 600_000, 15_000))
        assert _plain(Engine(columnar).range_query(query, 0, 600_000, 15_000)) == want, query
    assert any(ran)


def test_quantile_of_summed_rates_over_columns_makes_no_histogram_object(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``histogram_quantile(0.99, sum by (k) (rate(h[5m])))`` over counters of one schema, read as
    columns: the dense path answers every window, so no column becomes a ``FloatHistogram`` (rate
    made one per sample of the read for windows it had decided already: 2 of 3.9 s in
    bench-histogram's quantile query)."""
    made: list[int] = []
    objects = SparseHists.objects

    def counted(self: SparseHists) -> Any:
        made.append(len(self))
        return objects(self)

    monkeypatch.setattr(SparseHists, "objects", counted)
    columnar, memory = ColumnarMemory(), MemoryStorage()
    rng = np.random.default_rng(5)
    for k in range(4):
        counts = np.cumsum(rng.integers(0, 9, size=(60, 6)), axis=0).astype(np.float64)
        hs = [
            FloatHistogram(
                schema=3,
                count=float(c.sum()),
                sum=float(c.sum()) * 1e-4,
                positive_spans=((-90, 6),),
                positive_buckets=tuple(c.tolist()),
            )
            for c in counts
        ]
        for store in (columnar, memory):
            store.add_histograms({"__name__": "h", "k": str(k)}, np.arange(60) * 15_000, hs)
    query = "histogram_quantile(0.99, sum by (k) (rate(h[5m])))"
    got = Engine(columnar).range_query(query, 300_000, 885_000, 15_000).value
    assert made == []
    want = Engine(memory).range_query(query, 300_000, 885_000, 15_000).value
    assert isinstance(got, Matrix)
    assert isinstance(want, Matrix)
    assert [(s.labels, s.values.tobytes()) for s in got.series] == [
        (s.labels, s.values.tobytes()) for s in want.series
    ]


def test_holders_of_the_same_columns_share_one_set_of_objects() -> None:
    """Two holders of the same columns (a selector's read and the range made of it) make the
    histograms' objects once: what one makes, the other reads, whole, instead of making more."""
    from kernel_insight.kql.pushdown import HistColumns

    hs = [
        FloatHistogram(count=float(k), sum=float(k), positive_spans=((0, 1),), positive_buckets=(float(k),))
        for k in range(1, 9)
    ]
    data = SparseHists.of_objects(hs)
    data = data.with_hints(data.hint)  # columns only: no objects made yet
    ts = np.arange(len(hs), dtype=np.int64)
    read = HistColumns(ts, data, np.asarray([0, len(hs)], dtype=np.int64))
    ranged = HistColumns(ts, read.source(), read.offsets)
    assert ranged.source() is data

    some = read.objects_at(np.asarray([2, 5], dtype=np.int64))
    assert [h is not None for h in some] == [k in (2, 5) for k in range(len(hs))]
    assert not data.objects_made()  # only the rows asked for were made

    made = read.hs
    assert [str(h) for h in made] == [str(h) for h in hs]
    assert ranged.objects_at(np.asarray([1], dtype=np.int64)) is made
    assert ranged.hs is made
