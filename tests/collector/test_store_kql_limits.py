"""ClickHouse reads under a kql query's budget: ClickHouse itself stops them at the deadline and the sample limit."""

from __future__ import annotations

import contextlib
import threading
import time
import traceback

import pytest

from kernel_insight.collector.clickhouse.store import EmbeddedStore
from kernel_insight.collector.clickhouse.store import StorageError as StoreError
from kernel_insight.collector.rows import SampleBuilder
from kernel_insight.kql import Engine, EngineLimits, QueryTimeoutError, TooManySamplesError
from kernel_insight.kql.storage import ReadBudget

BASE = (int(time.time()) // 3600) * 3_600_000 - 3_600_000
SERIES, SAMPLES = 40, 60  # 2,400 samples, one every 15 s for 15 minutes


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    store = EmbeddedStore(tmp_path_factory.mktemp("limits"))
    b = SampleBuilder()
    for i in range(SERIES):
        ts = [BASE + k * 15_000 for k in range(SAMPLES)]
        b.add_series({"__name__": "util", "gpu": str(i)}, ts, [float(k) for k in range(SAMPLES)])
    store.insert_batch("seed", samples=b.build())
    yield store
    store.close()


END = BASE + (SAMPLES - 1) * 15_000


@pytest.mark.parametrize(
    ("query", "step_ms"),
    [
        ("util", 60_000),  # the grid push-down (timeSeriesLastToGrid): 40 rows of 11 cells
        ("rate(util[5m])", 60_000),  # a range function pushed down (timeSeries*ToGrid)
        ("util", 15_000),  # raw samples (steps finer than the grid push-down takes)
    ],
)
def test_clickhouse_refuses_reads_over_the_sample_limit(
    store, query: str, step_ms: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    returned: list[int] = [0]
    query_store = store.query

    def spy(sql: str, params=None):
        table = query_store(sql, params)
        if "max_result_rows" in sql:
            returned.append(table.num_rows)
        return table

    monkeypatch.setattr(store, "query", spy)
    engine = Engine(store.storage(use_cache=False), EngineLimits(max_samples=300))
    with pytest.raises(TooManySamplesError) as info:
        engine.range_query(query, BASE + 300_000, END, step_ms)
    assert info.value.message == TooManySamplesError.MESSAGE
    # The bounded read (max_result_rows, 'break' in ClickHouse) refused it, before the engine
    # built anything from the rows.
    assert len(returned) > 1
    assert traceback.extract_tb(info.tb)[-1].name == "_read"
    # Under the limit the same queries are answered.
    big = Engine(store.storage(use_cache=False), EngineLimits(max_samples=100_000))
    assert len(big.range_query(query, BASE + 300_000, END, step_ms).value) == SERIES


def test_clickhouse_stops_a_read_at_the_query_deadline(store) -> None:
    storage = store.storage(use_cache=False)
    budget = ReadBudget(deadline=time.monotonic() + 0.3, timeout_s=0.3, max_samples=10**9)
    began = time.monotonic()
    with pytest.raises(QueryTimeoutError, match=r"query timed out in expression evaluation \(timeout 0.3s\)"):
        storage._read(budget, "SELECT count() FROM numbers(100000000000) WHERE sipHash64(number) % 7 = 1")
    assert time.monotonic() - began < 10  # the statement alone would run for minutes


def test_reads_outside_a_query_are_not_bounded(store) -> None:
    storage = store.storage(use_cache=False)
    table = storage._read(None, "SELECT number FROM numbers(5000)", rows_per_sample=1)
    assert table.num_rows == 5000


def test_a_read_that_fails_midway_does_not_leak_into_the_next(store) -> None:
    # chDB hands the rows a failed statement had produced to the next query (embedded store).
    with pytest.raises(StoreError):
        store.query("SELECT throwIf(number = 500000) AS x FROM numbers(1000000)")
    assert store.query("SELECT number FROM numbers(1000)").num_rows == 1000


def test_a_failed_read_does_not_leak_into_another_threads_read(store) -> None:
    # Before the session lock, about one read in five of the reading thread got the failing
    # statement's rows (or none) while another thread kept failing.
    failures = 0
    wrong = 0
    done = threading.Event()

    def fail() -> None:
        nonlocal failures
        for _ in range(100):
            with contextlib.suppress(StoreError):
                store.query("SELECT throwIf(number = 50000) AS x FROM numbers(100000)")
            failures += 1
        done.set()

    t = threading.Thread(target=fail)
    t.start()
    reads = 0
    while not done.is_set() or reads < 50:
        wrong += store.query("SELECT number FROM numbers(1000)").num_rows != 1000
        reads += 1
    t.join()
    assert failures == 100
    assert wrong == 0, f"{wrong} of {reads} reads got another statement's rows"
