"""The engine's lean paths (``_Evaluator.instant_selector``, ``_Evaluator.range_selector``): a
bare selector and ``absent`` of one, answered without the general evaluation's machinery, equal
its answer (the same JSON bytes, samples and peak) over a real store: random float series with
stale markers and gaps, series with start timestamps, native histograms (the instant path
leaves them to the general one), cached and uncached hours, windows at hour edges, before
series begin and past the data."""

from __future__ import annotations

import random
import time
from typing import Any

import numpy as np
import pytest

from kernel_insight.collector.clickhouse.query import ClickHouseStorage
from kernel_insight.collector.clickhouse.store import EmbeddedStore
from kernel_insight.collector.rows import HistogramBuilder, SampleBuilder, canonical_labels
from kernel_insight.collector.sample_cache import BLOCK_MS, SampleCache
from kernel_insight.kql import engine as engine_module
from kernel_insight.kql.engine import Engine, _Evaluator
from kernel_insight.kql.histogram import FloatHistogram
from kernel_insight.kql.storage import STALE_NAN, Matcher
from kernel_insight.kql.values import prometheus_json_bytes

# Whole UTC hours inside the default retention: the cache's clock is set so the first two are settled.
HOUR0 = int(time.time() * 1000) // BLOCK_MS * BLOCK_MS - 6 * BLOCK_MS
HOURS = 3
STEP = 15_000
LOOKBACK = 300_000


# The last native histogram sample (_fill writes one a minute from HOUR0 + 3 s).
LAST_HISTOGRAM = HOUR0 + 3_000 + (HOURS * BLOCK_MS - 3_000 - 1) // 60_000 * 60_000


def _hist(i: int) -> FloatHistogram:
    return FloatHistogram(
        schema=3,
        zero_threshold=1e-128,
        zero_count=1.0,
        count=1.0 + 3 * i,
        sum=0.25 * i,
        positive_spans=((-2, 1), (3, 1)),
        positive_buckets=(float(i), float(2 * i)),
    )


def _fill(store: EmbeddedStore) -> None:
    rng = random.Random(17)
    s, h = SampleBuilder(), HistogramBuilder()
    for metric in ("gpu_temp", "launches_total"):
        for inst in ("n0", "n1", "n2"):
            for gpu in range(3):
                if rng.random() < 0.15:
                    continue
                first = rng.randrange(0, HOURS * BLOCK_MS // 2)  # series begin at different times
                last = HOURS * BLOCK_MS - rng.choice([0, 0, 20 * 60_000])  # some end early
                ts = [t + rng.randint(-2000, 2000) for t in range(HOUR0 + first, HOUR0 + last, STEP)]
                ts = [t for k, t in enumerate(ts) if k % 37 not in (5, 6, 7)]  # gaps under the lookback
                vs = [rng.gauss(60, 10) if rng.random() > 0.03 else STALE_NAN for _ in ts]
                labels = {"__name__": metric, "instance": inst, "gpu": str(gpu)}
                if metric == "launches_total":
                    labels["kernel"] = rng.choice(["gemm", "attn"])
                s.add_series(labels, ts, vs)
    # Counters with start timestamps (each sample's start a second before it).
    for inst in ("n0", "n1"):
        ts_st = np.arange(HOUR0 + 7_000, HOUR0 + HOURS * BLOCK_MS, STEP, dtype=np.int64)
        s.add_series_canonical(
            canonical_labels({"__name__": "started_total", "instance": inst}),
            ts_st,
            np.arange(len(ts_st), dtype=np.float64),
            ts_st - 1_000,
        )
    # Native histograms, and a series that changes from floats to histograms.
    for gpu in ("0", "1"):
        for k, t in enumerate(range(HOUR0 + 3_000, HOUR0 + HOURS * BLOCK_MS, 60_000)):
            h.add_histogram({"__name__": "kernel_duration_seconds", "gpu": gpu}, t, _hist(k + 1))
    mixed = {"__name__": "kernel_duration_seconds", "gpu": "2"}
    s.add_series(mixed, list(range(HOUR0, HOUR0 + BLOCK_MS, STEP)), [1.0] * (BLOCK_MS // STEP))
    for k, t in enumerate(range(HOUR0 + BLOCK_MS, HOUR0 + HOURS * BLOCK_MS, 60_000)):
        h.add_histogram(mixed, t, _hist(k + 1))
    store.insert_batch("b:1", samples=s.build(), histograms=h.build())


@pytest.fixture
def store(tmp_path):
    s = EmbeddedStore(tmp_path / "d")
    _fill(s)
    # Hours 0 and 1 settled (cacheable), hour 2 still being written: windows in it read ClickHouse.
    settled_at = HOUR0 + 2 * BLOCK_MS + 3 * 60_000
    s.sample_cache = SampleCache(64 << 20, clock=lambda: settled_at / 1000)
    yield s
    s.close()


SELECTORS = [
    "gpu_temp",
    'gpu_temp{instance="n1"}',
    'gpu_temp{instance=~"n[01]", gpu!="2"}',
    'launches_total{kernel="attn"}',
    'launches_total{kernel!="gemm", gpu!~"2"}',
    'gpu_temp{instance="nowhere"}',
    'gpu_temp{missing=""}',
    "started_total",
    "kernel_duration_seconds",
    'kernel_duration_seconds{gpu="2"}',
    '{__name__=~"gpu_temp|launches_total", gpu="1"}',
    'nothing_at_all{job="x"}',
]
QUERIES = [q for sel in SELECTORS for q in (sel, f"absent({sel})")]
QUERIES += ['(gpu_temp{instance="n1"})', 'absent((gpu_temp{instance="nowhere"}))', "gpu_temp offset 1m"]
QUERIES += ["rate(started_total[5m])"]


def _answer(engine: Engine, q: str, t: int) -> tuple[bytes, int, int]:
    r = engine.instant_query(q, t)
    return prometheus_json_bytes(r.value), r.stats.samples, r.stats.peak_samples


def _recorded(monkeypatch: pytest.MonkeyPatch, owner: type, name: str) -> list[Any]:
    """What every call of ``owner.name`` returns from now on, in order (the method still answers)."""
    real = getattr(owner, name)
    got: list[Any] = []
    monkeypatch.setattr(owner, name, lambda *a: got.append(real(*a)) or got[-1])
    return got


def _fill_the_cache(store: EmbeddedStore) -> None:
    """Queue the fill of the settled hours (0 and 1) of every metric the cache may hold, and wait for it."""
    for metric in ("gpu_temp", "launches_total", "started_total", "kernel_duration_seconds"):
        store.storage().select_columns([Matcher("__name__", "=", metric)], HOUR0, HOUR0 + HOURS * BLOCK_MS)
    assert store.sample_cache.wait_idle()


def test_the_lean_instant_path_answers_as_the_general_one(store, monkeypatch):
    rng = random.Random(3)
    times = [HOUR0 + k * BLOCK_MS + d for k in range(HOURS + 1) for d in (-1, 0, LOOKBACK - 1)]
    times += [HOUR0 + rng.randrange(0, HOURS * BLOCK_MS + 10 * 60_000) for _ in range(4)]
    lean: dict[str, int] = {"cached": 0, "uncached": 0}
    general = 0
    answered = _recorded(monkeypatch, _Evaluator, "instant_selector")
    grid_reads = _recorded(monkeypatch, ClickHouseStorage, "select_last_on_grid")
    from_blocks = _recorded(monkeypatch, ClickHouseStorage, "_cached_last")
    _fill_the_cache(store)
    chosen = engine_module._lean_selector
    for use_cache in (True, False):
        engine = Engine(store.storage(use_cache=use_cache))
        for q in QUERIES:
            for t in times:
                monkeypatch.setattr(engine_module, "_lean_selector", lambda expr: None)
                want = _answer(engine, q, t)
                monkeypatch.setattr(engine_module, "_lean_selector", chosen)
                answered.clear()
                grid_reads.clear()
                from_blocks.clear()
                got = _answer(engine, q, t)
                assert got == want, (q, t, use_cache)
                # A declined grid read is not asked again by the general path that follows.
                assert len(grid_reads) <= 1, (q, t)
                if answered and answered[0] is not None:
                    lean["cached" if from_blocks and from_blocks[0] is not None else "uncached"] += 1
                else:
                    general += 1
                if q.startswith(("(", "absent((")) or "offset" in q or "rate(" in q:
                    assert not answered  # not a lean shape (parentheses: see _lean_selector)
                elif (
                    "kernel_duration_seconds" in q and t >= HOUR0 + BLOCK_MS and t - LOOKBACK < LAST_HISTOGRAM
                ):
                    # Histograms in the window: the general path. A window past the data may be
                    # answered lean (nothing there): it is when it falls in a later UTC day, whose
                    # series rows do not name the histogram metric (from 03:00 to 04:00 UTC here).
                    assert answered == [None]
    assert lean["cached"] > 60, lean  # answered from the cached hours' blocks
    assert lean["uncached"] > 100, lean  # answered by ClickHouse (hour 2, and no cache)
    assert general > 50


def test_the_lean_path_keeps_the_series_limit(store):
    from kernel_insight.kql.engine import EngineLimits
    from kernel_insight.kql.errors import TooManySeriesError

    engine = Engine(store.storage(), EngineLimits(max_series=2))
    with pytest.raises(TooManySeriesError):
        engine.instant_query("gpu_temp", HOUR0 + BLOCK_MS)


def _range_answer(engine: Engine, q: str, start: int, end: int, step: int) -> tuple[bytes, int, int, int]:
    r = engine.range_query(q, start, end, step)
    return prometheus_json_bytes(r.value), r.stats.samples, r.stats.peak_samples, r.stats.series


def test_the_lean_range_path_answers_as_the_general_one(store, monkeypatch):
    """``_Evaluator.range_selector``: a bare selector and ``absent`` of one over a range (steps
    on and off the samples, windows over cached hours, the hour still written, before the
    series and past the data; histograms and a float-to-histogram series among them) give the
    general evaluation's bytes, samples, peak and series count."""
    rng = random.Random(5)
    windows = [
        (HOUR0 + 30 * 60_000, HOUR0 + 90 * 60_000, 15_000),  # cached hours 0-1
        (HOUR0 - 20 * 60_000, HOUR0 + 40 * 60_000, 15_000),  # before every series
        (HOUR0, HOUR0 + HOURS * BLOCK_MS, 60_000),  # all three hours (the last one uncached)
        (HOUR0 + 2 * BLOCK_MS + 5_000, HOUR0 + 2 * BLOCK_MS + 50 * 60_000, 30_000),  # uncached hour
        (HOUR0 + HOURS * BLOCK_MS - 10 * 60_000, HOUR0 + HOURS * BLOCK_MS + 20 * 60_000, 15_000),  # past
        (HOUR0 + BLOCK_MS - 7_000, HOUR0 + BLOCK_MS + 7_000, 1_000),  # fine steps, an hour edge
    ]
    for _ in range(3):
        start = HOUR0 + rng.randrange(0, HOURS * BLOCK_MS)
        windows.append((start, start + rng.randrange(0, 2 * BLOCK_MS), rng.choice([15_000, 37_000, 60_000])))
    answered = _recorded(monkeypatch, _Evaluator, "range_selector")
    grid_reads = _recorded(monkeypatch, ClickHouseStorage, "select_last_on_grid")
    _fill_the_cache(store)
    chosen = engine_module._lean_selector
    lean = empty_absent = 0
    for use_cache in (True, False):
        engine = Engine(store.storage(use_cache=use_cache))
        for q in QUERIES:
            for start, end, step in windows:
                monkeypatch.setattr(engine_module, "_lean_selector", lambda expr: None)
                want = _range_answer(engine, q, start, end, step)
                monkeypatch.setattr(engine_module, "_lean_selector", chosen)
                answered.clear()
                grid_reads.clear()
                got = _range_answer(engine, q, start, end, step)
                assert got == want, (q, start, end, step, use_cache)
                assert len(grid_reads) <= 1, (q, start, end, step)
                if q.startswith(("(", "absent((")) or "offset" in q or "rate(" in q:
                    assert not answered
                else:
                    assert len(answered) == 1
                    lean += 1
                    empty_absent += q.startswith("absent(") and got[1] == 0 and b'"values":[[' in got[0]
    assert lean == 2 * len(SELECTORS) * 2 * len(windows)
    assert empty_absent > 30  # absent of a selector that matched nothing: one series of 1


def test_the_lean_range_path_keeps_the_limits(store):
    from kernel_insight.kql.engine import EngineLimits
    from kernel_insight.kql.errors import TooManySamplesError, TooManySeriesError

    start, end = HOUR0 + 10 * 60_000, HOUR0 + 70 * 60_000
    with pytest.raises(TooManySeriesError):
        Engine(store.storage(), EngineLimits(max_series=2)).range_query("gpu_temp", start, end, 15_000)
    # absent's 241 ones count toward the limit as the general evaluation counts them.
    with pytest.raises(TooManySamplesError):
        Engine(store.storage(), EngineLimits(max_samples=200)).range_query(
            'absent(gpu_temp{instance="nowhere"})', start, end, 15_000
        )
    answer = Engine(store.storage(), EngineLimits(max_samples=241)).range_query(
        'absent(gpu_temp{instance="nowhere"})', start, end, 15_000
    )
    assert answer.stats.peak_samples == 241
