"""The shapes of what a store may return beyond ``Storage.select``: columns, and selectors on a step grid.

The engine flattens selected series into ``(ts, vs, offsets)`` anyway; a store answering in
that form (``Capability.COLUMNS``: :class:`SeriesColumns`, e.g. ClickHouse's one Arrow result
ordered by series) saves splitting the result into per-series objects and concatenating them
again. A store declaring ``Capability.LAST_ON_GRID`` or ``RANGE_ON_GRID`` goes further and
returns a selector's value at every step (:class:`GridColumns`), so only one value per series
and step leaves the database. Stores declaring neither keep working through ``select``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from kernel_insight.kql.sparsehists import HistSamples, SparseHists
from kernel_insight.kql.storage import Labels, SeriesData, is_stale, join_start_timestamps

__all__ = [
    "GRID_MIN_STEP_MS",
    "GridColumns",
    "HistColumns",
    "SeriesColumns",
    "columns_of",
    "gather_ranges",
    "grid_step",
]

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]
OBJ = npt.NDArray[np.object_]


class HistColumns(HistSamples):
    """The native-histogram samples of selected series, laid out as :class:`SeriesColumns` lays out floats.

    Series ``i`` owns ``ts[offsets[i]:offsets[i+1]]`` and the histograms at the same positions:
    ``FloatHistogram`` objects (``hs``, an object array, so windows and steps gather them with
    numpy indexing), or columns (``data``, :class:`SparseHists`, as a columnar store reads
    them), from which ``hs`` makes objects only when something asks for them.
    """

    __slots__ = ("offsets", "st", "ts")

    def __init__(self, ts: I64, hs: OBJ | SparseHists, offsets: I64, st: I64 | None = None) -> None:
        super().__init__(hs)
        self.ts = ts  # ms, ascending within each series
        self.offsets = offsets  # len(labels) + 1
        self.st = st  # start timestamps (ms, 0 = unset) beside ts; None when none is set

    def without_stale(self) -> HistColumns:
        if self.data is not None:
            sums = self.data.sum
        else:
            # The sums as one array and their bits compared at once (is_stale_histogram per
            # object was a tenth of a 240,000-histogram quantile query).
            sums = np.fromiter((h.sum for h in self.hs), dtype=np.float64, count=len(self.hs))
        stale = is_stale(sums)
        if not stale.any():
            return self
        kept_before = np.concatenate([[0], np.cumsum(~stale)])
        keep = np.flatnonzero(~stale)
        rest = self.hs[keep] if self.data is None else self.data.take(keep)
        return HistColumns(
            self.ts[keep], rest, kept_before[self.offsets], None if self.st is None else self.st[keep]
        )


@dataclass(frozen=True, slots=True)
class SeriesColumns:
    """Selected series as one block: series ``i`` owns samples ``offsets[i]:offsets[i+1]``.

    Series are sorted by labels and have at least one sample each, as ``Storage.select`` returns them.
    Native-histogram samples, when any series has some, are in ``hist`` (None: floats only,
    the fast path every float query keeps).
    """

    labels: list[Labels]
    ts: I64  # ms, ascending within each series
    vs: F64  # stale markers keep their bit pattern
    offsets: I64  # len(labels) + 1, offsets[0] == 0
    hist: HistColumns | None = None
    #: Start timestamps (ms, 0 = unset) beside ``ts``; None when no selected series has one.
    st: I64 | None = None

    def __len__(self) -> int:
        return len(self.labels)

    def series(self) -> list[SeriesData]:
        """The same data as ``Storage.select`` returns it (views, no copies)."""
        o = self.offsets.tolist()
        st = self.st
        if self.hist is None:
            return [
                SeriesData(
                    labels,
                    self.ts[o[i] : o[i + 1]],
                    self.vs[o[i] : o[i + 1]],
                    start_timestamps=None if st is None else st[o[i] : o[i + 1]],
                )
                for i, labels in enumerate(self.labels)
            ]
        h = self.hist
        ho = h.offsets.tolist()
        return [
            SeriesData(
                labels,
                self.ts[o[i] : o[i + 1]],
                self.vs[o[i] : o[i + 1]],
                h.ts[ho[i] : ho[i + 1]],
                tuple(h.hs[ho[i] : ho[i + 1]].tolist()),
                None if st is None else st[o[i] : o[i + 1]],
                None if h.st is None else h.st[ho[i] : ho[i + 1]],
            )
            for i, labels in enumerate(self.labels)
        ]

    def without_stale(self) -> SeriesColumns:
        """Stale markers removed; a series left with no sample keeps its (empty) slot."""
        hist = None if self.hist is None else self.hist.without_stale()
        stale = is_stale(self.vs)
        if not stale.any():
            return (
                self
                if hist is self.hist
                else SeriesColumns(self.labels, self.ts, self.vs, self.offsets, hist, self.st)
            )
        kept_before = np.concatenate([[0], np.cumsum(~stale)])
        st = None if self.st is None else self.st[~stale]
        return SeriesColumns(
            self.labels, self.ts[~stale], self.vs[~stale], kept_before[self.offsets], hist, st
        )


def columns_of(series: Sequence[SeriesData]) -> SeriesColumns:
    """Per-series results of ``Storage.select`` as one block."""
    offsets = np.zeros(len(series) + 1, dtype=np.int64)
    if not series:
        return SeriesColumns([], np.empty(0, dtype=np.int64), np.empty(0), offsets)
    np.cumsum([len(s.timestamps) for s in series], out=offsets[1:])
    ts = np.concatenate([s.timestamps for s in series]).astype(np.int64, copy=False)
    vs = np.concatenate([s.values for s in series]).astype(np.float64, copy=False)
    st = join_start_timestamps([(s.start_timestamps, len(s.timestamps)) for s in series])
    hist = None
    if any(s.histograms for s in series):
        hoffsets = np.zeros(len(series) + 1, dtype=np.int64)
        np.cumsum([len(s.histograms) for s in series], out=hoffsets[1:])
        hts = np.concatenate([s.hist_timestamps for s in series]).astype(np.int64, copy=False)
        hs = np.empty(int(hoffsets[-1]), dtype=object)
        hs[:] = [h for s in series for h in s.histograms]
        hist = HistColumns(
            hts,
            hs,
            hoffsets,
            join_start_timestamps([(s.hist_start_timestamps, len(s.histograms)) for s in series]),
        )
    return SeriesColumns([s.labels for s in series], ts, vs, offsets, hist, st)


def gather_ranges(starts: I64, lengths: I64) -> I64:
    """Indices of the concatenated ranges ``starts[i] : starts[i] + lengths[i]``, in order."""
    total = int(lengths.sum())
    if total == 0:
        return np.empty(0, dtype=np.int64)
    ends = np.cumsum(lengths)
    shift = np.repeat(starts - (ends - lengths), lengths)
    out: I64 = np.arange(total, dtype=np.int64) + shift
    return out


#: Below this step a range query's grid holds about as many points as the raw samples (15 s
#: scrapes), so computing it in ClickHouse saves nothing; instant queries always qualify.
GRID_MIN_STEP_MS = 30_000


@dataclass(frozen=True, slots=True)
class GridColumns:
    """Each selected series' latest sample at every step of a grid, as the engine's lookup computes it.

    ``sample_ts[i, j]`` is the timestamp of the sample behind ``values[i, j]``; ``present`` is
    False where no sample lies in the lookback window or the latest one is a stale marker.
    """

    labels: list[Labels]  # sorted
    values: F64  # (series, steps)
    sample_ts: I64 | None  # (series, steps); None when not asked for
    present: npt.NDArray[np.bool_]  # (series, steps)

    def __len__(self) -> int:
        return len(self.labels)


def grid_step(refs: I64) -> int | None:
    """The step of evenly spaced reference times (1 for a single time), or None when they are not a grid."""
    if len(refs) == 1:
        return 1
    d = np.diff(refs)
    step = int(d[0])
    if step <= 0 or not (d == step).all():
        return None
    return step
