"""A MemoryStorage whose ``select_columns`` hands histograms over as columns (SparseHists), the
counter-reset hints left pending as the ClickHouse read leaves them: the promqltest scripts and
property tests run the engine's columnar histogram path through it."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kernel_insight.kql.pushdown import HistColumns, SeriesColumns, columns_of
from kernel_insight.kql.sparsehists import SparseHists, tsdb_pending
from kernel_insight.kql.storage import NO_HINTS, Capability, Matcher, MemoryStorage, SelectHints


class ColumnarMemory(MemoryStorage):
    """MemoryStorage's samples; histograms as the stored objects (hints as written), except each
    window's first, which keeps the hint MemoryStorage gives it (it decides that one from the
    sample before the window, which a columnar read does not see)."""

    capabilities = frozenset({Capability.COLUMNS})

    def select_columns(
        self, matchers: Sequence[Matcher], start_ms: int, end_ms: int, hints: SelectHints = NO_HINTS
    ) -> SeriesColumns:
        series = self.select(matchers, start_ms, end_ms, hints)
        cols = columns_of(series)
        if cols.hist is None:
            return cols
        raw: list[object] = []
        for data in series:
            stored = self._series[data.labels]
            # The stored histograms in time order, deduplicated as arrays() does (the last write wins).
            hts = np.asarray(stored.hts, dtype=np.int64)
            order = np.argsort(hts, kind="stable")
            by_t = {int(hts[i]): stored.hs[i] for i in order.tolist()}
            hs = [by_t[t] for t in data.hist_timestamps.tolist()]
            if hs:
                hs[0] = data.histograms[0]
            raw.extend(hs)
        sparse = tsdb_pending(
            SparseHists.of_objects(raw), cols.hist.ts, cols.hist.offsets, cols.ts, cols.offsets
        )
        hist = HistColumns(cols.hist.ts, sparse, cols.hist.offsets, cols.hist.st)
        return SeriesColumns(cols.labels, cols.ts, cols.vs, cols.offsets, hist, cols.st)
