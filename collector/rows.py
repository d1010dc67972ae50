"""Column batches the store inserts: samples, kernel spans, events, instances.

Every import path (ring records, agent batches, OpenMetrics text, remote_write)
produces these, so the store has one insert path per table and computes each
series fingerprint once per batch, not once per sample.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = [
    "MAX_TS_MS",
    "MIN_TS_MS",
    "Event",
    "InstanceInfo",
    "Labels",
    "SampleBatch",
    "SampleBuilder",
    "SeriesLimits",
    "SpanBatch",
    "canonical_labels",
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


@dataclass(frozen=True, slots=True)
class SeriesLimits:
    """What a series may look like when it arrives from outside (remote_write, ``ki import``).

    Names follow Prometheus' classic rules (``[a-zA-Z_:][a-zA-Z0-9_:]*`` for metric names,
    ``[a-zA-Z_][a-zA-Z0-9_]*`` for label names) unless ``utf8_names`` allows any non-empty
    UTF-8, as Prometheus 3's ``metric_name_validation_scheme: utf8`` does. The size limits
    default to Grafana Mimir's (30 labels, 1,024-byte names, 2,048-byte values); 0 turns one off.
    """

    max_labels: int = 30
    max_name_bytes: int = 1024
    max_value_bytes: int = 2048
    utf8_names: bool = False


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

    def __post_init__(self) -> None:
        n = len(self.ts_ms)
        if len(self.series_idx) != n or len(self.values) != n:
            raise ValueError("series_idx, ts_ms and values must have the same length")
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

    def add_series_canonical(
        self, labels: Labels, ts_ms: npt.NDArray[np.int64], values: npt.NDArray[np.float64]
    ) -> None:
        """Like :meth:`add_series` for labels already made by :func:`canonical_labels` (not checked again)."""
        i = self._index.get(labels)
        if i is None:
            i = self._index[labels] = len(self._series)
            self._series.append(labels)
        self._idx.append(np.full(len(ts_ms), i, dtype=np.int32))
        self._ts.append(np.asarray(ts_ms, dtype=np.int64))
        self._vs.append(np.asarray(values, dtype=np.float64))

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

    def __len__(self) -> int:
        return len(self._one_ts) + sum(len(t) for t in self._ts)

    def build(self) -> SampleBatch:
        idx = [*self._idx, np.asarray(self._one_idx, dtype=np.int32)]
        ts = [*self._ts, np.asarray(self._one_ts, dtype=np.int64)]
        vs = [*self._vs, np.asarray(self._one_vs, dtype=np.float64)]
        return SampleBatch(list(self._series), np.concatenate(idx), np.concatenate(ts), np.concatenate(vs))


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

    def __post_init__(self) -> None:
        n = len(self.start_ns)
        cols = (self.instance, self.gpu, self.stream, self.kernel, self.end_ns, self.correlation, self.pid)
        if any(len(c) != n for c in cols):
            raise ValueError("every span column must have the same length")

    def __len__(self) -> int:
        return len(self.start_ns)

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
