"""The series rows a process has written: one row per (series, UTC day) the series has samples on.

A batch's samples and histograms name their series by fingerprint; the series table holds each
series' labels once per day, so selectors and label APIs find it (docs/storage.md). The store
asks this index which of a batch's (series, day) pairs have no row yet and writes only those.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa  # type: ignore[import-untyped]

from kernel_insight.collector.clickhouse.arrow_rows import concat
from kernel_insight.collector.head import find_sorted
from kernel_insight.collector.rows import HistogramBatch, Labels, SampleBatch, series_fingerprint

_MS_PER_DAY = 86_400_000
_SERIES_CACHE_MAX = 2_000_000

#: A series row's key: (fingerprint, day since the epoch).
SeriesKey = tuple[int, int]


def _labels_map(series: Sequence[Labels]) -> pa.MapArray:
    """The series table's ``labels`` column: each series' labels but ``__name__`` (which every
    series has once), built from flat key and value columns rather than a list of pairs per series."""
    offsets = np.zeros(len(series) + 1, np.int32)
    np.cumsum([len(s) - 1 for s in series], out=offsets[1:])
    pairs = [kv for s in series for kv in s if kv[0] != "__name__"]
    if len(pairs) != offsets[-1]:  # a series without a name: count each one's pairs
        np.cumsum([sum(k != "__name__" for k, _ in s) for s in series], out=offsets[1:])
    keys, values = (list(c) for c in zip(*pairs, strict=True)) if pairs else ([], [])
    return pa.MapArray.from_arrays(
        pa.array(offsets, pa.int32()), pa.array(keys, pa.string()), pa.array(values, pa.string())
    )


class SeriesIndex:
    """The (series, day) pairs whose series rows are written, and each label set's fingerprint."""

    __slots__ = ("_fp_cache", "_lock", "_seen_by_day")

    def __init__(self) -> None:
        #: The (series, day) pairs whose series rows are written, as a sorted fingerprint array per
        #: day: a batch's series are checked against them at once (no Python object per pair).
        self._seen_by_day: dict[int, np.ndarray[Any, np.dtype[np.uint64]]] = {}
        self._lock = threading.Lock()
        self._fp_cache: dict[Labels, tuple[int, str]] = {}

    def fingerprint(self, labels: Labels) -> tuple[int, str]:
        """The series' fingerprint and metric name, remembered: a steady stream of the same series
        (remote_write sends each one every scrape) costs one dict lookup per series per batch."""
        meta = self._fp_cache.get(labels)
        if meta is None:
            if len(self._fp_cache) > _SERIES_CACHE_MAX:
                self._fp_cache.clear()
            meta = self._fp_cache[labels] = (series_fingerprint(labels), dict(labels)["__name__"])
        return meta

    def rows(
        self,
        batch: SampleBatch | HistogramBatch,
        fps: np.ndarray[Any, np.dtype[np.uint64]],
        metric_of: Sequence[str] | npt.NDArray[np.object_],
    ) -> tuple[pa.Table | None, list[tuple[int, int]]]:
        days = batch.ts_ms // _MS_PER_DAY
        first, last = int(days.min()), int(days.max())
        # Seen pairs are skipped even under a dedup token: a retry then sends fewer rows under
        # the same token, which the engine drops or stores exactly as it would the full set.
        if first == last:  # the common case: every sample of the batch on one UTC day
            # A series row only for a day it has samples on (bincount: O(n), np.unique sorted).
            used = np.flatnonzero(np.bincount(batch.series_idx, minlength=len(batch.series)))
            row_days = np.full(len(used), first, np.int64)
        else:
            pairs = np.unique((batch.series_idx.astype(np.int64) << 24) | (days & 0xFFFFFF))
            used, row_days = pairs >> 24, pairs & 0xFFFFFF
        with self._lock:
            new = ~self._seen(fps[used], row_days)
        if not new.any():
            return None, []
        idx, row_days = used[new], row_days[new]
        row_fps = fps[idx]
        data = pa.table(
            {
                "date": pa.array(row_days.astype(np.int32), pa.date32()),
                "metric": pa.array(
                    metric_of[idx]
                    if isinstance(metric_of, np.ndarray)
                    else [metric_of[i] for i in idx.tolist()],
                    pa.string(),
                ),
                "fingerprint": pa.array(row_fps, pa.uint64()),
                "labels": _labels_map([batch.series[i] for i in idx.tolist()]),
            }
        )
        return data, list(zip(row_fps.tolist(), row_days.tolist(), strict=True))

    def _seen(
        self, fps: np.ndarray[Any, np.dtype[np.uint64]], days: np.ndarray[Any, Any]
    ) -> npt.NDArray[np.bool_]:
        """Whether each (fingerprint, day) pair's series row is written (under the series lock)."""
        out = np.zeros(len(fps), np.bool_)
        for day in np.unique(days).tolist() if len(days) else ():
            known = self._seen_by_day.get(day)
            if known is not None and len(known):
                on = days == day
                out[on] = find_sorted(known, fps[on]) >= 0
        return out

    def mark(self, keys: Sequence[tuple[int, int]]) -> None:
        if not keys:
            return
        fps = np.fromiter((k[0] for k in keys), np.uint64, len(keys))
        days = np.fromiter((k[1] for k in keys), np.int64, len(keys))
        with self._lock:
            if sum(len(a) for a in self._seen_by_day.values()) > _SERIES_CACHE_MAX:
                self._seen_by_day.clear()
            for day in np.unique(days).tolist():
                new = np.unique(fps[days == day])
                have = self._seen_by_day.get(day)
                if have is not None and len(have):
                    new = new[find_sorted(have, new) < 0]
                    # Inserted in place of a sort of the whole day's array: O(n) per batch.
                    new = np.insert(have, np.searchsorted(have, new), new)
                self._seen_by_day[day] = new

    def new_rows(self, parts: list[pa.Table], keys: Sequence[SeriesKey]) -> pa.Table | None:
        """A group's series rows (``parts``, keyed ``keys`` row by row) without repeats and without
        pairs another group wrote since; None when none is left."""
        if not keys:
            return None
        fps = np.fromiter((k[0] for k in keys), np.uint64, len(keys))
        days = np.fromiter((k[1] for k in keys), np.int64, len(keys))
        # The first row of each pair (np.unique's index), of the pairs not written meanwhile.
        _, first = np.unique(np.stack([fps, days.astype(np.uint64)]), axis=1, return_index=True)
        first.sort()
        with self._lock:
            keep = first[~self._seen(fps[first], days[first])]
        if not len(keep):
            return None
        data = concat(parts)
        return data if len(keep) == len(keys) else data.take(pa.array(keep, pa.int64()))
