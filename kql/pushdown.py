"""Columnar reads: a store that can hand over every selected sample as one set of arrays skips per-series work.

The engine flattens selected series into ``(ts, vs, offsets)`` anyway; a store answering in
that form (:class:`ColumnarStorage`, e.g. ClickHouse's one Arrow result ordered by series)
saves splitting the result into per-series objects and concatenating them again, which
costs Python time per series. Stores without it keep working through :func:`columns_of`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from kernel_insight.kql.storage import Labels, Matcher, SeriesData, is_stale

__all__ = ["ColumnarStorage", "SeriesColumns", "columns_of", "gather_ranges"]

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class SeriesColumns:
    """Selected series as one block: series ``i`` owns samples ``offsets[i]:offsets[i+1]``.

    Series are sorted by labels and have at least one sample each, as ``Storage.select`` returns them.
    """

    labels: list[Labels]
    ts: I64  # ms, ascending within each series
    vs: F64  # stale markers keep their bit pattern
    offsets: I64  # len(labels) + 1, offsets[0] == 0

    def __len__(self) -> int:
        return len(self.labels)

    def series(self) -> list[SeriesData]:
        """The same data as ``Storage.select`` returns it (views, no copies)."""
        o = self.offsets.tolist()
        return [
            SeriesData(labels, self.ts[o[i] : o[i + 1]], self.vs[o[i] : o[i + 1]])
            for i, labels in enumerate(self.labels)
        ]

    def without_stale(self) -> SeriesColumns:
        """Stale markers removed; a series left with no sample keeps its (empty) slot."""
        stale = is_stale(self.vs)
        if not stale.any():
            return self
        kept_before = np.concatenate([[0], np.cumsum(~stale)])
        return SeriesColumns(self.labels, self.ts[~stale], self.vs[~stale], kept_before[self.offsets])


@runtime_checkable
class ColumnarStorage(Protocol):
    """A :class:`kernel_insight.kql.storage.Storage` that can also answer ``select`` as one block."""

    def select_columns(self, matchers: Sequence[Matcher], start_ms: int, end_ms: int) -> SeriesColumns:
        """What ``select`` returns, as :class:`SeriesColumns`."""
        ...


def columns_of(series: Sequence[SeriesData]) -> SeriesColumns:
    """Per-series results of ``Storage.select`` as one block."""
    offsets = np.zeros(len(series) + 1, dtype=np.int64)
    if not series:
        return SeriesColumns([], np.empty(0, dtype=np.int64), np.empty(0), offsets)
    np.cumsum([len(s.timestamps) for s in series], out=offsets[1:])
    ts = np.concatenate([s.timestamps for s in series]).astype(np.int64, copy=False)
    vs = np.concatenate([s.values for s in series]).astype(np.float64, copy=False)
    return SeriesColumns([s.labels for s in series], ts, vs, offsets)


def gather_ranges(starts: I64, lengths: I64) -> I64:
    """Indices of the concatenated ranges ``starts[i] : starts[i] + lengths[i]``, in order."""
    total = int(lengths.sum())
    if total == 0:
        return np.empty(0, dtype=np.int64)
    ends = np.cumsum(lengths)
    shift = np.repeat(starts - (ends - lengths), lengths)
    out: I64 = np.arange(total, dtype=np.int64) + shift
    return out
