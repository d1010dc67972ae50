"""Column batches the store inserts: samples, kernel spans, events, instances.

Every import path (ring records, agent batches, OpenMetrics text, remote_write)
produces these, so the store has one insert path per table and computes each
series fingerprint once per batch, not once per sample.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
import numpy.typing as npt

from kernel_insight.collector.defaults import SeriesLimits
from kernel_insight.kql.storage import join_start_timestamps

__all__ = [
    "CALL_TRACKS",
    "MAX_TS_MS",
    "MIN_TS_MS",
    "CallBatch",
    "Event",
    "HistogramBatch",
    "HistogramBuilder",
    "InstanceInfo",
    "Labels",
    "SampleBatch",
    "SampleBuilder",
    "SeriesLimits",
    "SpanBatch",
    "canonical_labels",
    "concat_histograms",
    "concat_samples",
    "series_fingerprint",
    "validate_series",
]

#: Sample timestamps the schema can hold: the series table's Date column spans 1970-01-01 .. 2149-06-06.
MIN_TS_MS = 0
MAX_TS_MS = 65_536 * 86_400_000 - 1

#: Sorted (name, value) pairs, ``__name__`` included, no empty values (as kql's ``normalize_labels``).
Labels = tuple[tuple[str, str], ...]


def canonical_labels(labels: Mapping[str, str] | Iterable[tuple[str, str]]) -> Labels:
    """Sorted labels without empty values; raises ValueError without a metric name or with a repeated label."""
    items = list(labels.items() if isinstance(labels, Mapping) else labels)
    names = [k for k, _ in items]
    if len(set(names)) != len(names):
        dup = sorted({k for k in names if names.count(k) > 1})
        raise ValueError(f"repeated label name(s) {', '.join(dup)}")
    out = tuple(sorted((str(k), str(v)) for k, v in items if v != ""))
    if not any(k == "__name__" for k, _ in out):
        raise ValueError("a series needs a metric name (__name__)")
    for k, _ in out:
        if not k:
            raise ValueError("empty label name")
    return out


_METRIC_NAME_RE = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME_RE = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


def validate_series(labels: Labels, limits: SeriesLimits) -> None:
    """Raise ValueError with a message a sender can act on when ``labels`` break ``limits``."""
    if limits.max_labels and len(labels) > limits.max_labels:
        raise ValueError(f"{len(labels)} labels exceed the limit of {limits.max_labels} (__name__ included)")
    names, values = limits.max_name_bytes, limits.max_value_bytes
    for k, v in labels:
        if names and len(k) > names // 4 and len(k.encode()) > names:
            raise ValueError(f"label name of {len(k.encode())} bytes exceeds the limit of {names}")
        if k == "__name__":  # the metric name is a name: the name limit, not the value limit
            if names and len(v) > names // 4 and len(v.encode()) > names:
                raise ValueError(f"metric name of {len(v.encode())} bytes exceeds the limit of {names}")
        elif values and len(v) > values // 4 and len(v.encode()) > values:
            raise ValueError(
                f"value of label {k[:64]!r} has {len(v.encode())} bytes, over the limit of {values}"
            )
        if not limits.utf8_names:
            if k == "__name__":
                if not _METRIC_NAME_RE.fullmatch(v):
                    raise ValueError(f"invalid metric name {v[:128]!r} (want [a-zA-Z_:][a-zA-Z0-9_:]*)")
            elif not _LABEL_NAME_RE.fullmatch(k):
                raise ValueError(f"invalid label name {k[:128]!r} (want [a-zA-Z_][a-zA-Z0-9_]*)")


def series_fingerprint(labels: Labels) -> int:
    """A stable 64-bit id of a canonical label set; the samples table's key.

    Computed in Python, not by ClickHouse, so every collector and every import path agrees
    on it without a round trip. Separators are bytes that UTF-8 text never contains.
    """
    h = hashlib.blake2b(digest_size=8)
    for k, v in labels:
        h.update(k.encode())
        h.update(b"\xff")
        h.update(v.encode())
        h.update(b"\xfe")
    return int.from_bytes(h.digest(), "little")


@dataclass(slots=True)
class SampleBatch:
    """Samples as columns: ``series[series_idx[i]]`` has the value ``values[i]`` at ``ts_ms[i]``."""

    series: list[Labels]
    series_idx: npt.NDArray[np.int32]
    ts_ms: npt.NDArray[np.int64]
    values: npt.NDArray[np.float64]
    #: Per entry of ``series``: its ``series_fingerprint`` and its metric name as a code into a
    #: list of names, when the maker already had them (remote_write's decoder keeps them per
    #: series): the store then looks nothing up series by series. None: the store works them out.
    series_meta: tuple[npt.NDArray[np.uint64], npt.NDArray[np.int32], list[str]] | None = None
    #: Per sample: its start timestamp (ms; 0 = unset), remote_write 2.0's ``Sample.start_timestamp``.
    #: None when no sample has one (every source but remote_write 2.0): the store then writes no
    #: ``st`` column and the rows read its default, 0.
    st_ms: npt.NDArray[np.int64] | None = None

    def __post_init__(self) -> None:
        n = len(self.ts_ms)
        if len(self.series_idx) != n or len(self.values) != n:
            raise ValueError("series_idx, ts_ms and values must have the same length")
        if self.st_ms is not None and len(self.st_ms) != n:
            raise ValueError("st_ms must hold one start timestamp per sample")
        if self.series_meta is not None and not (
            len(self.series_meta[0]) == len(self.series_meta[1]) == len(self.series)
        ):
            raise ValueError("series_meta must hold one fingerprint and one metric code per series")
        if n and (int(self.series_idx.min()) < 0 or int(self.series_idx.max()) >= len(self.series)):
            raise ValueError("series_idx points outside series")
        if n and (int(self.ts_ms.min()) < MIN_TS_MS or int(self.ts_ms.max()) > MAX_TS_MS):
            bad = int(self.ts_ms.min()) if int(self.ts_ms.min()) < MIN_TS_MS else int(self.ts_ms.max())
            raise ValueError(f"timestamp {bad} ms is outside the storable range 1970-01-01 .. 2149-06-06")

    def __len__(self) -> int:
        return len(self.ts_ms)

    @classmethod
    def empty(cls) -> SampleBatch:
        return cls([], np.empty(0, np.int32), np.empty(0, np.int64), np.empty(0, np.float64))


def concat_samples(batches: Sequence[SampleBatch]) -> SampleBatch:
    """One batch holding every sample of ``batches``, each series listed once."""
    if len(batches) == 1:
        return batches[0]
    index: dict[Labels, int] = {}
    series: list[Labels] = []
    idx = []
    for b in batches:
        remap = np.empty(len(b.series), dtype=np.int32)
        for j, labels in enumerate(b.series):
            i = index.get(labels)
            if i is None:
                i = index[labels] = len(series)
                series.append(labels)
            remap[j] = i
        idx.append(remap[b.series_idx])
    if not batches:
        return SampleBatch.empty()
    return SampleBatch(
        series,
        np.concatenate(idx),
        np.concatenate([b.ts_ms for b in batches]),
        np.concatenate([b.values for b in batches]),
        st_ms=join_start_timestamps([(b.st_ms, len(b)) for b in batches]),
    )


class SampleBuilder:
    """Collects samples one at a time or a series at a time, then builds a :class:`SampleBatch`.

    >>> b = SampleBuilder()
    >>> b.add({"__name__": "up", "gpu": "0"}, 1_000, 1.0)
    >>> len(b.build())
    1
    """

    def __init__(self) -> None:
        self._index: dict[Labels, int] = {}
        self._series: list[Labels] = []
        self._idx: list[npt.NDArray[np.int32]] = []
        self._ts: list[npt.NDArray[np.int64]] = []
        self._vs: list[npt.NDArray[np.float64]] = []
        self._one_idx: list[int] = []
        self._one_ts: list[int] = []
        self._one_vs: list[float] = []
        self._st: list[npt.NDArray[np.int64] | None] = []  # per entry of _ts; None: no start timestamps

    def _series_index(self, labels: Mapping[str, str] | Iterable[tuple[str, str]] | Labels) -> int:
        key = labels if isinstance(labels, tuple) and labels in self._index else canonical_labels(labels)
        i = self._index.get(key)
        if i is None:
            i = self._index[key] = len(self._series)
            self._series.append(key)
        return i

    def add(self, labels: Mapping[str, str] | Iterable[tuple[str, str]], ts_ms: int, value: float) -> None:
        self._one_idx.append(self._series_index(labels))
        self._one_ts.append(int(ts_ms))
        self._one_vs.append(float(value))

    def add_canonical(self, labels: Labels, ts_ms: int, value: float) -> None:
        """Like :meth:`add` for labels already made by :func:`canonical_labels` (not checked again)."""
        i = self._index.get(labels)
        if i is None:
            i = self._index[labels] = len(self._series)
            self._series.append(labels)
        self._one_idx.append(i)
        self._one_ts.append(int(ts_ms))
        self._one_vs.append(float(value))

    def add_series(
        self,
        labels: Mapping[str, str] | Iterable[tuple[str, str]],
        ts_ms: Sequence[int] | npt.NDArray[np.int64],
        values: Sequence[float] | npt.NDArray[np.float64],
    ) -> None:
        ts = np.asarray(ts_ms, dtype=np.int64)
        vs = np.asarray(values, dtype=np.float64)
        if ts.shape != vs.shape or ts.ndim != 1:
            raise ValueError("timestamps and values must be 1-d and the same length")
        i = self._series_index(labels)
        self._idx.append(np.full(len(ts), i, dtype=np.int32))
        self._ts.append(ts)
        self._vs.append(vs)
        self._st.append(None)

    def add_series_canonical(
        self,
        labels: Labels,
        ts_ms: npt.NDArray[np.int64],
        values: npt.NDArray[np.float64],
        st_ms: npt.NDArray[np.int64] | None = None,
    ) -> None:
        """Like :meth:`add_series` for labels already made by :func:`canonical_labels` (not checked
        again); ``st_ms``: the samples' start timestamps (0 = unset), None when none has one."""
        i = self._index.get(labels)
        if i is None:
            i = self._index[labels] = len(self._series)
            self._series.append(labels)
        if st_ms is not None and len(st_ms) != len(ts_ms):
            raise ValueError("start timestamps and timestamps differ in length")
        self._idx.append(np.full(len(ts_ms), i, dtype=np.int32))
        self._ts.append(np.asarray(ts_ms, dtype=np.int64))
        self._vs.append(np.asarray(values, dtype=np.float64))
        self._st.append(None if st_ms is None or not st_ms.any() else np.asarray(st_ms, dtype=np.int64))

    def add_columns(
        self,
        series: Sequence[Labels],
        idx: npt.NDArray[np.integer[Any]],
        ts_ms: npt.NDArray[np.int64],
        values: npt.NDArray[np.float64],
    ) -> None:
        """Many series at once: sample ``i`` belongs to ``series[idx[i]]`` (canonical labels, not checked)."""
        remap = np.empty(len(series), dtype=np.int32)
        for j, labels in enumerate(series):
            i = self._index.get(labels)
            if i is None:
                i = self._index[labels] = len(self._series)
                self._series.append(labels)
            remap[j] = i
        self._idx.append(remap[idx])
        self._ts.append(np.asarray(ts_ms, dtype=np.int64))
        self._vs.append(np.asarray(values, dtype=np.float64))
        self._st.append(None)

    def __len__(self) -> int:
        return len(self._one_ts) + sum(len(t) for t in self._ts)

    def build(self) -> SampleBatch:
        idx = [*self._idx, np.asarray(self._one_idx, dtype=np.int32)]
        ts = [*self._ts, np.asarray(self._one_ts, dtype=np.int64)]
        vs = [*self._vs, np.asarray(self._one_vs, dtype=np.float64)]
        st = join_start_timestamps(
            [*zip(self._st, map(len, self._ts), strict=True), (None, len(self._one_ts))]
        )
        return SampleBatch(
            list(self._series), np.concatenate(idx), np.concatenate(ts), np.concatenate(vs), st_ms=st
        )


I32 = npt.NDArray[np.int32]
F64 = npt.NDArray[np.float64]

#: Prometheus' counter-reset hints (``histogram.CounterResetHint``): unknown, reset, not a reset, gauge.
COUNTER_RESET_HINTS = (0, 1, 2, 3)


def _offsets(lengths: npt.NDArray[np.integer[Any]]) -> npt.NDArray[np.int32]:
    out = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=out[1:])
    return out


@dataclass(slots=True)
class HistogramBatch:
    """Native histogram samples as columns, in the float samples' series model.

    Row ``i`` belongs to ``series[series_idx[i]]`` at ``ts_ms[i]``. Scalars are one value per
    row; spans, buckets and custom values are flat arrays cut by per-row offsets (``*_offsets``
    has ``len + 1`` entries, row ``i`` owning ``[off[i], off[i+1])``), the layout of an Arrow
    list column, so the store hands them to ClickHouse without a loop per row. Buckets are
    ABSOLUTE counts (a ``FloatHistogram``'s), not the deltas integer histograms travel as
    (:meth:`HistogramBuilder.add_deltas` converts).
    """

    series: list[Labels]
    series_idx: I32
    ts_ms: npt.NDArray[np.int64]
    schema: I32
    zero_threshold: F64
    zero_count: F64
    count: F64
    sum: F64
    counter_reset_hint: npt.NDArray[np.uint8]
    pos_span_offset: I32  # flat: every row's positive spans' offsets, then cut by pos_span_offsets
    pos_span_length: npt.NDArray[np.uint32]
    pos_span_offsets: I32
    pos_buckets: F64
    pos_bucket_offsets: I32
    neg_span_offset: I32
    neg_span_length: npt.NDArray[np.uint32]
    neg_span_offsets: I32
    neg_buckets: F64
    neg_bucket_offsets: I32
    custom_values: F64
    custom_value_offsets: I32
    #: Per row: its start timestamp (ms; 0 = unset), remote_write 2.0's ``Histogram.start_timestamp``;
    #: None when no row has one (as :attr:`SampleBatch.st_ms`).
    st_ms: npt.NDArray[np.int64] | None = None

    def __post_init__(self) -> None:
        n = len(self.ts_ms)
        if self.st_ms is not None and len(self.st_ms) != n:
            raise ValueError("st_ms must hold one start timestamp per row")
        scalars = (
            self.series_idx,
            self.schema,
            self.zero_threshold,
            self.zero_count,
            self.count,
            self.sum,
            self.counter_reset_hint,
        )
        if any(len(c) != n for c in scalars):
            raise ValueError("every histogram column must have one value per row")
        for name, offsets, flat in (
            ("positive span", self.pos_span_offsets, self.pos_span_offset),
            ("positive bucket", self.pos_bucket_offsets, self.pos_buckets),
            ("negative span", self.neg_span_offsets, self.neg_span_offset),
            ("negative bucket", self.neg_bucket_offsets, self.neg_buckets),
            ("custom value", self.custom_value_offsets, self.custom_values),
        ):
            if len(offsets) != n + 1 or int(offsets[0]) != 0 or int(offsets[-1]) != len(flat):
                raise ValueError(f"{name} offsets must have {n + 1} entries from 0 to {len(flat)}")
            if n and bool(np.any(np.diff(offsets) < 0)):
                raise ValueError(f"{name} offsets must not decrease")
        if len(self.pos_span_length) != len(self.pos_span_offset) or len(self.neg_span_length) != len(
            self.neg_span_offset
        ):
            raise ValueError("span offsets and lengths must have the same length")
        if n and (int(self.series_idx.min()) < 0 or int(self.series_idx.max()) >= len(self.series)):
            raise ValueError("series_idx points outside series")
        if n and (int(self.ts_ms.min()) < MIN_TS_MS or int(self.ts_ms.max()) > MAX_TS_MS):
            bad = int(self.ts_ms.min()) if int(self.ts_ms.min()) < MIN_TS_MS else int(self.ts_ms.max())
            raise ValueError(f"timestamp {bad} ms is outside the storable range 1970-01-01 .. 2149-06-06")
        if n and (int(self.schema.min()) < -128 or int(self.schema.max()) > 127):
            raise ValueError("histogram schema must be within -128 .. 127 (Prometheus uses -53 and -4 .. 8)")
        if n and int(self.counter_reset_hint.max()) > 3:
            raise ValueError(
                "counter_reset_hint must be 0 (unknown), 1 (reset), 2 (not a reset) or 3 (gauge)"
            )

    def __len__(self) -> int:
        return len(self.ts_ms)

    @classmethod
    def empty(cls) -> HistogramBatch:
        return HistogramBuilder().build()

    def slice(self, lo: int, hi: int) -> HistogramBatch:
        """Rows ``lo`` to ``hi`` (exclusive) as a batch of their own, sharing ``series``."""

        def cut(offsets: I32, *flats: npt.NDArray[Any]) -> list[npt.NDArray[Any]]:
            a, z = int(offsets[lo]), int(offsets[hi])
            return [(offsets[lo : hi + 1] - a).astype(np.int32), *(f[a:z] for f in flats)]

        ps_off, ps_o, ps_l = cut(self.pos_span_offsets, self.pos_span_offset, self.pos_span_length)
        pb_off, pb = cut(self.pos_bucket_offsets, self.pos_buckets)
        ns_off, ns_o, ns_l = cut(self.neg_span_offsets, self.neg_span_offset, self.neg_span_length)
        nb_off, nb = cut(self.neg_bucket_offsets, self.neg_buckets)
        cv_off, cv = cut(self.custom_value_offsets, self.custom_values)
        r = slice(lo, hi)
        return HistogramBatch(
            self.series,
            self.series_idx[r],
            self.ts_ms[r],
            self.schema[r],
            self.zero_threshold[r],
            self.zero_count[r],
            self.count[r],
            self.sum[r],
            self.counter_reset_hint[r],
            ps_o,
            ps_l,
            ps_off,
            pb,
            pb_off,
            ns_o,
            ns_l,
            ns_off,
            nb,
            nb_off,
            cv,
            cv_off,
            None if self.st_ms is None else self.st_ms[r],
        )

    def take(
        self,
        rows: npt.NDArray[np.integer[Any]],
        series: list[Labels] | None = None,
        series_idx: I32 | None = None,
    ) -> HistogramBatch:
        """These rows (indices, in this order) as a batch of their own; ``series`` and ``series_idx``
        (one per kept row) replace the series when given (relabelling)."""
        rows = np.asarray(rows, dtype=np.int64)

        def cut(offsets: I32, *flats: npt.NDArray[Any]) -> list[npt.NDArray[Any]]:
            starts, lengths = offsets[:-1][rows].astype(np.int64), np.diff(offsets)[rows].astype(np.int64)
            new = np.zeros(len(rows) + 1, dtype=np.int32)
            np.cumsum(lengths, out=new[1:])
            at = np.repeat(starts - new[:-1], lengths) + np.arange(int(new[-1]), dtype=np.int64)
            return [new, *(f[at] for f in flats)]

        ps_off, ps_o, ps_l = cut(self.pos_span_offsets, self.pos_span_offset, self.pos_span_length)
        pb_off, pb = cut(self.pos_bucket_offsets, self.pos_buckets)
        ns_off, ns_o, ns_l = cut(self.neg_span_offsets, self.neg_span_offset, self.neg_span_length)
        nb_off, nb = cut(self.neg_bucket_offsets, self.neg_buckets)
        cv_off, cv = cut(self.custom_value_offsets, self.custom_values)
        idx = self.series_idx[rows] if series_idx is None else series_idx
        return HistogramBatch(
            self.series if series is None else series,
            idx,
            self.ts_ms[rows],
            self.schema[rows],
            self.zero_threshold[rows],
            self.zero_count[rows],
            self.count[rows],
            self.sum[rows],
            self.counter_reset_hint[rows],
            ps_o,
            ps_l,
            ps_off,
            pb,
            pb_off,
            ns_o,
            ns_l,
            ns_off,
            nb,
            nb_off,
            cv,
            cv_off,
            None if self.st_ms is None else self.st_ms[rows],
        )

    def row(self, i: int) -> dict[str, Any]:
        """Row ``i`` as plain values (the fields of a ``FloatHistogram``, plus labels and ts_ms)."""

        def cut(flat: npt.NDArray[Any], off: I32) -> list[Any]:
            return flat[int(off[i]) : int(off[i + 1])].tolist()  # type: ignore[no-any-return]

        return {
            "labels": self.series[int(self.series_idx[i])],
            "ts_ms": int(self.ts_ms[i]),
            "schema": int(self.schema[i]),
            "zero_threshold": float(self.zero_threshold[i]),
            "zero_count": float(self.zero_count[i]),
            "count": float(self.count[i]),
            "sum": float(self.sum[i]),
            "counter_reset_hint": int(self.counter_reset_hint[i]),
            "positive_spans": tuple(
                zip(
                    cut(self.pos_span_offset, self.pos_span_offsets),
                    cut(self.pos_span_length, self.pos_span_offsets),
                    strict=True,
                )
            ),
            "positive_buckets": tuple(cut(self.pos_buckets, self.pos_bucket_offsets)),
            "negative_spans": tuple(
                zip(
                    cut(self.neg_span_offset, self.neg_span_offsets),
                    cut(self.neg_span_length, self.neg_span_offsets),
                    strict=True,
                )
            ),
            "negative_buckets": tuple(cut(self.neg_buckets, self.neg_bucket_offsets)),
            "custom_values": tuple(cut(self.custom_values, self.custom_value_offsets)),
        }


def _cat(parts: Sequence[npt.NDArray[Any]], dtype: type[np.generic]) -> npt.NDArray[Any]:
    return np.concatenate(parts).astype(dtype, copy=False) if parts else np.empty(0, dtype)


def _cat_offsets(batches: Sequence[HistogramBatch], name: str) -> I32:
    """Per-row offsets of several batches joined: each batch's shifted by the flat values before it."""
    out = [np.zeros(1, np.int32)]
    base = 0
    for b in batches:
        off: I32 = getattr(b, name)
        out.append((off[1:] + base).astype(np.int32))
        base += int(off[-1])
    return np.concatenate(out)


def concat_histograms(batches: Sequence[HistogramBatch]) -> HistogramBatch:
    """One batch holding every histogram sample of ``batches``, each series listed once."""
    if len(batches) == 1:
        return batches[0]
    if not batches:
        return HistogramBatch.empty()
    index: dict[Labels, int] = {}
    series: list[Labels] = []
    idx = []
    for b in batches:
        remap = np.empty(len(b.series), dtype=np.int32)
        for j, labels in enumerate(b.series):
            i = index.get(labels)
            if i is None:
                i = index[labels] = len(series)
                series.append(labels)
            remap[j] = i
        idx.append(remap[b.series_idx])

    def cat(name: str, dtype: type[np.generic]) -> npt.NDArray[Any]:
        return _cat([getattr(b, name) for b in batches], dtype)

    return HistogramBatch(
        series,
        np.concatenate(idx),
        cat("ts_ms", np.int64),
        cat("schema", np.int32),
        cat("zero_threshold", np.float64),
        cat("zero_count", np.float64),
        cat("count", np.float64),
        cat("sum", np.float64),
        cat("counter_reset_hint", np.uint8),
        cat("pos_span_offset", np.int32),
        cat("pos_span_length", np.uint32),
        _cat_offsets(batches, "pos_span_offsets"),
        cat("pos_buckets", np.float64),
        _cat_offsets(batches, "pos_bucket_offsets"),
        cat("neg_span_offset", np.int32),
        cat("neg_span_length", np.uint32),
        _cat_offsets(batches, "neg_span_offsets"),
        cat("neg_buckets", np.float64),
        _cat_offsets(batches, "neg_bucket_offsets"),
        cat("custom_values", np.float64),
        _cat_offsets(batches, "custom_value_offsets"),
        join_start_timestamps([(b.st_ms, len(b)) for b in batches]),
    )


Spans = Sequence[tuple[int, int]]


class HistogramBuilder:
    """Collects native histogram samples one at a time, then builds a :class:`HistogramBatch`.

    ``add`` takes absolute bucket counts (a float histogram, or an integer one already summed);
    ``add_deltas`` takes an integer histogram as remote_write and the agent send it, each bucket
    the difference to the one before; ``add_histogram`` takes any object with a
    ``FloatHistogram``'s fields (kernel_insight.kql.histogram).

    >>> b = HistogramBuilder()
    >>> b.add({"__name__": "lat", "gpu": "0"}, 1_000, schema=3, count=3.0, sum=0.5,
    ...       positive_spans=[(0, 2)], positive_buckets=[1.0, 2.0])
    >>> len(b.build())
    1
    """

    def __init__(self) -> None:
        self._index: dict[Labels, int] = {}
        self._series: list[Labels] = []
        self._idx: list[int] = []
        self._ts: list[int] = []
        self._schema: list[int] = []
        self._zt: list[float] = []
        self._zc: list[float] = []
        self._count: list[float] = []
        self._sum: list[float] = []
        self._hint: list[int] = []
        self._span_off: tuple[list[int], list[int]] = ([], [])
        self._span_len: tuple[list[int], list[int]] = ([], [])
        self._span_n: tuple[list[int], list[int]] = ([], [])
        self._buckets: tuple[list[float], list[float]] = ([], [])
        self._bucket_n: tuple[list[int], list[int]] = ([], [])
        self._custom: list[float] = []
        self._custom_n: list[int] = []
        self._st: list[int] = []

    def __len__(self) -> int:
        return len(self._ts)

    def _series_index(self, labels: Mapping[str, str] | Iterable[tuple[str, str]]) -> int:
        key = labels if isinstance(labels, tuple) and labels in self._index else canonical_labels(labels)
        i = self._index.get(key)
        if i is None:
            i = self._index[key] = len(self._series)
            self._series.append(key)
        return i

    def add(
        self,
        labels: Mapping[str, str] | Iterable[tuple[str, str]],
        ts_ms: int,
        *,
        schema: int,
        count: float,
        sum: float,
        zero_threshold: float = 0.0,
        zero_count: float = 0.0,
        positive_spans: Spans = (),
        positive_buckets: Sequence[float] = (),
        negative_spans: Spans = (),
        negative_buckets: Sequence[float] = (),
        counter_reset_hint: int = 0,
        custom_values: Sequence[float] = (),
        start_timestamp_ms: int = 0,
    ) -> None:
        """One histogram sample with absolute bucket counts; ValueError if spans and buckets disagree.

        ``start_timestamp_ms``: when the histogram started counting (0 = unset; remote_write 2.0)."""
        if counter_reset_hint not in COUNTER_RESET_HINTS:
            raise ValueError(f"counter_reset_hint {counter_reset_hint} is not one of 0, 1, 2, 3")
        if not -128 <= schema <= 127:
            raise ValueError(f"histogram schema {schema} is outside -128 .. 127")
        for what, spans, buckets in (
            ("positive", positive_spans, positive_buckets),
            ("negative", negative_spans, negative_buckets),
        ):
            need = 0
            for i, (off, length) in enumerate(spans):
                if length < 0 or (i > 0 and off < 0):
                    raise ValueError(
                        f"{what} span {i} ({off}, {length}): only the first span may have a negative offset, no length is negative"
                    )
                need += length
            if need != len(buckets):
                raise ValueError(
                    f"{what} spans cover {need} buckets but {len(buckets)} bucket counts were given"
                )
        # Prometheus' ValidateHistogram: no negative count, and no more observations in the buckets
        # than the histogram counts (a float histogram may be a rounding error over).
        if zero_count < 0 or any(c < 0 for c in positive_buckets) or any(c < 0 for c in negative_buckets):
            raise ValueError("a bucket (or the zero bucket) has a negative observation count")
        observed = float(zero_count) + math.fsum(positive_buckets) + math.fsum(negative_buckets)
        if observed > count and observed - count > 1e-9 * max(1.0, abs(count)):
            raise ValueError(f"{observed:g} observations found in buckets, but the count is {count:g}")
        self._idx.append(self._series_index(labels))
        self._ts.append(int(ts_ms))
        self._schema.append(int(schema))
        self._zt.append(float(zero_threshold))
        self._zc.append(float(zero_count))
        self._count.append(float(count))
        self._sum.append(float(sum))
        self._hint.append(int(counter_reset_hint))
        for side, spans, buckets in (
            (0, positive_spans, positive_buckets),
            (1, negative_spans, negative_buckets),
        ):
            self._span_off[side].extend(int(o) for o, _ in spans)
            self._span_len[side].extend(int(n) for _, n in spans)
            self._span_n[side].append(len(spans))
            self._buckets[side].extend(float(c) for c in buckets)
            self._bucket_n[side].append(len(buckets))
        self._custom.extend(float(v) for v in custom_values)
        self._custom_n.append(len(custom_values))
        self._st.append(int(start_timestamp_ms))

    def add_deltas(
        self,
        labels: Mapping[str, str] | Iterable[tuple[str, str]],
        ts_ms: int,
        *,
        schema: int,
        count: float,
        sum: float,
        zero_threshold: float = 0.0,
        zero_count: float = 0.0,
        positive_spans: Spans = (),
        positive_deltas: Sequence[int] = (),
        negative_spans: Spans = (),
        negative_deltas: Sequence[int] = (),
        counter_reset_hint: int = 0,
        custom_values: Sequence[float] = (),
    ) -> None:
        """An integer histogram whose buckets are deltas (each to the previous bucket of its side)."""
        self.add(
            labels,
            ts_ms,
            schema=schema,
            count=count,
            sum=sum,
            zero_threshold=zero_threshold,
            zero_count=zero_count,
            positive_spans=positive_spans,
            positive_buckets=np.cumsum(np.asarray(positive_deltas, dtype=np.int64))
            .astype(np.float64)
            .tolist(),
            negative_spans=negative_spans,
            negative_buckets=np.cumsum(np.asarray(negative_deltas, dtype=np.int64))
            .astype(np.float64)
            .tolist(),
            counter_reset_hint=counter_reset_hint,
            custom_values=custom_values,
        )

    def add_histogram(
        self,
        labels: Mapping[str, str] | Iterable[tuple[str, str]],
        ts_ms: int,
        h: Any,
        start_timestamp_ms: int = 0,
    ) -> None:
        """A ``FloatHistogram`` (kernel_insight.kql.histogram) or anything with its fields."""
        self.add(
            labels,
            ts_ms,
            schema=h.schema,
            count=h.count,
            sum=h.sum,
            zero_threshold=h.zero_threshold,
            zero_count=h.zero_count,
            positive_spans=h.positive_spans,
            positive_buckets=h.positive_buckets,
            negative_spans=h.negative_spans,
            negative_buckets=h.negative_buckets,
            counter_reset_hint=getattr(h, "counter_reset_hint", 0),
            custom_values=getattr(h, "custom_values", ()),
            start_timestamp_ms=start_timestamp_ms,
        )

    def build(self) -> HistogramBatch:
        return HistogramBatch(
            list(self._series),
            np.asarray(self._idx, dtype=np.int32),
            np.asarray(self._ts, dtype=np.int64),
            np.asarray(self._schema, dtype=np.int32),
            np.asarray(self._zt, dtype=np.float64),
            np.asarray(self._zc, dtype=np.float64),
            np.asarray(self._count, dtype=np.float64),
            np.asarray(self._sum, dtype=np.float64),
            np.asarray(self._hint, dtype=np.uint8),
            np.asarray(self._span_off[0], dtype=np.int32),
            np.asarray(self._span_len[0], dtype=np.uint32),
            _offsets(np.asarray(self._span_n[0], dtype=np.int64)),
            np.asarray(self._buckets[0], dtype=np.float64),
            _offsets(np.asarray(self._bucket_n[0], dtype=np.int64)),
            np.asarray(self._span_off[1], dtype=np.int32),
            np.asarray(self._span_len[1], dtype=np.uint32),
            _offsets(np.asarray(self._span_n[1], dtype=np.int64)),
            np.asarray(self._buckets[1], dtype=np.float64),
            _offsets(np.asarray(self._bucket_n[1], dtype=np.int64)),
            np.asarray(self._custom, dtype=np.float64),
            _offsets(np.asarray(self._custom_n, dtype=np.int64)),
            np.asarray(self._st, dtype=np.int64) if any(self._st) else None,
        )


@dataclass(slots=True)
class SpanBatch:
    """Kernel executions as columns; ``kernel`` names are resolved strings, ``instance`` one per row."""

    instance: list[str]
    gpu: npt.NDArray[np.uint16]
    stream: npt.NDArray[np.uint64]
    kernel: list[str]
    start_ns: npt.NDArray[np.int64]
    end_ns: npt.NDArray[np.int64]
    correlation: npt.NDArray[np.uint64]
    pid: npt.NDArray[np.uint32]
    #: The host side of spans from the CUDA-event probe (ring flag LAUNCH_SPAN): when the host
    #: launched the span (0: unknown), the host ns its code took, and the host thread.
    #: Left out: zeros.
    launch_ns: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, np.int64))
    launch_host_ns: npt.NDArray[np.uint32] = field(default_factory=lambda: np.zeros(0, np.uint32))
    tid: npt.NDArray[np.uint32] = field(default_factory=lambda: np.zeros(0, np.uint32))
    #: ``kernel`` once more as (per-row code, distinct names), when the maker had it (derive
    #: does): the store then writes the names as a dictionary without encoding every row again.
    kernel_dict: tuple[npt.NDArray[np.int32], list[str]] | None = None
    #: The Kubernetes (pod, namespace, container) holding each span's GPU when it started, as
    #: (per-row index into the list, distinct holders); None: none held any ("" each).
    owners: tuple[npt.NDArray[np.int32], list[tuple[str, str, str]]] | None = None
    #: The NVTX range enclosing each span's launch (CUPTI probe, ring LAUNCH_SPAN block x), as
    #: (per-row index into the list, distinct ranges); None: no span had one ("" each).
    nvtx: tuple[npt.NDArray[np.int32], list[str]] | None = None

    def __post_init__(self) -> None:
        n = len(self.start_ns)
        cols = (self.instance, self.gpu, self.stream, self.kernel, self.end_ns, self.correlation, self.pid)
        if any(len(c) != n for c in cols):
            raise ValueError("every span column must have the same length")
        if self.kernel_dict is not None and len(self.kernel_dict[0]) != n:
            raise ValueError("every span column must have the same length")
        # Dictionary columns: (per-row code, distinct values), every code within the values.
        for coded, what in ((self.owners, "an owner code is outside the owners list"),
                            (self.nvtx, "an NVTX range code is outside the ranges list")):  # fmt: skip
            if coded is None:
                continue
            codes, values = coded
            if len(codes) != n:
                raise ValueError("every span column must have the same length")
            if n and not 0 <= int(codes.min()) <= int(codes.max()) < len(values):
                raise ValueError(what)
        if n and not len(self.launch_ns):
            self.launch_ns = np.zeros(n, np.int64)
        if n and not len(self.launch_host_ns):
            self.launch_host_ns = np.zeros(n, np.uint32)
        if n and not len(self.tid):
            self.tid = np.zeros(n, np.uint32)
        if not len(self.launch_ns) == len(self.launch_host_ns) == len(self.tid) == n:
            raise ValueError("every span column must have the same length")

    def __len__(self) -> int:
        return len(self.start_ns)

    def owner_columns(self) -> tuple[npt.NDArray[np.int32], list[tuple[str, str, str]]]:
        """Each span's (pod, namespace, container) as (codes, distinct holders), "" each where none."""
        if self.owners is not None:
            return self.owners
        return np.zeros(len(self), np.int32), [("", "", "")]

    @classmethod
    def empty(cls) -> SpanBatch:
        return cls(
            [],
            np.empty(0, np.uint16),
            np.empty(0, np.uint64),
            [],
            np.empty(0, np.int64),
            np.empty(0, np.int64),
            np.empty(0, np.uint64),
            np.empty(0, np.uint32),
        )


#: The tracks of ``gpu_calls`` (:class:`CallBatch` ``track``): NCCL collectives, memory
#: operations (allocations, frees, copies) and host waits on the GPU (syncs).
CALL_TRACKS = ("nccl", "memory", "sync")


@dataclass(slots=True)
class CallBatch:
    """Host/GPU calls other than kernels, one row each (ring COLLECTIVE, MEMOP, SYNC records).

    ``track`` is one of :data:`CALL_TRACKS`; ``op`` the call's kind within it (``allreduce``,
    ``alloc``, ``stream``...). ``handle`` is the communicator (nccl), the address (memory) or
    the stream/event handle (sync); ``status`` a memory call's CUDA status; ``failed`` the
    record's FAILED flag. Fields a track has no use for are zero.
    """

    instance: list[str]
    gpu: npt.NDArray[np.uint16]
    track: list[str]
    op: list[str]
    start_ns: npt.NDArray[np.int64]
    duration_ns: npt.NDArray[np.uint64]
    bytes: npt.NDArray[np.uint64]
    handle: npt.NDArray[np.uint64]
    pid: npt.NDArray[np.uint32]
    tid: npt.NDArray[np.uint32]
    rank: npt.NDArray[np.uint32]
    nranks: npt.NDArray[np.uint32]
    status: npt.NDArray[np.int32]
    failed: npt.NDArray[np.uint8]

    def __post_init__(self) -> None:
        n = len(self.start_ns)
        if any(len(getattr(self, f.name)) != n for f in fields(self)):
            raise ValueError("every call column must have the same length")

    def __len__(self) -> int:
        return len(self.start_ns)

    @classmethod
    def empty(cls) -> CallBatch:
        return cls.of("", 0, [])

    @classmethod
    def of(
        cls,
        instance: str,
        gpu: int,
        calls: Sequence[tuple[str, str, int, int, int, int]],
        *,
        pid: int = 0,
        tid: int = 0,
        rank: int = 0,
        nranks: int = 0,
        failed: Sequence[bool] = (),
    ) -> CallBatch:
        """One GPU's calls from ``(track, op, start_ns, duration_ns, bytes, handle)`` rows, the same
        host thread and rank for all (tests, benchmarks); ``failed`` per call, default none.

        >>> len(CallBatch.of("n1", 0, [("nccl", "allreduce", 10, 5, 1024, 0xC0)], nranks=8))
        1
        """
        n = len(calls)
        col = list(zip(*calls, strict=True)) if calls else [()] * 6
        return cls(
            instance=[instance] * n,
            gpu=np.full(n, gpu, np.uint16),
            track=[str(t) for t in col[0]],
            op=[str(o) for o in col[1]],
            start_ns=np.array(col[2], np.int64),
            duration_ns=np.array(col[3], np.uint64),
            bytes=np.array(col[4], np.uint64),
            handle=np.array(col[5], np.uint64),
            pid=np.full(n, pid, np.uint32),
            tid=np.full(n, tid, np.uint32),
            rank=np.full(n, rank, np.uint32),
            nranks=np.full(n, nranks, np.uint32),
            status=np.zeros(n, np.int32),
            failed=np.array(failed, np.uint8) if len(failed) else np.zeros(n, np.uint8),
        )

    @classmethod
    def concat(cls, parts: Sequence[CallBatch]) -> CallBatch:
        """One batch of the rows of ``parts``, in order."""
        parts = [p for p in parts if len(p)]
        if not parts:
            return cls.empty()
        if len(parts) == 1:
            return parts[0]
        cols: dict[str, Any] = {}
        for f in fields(cls):
            first = getattr(parts[0], f.name)
            if isinstance(first, list):
                cols[f.name] = [v for p in parts for v in getattr(p, f.name)]
            else:
                cols[f.name] = np.concatenate([getattr(p, f.name) for p in parts])
        return cls(**cols)


@dataclass(frozen=True, slots=True)
class Event:
    """One discrete incident (an OOM, an Xid, an NCCL timeout...)."""

    instance: str
    gpu: int
    ts_ns: int
    kind: str
    code: int = 0
    aux: int = 0
    pid: int = 0
    message: str = ""


@dataclass(frozen=True, slots=True)
class InstanceInfo:
    """What an instance is; the newest ``last_seen_ms`` wins when the same id is written twice."""

    id: str
    last_seen_ms: int
    hardware_fingerprint: str = ""
    gpu_count: int = 0
    gpu_model: str = ""
    memory_total_bytes: int = 0
    labels: Mapping[str, str] = field(default_factory=dict)
    attributes: Mapping[str, str] = field(default_factory=dict)
