"""One read per metric per evaluation (rules/prefetch.py) answers exactly what the store would."""

from __future__ import annotations

import numpy as np
import pytest

from kernel_insight.kql import Engine, MemoryStorage, parse
from kernel_insight.rules.prefetch import CycleStorage, read_windows

T = 10_000_000


@pytest.fixture
def store():
    rng = np.random.default_rng(3)
    s = MemoryStorage()
    for inst in range(6):
        for gpu in range(4):
            ts = np.arange(T - 3_600_000, T + 60_000, 15_000) + inst * 1000
            base = {"instance": f"h{inst}", "gpu": str(gpu)}
            s.add({"__name__": "temp", **base}, ts, rng.normal(60, 10, len(ts)))
            s.add({"__name__": "launches_total", **base}, ts, np.cumsum(rng.poisson(5, len(ts))))
    return s


QUERIES = [
    "temp",
    'temp{instance="h2"} > 60',
    'temp{instance="h2", gpu="1"}',
    'temp{instance=~"h[12]", gpu!="0"}',
    "avg_over_time(temp[5m])",
    "rate(launches_total[10m] offset 5m)",
    'max_over_time(rate(launches_total{gpu="3"}[1m])[20m:1m])',
    "temp @ 9000",  # pinned: read through to the store
    'count({__name__=~"temp|launches_total"})',  # a name by regex: read through
    "sum by (instance) (temp) / on (instance) group_left () max(temp)",
    'temp{instance=""}',
    "temp offset -1m",  # a read after the evaluation time: through
]


@pytest.mark.parametrize("query", QUERIES)
def test_answers_equal_the_stores(store, query):
    expr = parse(query)
    cycle = CycleStorage(store, T, read_windows([expr]))
    got = Engine(cycle).instant_query(expr, T).value
    want = Engine(store).instant_query(expr, T).value
    assert got == want


def test_each_metric_is_read_once_for_the_whole_group(store):
    exprs = [parse(q) for q in QUERIES[:7]]
    windows = read_windows(exprs)
    assert windows == {"temp": 600_000, "launches_total": 1_200_000 + 60_000 + 300_000}
    cycle = CycleStorage(store, T, windows)
    engine = Engine(cycle)
    for e in exprs:
        engine.instant_query(e, T)
    assert cycle.reads == 1  # short windows are read together, with the longest of them


def test_what_the_group_writes_is_seen_by_the_next_rule(store):
    cycle = CycleStorage(store, T, read_windows([parse("temp"), parse("rec")]))
    engine = Engine(cycle)
    assert engine.instant_query("rec", T).value.samples == ()
    written = [((("__name__", "rec"), ("x", "1")), T, 4.0)]
    store.add(dict(written[0][0]), [T], [4.0])
    cycle.absorb(written)
    (s,) = engine.instant_query("rec", T).value.samples
    assert (s.labels, s.value) == ((("__name__", "rec"), ("x", "1")), 4.0)
    assert cycle.reads == 1


def test_only_reads_held_in_memory_are_served_from_it():
    from kernel_insight.rules.prefetch import served_from_memory

    assert served_from_memory(parse("rate(x[5m]) > on (a) group_left () max(y offset 1m)"))
    assert served_from_memory(parse("max_over_time(rate(x[1m])[10m:1m])"))
    assert not served_from_memory(parse('{__name__=~"x|y"}'))
    assert not served_from_memory(parse("x @ 100"))
    assert not served_from_memory(parse("x offset -1m"))
    assert not served_from_memory(parse("x[step() * 2]"))
    assert not served_from_memory(parse("info(x)"))


def test_rate_of_a_metric_read_first_by_another_rule_keeps_its_start_timestamps():
    """What is held answers rate even when another function read the metric first (its read then
    asked for no start timestamps): the held series carry them, as the store's rate reads them."""
    s = MemoryStorage()
    ts = np.arange(T - 1_800_000, T + 1, 15_000)
    # Starts 1 s before each sample from halfway on: a reset at every sample the values do not show.
    st = np.where(ts >= T - 600_000, ts - 1_000, 0)
    s.add({"__name__": "c_total"}, ts, np.arange(len(ts), dtype=float), st)
    exprs = [parse("sum_over_time(c_total[10m])"), parse("rate(c_total[5m])")]
    cycle = CycleStorage(s, T, read_windows(exprs))
    engine = Engine(cycle)
    engine.instant_query(exprs[0], T)
    got = engine.instant_query(exprs[1], T).value
    want = Engine(s).instant_query(exprs[1], T).value
    assert got == want
    assert got != Engine(s).instant_query(parse("rate(c_total[5m:15s])"), T).value


def test_with_a_head_each_distinct_read_goes_to_it_once_and_the_groups_writes_are_seen(tmp_path):
    """Over a store whose head covers the window (collector/head.py), the group's rules share
    each distinct read (selector and window, or an instant selector's newest samples) instead of
    copying metrics into per-series objects; answers are the store's, and a metric the group
    wrote this evaluation is read with what it wrote."""
    import time

    from kernel_insight.collector.clickhouse.store import EmbeddedStore
    from kernel_insight.collector.rows import SampleBuilder

    now = (int(time.time()) // 60) * 60_000
    store = EmbeddedStore(tmp_path, head_bytes=1 << 26, head_window_ms=3_600_000)
    try:
        deadline = time.monotonic() + 60
        while not store.head.ready:  # type: ignore[union-attr]
            assert time.monotonic() < deadline, "the head did not load"
            time.sleep(0.02)
        b = SampleBuilder()
        ts = list(range(now - 600_000, now + 1, 15_000))
        for inst in range(3):
            b.add_series({"__name__": "temp", "instance": f"h{inst}"}, ts, [float(inst + t % 7) for t in ts])
            b.add_series(
                {"__name__": "c_total", "instance": f"h{inst}"}, ts, [float(k) for k in range(len(ts))]
            )
        store.insert_batch("b", samples=b.build())
        queries = [
            "temp > 1",
            "temp > 1",
            "rate(c_total[5m]) / on (instance) temp",
            "rate(c_total[5m])",
            "rec",
        ]
        exprs = [parse(q) for q in queries]
        cycle = CycleStorage(store.storage(), now, read_windows(exprs))
        engine, plain = Engine(cycle), Engine(store.storage())
        for e in exprs[:4]:
            assert engine.instant_query(e, now).value == plain.instant_query(e, now).value
        # temp's newest samples and c_total's 5 minutes: two reads for four rules; nothing copied.
        assert (cycle.shared_reads, cycle.reads) == (2, 0)
        written = [((("__name__", "rec"), ("x", "1")), now, 4.0)]
        cycle.absorb(written, load=True)  # the writer's way: not in the store yet
        (s,) = engine.instant_query("rec", now).value.samples
        assert (s.labels, s.value) == ((("__name__", "rec"), ("x", "1")), 4.0)
    finally:
        store.close()
