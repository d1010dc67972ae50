"""Label queries over windows of several days: whole days come from the series index alone, and still
answer exactly as MemoryStorage does."""

from __future__ import annotations

import random
import time

import pytest

from kernel_insight.collector.clickhouse.store import EmbeddedStore
from kernel_insight.collector.rows import SampleBuilder
from kernel_insight.kql.storage import Matcher, MemoryStorage

DAY = 86_400_000
D0 = (int(time.time() * 1000) // DAY - 5) * DAY  # midnight UTC, five days ago


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    rng = random.Random(3)
    mem = MemoryStorage()
    b = SampleBuilder()
    for i in range(40):
        labels = {"__name__": f"m{i % 3}", "s": str(i), "odd": "yes" if i % 2 else ""}
        # Each series lives on a few random stretches of the four days, some touching midnight.
        ts = sorted(
            {
                D0 + rng.choice([0, DAY, 2 * DAY, 3 * DAY]) + rng.choice([0, 1, 3_600_000, DAY - 1, DAY // 2])
                for _ in range(rng.randint(1, 4))
            }
        )
        mem.add(labels, ts, [1.0] * len(ts))
        b.add_series(labels, ts, [1.0] * len(ts))
    store = EmbeddedStore(tmp_path_factory.mktemp("days"))
    store.insert_samples(b.build())
    yield store.storage(), mem
    store.close()


WINDOWS = [
    (D0, D0 + 4 * DAY - 1),  # four whole days
    (D0 + 1, D0 + 4 * DAY - 2),  # partial first and last days
    (D0 + DAY, D0 + 2 * DAY - 1),  # exactly one day
    (D0 + DAY - 1, D0 + DAY),  # the two ms around a midnight
    (D0 + DAY // 2, D0 + 3 * DAY + 3_600_000),  # partial, whole, whole, partial
    (D0 + DAY + 2, D0 + DAY + 3_599_999),  # inside one day
    (D0 - 10 * DAY, D0 - 1),  # before any data
    (-(10**15), 10**16),  # far beyond what the schema holds
]


@pytest.mark.parametrize(("start", "end"), WINDOWS)
def test_label_names_and_values_over_days_match_memory_storage(both, start, end):
    ch, mem = both
    for matchers in ([], [Matcher("__name__", "=~", "m[01]")], [Matcher("odd", "=", "yes")]):
        assert ch.label_names(matchers, start, end) == mem.label_names(matchers, start, end)
        for name in ("s", "__name__", "odd"):
            assert ch.label_values(name, matchers, start, end) == mem.label_values(name, matchers, start, end)


@pytest.mark.parametrize(("start", "end"), WINDOWS[:5])
def test_select_over_days_matches_memory_storage(both, start, end):
    ch, mem = both
    got = ch.select([Matcher("s", "!=", "")], start, end)
    want = mem.select([Matcher("s", "!=", "")], start, end)
    assert [(d.labels, d.timestamps.tolist()) for d in got] == [
        (d.labels, d.timestamps.tolist()) for d in want
    ]
