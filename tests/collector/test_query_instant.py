"""Instant selectors that name their metrics (``ClickHouseStorage._last_instant``): one read of the
samples, the other matchers decided on labels, the verdicts kept while the same series are present.

Each answer is compared with kql's reference storage (MemoryStorage) holding the same samples, and
each test checks which path answered, so a silent fallback to the general path fails here.
"""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

from kernel_insight.collector.clickhouse import query
from kernel_insight.collector.clickhouse.store import EmbeddedStore, ServerStore
from kernel_insight.collector.rows import HistogramBuilder, SampleBuilder
from kernel_insight.kql.engine import Engine
from kernel_insight.kql.storage import STALE_NAN, Matcher, MemoryStorage

#: Recent data, so the sample cache (settled hours only) never answers instead.
NOW = int(time.time() * 1000) // 1000 * 1000
LOOKBACK = 300_000


class Both:
    """The same samples in a ClickHouse store and in kql's reference storage."""

    def __init__(self, store) -> None:
        self.store = store
        self.mem = MemoryStorage()

    def add(self, series: list[tuple[dict[str, str], list[int], list[float]]]) -> None:
        b = SampleBuilder()
        for labels, ts, vs in series:
            b.add_series(labels, ts, vs)
            for t, v in zip(ts, vs, strict=True):
                self.mem.add(labels, [t], [v])
        self.store.insert_samples(b.build())

    def check(self, selector: str, t: int, *, instant: bool) -> list[dict[str, str]]:
        """The selector at ``t`` on both; whether the instant read answered must be ``instant``."""
        ch = self.store.storage()
        answered = []
        real = ch._last_instant

        def spy(*args, **kwargs):
            result = real(*args, **kwargs)
            answered.append(result is not None)
            return result

        ch._last_instant = spy
        got = Engine(ch).instant_query(selector, t).value
        want = Engine(self.mem).instant_query(selector, t).value
        assert [s.labels for s in got.samples] == [s.labels for s in want.samples], selector
        np.testing.assert_array_equal([s.value for s in got.samples], [s.value for s in want.samples])
        assert answered == [instant], f"{selector}: instant read answered {answered}"
        return [dict(s.labels) for s in got.samples]


@pytest.fixture(params=["embedded", "clickhouse-connect-chdb"])
def both(request, tmp_path):
    # The second runs ServerStore's code (its histogram check is a query, not a known set).
    store = (
        EmbeddedStore(tmp_path / "s", cache_bytes=0)
        if request.param == "embedded"
        else ServerStore.connect(f"chdb://{tmp_path / 's'}")
    )
    yield Both(store)
    store.close()


def _fleet(instances: int, *, t: int = NOW - 10_000) -> list[tuple[dict[str, str], list[int], list[float]]]:
    out = []
    for n in range(instances):
        for gpu in range(2):
            base = {"instance": f"n{n}", "gpu": str(gpu)}
            out.append(
                ({**base, "__name__": "gpu_power_watts"}, [t - 60_000, t], [100.0 + n, 200.0 + n + gpu])
            )
            out.append(({**base, "__name__": "gpu_temperature_celsius"}, [t], [40.0 + gpu]))
            out.append(({**base, "__name__": "other_metric"}, [t], [1.0]))
    return out


def test_named_metrics_and_label_matchers_equal_the_reference(both):
    both.add(_fleet(4))
    both.add([({"__name__": "gpu_power_watts", "gpu": "0"}, [NOW - 5_000], [7.0])])  # no instance label
    for selector in (
        "gpu_power_watts",
        'gpu_power_watts{instance!=""}',
        '{__name__=~"gpu_power_watts|gpu_temperature_celsius", instance!=""}',
        '{__name__=~"(gpu_power_watts|gpu_temperature_celsius)", gpu="1"}',
        'gpu_power_watts{instance=~"n[12]", gpu!="0"}',
        '{__name__="gpu_power_watts", __name__!="x"}',
    ):
        assert both.check(selector, NOW, instant=True), selector
    assert both.check("absent_metric", NOW, instant=True) == []


def test_selectors_without_a_literal_metric_set_take_the_general_path(both):
    both.add(_fleet(2))
    assert both.check('{__name__=~"gpu_.*"}', NOW, instant=False)
    assert both.check('{instance="n1"}', NOW, instant=False)


def test_lookback_edges_and_stale_markers(both):
    t = NOW
    both.add(
        [
            ({"__name__": "m", "s": "edge_out"}, [t - LOOKBACK], [1.0]),  # (t - 5m, t] leaves it out
            ({"__name__": "m", "s": "edge_in"}, [t - LOOKBACK + 1], [2.0]),
            ({"__name__": "m", "s": "at_t"}, [t - 1_000, t], [3.0, 4.0]),
            ({"__name__": "m", "s": "after_t"}, [t - 1_000, t + 1], [5.0, 6.0]),
            ({"__name__": "m", "s": "stale"}, [t - 2_000, t - 1_000], [7.0, STALE_NAN]),
            ({"__name__": "m", "s": "stale_then_back"}, [t - 2_000, t - 1_000], [STALE_NAN, 8.0]),
            ({"__name__": "m", "s": "nan"}, [t - 1_000], [math.nan]),
        ]
    )
    got = both.check("m", t, instant=True)
    assert [g["s"] for g in got] == ["after_t", "at_t", "edge_in", "nan", "stale_then_back"]


def test_series_that_come_and_go_between_reads_are_seen(both):
    selector = '{__name__=~"gpu_power_watts|gpu_temperature_celsius", instance!=""}'
    both.add(_fleet(2))
    first = both.check(selector, NOW, instant=True)
    both.add([({"__name__": "gpu_power_watts", "instance": "n9", "gpu": "0"}, [NOW - 1_000], [9.0])])
    second = both.check(selector, NOW, instant=True)
    assert len(second) == len(first) + 1
    # Later, n0 and n1 have no sample within the lookback: only n9 is left.
    later = NOW - 1_000 + LOOKBACK - 1
    assert {g["instance"] for g in both.check(selector, later, instant=True)} == {"n9"}
    assert len(both.check(selector, NOW, instant=True)) == len(second)  # the earlier set again


def _statements(store, monkeypatch) -> list[str]:
    """Every statement the store runs from now on."""
    statements: list[str] = []
    real = store.query

    def spy(sql, *args, **kwargs):
        statements.append(sql)
        return real(sql, *args, **kwargs)

    monkeypatch.setattr(store, "query", spy)
    return statements


def test_steady_reads_ask_the_series_table_nothing(both, monkeypatch):
    both.add(_fleet(3))
    selector = 'gpu_power_watts{instance!=""}'
    both.check(selector, NOW, instant=True)  # learns the labels and the verdicts
    statements = _statements(both.store, monkeypatch)
    assert len(both.check(selector, NOW, instant=True)) == 6
    reads = [s for s in statements if "histograms" not in s]
    assert len(reads) == 1, statements
    assert "argMax" in reads[0]
    assert query.qualified(both.store.database, "series") not in reads[0]


def test_too_many_series_for_an_instant_read_take_the_general_path_and_stay_there(both, monkeypatch):
    monkeypatch.setattr(query, "INSTANT_READ_MAX_ROWS", 3)
    both.add(_fleet(3))
    assert len(both.check("gpu_power_watts", NOW, instant=False)) == 6
    asked = _statements(both.store, monkeypatch)
    both.check("gpu_power_watts", NOW, instant=False)
    assert not any("argMax" in s for s in asked)  # remembered: no second try


def test_metrics_with_native_histograms_take_the_general_path(both):
    both.add(_fleet(1))
    h = HistogramBuilder()
    h.add(
        {"__name__": "gpu_power_watts", "instance": "h0"},
        NOW - 1_000,
        schema=0,
        count=2,
        sum=3.0,
        positive_spans=[(0, 1)],
        positive_buckets=[2.0],
    )
    both.store.insert_histograms(h.build())
    ch = both.store.storage()
    grid = ch._last_instant([Matcher("__name__", "=", "gpu_power_watts")], NOW, LOOKBACK, None, True)
    assert grid is None
    assert (
        ch._last_instant([Matcher("__name__", "=", "gpu_temperature_celsius")], NOW, LOOKBACK, None, True)
        is not None
    )


def test_selective_matchers_over_many_series_take_the_general_path_after_the_first_read(both, monkeypatch):
    monkeypatch.setattr(query, "INSTANT_SELECTIVE_MIN_ROWS", 4)
    monkeypatch.setattr(query, "INSTANT_SELECTIVE_SHARE", 4)  # under 1 in 4 of over 4 series
    both.add(_fleet(4))  # 8 gpu_power_watts series, one of them n2's GPU 1
    selector = 'gpu_power_watts{instance="n2", gpu="1"}'
    assert len(both.check(selector, NOW, instant=True)) == 1  # learns that 1 in 8 matches
    assert len(both.check(selector, NOW, instant=False)) == 1
    assert len(both.check('gpu_power_watts{gpu="1"}', NOW, instant=True)) == 4  # half: stays
    assert len(both.check('gpu_power_watts{gpu="1"}', NOW, instant=True)) == 4


def test_a_series_stored_before_its_series_row_is_judged_at_the_next_read(both, monkeypatch):
    """Samples can be readable before their series-table row: such a series is left unjudged and
    must be judged at the next read even though the present series did not change (else it stays
    unselected until some series comes or goes, in a steady fleet perhaps never)."""
    both.add(_fleet(1))
    ch = both.store.storage()
    real = ch._labels_of
    rows_readable = False

    def labels_of(budget, metrics, fps, start_ms, end_ms):
        got = real(budget, metrics, fps, start_ms, end_ms)
        return got if rows_readable else {}

    monkeypatch.setattr(ch, "_labels_of", labels_of)
    selector = [Matcher("__name__", "=", "gpu_power_watts")]
    first = ch._last_instant(selector, NOW, LOOKBACK, None, True)
    assert first is not None
    assert first.labels == []
    rows_readable = True
    second = ch._last_instant(selector, NOW, LOOKBACK, None, True)
    assert second is not None
    assert sorted(dict(labels)["gpu"] for labels in second.labels) == ["0", "1"]
