"""Start timestamps through the ClickHouse back end: Prometheus' start_timestamps.test run over the
store (embedded, and a server store that cannot know which metrics have them) gives what it gives
over MemoryStorage, and series without start timestamps read no st where the store knows them."""

from __future__ import annotations

import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kernel_insight.collector.clickhouse.schema import Retention
from kernel_insight.collector.clickhouse.store import EmbeddedStore, ServerStore, Store
from kernel_insight.collector.rows import HistogramBuilder, SampleBuilder, canonical_labels
from kernel_insight.kql.engine import Engine
from kernel_insight.kql.promqltest import default_dir, run_file
from kernel_insight.kql.pushdown import GridColumns, SeriesColumns
from kernel_insight.kql.storage import NO_HINTS, Capability, Matcher, MemoryStorage, SelectHints, SeriesData

SCRIPT = default_dir() / "start_timestamps.test"


class StoreBacked(MemoryStorage):
    """The promqltest runner's storage, written to an embedded store (every sample kept: the
    scripts' data is from 1970) and read back through its kql back end, pushdowns included."""

    def __init__(self) -> None:
        super().__init__()
        self._dir = Path(tempfile.mkdtemp(prefix="ki-st-"))
        self._store: Store | None = None
        self._n = 0

    def _open(self) -> Store:
        if self._store is None:
            self._n += 1
            self._store = self._make(self._dir / str(self._n))
        return self._store

    def _make(self, path: Path) -> Store:
        return EmbeddedStore(path, retention=Retention(samples_days=0), cache_bytes=1 << 24)


class ServerBacked(StoreBacked):
    """StoreBacked over a server store (clickhouse-connect's chDB back end runs the ServerStore
    code in process): it cannot know which metrics have start timestamps, so every read of the
    four functions takes st along and every grid pushdown asks."""

    def _make(self, path: Path) -> Store:
        store = ServerStore.connect(f"chdb://{path}", retention=Retention(samples_days=0))
        assert store.start_timestamp_metrics() is None
        return store

    def add(
        self,
        labels: Mapping[str, str] | Iterable[tuple[str, str]],
        timestamps: Iterable[int],
        values: Iterable[float],
        start_timestamps: Iterable[int] | None = None,
    ) -> None:
        ts, vs = list(timestamps), list(values)
        st = None if start_timestamps is None else list(start_timestamps)
        super().add(labels, ts, vs, st)
        b = SampleBuilder()
        b.add_series_canonical(
            canonical_labels(dict(labels)),
            np.asarray(ts, np.int64),
            np.asarray(vs, np.float64),
            None if st is None else np.asarray(st, np.int64),
        )
        self._open().insert_samples(b.build())

    def add_histograms(
        self,
        labels: Mapping[str, str] | Iterable[tuple[str, str]],
        timestamps: Iterable[int],
        histograms: Iterable[Any],
        start_timestamps: Iterable[int] | None = None,
    ) -> None:
        ts, hs = list(timestamps), list(histograms)
        st = [0] * len(ts) if start_timestamps is None else list(start_timestamps)
        super().add_histograms(labels, ts, hs, None if start_timestamps is None else st)
        b = HistogramBuilder()
        for t, h, s in zip(ts, hs, st, strict=True):
            b.add_histogram(dict(labels), t, h, s)
        self._open().insert_histograms(b.build())

    def clear(self) -> None:
        super().clear()
        if self._store is not None:
            self._store.close()
            self._store = None

    capabilities = frozenset({Capability.COLUMNS, Capability.RANGE_ON_GRID})

    def select(
        self, matchers: Sequence[Matcher], start_ms: int, end_ms: int, hints: SelectHints = NO_HINTS
    ) -> list[SeriesData]:
        return self._open().storage().select(matchers, start_ms, end_ms, hints)

    def select_columns(
        self, matchers: Sequence[Matcher], start_ms: int, end_ms: int, hints: SelectHints = NO_HINTS
    ) -> SeriesColumns:
        return self._open().storage().select_columns(matchers, start_ms, end_ms, hints)

    def select_range_on_grid(
        self, matchers: Sequence[Matcher], start_ms: int, end_ms: int, hints: SelectHints
    ) -> tuple[GridColumns, int] | None:
        return self._open().storage().select_range_on_grid(matchers, start_ms, end_ms, hints)


@pytest.mark.parametrize("backed", [StoreBacked, ServerBacked], ids=["embedded", "server"])
def test_start_timestamps_script_passes_over_the_store_as_over_memory(backed: type[StoreBacked]) -> None:
    want = run_file(SCRIPT)
    got = run_file(SCRIPT, storage_type=backed)
    assert [(r.case.id, r.passed, r.reason) for r in got.results] == [
        (r.case.id, r.passed, r.reason) for r in want.results
    ]
    assert got.count("float", True) == 16  # every float case, start timestamps at work in 14


def test_series_without_start_timestamps_read_no_st_column(tmp_path: Path) -> None:
    """The usual rate: no st in any statement, and the ClickHouse grid pushdown still answers;
    a metric with start timestamps is read with them and the pushdown stands aside."""
    with EmbeddedStore(tmp_path / "d", retention=Retention(samples_days=0), cache_bytes=0) as store:
        b = SampleBuilder()
        for i in range(2):
            b.add_series(
                {"__name__": "plain_total", "i": str(i)},
                list(range(0, 600_000, 15_000)),
                [float(k) for k in range(40)],
            )
        b.add_series_canonical(
            canonical_labels({"__name__": "st_total"}),
            np.arange(0, 600_000, 15_000, dtype=np.int64),
            np.arange(40, dtype=np.float64),
            np.arange(0, 600_000, 15_000, dtype=np.int64) - 1_000,
        )
        store.insert_samples(b.build())
        seen: list[str] = []
        real = store.query
        store.query = lambda sql, params=None: (seen.append(sql), real(sql, params))[1]  # type: ignore[method-assign]
        engine = Engine(store.storage())
        plain = engine.range_query("rate(plain_total[2m])", 300_000, 600_000, 60_000)
        assert len(plain.value.series) == 2
        assert not any("value, st" in sql for sql in seen), seen
        assert any("ToGrid" in sql for sql in seen)  # pushed down as before
        seen.clear()
        # Every sample of st_total starts 1 s before itself, after the previous one: each is a reset.
        got = engine.range_query("increase(st_total[2m])", 300_000, 600_000, 60_000)
        assert any("value, st FROM" in sql for sql in seen)
        assert not any("ToGrid" in sql for sql in seen)
        memory = MemoryStorage()
        memory.add(
            {"__name__": "st_total"},
            range(0, 600_000, 15_000),
            [float(k) for k in range(40)],
            [t - 1_000 for t in range(0, 600_000, 15_000)],
        )
        want = Engine(memory).range_query("increase(st_total[2m])", 300_000, 600_000, 60_000)
        assert [s.values.tolist() for s in got.value.series] == [s.values.tolist() for s in want.value.series]
        assert [s.values.tolist() for s in got.value.series] != [
            s.values.tolist()
            for s in engine.range_query("increase(st_total[2m:15s])", 300_000, 600_000, 60_000).value.series
        ]


def _plain_and_started() -> tuple[Any, MemoryStorage]:
    """plain_total (two series, no start timestamps) and st_total (each sample starts 1 s before
    itself, after the previous one: each is a reset), as a batch and in memory."""
    b = SampleBuilder()
    memory = MemoryStorage()
    ts = np.arange(0, 600_000, 15_000, dtype=np.int64)
    for i in range(2):
        labels = {"__name__": "plain_total", "i": str(i)}
        b.add_series(labels, ts.tolist(), [float(k) for k in range(40)])
        memory.add(labels, ts.tolist(), [float(k) for k in range(40)])
    b.add_series_canonical(
        canonical_labels({"__name__": "st_total"}), ts, np.arange(40, dtype=np.float64), ts - 1_000
    )
    memory.add({"__name__": "st_total"}, ts.tolist(), [float(k) for k in range(40)], (ts - 1_000).tolist())
    return b.build(), memory


def test_a_server_store_reads_start_timestamps_another_collector_wrote(tmp_path: Path) -> None:
    """A server store cannot know which metrics have start timestamps (another collector may write
    them at any time), so it has no staleness to bound: the raw read of the four functions takes
    st along, and the grid pushdown reads whether the window holds any (``st_set``); a series
    with some sends the query to the raw read, and its metric skips the grid from then on."""
    path = tmp_path / "d"
    writer = ServerStore.connect(f"chdb://{path}", retention=Retention(samples_days=0))
    reader = ServerStore.connect(f"chdb://{path}", retention=Retention(samples_days=0))
    try:
        batch, memory = _plain_and_started()
        writer.insert_samples(batch)
        assert reader.start_timestamp_metrics() is None
        assert reader.start_timestamp_metrics_seen() == frozenset()  # the writer's notes are its own
        seen: list[str] = []
        real = reader.query
        reader.query = lambda sql, params=None: (seen.append(sql), real(sql, params))[1]  # type: ignore[method-assign]
        engine, reference = Engine(reader.storage()), Engine(memory)

        def same(query: str) -> None:
            got = engine.range_query(query, 300_000, 600_000, 60_000).value.series
            want = reference.range_query(query, 300_000, 600_000, 60_000).value.series
            assert [s.labels for s in got] == [s.labels for s in want]
            for g, w in zip(got, want, strict=True):  # ClickHouse's grid adds in its own order
                np.testing.assert_allclose(g.values, w.values, rtol=1e-12)

        same("rate(plain_total[2m])")
        grid = [sql for sql in seen if "ToGrid" in sql]
        assert len(grid) == 1  # answered by the grid, which found no st
        assert "st_set" in grid[0]
        assert not any("value, st FROM" in sql for sql in seen)
        seen.clear()
        same("increase(st_total[2m])")  # the grid finds st, the raw read takes it along
        assert [("ToGrid" in sql, "value, st FROM" in sql) for sql in seen if "ki.samples" in sql] == [
            (True, False),
            (False, True),
        ]
        assert reader.start_timestamp_metrics_seen() == {"st_total"}
        seen.clear()
        same("increase(st_total[2m])")  # known now: straight to the raw read
        assert not any("ToGrid" in sql for sql in seen)
        assert any("value, st FROM" in sql for sql in seen)
        seen.clear()
        same("rate(plain_total[2m])")
        assert any("ToGrid" in sql for sql in seen)  # plain_total still pushed down
        seen.clear()
        same("increase(st_total[2m:15s])")  # a subquery: no start timestamps, no st read
        assert not any("st FROM" in sql or "st_set" in sql for sql in seen)
    finally:
        reader.close()
        writer.close()
