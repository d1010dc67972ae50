"""Random interleavings of writes, reads, background fills, clears and evictions: a read through
the sample cache always equals the same read without it (hypothesis state machine)."""

from __future__ import annotations

import itertools
import time

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from kernel_insight.collector.clickhouse.store import EmbeddedStore
from kernel_insight.collector.rows import SampleBuilder
from kernel_insight.collector.sample_cache import BLOCK_MS, SampleCache
from kernel_insight.kql.storage import Matcher

HOUR0 = int(time.time() * 1000) // BLOCK_MS * BLOCK_MS - 8 * BLOCK_MS
HOURS = 4
_metrics = itertools.count()


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    s = EmbeddedStore(tmp_path_factory.mktemp("cache-machine"))
    yield s
    s.close()


def test_the_cache_never_answers_differently(store):
    class Machine(RuleBasedStateMachine):
        """One fresh metric per example, so examples share the store but not their data."""

        @initialize()
        def setup(self) -> None:
            self.metric = f"m{next(_metrics)}"
            self.used: set[tuple[int, int]] = set()  # (series, ts): one value per timestamp
            store.sample_cache = SampleCache(4 << 20, clock=lambda: (HOUR0 + 10 * BLOCK_MS) / 1000)

        @rule(
            series=st.integers(0, 5),
            hour=st.integers(0, HOURS - 1),
            seconds=st.lists(st.integers(0, 3599), min_size=1, max_size=40, unique=True),
            value=st.floats(-1e6, 1e6),
        )
        def write(self, series: int, hour: int, seconds: list[int], value: float) -> None:
            b = SampleBuilder()
            for s in seconds:
                t = HOUR0 + hour * BLOCK_MS + s * 1000
                if (series, t) in self.used:
                    continue
                self.used.add((series, t))
                b.add({"__name__": self.metric, "gpu": str(series), "pair": str(series % 2)}, t, value + s)
            if len(b.build()):
                store.insert_samples(b.build())

        @rule(
            start=st.integers(-BLOCK_MS, HOURS * BLOCK_MS),
            length=st.integers(0, 3 * BLOCK_MS),
            pair=st.sampled_from(["", "0", "1"]),
        )
        def read(self, start: int, length: int, pair: str) -> None:
            matchers = [Matcher("__name__", "=", self.metric)]
            if pair:
                matchers.append(Matcher("pair", "=", pair))
            a, z = HOUR0 + start, HOUR0 + start + length
            want = store.storage(use_cache=False).select_columns(matchers, a, z)
            cache = store.sample_cache
            assert cache is not None
            for _ in range(2):  # the first read may queue a fill; the second then reads the cache
                got = store.storage().select_columns(matchers, a, z)
                assert got.labels == want.labels
                np.testing.assert_array_equal(got.offsets, want.offsets)
                np.testing.assert_array_equal(got.ts, want.ts)
                np.testing.assert_array_equal(got.vs, want.vs)
                assert cache.wait_idle()

        @rule()
        def let_fills_finish(self) -> None:
            assert store.sample_cache is not None
            assert store.sample_cache.wait_idle()

        @rule()
        def clear(self) -> None:
            assert store.sample_cache is not None
            store.sample_cache.clear()

        @rule(budget=st.sampled_from([2 << 10, 16 << 10, 4 << 20]))
        def resize(self, budget: int) -> None:
            """A new, smaller or larger cache: evictions and oversized hours happen."""
            old = store.sample_cache
            assert old is not None
            old.close()
            store.sample_cache = SampleCache(budget, clock=lambda: (HOUR0 + 10 * BLOCK_MS) / 1000)

        @invariant()
        def within_budget(self) -> None:
            cache = store.sample_cache
            if cache is not None:
                stats = cache.stats()
                assert stats.bytes <= stats.max_bytes
                assert stats.fills_failed == 0

        def teardown(self) -> None:
            if store.sample_cache is not None:
                store.sample_cache.close()

    Machine.TestCase.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
    Machine.TestCase().runTest()
